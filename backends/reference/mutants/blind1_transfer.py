"""Blind set 1 (transfer, layout, status lifecycle, timers, reuse, residue): written by a helper that had read docs/protocol.md and
sglang's code but not the checks, the scenarios or the catalogue (backends/reference/mutants/blind.py,
docs/mutants.md); scored as written before any check changed for it."""

from __future__ import annotations

from backends.reference.mutants._base import wrap as _patch
from backends.reference.mutants.blind import planted

_spec = planted("blind-1")

# ---- transfer and layout ----------------------------------------------------------

@_spec("binds-before-all-destinations", "R-XFER-1",
       "a room with several decode ranks starts transferring once all but one registered; the last rank's "
       "registration is then dropped and it never hears of its room",
       "mooncake/conn.py: WaitingForInput once len(transfer_infos[room]) reaches required_dst_info_num, "
       "with the count off by one")
def _binds_before_all_destinations():
    # Bug: the "enough destinations" test compares with destinations - 1.
    from backends.reference import prefill_core as pc
    from harness.spec.protocol import KVPoll

    def _bind(self, room, r, reg):
        r.dests[reg.decode] = pc._Dest(reg.dst_pages, reg.aux_slot, reg.generation)
        if len(r.dests) < r.destinations - 1:
            return []
        return self._set(room, r, KVPoll.WaitingForInput)

    pc.PrefillCore._bind = _bind


@_spec("chunk-cursor-per-destination", "R-LAYOUT-1",
       "the room's page cursor is advanced once per destination instead of once per chunk, so every decode "
       "rank after the first gets its pages at a shifted destination slice",
       "a per-destination loop over transfer_infos sharing one running page offset (mooncake/conn.py "
       "transfer_worker's per-req loop)")
def _chunk_cursor_per_destination():
    # Bug: r.sent += len(pages) inside the loop over destinations.
    from backends.reference import prefill_core as pc
    from harness.spec.protocol import KVPoll

    def make(original):
        def _on_SendChunk(self, e):
            r = self.rooms.get(e.room)
            if r is None or r.status in (KVPoll.Success, KVPoll.Failed, KVPoll.Bootstrapping) or r.num_pages is None \
                    or len(r.dests) < 2:
                return original(self, e)
            end = r.sent + len(e.pages)
            if end > len(r.dst_pages) or end > r.num_pages or (e.last and end != r.num_pages):
                return original(self, e)
            actions = self._set(e.room, r, KVPoll.Transferring)
            for decode, d in r.dests.items():
                if e.pages:
                    actions.append(self._write(e.room, r, decode, e.pages, d.dst_pages[r.sent:r.sent + len(e.pages)],
                                               aux=False))
                    r.sent += len(e.pages)
                if e.last and r.src_aux is not None:
                    actions.append(self._write(e.room, r, decode, (r.src_aux,), (d.dst_aux,), aux=True))
            if e.last:
                r.last_sent = True
                actions += self._maybe_success(e.room, r)
            return actions
        return _on_SendChunk

    _patch(pc.PrefillCore, "_on_SendChunk", make)


@_spec("head-slice-keyed-on-offset", "R-LAYOUT-1",
       "the decode decides whether a prefill rank's pages need head slicing by the first KV head only, not the "
       "head count, so a rank starting at the same head but holding more or fewer heads is copied as whole pages",
       "common/conn.py _get_mha_head_slice_blocks: a slice decision taken from one of the two head parameters")
def _head_slice_keyed_on_offset():
    # Bug: same head_start => treated as the same heads (source=None: whole-page copy).
    from backends.reference import landing

    def make(original):
        def apply_write(buffers, mine, plan, source, aux, dst, payload):
            if source is not None and source.head_start == mine.head_start:
                source = None
            return original(buffers, mine, plan, source, aux, dst, payload)
        return apply_write

    _patch(landing, "apply_write", make)


@_spec("pp-write-plan-of-stage-zero", "R-LAYOUT-2",
       "the decode lands every prefill stage's KV write with stage 0's layer plan (the plan looked up by room "
       "only, not by the sending stage)",
       "a per-room layer plan cached on the first peer of a room (mori/conn.py, PR #35281's PP handling)")
