"""Planted bugs in the control loops, workers and failure paths: R-LIVE, R-STALE, R-HB, R-RESTART,
R-ABORT, R-FANOUT, R-REASON (backends.reference.mutants lists them)."""

from __future__ import annotations

import dataclasses
import logging
import queue
import re
from typing import Callable

from backends.reference import decode_core as dc
from backends.reference import prefill_core as pc
from backends.reference import wire
from backends.reference.mutants._base import PlantedLoopDeath, wrap
from harness.spec.protocol import KVPoll

ra = None  # backends.reference.adapter, set by apply_from_env (it imports torch; the catalogue does not)
log = logging.getLogger("pdconform.reference")


# ---- R-LIVE-1/2/3/4 ----------------------------------------------------------------

def _loop_dies_on_short_frame() -> None:
    orig = wire.parse

    def parse(frames):
        try:
            return orig(frames)
        except wire.MalformedFrame as exc:
            short = re.search(r"with (\d+) fields, expected (\d+)", str(exc))
            if short and int(short[1]) < int(short[2]):  # a frame with too few fields indexes past its end
                raise PlantedLoopDeath(f"IndexError: {exc}") from None
            raise
    wrap(ra, "parse", lambda _: parse)  # wrap: a renamed target fails loudly, never a silent no-op


def _worker_exits_when_idle() -> None:
    def _transfer_worker(self):
        taken = 0
        while not self.stopping.is_set():
            try:
                room, pages = self.chunks.get(timeout=0.1)
            except queue.Empty:
                if taken:
                    return  # "done": the loop ends once its queue is empty
                continue
            taken += 1
            self.points.hit("worker-take-chunk", room=room)
            self.side.submit(lambda room=room, pages=pages: self._send_chunk_now(room, pages))
    wrap(ra.ReferenceRole, "_transfer_worker", lambda _: _transfer_worker)


def _ready_flag(kill: Callable[[list[bytes]], bool]) -> None:
    """The prefill's control thread reads state its constructor assigns after starting it:
    a frame ``kill`` picks that arrives before start_prefill returns kills the thread."""
    def make_start(orig):
        def start_prefill(self, layout, bootstrap_port, pp=(1, 0, ""), attn_tp=(1, 0)):
            self._planted_ready = False
            out = orig(self, layout, bootstrap_port, pp, attn_tp)
            self._planted_ready = True
            return out
        return start_prefill
    wrap(ra.ReferenceRole, "start_prefill", make_start)

    def make_frames(orig):
        def _prefill_frames(self, frames):
            if not getattr(self, "_planted_ready", True) and kill(frames):
                raise PlantedLoopDeath("AttributeError: state read before the constructor assigned it")
            return orig(self, frames)
        return _prefill_frames
    wrap(ra.ReferenceRole, "_prefill_frames", make_frames)


def _watermark_before_staging_fatal() -> None:
    _ready_flag(lambda frames: bool(frames) and frames[0] == b"WATERMARK")


def _staging_ctx_after_thread_start() -> None:
    # Mooncake's _staging_ctx: assigned after start_prefill_thread; with staging on, a
    # WATERMARK in the window reaches a context that is still None
    from harness.target.role_context import staging_on

    _ready_flag(lambda frames: bool(frames) and frames[0] == b"WATERMARK" and staging_on())


def _state_after_thread_start() -> None:
    _ready_flag(lambda frames: True)


# ---- R-STALE-1 ---------------------------------------------------------------------

def _stale_chunk_raises_logged() -> None:
    def make(orig):
        def _send_chunk_now(self, room, pages):
            try:
                if room not in self.prefill.rooms:
                    raise KeyError(f"transfer_infos has no room {room}")  # NIXL's assert, caught by its worker
                return orig(self, room, pages)
            except KeyError:
                log.warning("transfer worker: chunk of room %s failed", room, exc_info=True)
        return _send_chunk_now
    wrap(ra.ReferenceRole, "_send_chunk_now", make)


