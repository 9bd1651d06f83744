"""Blind set 2 (transfer, layout, terminal statuses, timers, room reuse): written by a helper that had read docs/protocol.md and sglang's code but not the checks, the scenarios or the catalogue; scored as written."""
from __future__ import annotations

from backends.reference.mutants._base import PlantedLoopDeath, wrap  # noqa: F401
from backends.reference.mutants.blind import planted

_spec = planted("blind-2")


@_spec("aux-write-outside-success-count", "R-XFER-2",
       "The prefill does not count a room's aux write among its outstanding writes, so it reports Success "
       "(and the decode reads Success) as soon as the KV writes complete, while a delayed aux WRITE may still "
       "be in flight or may fail.",
       "Mori's aux path with SGLANG_MORI_SEND_AUX_RDMA off (mori/conn.py: aux data sent on its own channel, "
       "not awaited before the status; docs/sglang-bugs.md B12)")
def _aux_write_outside_success_count():
    # Bug: _write drops aux writes from r.outstanding, so _maybe_success ignores them.
    from backends.reference import prefill_core as pc

    def make(original):
        def method(self, room, r, decode, src, dst, aux):
            w = original(self, room, r, decode, src, dst, aux)
            if aux:
                r.outstanding.discard(w.write_id)
            return w
        return method
    wrap(pc.PrefillCore, "_write", make)


@_spec("dp-size-from-first-rank-entry", "R-DP-1",
       "The decode reads the prefill's DP size off the first rank entry of the bootstrap answer (engine 0's, "
       "so always 1) and sends every room to prefill engine 0, even the rooms engine room mod DP serves.",
       "decode.py _resolve_prefill_dp_rank (prefill_info.dp_size == 1 -> engine 0) with a wrongly "
       "resolved prefill_info.dp_size")
def _dp_size_from_first_rank_entry():
    # Bug: room_engine computes dp from stages[0] instead of the highest dp_rank.
    from backends.reference import adapter as ad

    def make(original):
        def room_engine(stages, room):
            dp = 1 + int(stages[0].get("dp_rank", 0)) if stages else 1
            return [st for st in stages if int(st.get("dp_rank", 0)) == room % dp]
        return room_engine
    wrap(ad, "room_engine", make)


@_spec("draft-v-offset-from-half-pool", "R-LAYOUT-2",
       "With draft KV on the decode only (MHA), the decode lands prefill layer l's V pages at buffer "
       "len(pool)/2 + l, half of a pool that includes the draft buffers, instead of right after its main K "
       "buffers: V lands in the wrong (draft or main) buffers while both sides report Success.",
       "common/conn.py get_mha_kv_ptrs_with_pp and mori/conn.py _get_mha_mem_desc_slices (V offset with "
       "draft KV, PR #35281; docs/sglang-bugs.md B4)")
def _draft_v_offset_from_half_pool():
    # Bug: landing.layout_plan rewrites main-layer V pairs to dst = (K+V buffers incl. draft) / 2 + i.
    import dataclasses

    from backends.reference import landing
    from harness.spec.layout_plan import Plan

    def make(original):
        def layout_plan(prefill, mine):
            result = original(prefill, mine)
            if not isinstance(result, Plan) or mine.mla or not mine.draft_layers or prefill.draft_layers:
                return result
            main = mine.main_layers
            half = (2 * len(main) + 2 * mine.draft_layers) // 2
            pairs = tuple(dataclasses.replace(p, dst=half + (p.buffer.layer - main.start))
                          if p.buffer.kind == "V" and not p.buffer.draft else p for p in result.pairs)
            return Plan(pairs)
        return layout_plan
    wrap(landing, "layout_plan", make)


@_spec("late-abort-flips-sender-success", "R-TERM-1",
       "An ABORT of the bound generation that reaches the prefill after the room concluded Success overwrites "
       "the sender's Success with Failed (a terminal status changes before clear).",
       "common/conn.py update_status (a Failed update always overwrites, Success included) reached from "
       "mooncake/conn.py _handle_deferred_abort_notification when room_active is computed wrongly")
def _late_abort_flips_sender_success():
    # Bug: _on_AbortReceived forces a Success room to Failed before the normal handling.
    from backends.reference import prefill_core as pc
    from harness.spec.protocol import KVPoll

    def make(original):
        def method(self, e):
            r = self.rooms.get(e.room)
            bound = r.dests.get(e.decode) if r is not None else None
            flipped = []
            if bound is not None and bound.generation == e.generation and r.status == KVPoll.Success:
                r.status, r.reason = KVPoll.Failed, f"aborted by decode {e.decode}"
                flipped = [pc.StatusChanged(e.room, KVPoll.Failed, r.reason)]
            return flipped + original(self, e)
        return method
    wrap(pc.PrefillCore, "_on_AbortReceived", make)


