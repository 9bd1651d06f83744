"""Blind set 1 (liveness, failure propagation, aborts): written by a helper that had read docs/protocol.md and
sglang's code but not the checks, the scenarios or the catalogue (backends/reference/mutants/blind.py,
docs/mutants.md); scored as written before any check changed for it."""

from __future__ import annotations

from backends.reference.mutants._base import PlantedLoopDeath as _ThreadDeath
from backends.reference.mutants._base import wrap as _patch
from backends.reference.mutants.blind import planted

_spec = planted("blind-1")

# ---- liveness --------------------------------------------------------------------------

@_spec("malformed-register-fails-room", "R-LIVE-1",
       "a REGISTER frame that does not parse fails the prefill room its first field names, instead of being "
       "dropped with no state change",
       "docs/sglang-bugs.md B3 (NIXL refused registrations), mooncake KVArgsRegisterInfo.from_zmq errors "
       "recorded as the room's failure")
def _malformed_register_fails_room():
    # Bug: on a parse error of REGISTER the named room is failed.
    from backends.reference import adapter
    from backends.reference import prefill_core as pc
    from harness.spec.protocol import KVPoll

    def _on_RegistrationRefused(self, e):
        r = self.rooms.get(e.room)
        return [] if r is None else self._set(e.room, r, KVPoll.Failed, e.reason)

    pc.PrefillCore._on_RegistrationRefused = _on_RegistrationRefused

    class RegistrationRefused:
        def __init__(self, room, reason):
            self.room, self.reason = room, reason

    def make(original):
        def _prefill_frames(self, frames):
            try:
                return original(self, frames)
            except Exception as exc:
                if frames and frames[0] == b"REGISTER" and len(frames) > 1:
                    try:
                        room = int(frames[1])
                    except ValueError:
                        raise exc from None
                    self._prefill_event(RegistrationRefused(room, f"registration refused: {exc}"))
                raise
        return _prefill_frames

    _patch(adapter.ReferenceRole, "_prefill_frames", make)


@_spec("watermark-unknown-session-fatal", "R-LIVE-3",
       "with staging on, a WATERMARK from a session the prefill has no registration of yet kills its control "
       "thread (the session table is indexed, not looked up)",
       "common/staging_handler.py handle_watermark_msg, remote_watermarks[session] instead of .get")
def _watermark_unknown_session_fatal():
    # Bug: sessions[frames[3]] raises on an unknown session, uncaught.
    from backends.reference import adapter

    def make(original):
        def _prefill_frames(self, frames):
            if self.staging_ctx is not None and frames:
                sessions = self.staging_ctx.setdefault("sessions", set())
                if frames[0] == b"REGISTER" and len(frames) > 2:
                    sessions.add(frames[2])
                elif frames[0] == b"WATERMARK":
                    session = frames[3] if len(frames) > 3 else b""
                    if session not in sessions:
                        raise _ThreadDeath(f"KeyError: WATERMARK for unknown session {session[:32]!r}")
            return original(self, frames)
        return _prefill_frames

    _patch(adapter.ReferenceRole, "_prefill_frames", make)


@_spec("worker-returns-on-unknown-room", "R-LIVE-2",
       "the transfer worker returns (ends) instead of skipping when it takes a chunk for a room the prefill "
       "does not hold, so every later chunk waits forever",
       "a `return` for a `continue` in a transfer worker loop (nixl/conn.py transfer_worker)")
def _worker_returns_on_unknown_room():
    # Bug: the worker thread's loop ends on a chunk of an unknown room.
    import queue

    from backends.reference import adapter

    def _transfer_worker(self):
        while not self.stopping.is_set():
            try:
                room, pages = self.chunks.get(timeout=0.1)
            except queue.Empty:
                continue
            self.points.hit("worker-take-chunk", room=room)
            if room not in self.prefill.rooms:
                adapter.log.debug("chunk for room %s that is not held: worker done", room)
                return
            self.side.submit(lambda room=room, pages=pages: self._send_chunk_now(room, pages))

    adapter.ReferenceRole._transfer_worker = _transfer_worker


@_spec("stale-chunk-resurrects-status", "R-STALE-1",
       "the prefill marks a chunk's room Transferring in its status map before checking that the room is "
       "still held, so a chunk for a cleared room brings its status entry back",
       "common/conn.py update_status (its comment: anything but an opening status would resurrect a "
       "concluded room)")
