"""Planted bugs in what a room transfers and how its lifecycle ends: R-XFER, R-LAYOUT, R-DP, R-TERM,
R-TIMEOUT, R-REUSE, R-RESIDUE (backends.reference.mutants lists them)."""

from __future__ import annotations

import dataclasses
import logging
from typing import Callable

from backends.reference import decode_core as dc
from backends.reference import prefill_core as pc
from backends.reference.mutants._base import wrap
from harness.spec import layout_plan
from harness.spec.protocol import KVPoll

ra = None  # backends.reference.adapter, set by apply_from_env (it imports torch; the catalogue does not)
log = logging.getLogger("pdconform.reference")


# ---- R-XFER-1 ----------------------------------------------------------------------

def _no_success_status() -> None:
    def make(orig):
        def _set(self, room, r, status, reason=""):
            return [a for a in orig(self, room, r, status, reason)
                    if not (isinstance(a, pc.SendStatus) and a.status == KVPoll.Success)]
        return _set
    wrap(pc.PrefillCore, "_set", make)


def _last_chunk_missed() -> None:
    def _send_chunk_now(self, room, pages):
        r = self.prefill.rooms.get(room)
        last = r is not None and r.num_pages is not None and r.sent + len(pages) > r.num_pages  # off by one
        self._prefill_event(pc.SendChunk(room, tuple(pages), last))
    wrap(ra.ReferenceRole, "_send_chunk_now", lambda _: _send_chunk_now)


# ---- R-XFER-2 ----------------------------------------------------------------------

def _success_before_aux() -> None:
    def make(orig):
        def _write(self, room, r, decode, src, dst, aux):
            w = orig(self, room, r, decode, src, dst, aux)
            if aux:  # the aux goes on a path of its own and Success does not wait for it
                r.outstanding.discard(w.write_id)
            return w
        return _write
    wrap(pc.PrefillCore, "_write", make)


# ---- R-LAYOUT-1 --------------------------------------------------------------------

def _aux_slot_off_by_one() -> None:
    def make(orig):
        def _send_write(self, w):
            if w.aux:
                w = dataclasses.replace(w, dst=((w.dst[0] + 1) % self.layout.aux_slots,))
            return orig(self, w)
        return _send_write
    wrap(ra.ReferenceRole, "_send_write", make)


def _chunk_offset_restarts() -> None:
    def make(orig):
        def _write(self, room, r, decode, src, dst, aux):
            if not aux:  # every chunk written from the first destination page
                dst = r.dests[decode].dst_pages[:len(dst)]
            return orig(self, room, r, decode, src, dst, aux)
        return _write
    wrap(pc.PrefillCore, "_write", make)


def _destinations_sorted() -> None:
    def make(orig):
        def _write(self, room, r, decode, src, dst, aux):
            return orig(self, room, r, decode, src, tuple(sorted(dst)) if not aux else dst, aux)
        return _write
    wrap(pc.PrefillCore, "_write", make)


# ---- R-LAYOUT-2 --------------------------------------------------------------------

def _shifted_plan(shift: Callable[[layout_plan.LayoutSpec, layout_plan.BufferPair, list], int | None]):
    """A planner that pairs like the reference's, then moves each pair's destination to
    ``shift(spec, pair, decode buffers)`` (None: keep): an index computed by position."""
    def plan(spec):
        result = layout_plan.plan(spec)
        if not isinstance(result, layout_plan.Plan):
            return result
        dst = layout_plan.side_buffers(spec.attention, spec.decode)
        pairs = []
        for p in result.pairs:
            moved = shift(spec, p, dst)
            pairs.append(p if moved is None or not 0 <= moved < len(dst) else dataclasses.replace(p, dst=moved))
        return layout_plan.Plan(tuple(pairs))
    wrap(ra, "plan", lambda _: plan)


def _draft_v_offset() -> None:
    # draft V found after the draft K block counted with the main layer count, not the draft's
    def shift(spec, p, dst):
        if p.buffer.draft and p.buffer.kind == "V":
            main = len(spec.decode.main_layers)
            return 2 * main + main + p.buffer.layer
        return None
    _shifted_plan(shift)


def _stage_start_ignored() -> None:
    # a prefill stage's layer written at its index within the stage, as if the decode's stage began there
    def shift(spec, p, dst):
        if p.buffer.draft or spec.prefill.start_layer == spec.decode.start_layer:
            return None
        return p.dst - (spec.prefill.start_layer - spec.decode.start_layer)
    _shifted_plan(shift)