def _stale_chunk_written() -> None:
    def make_clear(orig):
        def _on_Clear(self, e):  # noqa: N802
            r = self.rooms.get(e.room)
            if r is not None:
                self.__dict__.setdefault("_planted_dests", {})[e.room] = (r.dests, r.sent)
            return orig(self, e)
        return _on_Clear
    wrap(pc.PrefillCore, "_on_Clear", make_clear)

    def make_chunk(orig):
        def _on_SendChunk(self, e):  # noqa: N802
            kept = self.__dict__.get("_planted_dests", {}).get(e.room)
            if e.room not in self.rooms and kept is not None and e.pages:
                dests, sent = kept  # the chunk is written from what the worker still holds
                self._next_write += 1
                return [pc.StartWrite(e.room, self._next_write, decode, e.pages,
                                      d.dst_pages[sent:sent + len(e.pages)], False, d.generation)
                        for decode, d in dests.items()]
            return orig(self, e)
        return _on_SendChunk
    wrap(pc.PrefillCore, "_on_SendChunk", make_chunk)

    def make_send(orig):
        def _send_write(self, w):
            if w.room not in self.prefill.rooms and w.write_id not in self.prefill.issued:
                self.prefill.issued[w.write_id] = (w.room, None, w.decode)
            return orig(self, w)
        return _send_write
    wrap(ra.ReferenceRole, "_send_write", make_send)


# ---- R-HB-1 ------------------------------------------------------------------------

def _no_heartbeat_checker() -> None:
    def make(orig):
        def _on_Tick(self, e):  # noqa: N802
            return [a for a in orig(self, e) if not isinstance(a, dc.ProbeHealth)]
        return _on_Tick
    wrap(dc.DecodeCore, "_on_Tick", make)


def _health_probe_impatient() -> None:
    from backends.reference import adapter

    adapter.HEALTH_TIMEOUT_S = 0.1  # read by the decode's probe thread at each probe


def _heartbeat_fails_every_prefill() -> None:
    def make(orig):
        def _on_HeartbeatResult(self, e):  # noqa: N802
            actions = orig(self, e)
            if any(isinstance(a, dc.StatusChanged) and a.status == KVPoll.Failed for a in actions):
                for room, r in self.rooms.items():  # every room, whichever prefill it is bound to
                    actions += self._set(room, r, KVPoll.Failed, f"prefill {e.prefill} stopped answering")
            return actions
        return _on_HeartbeatResult
    wrap(dc.DecodeCore, "_on_HeartbeatResult", make)


# ---- R-RESTART-1 -------------------------------------------------------------------

def _stale_connection_pool() -> None:
    def make(orig):
        def open_receiver(self, room, bootstrap_addr, timeout_s):
            pool = self.__dict__.setdefault("_planted_pool", {})
            out = orig(self, room, bootstrap_addr, timeout_s)
            # the control endpoint first learnt for a bootstrap address is kept for good
            self.peer[room] = pool.setdefault(bootstrap_addr, self.peer[room])
            return out
        return open_receiver
    wrap(ra.ReferenceRole, "open_receiver", make)


# ---- R-ABORT-1/2 -------------------------------------------------------------------

def _abort_not_held_malformed() -> None:
    def make(orig):
        def _on_AbortReceived(self, e):  # noqa: N802
            r = self.rooms.get(e.room)
            if r is None or e.decode not in r.dests:
                return [pc.Log("warning", f"malformed ABORT for room {e.room}: no such room; dropped")]
            return orig(self, e)
        return _on_AbortReceived
    wrap(pc.PrefillCore, "_on_AbortReceived", make)


def _abort_ignored_while_transferring() -> None:
    def make(orig):
        def _on_AbortReceived(self, e):  # noqa: N802
            r = self.rooms.get(e.room)
            if r is not None and r.status == KVPoll.Transferring:
                return [pc.Log("info", f"room {e.room}: ABORT while transferring ignored")]
            return orig(self, e)
        return _on_AbortReceived
    wrap(pc.PrefillCore, "_on_AbortReceived", make)


def _ack_before_drain() -> None:
    def make(orig):
        def __init__(self, *args, **kwargs):
            orig(self, *args, **kwargs)
            self.planted_bug = "ack-before-drain"
        return __init__
    wrap(pc.PrefillCore, "__init__", make)


def _ack_withheld_after_failed_write() -> None:
    def make(orig):
        def _on_WriteDone(self, e):  # noqa: N802
            r = self.rooms.get(e.room)
            failed_here = not e.ok and r is not None and e.write_id in r.outstanding
            actions = orig(self, e)
            if failed_here:
                r.outstanding.add(e.write_id)  # the room is "poisoned": a failed write never counts as drained
            return actions
        return _on_WriteDone
    wrap(pc.PrefillCore, "_on_WriteDone", make)