def _stale_chunk_resurrects_status():
    # Bug: status[room] = Transferring before the core sees (and drops) the chunk.
    from backends.reference import adapter
    from harness.spec.protocol import KVPoll

    def make(original):
        def _send_chunk_now(self, room, pages):
            if self.status.get(room) not in (KVPoll.Success, KVPoll.Failed):
                self.status[room] = KVPoll.Transferring
            return original(self, room, pages)
        return _send_chunk_now

    _patch(adapter.ReferenceRole, "_send_chunk_now", make)


# ---- failure propagation --------------------------------------------------------------

@_spec("heartbeat-skips-bootstrapping-rooms", "R-HB-1",
       "a dead prefill fails only the decode rooms that already sent their metadata; rooms still "
       "Bootstrapping stay there forever",
       "common/conn.py addr_to_rooms_tracker, if filled at send_metadata rather than at receiver init")
def _heartbeat_skips_bootstrapping_rooms():
    # Bug: node failure walks only rooms past Bootstrapping.
    from backends.reference import decode_core as dc
    from harness.spec.protocol import KVPoll

    def _on_HeartbeatResult(self, e):
        if not any(r.prefill == e.prefill for r in self.rooms.values()):
            return []
        if e.ok:
            self.failures[e.prefill] = 0
            return []
        self.failures[e.prefill] = self.failures.get(e.prefill, 0) + 1
        if self.failures[e.prefill] < self.heartbeat_max_failures:
            return []
        actions = []
        for room, r in self.rooms.items():
            if r.prefill == e.prefill and r.status != KVPoll.Bootstrapping:
                actions += self._set(room, r, KVPoll.Failed,
                                     f"prefill {e.prefill} stopped answering its health endpoint")
        return actions

    dc.DecodeCore._on_HeartbeatResult = _on_HeartbeatResult


@_spec("heartbeat-peer-dropped-on-clear", "R-HB-1",
       "clearing any room stops the heartbeat of its prefill, even while other rooms are bound to it, so a "
       "later death of that prefill is never noticed for them",
       "per-peer state (prefill_info_table, session_pool) removed per room in the receiver's clear")
def _heartbeat_peer_dropped_on_clear():
    # Bug: Clear pops last_probe/failures of the room's prefill unconditionally.
    from backends.reference import decode_core as dc

    def make(original):
        def _on_Clear(self, e):
            r = self.rooms.get(e.room)
            actions = original(self, e)
            if r is not None:
                self.failures.pop(r.prefill, None)
                self.last_probe.pop(r.prefill, None)
            return actions
        return _on_Clear

    _patch(dc.DecodeCore, "_on_Clear", make)


@_spec("heartbeat-thread-dies-on-refusal", "R-HB-1",
       "the decode's heartbeat thread handles an HTTP error answer but not a refused connection, which kills "
       "it, so a killed prefill's rooms are never failed by the heartbeat",
       "RFC #33861 (Mori's decode heartbeat); a checker catching requests.HTTPError only")
def _heartbeat_thread_dies_on_refusal():
    # Bug: only urllib's HTTPError counts as a failed probe; any other OSError escapes the thread.
    import time
    import urllib.error
    import urllib.request

    from backends.reference import adapter
    from backends.reference import decode_core as dc

    def _probe_loop(self):
        while True:
            prefill = self.probes.get()
            try:
                with urllib.request.urlopen(f"http://{prefill}/health", timeout=adapter.HEALTH_TIMEOUT_S) as reply:
                    ok = reply.status == 200
            except urllib.error.HTTPError:
                ok = False
            except OSError as exc:
                raise _ThreadDeath(f"health probe of {prefill} failed: {exc!r}") from exc
            now = time.monotonic()
            self.side.submit(lambda p=prefill, ok=ok, now=now: self._decode_event(dc.HeartbeatResult(p, ok, now)))

    adapter.ReferenceRole._probe_loop = _probe_loop


@_spec("lost-decode-writes-reported-done", "R-PEER-1",
       "when the connection to a decode is lost, its pending writes are completed as successful (flushed "
       "completions read as done), so a room to a dead decode can reach Success",
       "an RDMA work completion with a flush status counted as done; NIXL xfer state read after disconnect")