def _head_slice_at_zero() -> None:
    # a prefill TP rank's KV heads written from the decode rank's first head, not at their own
    from backends.reference import landing

    def land_heads(tensor, dst, pages, mine, source):
        shared = landing.shared_heads(tensor, pages, mine, source)
        if shared is not None:
            first, last, view, src = shared
            view[dst, :, 0:last - first] = src
    landing.land_heads = land_heads


# ---- R-DP-1 ------------------------------------------------------------------------

def _dp_engine_zero() -> None:
    # the decode takes every room from prefill DP engine 0, whatever engine the room selects
    ra.room_engine = lambda stages, room: [st for st in stages if int(st.get("dp_rank", 0)) == 0]


# ---- R-TERM-1 ----------------------------------------------------------------------

def _failed_raised_to_success() -> None:
    # sglang's update_status merges with max(): Failed (0) is raised by any later status
    def make(orig):
        def _set(self, room, r, status, reason=""):
            if r.status == KVPoll.Failed and status > r.status:
                r.status = status
                return [dc.StatusChanged(room, status, reason)]
            return orig(self, room, r, status, reason)
        return _set
    wrap(dc.DecodeCore, "_set", make)

    def make_status(orig):
        def _on_StatusReceived(self, e):  # noqa: N802 (the core's handler naming)
            r = self.rooms.get(e.room)
            if r is not None and r.status == KVPoll.Failed and e.status == KVPoll.Success:
                return self._set(e.room, r, KVPoll.Success)
            return orig(self, e)
        return _on_StatusReceived
    wrap(dc.DecodeCore, "_on_StatusReceived", make_status)

    def make_abort(orig):
        def _on_AbortReceived(self, e):  # noqa: N802
            r = self.rooms.get(e.room)
            if r is not None and r.outstanding and e.decode in r.dests:  # its transfer goes on and "completes"
                self.__dict__.setdefault("_planted_done", {})[e.room] = [
                    (decode, d.generation) for decode, d in r.dests.items()]
            return orig(self, e)
        return _on_AbortReceived
    wrap(pc.PrefillCore, "_on_AbortReceived", make_abort)

    def make_drain(orig):
        def _finish_drain(self, room, drain):
            actions = orig(self, room, drain)
            if not drain.outstanding:
                actions += [pc.SendStatus(room, decode, KVPoll.Success, "", generation)
                            for decode, generation in self.__dict__.get("_planted_done", {}).pop(room, [])]
            return actions
        return _finish_drain
    wrap(pc.PrefillCore, "_finish_drain", make_drain)


# ---- R-TIMEOUT-1/2/3 ---------------------------------------------------------------

def _bootstrap_deadline_reset() -> None:
    def make(orig):
        def _on_Tick(self, e):  # noqa: N802
            for r in self.rooms.values():
                if r.status == KVPoll.Bootstrapping:
                    r.opened_at = e.now  # the deadline restarts on every tick
            return orig(self, e)
        return _on_Tick
    wrap(pc.PrefillCore, "_on_Tick", make)


def _bootstrap_deadline_any_state() -> None:
    def make(orig):
        def _on_Tick(self, e):  # noqa: N802
            actions = orig(self, e)
            for room, r in list(self.rooms.items()):
                if r.status in (KVPoll.WaitingForInput, KVPoll.Transferring) \
                        and e.now - r.opened_at >= self.bootstrap_timeout_s:
                    actions += self._set(room, r, KVPoll.Failed, "bootstrap timeout")
            return actions
        return _on_Tick
    wrap(pc.PrefillCore, "_on_Tick", make)


def _waiting_deadline_reset() -> None:
    def make(orig):
        def _on_Tick(self, e):  # noqa: N802
            for r in self.rooms.values():
                if r.status == KVPoll.WaitingForInput:
                    r.waiting_since = e.now
            return orig(self, e)
        return _on_Tick
    wrap(dc.DecodeCore, "_on_Tick", make)


def _stuck_write_waited_forever() -> None:
    def make(orig):
        def __init__(self, *args, **kwargs):
            orig(self, *args, **kwargs)
            self.transfer_timeout_s = None  # NIXL's _await_handles: no deadline
        return __init__
    wrap(pc.PrefillCore, "__init__", make)