@_spec("bootstrap-deadline-spans-waiting", "R-TIMEOUT-1",
       "The prefill's bootstrap deadline keeps running after the decode registered: a room still "
       "WaitingForInput (registered, first chunk not yet sent) at open + bootstrap timeout is failed as a "
       "bootstrap timeout.",
       "common/conn.py CommonKVSender._check_bootstrap_timeout (deadline from init_time, checked by poll "
       "outside the Bootstrapping state); NIXL prefill bootstrap timeout, PR #34692")
def _bootstrap_deadline_spans_waiting():
    # Bug: _on_Tick also applies the bootstrap deadline to WaitingForInput rooms.
    from backends.reference import prefill_core as pc
    from harness.spec.protocol import KVPoll

    def make(original):
        def method(self, e):
            actions = original(self, e)
            for room, r in list(self.rooms.items()):
                if r.status == KVPoll.WaitingForInput and e.now - r.opened_at >= self.bootstrap_timeout_s:
                    actions += self._set(room, r, KVPoll.Failed,
                                         f"decode did not register within the bootstrap timeout of "
                                         f"{self.bootstrap_timeout_s:g} s")
            return actions
        return method
    wrap(pc.PrefillCore, "_on_Tick", make)


@_spec("waiting-deadline-rearmed-by-heartbeat", "R-TIMEOUT-2",
       "Every answered health probe of a prefill restarts the waiting deadline of that prefill's "
       "WaitingForInput rooms, so a live prefill that never concludes a room keeps the receiver waiting "
       "forever (the waiting timeout never fires while the heartbeat interval is shorter).",
       "common/conn.py CommonKVReceiver._check_waiting_timeout measured from init_time, with a backend "
       "hook (_on_heartbeat_success) that refreshes per-room timers")
def _waiting_deadline_rearmed_by_heartbeat():
    # Bug: _on_HeartbeatResult(ok) sets waiting_since = now for the prefill's waiting rooms.
    from backends.reference import decode_core as dc
    from harness.spec.protocol import KVPoll

    def make(original):
        def method(self, e):
            actions = original(self, e)
            if e.ok:
                for r in self.rooms.values():
                    if r.prefill == e.prefill and r.status == KVPoll.WaitingForInput and r.waiting_since is not None:
                        r.waiting_since = e.now
            return actions
        return method
    wrap(dc.DecodeCore, "_on_HeartbeatResult", make)


@_spec("transfer-timeout-counted-as-done", "R-TIMEOUT-3",
       "A write declared lost at the transfer timeout is taken off its room's outstanding set as if it had "
       "completed, so the room concludes Success (and tells the decode so) instead of Failed, with bytes "
       "that never landed.",
       "a transfer worker that treats a timed-out batch as settled (mooncake/conn.py transfer_worker and "
       "_poison_unsettled_send around MC_TRANSFER_TIMEOUT; nixl/conn.py _await_handles)")
def _transfer_timeout_counted_as_done():
    # Bug: _expire_writes calls _maybe_success where it should fail the room.
    from backends.reference import prefill_core as pc

    def make(original):
        def method(self, now):
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
        return method
    wrap(pc.PrefillCore, "_expire_writes", make)


@_spec("clear-skips-retiring-generations", "R-REUSE-1",
       "The prefill's clear() forgets the decode generations bound to the room instead of retiring them, "
       "so a late duplicate REGISTER of the ended lifecycle is parked as an early registration and bound "
       "to the next sender of that room number (writes into the old lifecycle's pages).",
       "registrations keyed by room only before the deferred-release generations of PRs #35049/#35360 "
       "(common/conn.py transfer_infos; docs/sglang-bugs.md B13)")
def _clear_skips_retiring_generations():
    # Bug: _on_Clear drops the retired entries it has just added.
    from backends.reference import prefill_core as pc

    def make(original):
        def method(self, e):
            before = set(self.retired)
            actions = original(self, e)
            for key in set(self.retired) - before:
                del self.retired[key]
            return actions
        return method
    wrap(pc.PrefillCore, "_on_Clear", make)


