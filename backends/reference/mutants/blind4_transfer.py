"""Blind set 4 (transfer, layout, statuses, timers, reuse): written by a helper that had read docs/protocol.md, the reference and sglang's code but not the checks, the scenarios or the catalogue; scored as written."""

from __future__ import annotations

from backends.reference.mutants._base import PlantedLoopDeath, wrap  # noqa: F401
from backends.reference.mutants.blind import planted

_spec = planted("blind-4")


# ---- shared by the two planner mutants: remap a plan's destination buffers by identity ----------

def _remap_plan(result, attention, p_side, d_side, target):
    """``result`` (a Plan or a Rejection) with each pair's decode buffer replaced by the decode
    buffer of identity ``target(buffer, p_side, d_side)`` (the pair is kept when the decode has none)."""
    from harness.spec.layout_plan import BufferPair, Plan, side_buffers

    if not isinstance(result, Plan):
        return result
    where = {b: i for i, b in enumerate(side_buffers(attention, d_side))}
    pairs = []
    for p in result.pairs:
        t = target(p.buffer, p_side, d_side)
        pairs.append(BufferPair(p.src, where[t], p.buffer) if t in where else p)
    return Plan(tuple(pairs))


def _patch_planner(target):
    """Apply ``target`` both where the decode lands real writes (landing.layout_plan) and in the
    adapter's own pairing of generated layouts (plan_layouts): one planner, as in a backend."""
    from backends.reference import adapter as ad
    from backends.reference import landing
    from harness.spec.layout_plan import Plan, SideLayout, plan

    def side(layout):
        return SideLayout(layout.main_layers.start, layout.main_layers.stop, layout.draft_layers)

    original = landing.layout_plan

    def layout_plan(prefill, mine):
        return _remap_plan(original(prefill, mine), "MLA" if mine.mla else "MHA", side(prefill), side(mine), target)

    landing.layout_plan = layout_plan

    def plan_layouts(self, specs):
        from harness.spec.layouts import to_spec

        out = []
        for spec in specs:
            s = to_spec(spec)
            result = _remap_plan(plan(s), s.attention, s.prefill, s.decode, target)
            out.append({"pairs": [[p.src, p.dst] for p in result.pairs]} if isinstance(result, Plan)
                       else {"rejected": result.reason})
        return out

    ad.ReferenceRole.plan_layouts = plan_layouts


# ---- transfer -----------------------------------------------------------------------------

@_spec("aux-write-not-awaited", "R-XFER-2",
       "bug: the prefill counts only the KV page writes of a room as outstanding, not the aux write issued with "
       "the last chunk, so it reports Success (and tells the decode) as soon as the KV pages landed while a slow "
       "aux write is still on its way: the decode reads a stale first output token.",
       "like: mooncake/conn.py transfer_worker (aux sent by send_aux on its own path, the room's status updated "
       "after the KV batch without waiting for it)")
def _aux_write_not_awaited():
    # Bug: the aux write never enters the room's outstanding set.
    from backends.reference import prefill_core as pc

    def make(orig):
        def _write(self, room, r, decode, src, dst, aux):
            w = orig(self, room, r, decode, src, dst, aux)
            if aux:
                r.outstanding.discard(w.write_id)
            return w
        return _write

    wrap(pc.PrefillCore, "_write", make)


@_spec("success-on-last-write-only", "R-XFER-2",
       "bug: once the last chunk is handed over, the prefill treats the completion of the room's most recently "
       "issued write as the completion of all of them (it assumes writes complete in order) and reports Success "
       "while an earlier, slower write has not landed yet.",
       "like: nixl/conn.py transfer_worker / _await_handles (waiting on the last transfer handle of a batch only)")