def _pp_write_plan_of_stage_zero():
    # Bug: the sending stage is ignored when the write lands.
    from backends.reference import adapter

    def make(original):
        def _apply_write(self, room, aux, dst, payload, stage=0):
            return original(self, room, aux, dst, payload, 0)
        return _apply_write

    _patch(adapter.ReferenceRole, "_apply_write", make)


@_spec("pp-success-on-first-stage", "R-XFER-2",
       "with a prefill of several pipeline stages the decode reports Success on the first stage's Success, "
       "before the other stages' layers have landed",
       "common/conn.py check_status_pp_consensus: a consensus that takes the first stage's status")
def _pp_success_on_first_stage():
    # Bug: the first Success marks every stage as succeeded.
    from backends.reference import decode_core as dc
    from harness.spec.protocol import KVPoll

    def make(original):
        def _on_StatusReceived(self, e):
            r = self.rooms.get(e.room)
            if r is not None and e.status == KVPoll.Success and r.prefill == e.prefill \
                    and r.waiting_since is not None and e.generation == r.generation:
                r.succeeded |= set(range(r.stages))
            return original(self, e)
        return _on_StatusReceived

    _patch(dc.DecodeCore, "_on_StatusReceived", make)


# ---- status lifecycle ---------------------------------------------------------------

@_spec("failed-overrides-success-decode", "R-TERM-1",
       "on the decode a later failure (heartbeat loss, local abort) overwrites a room's Success with Failed "
       "before clear",
       "common/conn.py update_status: Failed is stored whatever the current status")
def _failed_overrides_success_decode():
    # Bug: the terminal guard lets Failed replace Success.
    from backends.reference import decode_core as dc
    from backends.reference.shared_events import StatusChanged
    from harness.spec.protocol import KVPoll

    def make(original):
        def _set(self, room, r, status, reason=""):
            if status == KVPoll.Failed and r.status == KVPoll.Success:
                r.status, r.reason = KVPoll.Failed, reason
                return [StatusChanged(room, status, reason)]
            return original(self, room, r, status, reason)
        return _set

    _patch(dc.DecodeCore, "_set", make)


@_spec("bootstrap-timeout-from-waiting-knob", "R-TIMEOUT-1",
       "the prefill takes its bootstrap deadline from the waiting timeout (the wrong knob), so an orphan sender "
       "fails only after SGLANG_DISAGGREGATION_WAITING_TIMEOUT",
       "a copy-pasted get_int_env_var(SGLANG_DISAGGREGATION_WAITING_TIMEOUT) for the bootstrap timeout "
       "(PR #34692 added NIXL's)")
def _bootstrap_timeout_from_waiting_knob():
    # Bug: bootstrap_timeout_s := transfer (waiting) timeout.
    from backends.reference import prefill_core as pc

    def make(original):
        def __init__(self, *args, **kwargs):
            original(self, *args, **kwargs)
            if self.transfer_timeout_s is not None:
                self.bootstrap_timeout_s = self.transfer_timeout_s
        return __init__

    _patch(pc.PrefillCore, "__init__", make)


@_spec("waiting-timeout-ms-vs-s", "R-TIMEOUT-2",
       "the decode measures the elapsed wait in milliseconds but compares it with the waiting timeout in "
       "seconds, so rooms fail a thousand times too early",
       "a deadline computed from time.perf_counter_ns()/1e6 against a seconds setting")
def _waiting_timeout_ms_vs_s():
    # Bug: the effective waiting timeout is waiting_timeout_s / 1000.
    from backends.reference import decode_core as dc

    def make(original):
        def __init__(self, *args, **kwargs):
            original(self, *args, **kwargs)
            self.waiting_timeout_s = self.waiting_timeout_s / 1000.0
        return __init__

    _patch(dc.DecodeCore, "__init__", make)