def _ack_twice() -> None:
    def make(orig):
        def _ack(self, room, decode, generation):
            return orig(self, room, decode, generation) * 2
        return _ack
    wrap(pc.PrefillCore, "_ack", make)


# ---- R-FANOUT-1, R-REASON-1 --------------------------------------------------------

def _failure_to_one_destination() -> None:
    def make(orig):
        def _set(self, room, r, status, reason=""):
            actions = orig(self, room, r, status, reason)
            told = [a for a in actions if isinstance(a, pc.SendStatus) and a.status == KVPoll.Failed]
            return [a for a in actions if a not in told[1:]]
        return _set
    wrap(pc.PrefillCore, "_set", make)


def _reason_dropped_for_one_rank() -> None:
    def make(orig):
        def _set(self, room, r, status, reason=""):
            actions = orig(self, room, r, status, reason)
            told = [a for a in actions if isinstance(a, pc.SendStatus) and a.status == KVPoll.Failed]
            return [dataclasses.replace(a, reason="") if a in told[1:] else a for a in actions]
        return _set
    wrap(pc.PrefillCore, "_set", make)

    def make_status(orig):
        def _on_StatusReceived(self, e):  # noqa: N802
            actions = orig(self, e)
            r = self.rooms.get(e.room)
            if r is not None and e.status == KVPoll.Failed and not e.reason and r.status == KVPoll.Failed:
                r.reason = ""  # the decode keeps what it was told: nothing
                actions = [dataclasses.replace(a, reason="") if isinstance(a, dc.StatusChanged) else a
                           for a in actions]
            return actions
        return _on_StatusReceived
    wrap(dc.DecodeCore, "_on_StatusReceived", make_status)


# ---- R-LOSS-1, R-RESIDUE-2 ----------------------------------------------------------

def _waiting_deadline_follows_heartbeat() -> None:
    """Liveness taken for progress: each answered health probe of a room's prefill pushes the
    room's waiting deadline out, so a room whose status was lost waits as long as its prefill lives."""
    def make(orig):
        def _on_HeartbeatResult(self, e):  # noqa: N802
            actions = orig(self, e)
            if e.ok:
                for r in self.rooms.values():
                    if r.prefill == e.prefill and r.status == KVPoll.WaitingForInput and r.waiting_since is not None:
                        r.waiting_since = e.now
            return actions
        return _on_HeartbeatResult
    wrap(dc.DecodeCore, "_on_HeartbeatResult", make)


def _unscheduled_registration_kept() -> None:
    """A decode's registration for a room the prefill never opened is kept for good: neither its
    bootstrap timeout nor the decode's ABORT drops it."""
    def make_tick(orig):
        def _on_Tick(self, e):  # noqa: N802
            kept = {room: dict(pending) for room, pending in self.registrations.items()}
            actions = orig(self, e)
            for room, pending in kept.items():
                self.registrations.setdefault(room, {}).update(
                    {d: v for d, v in pending.items() if room not in self.rooms})
            return actions
        return _on_Tick

    def make_abort(orig):
        def _on_AbortReceived(self, e):  # noqa: N802
            kept = dict(self.registrations.get(e.room, {}))
            actions = orig(self, e)
            if kept and e.room not in self.rooms:
                self.registrations.setdefault(e.room, {}).update(kept)
            return actions
        return _on_AbortReceived
    wrap(pc.PrefillCore, "_on_Tick", make_tick)
    wrap(pc.PrefillCore, "_on_AbortReceived", make_abort)


# ---- R-LOAD-1 ---------------------------------------------------------------------

BUSY_ROOMS = 32  # the planted batch path: once a side has sent statuses for this many rooms


def _status_split_under_load() -> None:
    """A busy sender's STATUS leaves as two messages (a frame boundary lost, as when two threads
    write one shared socket frame by frame): only once the side has sent statuses for more than
    BUSY_ROOMS rooms, so only many rooms in flight show it."""
    def make(orig):
        def send(self, endpoint, frames):
            if frames and frames[0] == b"STATUS":
                seen = self.__dict__.setdefault("_planted_status_rooms", set())
                seen.add(frames[1])
                if len(seen) > BUSY_ROOMS:
                    orig(self, endpoint, frames[:2])
                    return orig(self, endpoint, frames[2:])
            return orig(self, endpoint, frames)
        return send
    wrap(wire.ControlSide, "send", make)