@_spec("old-failed-status-skips-generation", "R-REUSE-1",
       "The decode checks the generation of a STATUS only for Success: a late Failed STATUS of an ended "
       "lifecycle of the room fails the room's new lifecycle.",
       "common/conn.py parse_kv_status_message / the decode's status handling, which names a room, not a "
       "lifecycle (docs/sglang-bugs.md B13)")
def _old_failed_status_skips_generation():
    # Bug: _on_StatusReceived applies Failed without comparing e.generation to the room's.
    from backends.reference import decode_core as dc
    from harness.spec.protocol import KVPoll

    def make(original):
        def method(self, e):
            r = self.rooms.get(e.room)
            if e.status == KVPoll.Failed and r is not None and r.prefill == e.prefill \
                    and e.generation != r.generation:
                return self._set(e.room, r, KVPoll.Failed, e.reason or f"prefill {e.prefill} reported a failure")
            return original(self, e)
        return method
    wrap(dc.DecodeCore, "_on_StatusReceived", make)


@_spec("chunk-after-abort-still-written", "R-STALE-1",
       "A chunk dequeued for a room that already concluded Failed (aborted or failed, not yet cleared) is "
       "still written to the decode; the room stays Failed, but its writes land after the ABORT (and after "
       "the ABORT_ACK when the room had drained).",
       "nixl/conn.py transfer_worker and mori/conn.py _run_chunk skipping only cleared rooms, not "
       "concluded ones (PR #35281; docs/sglang-bugs.md B6)")
def _chunk_after_abort_still_written():
    # Bug: _on_SendChunk treats a Failed room with destinations as Transferring, then restores Failed.
    from backends.reference import prefill_core as pc
    from harness.spec.protocol import KVPoll

    def make(original):
        def method(self, e):
            r = self.rooms.get(e.room)
            if r is None or r.status != KVPoll.Failed or not r.dests or r.num_pages is None or r.last_sent:
                return original(self, e)
            reason = r.reason
            r.status = KVPoll.Transferring
            try:
                actions = original(self, e)
            finally:
                r.status, r.reason = KVPoll.Failed, reason
            return [a for a in actions if not isinstance(a, (pc.StatusChanged, pc.SendStatus))]
        return method
    wrap(pc.PrefillCore, "_on_SendChunk", make)


@_spec("zero-destination-rank-waits-for-register", "R-XFER-1",
       "A prefill TP rank that no decode rank takes KV from (MLA's extra prefill ranks, destinations=0) "
       "is opened as if it had one destination, so it waits for a registration that never comes and its "
       "sender fails at the bootstrap timeout instead of concluding with its last chunk.",
       "common/conn.py CommonKVSender dummy ranks (is_dummy, required_dst_info_num) and mooncake/conn.py "
       "add_transfer_request's dummy-rank path")
def _zero_destination_rank_waits_for_register():
    # Bug: _on_OpenSender replaces destinations=0 by 1.
    import dataclasses

    from backends.reference import prefill_core as pc

    def make(original):
        def method(self, e):
            if e.destinations == 0:
                e = dataclasses.replace(e, destinations=1)
            return original(self, e)
        return method
    wrap(pc.PrefillCore, "_on_OpenSender", make)


@_spec("bootstrap-info-cached-per-address", "R-RESTART-1",
       "The decode caches a prefill's rank endpoints per bootstrap address and refreshes them only after a "
       "failed health probe, so after a prefill restarts on new ports inside the heartbeat interval, new "
       "rooms are registered to the old, dead ports and never start.",
       "common/conn.py CommonKVReceiver._setup_bootstrap_infos and connection_pool, purged only by "
       "_handle_node_failure (docs/sglang-bugs.md B7)")
def _bootstrap_info_cached_per_address():
    # Bug: adapter.fetch_stages memoised per address; only a failed HeartbeatResult evicts it.
    from backends.reference import adapter as ad
    from backends.reference import decode_core as dc

    cache: dict = {}

    def make_fetch(original):
        def fetch_stages(bootstrap_addr, timeout_s):
            if bootstrap_addr not in cache:
                cache[bootstrap_addr] = original(bootstrap_addr, timeout_s)
            return cache[bootstrap_addr]
        return fetch_stages
    wrap(ad, "fetch_stages", make_fetch)

    def make_event(original):
        def method(self, event):
            if isinstance(event, dc.HeartbeatResult) and not event.ok:
                cache.pop(event.prefill, None)
            return original(self, event)
        return method
    wrap(ad.ReferenceRole, "_decode_event", make_event)