def _lost_decode_writes_reported_done():
    # Bug: DecodeLost completes the decode's writes with ok=True.
    from backends.reference import prefill_core as pc

    def _on_DecodeLost(self, e):
        actions = []
        for write_id, (room, _, decode) in list(self.issued.items()):
            if decode == e.decode:
                actions += self.handle(pc.WriteDone(room, write_id, True))
        return actions

    pc.PrefillCore._on_DecodeLost = _on_DecodeLost


@_spec("abort-keeps-early-registration", "R-ABORT-1",
       "an ABORT for a room the prefill does not hold yet leaves that generation's early registration queued, "
       "so the sender created later binds it and writes into pages the decode released",
       "common/conn.py _handle_bootstrap_message (before deferred_bootstrap retained cancellations that beat "
       "source creation)")
def _abort_keeps_early_registration():
    # Bug: the pending registration of the ABORTed generation is put back.
    from backends.reference import prefill_core as pc

    def make(original):
        def _on_AbortReceived(self, e):
            pending = dict(self.registrations.get(e.room, {}))
            actions = original(self, e)
            if pending and e.room not in self.rooms:
                self.registrations[e.room] = {**pending, **self.registrations.get(e.room, {})}
            return actions
        return _on_AbortReceived

    _patch(pc.PrefillCore, "_on_AbortReceived", make)


@_spec("clear-forgets-inflight-writes", "R-ABORT-2",
       "clear drops the room's in-flight writes instead of draining them, so an ABORT after clear is answered "
       "at once while those writes can still land",
       "docs/sglang-bugs.md B6 kind: clear() pops transfer state while a batch is queued")
def _clear_forgets_inflight_writes():
    # Bug: r.outstanding emptied before clear, so no drain is recorded.
    from backends.reference import prefill_core as pc

    def make(original):
        def _on_Clear(self, e):
            r = self.rooms.get(e.room)
            if r is not None:
                r.outstanding = set()
            return original(self, e)
        return _on_Clear

    _patch(pc.PrefillCore, "_on_Clear", make)


@_spec("ack-generation-from-room-table", "R-ABORT-2",
       "an ABORT_ACK for a room the prefill no longer (or not yet) holds carries generation 0, read from a "
       "room table that has no entry, instead of the ABORT's generation",
       "common/conn.py AbortAck built from per-room state rather than echoing the AbortNotification")
def _ack_generation_from_room_table():
    # Bug: SendAbortAck.generation = 0 when the room is not held.
    from backends.reference import prefill_core as pc

    def make(original):
        def _ack(self, room, decode, generation):
            actions = original(self, room, decode, generation)
            if room in self.rooms:
                return actions
            return [pc.SendAbortAck(a.room, a.decode, 0) if isinstance(a, pc.SendAbortAck) else a for a in actions]
        return _ack

    _patch(pc.PrefillCore, "_ack", make)


@_spec("abort-failure-not-fanned-out", "R-FANOUT-1",
       "a room failed by one decode rank's ABORT is not reported to its other decode ranks (the ABORT path "
       "updates the status without notifying), so they wait out their timeout",
       "common/conn.py _room_notify_targets used on the write-failure path only")
def _abort_failure_not_fanned_out():
    # Bug: the SendStatus actions of the ABORT handler are dropped.
    from backends.reference import prefill_core as pc

    def make(original):
        def _on_AbortReceived(self, e):
            return [a for a in original(self, e) if not isinstance(a, pc.SendStatus)]
        return _on_AbortReceived

    _patch(pc.PrefillCore, "_on_AbortReceived", make)


@_spec("heartbeat-reason-without-prefill", "R-REASON-1",
       "a room failed by the heartbeat carries a generic reason that does not name the prefill",
       "common/conn.py record_failure with a fixed message instead of the bootstrap address")
def _heartbeat_reason_without_prefill():
    # Bug: the heartbeat failure reason is replaced by a generic one.
    from backends.reference import decode_core as dc
    from backends.reference.shared_events import StatusChanged
    from harness.spec.protocol import KVPoll

    generic = "KV transfer failed: peer lost"

    def make(original):
        def _on_HeartbeatResult(self, e):
            out = []
            for a in original(self, e):
                if isinstance(a, StatusChanged) and a.status == KVPoll.Failed:
                    a = StatusChanged(a.room, a.status, generic)
                    if a.room in self.rooms:
                        self.rooms[a.room].reason = generic
                out.append(a)
            return out
        return _on_HeartbeatResult

    _patch(dc.DecodeCore, "_on_HeartbeatResult", make)