@_spec("completion-in-issue-order", "R-TIMEOUT-3",
       "a write's completion is taken to complete every earlier write of its room (completions assumed in "
       "issue order), so a stuck KV write is forgotten once the aux write completes and the room succeeds",
       "NIXL _await_handles / Mooncake batch status checked on the last handle of a batch only")
def _completion_in_issue_order():
    # Bug: WriteDone(ok) for write N discards every outstanding write < N of the room.
    from backends.reference import prefill_core as pc

    def make(original):
        def _on_WriteDone(self, e):
            r = self.rooms.get(e.room)
            if e.ok and r is not None and e.write_id in r.outstanding:
                for earlier in [w for w in r.outstanding if w < e.write_id]:
                    r.outstanding.discard(earlier)
                    self.issued.pop(earlier, None)
            return original(self, e)
        return _on_WriteDone

    _patch(pc.PrefillCore, "_on_WriteDone", make)


@_spec("generation-restarts-per-room", "R-REUSE-1",
       "the decode numbers a room's lifecycles with a counter kept in the room's own state, which clear drops, "
       "so every lifecycle of a reused room has generation 1 and is taken for the old one",
       "deferred-release generations kept per room and popped in clear (PRs #35049, #35360)")
def _generation_restarts_per_room():
    # Bug: generation = 1 for every new receiver.
    from backends.reference import decode_core as dc

    def make(original):
        def _on_OpenReceiver(self, e):
            fresh = e.room not in self.rooms
            actions = original(self, e)
            if fresh and e.room in self.rooms:
                self.rooms[e.room].generation = 1
            return actions
        return _on_OpenReceiver

    _patch(dc.DecodeCore, "_on_OpenReceiver", make)


@_spec("abort-tombstone-by-room", "R-REUSE-1",
       "the prefill matches an ABORTed generation's tombstone by room and decode only, so a newer lifecycle's "
       "registration of that room is dropped until the tombstone expires",
       "common/conn.py deferred_bootstrap.fail(room): cancellations keyed by room, not lifecycle")
def _abort_tombstone_by_room():
    # Bug: tombstone lookup ignores the generation.
    from backends.reference import prefill_core as pc
    from backends.reference.shared_events import Log

    def make(original):
        def _on_DecodeRegistered(self, e):
            if any(k[0] == e.room and k[1] == e.decode for k in self.tombstones):
                return [Log("info", f"room {e.room}: registration from {e.decode} of an aborted room dropped")]
            return original(self, e)
        return _on_DecodeRegistered

    _patch(pc.PrefillCore, "_on_DecodeRegistered", make)


@_spec("ended-generations-never-expire", "R-RESIDUE-1",
       "the prefill's memory of ended generations (tombstones, retired registrations) is never pruned",
       "a table of aborted/ended rooms that is only ever added to (common/conn.py _deferred_ack_targets "
       "popped only when the room number is reused)")
def _ended_generations_never_expire():
    # Bug: the tick's expiry pass never sees the tables.
    from backends.reference import prefill_core as pc

    def make(original):
        def _on_Tick(self, e):
            kept = self.tombstones, self.retired
            self.tombstones, self.retired = {}, {}
            try:
                return original(self, e)
            finally:
                kept[0].update(self.tombstones)
                kept[1].update(self.retired)
                self.tombstones, self.retired = kept
        return _on_Tick

    _patch(pc.PrefillCore, "_on_Tick", make)


@_spec("failed-write-handle-kept", "R-RESIDUE-1",
       "the prefill releases a write's handle when it completes, but not when it completes with an error, so "
       "the failed write's entry outlives its room",
       "per-handle state freed on the success path only (nixl/conn.py release of xfer handles)")
def _failed_write_handle_kept():
    # Bug: issued[write_id] is put back after a failed completion.
    from backends.reference import prefill_core as pc

    def make(original):
        def _on_WriteDone(self, e):
            entry = self.issued.get(e.write_id)
            actions = original(self, e)
            if not e.ok and entry is not None:
                self.issued[e.write_id] = entry
            return actions
        return _on_WriteDone

    _patch(pc.PrefillCore, "_on_WriteDone", make)