def _dead_decode_write_waited_forever() -> None:
    """No deadline, and the engine's loss of a decode (its connection closed or refused, as when
    its process was killed: pc.DecodeLost) fails none of the writes to it: they are waited for forever."""
    _stuck_write_waited_forever()

    def make(orig):
        def _on_DecodeLost(self, e):  # noqa: N802
            return []
        return _on_DecodeLost
    wrap(pc.PrefillCore, "_on_DecodeLost", make)


# ---- R-REUSE-1 ---------------------------------------------------------------------

def _old_generation_ack_applied() -> None:
    def make(orig):
        def _on_AbortAckReceived(self, e):  # noqa: N802
            r = self.rooms.get(e.room)
            if r is not None and e.generation != r.generation:  # matched by room only: the ACK ends the room
                return self._set(e.room, r, KVPoll.Failed, "aborted (ABORT_ACK received)") + [dc.ReleaseSafe(e.room)]
            return orig(self, e)
        return _on_AbortAckReceived
    wrap(dc.DecodeCore, "_on_AbortAckReceived", make)


def _old_generation_status_applied() -> None:
    def make(orig):
        def _on_StatusReceived(self, e):  # noqa: N802
            r = self.rooms.get(e.room)
            if r is not None and e.generation != r.generation:  # matched by room only, as Common's STATUS
                e = dataclasses.replace(e, generation=r.generation)
            return orig(self, e)
        return _on_StatusReceived
    wrap(dc.DecodeCore, "_on_StatusReceived", make)


def _old_generation_abort_applied() -> None:
    def make(orig):
        def _on_AbortReceived(self, e):  # noqa: N802
            r = self.rooms.get(e.room)
            bound = r.dests.get(e.decode) if r is not None else None
            if r is not None and r.status not in (KVPoll.Success, KVPoll.Failed) \
                    and (bound is None or bound.generation != e.generation):  # matched by room only
                return self._set(e.room, r, KVPoll.Failed, f"aborted by decode {e.decode}") \
                    + self._ack(e.room, e.decode, e.generation)
            return orig(self, e)
        return _on_AbortReceived
    wrap(pc.PrefillCore, "_on_AbortReceived", make)


def _status_kept_across_clear() -> None:
    # like update_status on a status map that clear did not empty: the old Failed is "terminal"
    def make_clear(orig):
        def clear(self, room):
            kept = self.status.get(room)
            orig(self, room)
            if self.role == "prefill" and kept == KVPoll.Failed:
                self._sync(lambda: self.status.__setitem__(room, kept))
        return clear
    wrap(ra.ReferenceRole, "clear", make_clear)

    def make_record(orig):
        def _record(self, room, status, reason):
            if self.role == "prefill" and self.status.get(room) == KVPoll.Failed:
                return
            return orig(self, room, status, reason)
        return _record
    wrap(ra.ReferenceRole, "_record", make_record)


# ---- R-RESIDUE-1 -------------------------------------------------------------------

def _failed_room_kept() -> None:
    def make(orig):
        def _on_Clear(self, e):  # noqa: N802
            r = self.rooms.get(e.room)
            actions = orig(self, e)
            if r is not None and r.status == KVPoll.Failed:
                self.rooms[e.room] = r  # a failure record nobody removes
            return actions
        return _on_Clear
    wrap(pc.PrefillCore, "_on_Clear", make)


def _decode_room_kept() -> None:
    def make(orig):
        def _on_Clear(self, e):  # noqa: N802
            r = self.rooms.get(e.room)
            actions = orig(self, e)
            if r is not None and r.status == KVPoll.Failed:
                self.rooms[e.room] = r
            return actions
        return _on_Clear
    wrap(dc.DecodeCore, "_on_Clear", make)


def _failure_record_in_substate() -> None:
    class FailureLog:  # a helper object of the manager, as staging or transfer-info records are
        def __init__(self):
            self.by_destination: dict[tuple[int, str], str] = {}

    def make(orig):
        def _set(self, room, r, status, reason=""):
            actions = orig(self, room, r, status, reason)
            if status == KVPoll.Failed and actions:
                log_ = self.__dict__.setdefault("failure_log", FailureLog())
                for decode in r.dests:
                    log_.by_destination[(room, decode)] = reason  # never removed
            return actions
        return _set
    wrap(pc.PrefillCore, "_set", make)