def _success_on_last_write_only():
    # Bug: completion of the highest write id settles every outstanding write of the room.
    from backends.reference import prefill_core as pc

    def make(orig):
        def _on_WriteDone(self, e):
            r = self.rooms.get(e.room)
            if (e.ok and r is not None and r.last_sent and e.write_id in r.outstanding
                    and e.write_id == max(r.outstanding)):
                r.outstanding = {e.write_id}
            return orig(self, e)
        return _on_WriteDone

    wrap(pc.PrefillCore, "_on_WriteDone", make)


# ---- layout -------------------------------------------------------------------------------

@_spec("pp-stage-local-layer-index", "R-LAYOUT-2",
       "bug: the decode pairs a prefill pipeline stage's buffers by the layer's index inside that stage instead "
       "of its model layer, so stage 1's layers land in the decode's first layers (stage 0 is unaffected).",
       "like: common/conn.py get_mha_kv_ptrs_with_pp / get_mla_kv_ptrs_with_pp (start_layer offset not applied "
       "to the decode's pointer list)")
def _pp_stage_local_layer_index():
    # Bug: decode buffer chosen as layer - prefill.start_layer.
    from harness.spec.layout_plan import BufferId

    def target(b, p, d):
        return b if b.draft else BufferId(False, b.layer - p.start_layer, b.kind)

    _patch_planner(target)


@_spec("draft-v-into-draft-k-slot", "R-LAYOUT-2",
       "bug: with draft KV on both sides, a draft layer's V buffer is placed at 2 x main layers + draft index on "
       "the decode, forgetting the draft K buffers in between, so draft V overwrites draft K and the decode's "
       "draft V stays stale.",
       "like: mori/conn.py / common/conn.py get_mha_kv_ptrs_with_pp (draft-KV V offset computed from the main "
       "layer count only, PR #35281)")
def _draft_v_offset():
    # Bug: draft V d lands in the decode buffer of draft K d.
    from harness.spec.layout_plan import BufferId

    def target(b, p, d):
        return BufferId(True, b.layer, "K") if b.draft and b.kind == "V" else b

    _patch_planner(target)


@_spec("head-offset-zero-prefill-wider", "R-LAYOUT-1",
       "bug: when a prefill rank holds fewer KV heads than the decode rank (prefill TP > decode TP), its heads "
       "are written at the decode's head 0 instead of at their own offset, so every prefill rank overwrites the "
       "first heads and the decode's other heads never get their KV.",
       "like: mooncake/conn.py send_kvcache_slice (dst_head_start_offset not set from the rank's position in its "
       "group when prefill_tp_size > decode_tp_size)")
def _head_offset_zero_prefill_wider():
    # Bug: destination head offset forced to 0 for a narrower prefill rank.
    from backends.reference import landing

    def land_heads(tensor, dst, pages, mine, source):
        shared = landing.shared_heads(tensor, pages, mine, source)
        if shared is None:
            return
        first, last, view, src = shared
        base = 0 if source.kv_heads < mine.kv_heads else first - mine.head_start
        view[dst, :, base:base + (last - first)] = src.to(view.device)

    landing.land_heads = land_heads


@_spec("mla-every-rank-expected", "R-XFER-1",
       "bug: the decode takes a stage's KV from every prefill TP rank whose heads overlap its own instead of the "
       "lowest rank holding each head; with MLA every rank holds the latent head, so it registers with the "
       "prefill's extra ranks too and waits for their status, which never comes: the room fails at the waiting "
       "timeout.",
       "like: common/conn.py _resolve_rank_mapping / _setup_bootstrap_infos (MLA extra ranks not marked dummy, "
       "required_prefill_response_num counting them)")
def _mla_every_rank_expected():
    # Bug: every overlapping rank is chosen, not one per head.
    from backends.reference import landing
    from harness.spec.protocol import Layout

    def chosen_ranks(ranks, mine):
        chosen = []
        lo, hi = mine.head_start, mine.head_start + mine.kv_heads
        for pp_rank in sorted({r.get("pp_rank", 0) for r in ranks}):
            stage = [r for r in ranks if r.get("pp_rank", 0) == pp_rank]
            try:
                layouts = [Layout(**r["layout"]) for r in stage]
            except TypeError:
                chosen += stage
                continue
            picked = [r for r, lay in zip(stage, layouts) if lay.head_start < hi and lo < lay.head_start + lay.kv_heads]
            chosen += picked or stage[:1]
        return chosen

    landing.chosen_ranks = chosen_ranks


@_spec("dp-size-highest-rank", "R-DP-1",
       "bug: the decode takes the prefill's DP size as the highest registered DP rank (guarded against 0) "
       "instead of that plus one, so with two prefill DP engines every room goes to engine 0: the odd rooms "
       "register where no sender exists, their sender on engine 1 times out and the decode waits in vain.",
       "like: decode.py _resolve_prefill_dp_rank (bootstrap_room % prefill_dp_size with the size read off the "
       "bootstrap server's rank table)")
def _dp_size_highest_rank():
    # Bug: dp = max(dp_rank) or 1 (off by one).
    from backends.reference import adapter as ad

    def room_engine(stages, room):
        dp = max((int(st.get("dp_rank", 0)) for st in stages), default=0) or 1
        return [st for st in stages if int(st.get("dp_rank", 0)) == room % dp]

    ad.room_engine = room_engine


# ---- timers -------------------------------------------------------------------------------

@_spec("bootstrap-timeout-past-registration", "R-TIMEOUT-1",
       "bug: the prefill keeps applying the bootstrap deadline after the decode registered: a room still "
       "WaitingForInput (its prefill forward slower than the bootstrap timeout) is failed as a bootstrap "
       "timeout although the decode did register.",
       "like: common/conn.py CommonKVSender._poll_with_status / _check_bootstrap_timeout (deadline checked for "
       "Bootstrapping and WaitingForInput, measured from init_time)")
def _bootstrap_timeout_past_registration():
    # Bug: the deadline also covers WaitingForInput.
    from backends.reference import prefill_core as pc
    from harness.spec.protocol import KVPoll

    def make(orig):
        def _on_Tick(self, e):
            actions = orig(self, e)
            for room, r in list(self.rooms.items()):
                if r.status == KVPoll.WaitingForInput and e.now - r.opened_at >= self.bootstrap_timeout_s:
                    actions += self._set(room, r, KVPoll.Failed,
                                         f"decode did not register within the bootstrap timeout of "
                                         f"{self.bootstrap_timeout_s:g} s")
            return actions
        return _on_Tick

    wrap(pc.PrefillCore, "_on_Tick", make)


@_spec("waiting-timer-wall-clock", "R-TIMEOUT-2",
       "bug: the decode stamps the start of a room's wait with the wall clock (time.time) while its timer "
       "compares against the monotonic clock, so the elapsed time is hugely negative and a receiver whose "
       "prefill never answers stays WaitingForInput forever.",
       "like: common/conn.py CommonKVReceiver.send_metadata / _check_waiting_timeout (init_time and the poll "
       "clock from different time sources)")
def _waiting_timer_wall_clock():
    # Bug: RequestKV.now from time.time(), Tick.now from time.monotonic().
    import time

    from backends.reference import adapter as ad
    from backends.reference import decode_core as dc

    def request_kv(self, room, pages, aux_slot):
        self.side.submit(lambda: self._decode_event(dc.RequestKV(room, tuple(pages), aux_slot, time.time())))

    ad.ReferenceRole.request_kv = request_kv


@_spec("timed-out-write-counted-done", "R-TIMEOUT-3",
       "bug: a write that does not complete within the transfer timeout is dropped from the room's outstanding "
       "set as if it had completed, so the prefill reports Success (and tells the decode) for a room whose bytes "
       "never landed, instead of failing it.",
       "like: nixl/conn.py _await_handles (a handle given up on after its deadline treated as settled)")
def _timed_out_write_counted_done():
    # Bug: expiry calls _maybe_success instead of failing the room.
    from backends.reference import prefill_core as pc

    def _expire_writes(self, now):
        if self.transfer_timeout_s is None:
            return []
        actions = []
        for write_id, (room, issued, decode) in list(self.issued.items()):
            if issued is None:
                self.issued[write_id] = (room, now, decode)
                continue
            if now - issued < self.transfer_timeout_s:
                continue
            del self.issued[write_id]
            drain = self.draining.get(room)
            if drain is not None and write_id in drain.outstanding:
                drain.outstanding.discard(write_id)
                actions += self._finish_drain(room, drain)
            r = self.rooms.get(room)
            if r is not None and write_id in r.outstanding:
                r.outstanding.discard(write_id)
                actions += self._maybe_success(room, r)
        return actions

    pc.PrefillCore._expire_writes = _expire_writes


# ---- statuses and reuse -------------------------------------------------------------------

@_spec("decode-status-no-generation", "R-REUSE-1",
       "bug: the decode matches a prefill STATUS to its receiver by room only and ignores the generation it "
       "carries, so a late STATUS of a room's previous lifecycle concludes (Success or Failed) the new receiver "
       "that reuses the room number.",
       "like: common/conn.py parse_kv_status_message / apply_prefill_status (status messages keyed by "
       "bootstrap_room alone)")
def _decode_status_no_generation():
    # Bug: every STATUS is taken as the current generation's.
    import dataclasses

    from backends.reference import decode_core as dc

    def make(orig):
        def _on_StatusReceived(self, e):
            r = self.rooms.get(e.room)
            if r is not None:
                e = dataclasses.replace(e, generation=r.generation)
            return orig(self, e)
        return _on_StatusReceived

    wrap(dc.DecodeCore, "_on_StatusReceived", make)


@_spec("decode-abort-flips-success", "R-TERM-1",
       "bug: the decode's abort() of a room that already reached Success records the abort as the room's "
       "failure and overwrites the status with Failed (and sends an ABORT), so a concluded room flips from "
       "Success to Failed.",
       "like: common/conn.py CommonKVReceiver.abort + update_status (Failed overrides any status, "
       "conclude_state only caches poll())")
def _decode_abort_flips_success():
    # Bug: abort() of a Success room sets Failed.
    from backends.reference import decode_core as dc
    from backends.reference.shared_events import StatusChanged
    from harness.spec.protocol import KVPoll

    def make(orig):
        def _on_Abort(self, e):
            r = self.rooms.get(e.room)
            if r is None or r.status != KVPoll.Success:
                return orig(self, e)
            r.status, r.reason = KVPoll.Failed, "Aborted by AbortReq."
            return [StatusChanged(e.room, KVPoll.Failed, r.reason)] + orig(self, e)
        return _on_Abort

    wrap(dc.DecodeCore, "_on_Abort", make)


@_spec("failure-only-to-failing-rank", "R-FANOUT-1",
       "bug: when one write of a room fails, the prefill tells only the decode rank that write went to; the "
       "room's other decode ranks (decode TP wider than the prefill's) hear nothing and wait out their waiting "
       "timeout.",
       "like: common/conn.py _room_notify_targets (the failure sent to the failed transfer's endpoint only)")
def _failure_only_to_failing_rank():
    # Bug: Failed STATUS filtered to the failed write's destination.
    from backends.reference import prefill_core as pc
    from harness.spec.protocol import KVPoll

    def make(orig):
        def _on_WriteDone(self, e):
            issued = self.issued.get(e.write_id)
            actions = orig(self, e)
            if e.ok or issued is None:
                return actions
            decode = issued[2]
            return [a for a in actions if not (isinstance(a, pc.SendStatus) and a.status == KVPoll.Failed
                                               and a.decode != decode)]
        return _on_WriteDone

    wrap(pc.PrefillCore, "_on_WriteDone", make)
