"""Blind set 3 (threads, heartbeat, aborts, residue, restarts, staging): written by a helper that had read docs/protocol.md and sglang's code but not the checks, the scenarios or the catalogue; scored as written."""

from __future__ import annotations

from backends.reference.mutants._base import PlantedLoopDeath, wrap  # noqa: F401
from backends.reference.mutants.blind import planted

_spec = planted("blind-3")


# ---- heartbeat and peer death ---------------------------------------------------------------

@_spec("probe-timeout-counted-alive", "R-HB-1",
       "bug: the decode's health probe counts a probe that timed out (connect or read) as answered, taking the "
       "prefill for busy, so a frozen or partitioned prefill is never declared dead (only a refused connection "
       "counts as a miss) and its rooms wait out the waiting timeout",
       "like: common/conn.py heartbeat_checker (session.get(timeout=(2, 3)), every exception a miss); a backend "
       "that catches requests' Timeout apart as 'slow, not dead'")
def _probe_timeout_counted_alive():
    # Bug: _probe_loop maps a timeout to ok=True
    from backends.reference import adapter as ad
    from backends.reference import decode_core as dc

    def make(original):
        def _probe_loop(self):
            import socket
            import time
            import urllib.request

            while True:
                prefill = self.probes.get()
                try:
                    with urllib.request.urlopen(f"http://{prefill}/health", timeout=ad.HEALTH_TIMEOUT_S) as reply:
                        ok = reply.status == 200
                except OSError as exc:
                    slow = (TimeoutError, socket.timeout)
                    ok = isinstance(exc, slow) or isinstance(getattr(exc, "reason", None), slow)
                now = time.monotonic()
                self.side.submit(lambda p=prefill, ok=ok, now=now: self._decode_event(dc.HeartbeatResult(p, ok, now)))
        return _probe_loop
    wrap(ad.ReferenceRole, "_probe_loop", make)


@_spec("heartbeat-fails-on-first-miss", "R-NET-2",
       "bug: the decode's heartbeat compares its miss count with max failures minus one, so a single missed "
       "probe (a 1.5 s blip of the control path, a slow answer) fails every room bound to a live prefill",
       "like: common/conn.py heartbeat_checker (heartbeat_failures >= max_failures after the increment); an "
       "off-by-one in a backend that counts the current miss before comparing")
def _heartbeat_fails_on_first_miss():
    # Bug: the failure threshold is heartbeat_max_failures - 1 (at least 1)
    from backends.reference import decode_core as dc

    def make(original):
        def method(self, e):
            saved = self.heartbeat_max_failures
            self.heartbeat_max_failures = max(1, saved - 1)
            try:
                return original(self, e)
            finally:
                self.heartbeat_max_failures = saved
        return method
    wrap(dc.DecodeCore, "_on_HeartbeatResult", make)


@_spec("dead-prefill-blacklisted", "R-NET-1",
       "bug: once the heartbeat declared a prefill dead, the decode remembers it as dead for good: after the "
       "network heals (or the prefill comes back), every new room to that bootstrap address fails as soon as "
       "it sends its metadata, without registering",
       "like: mooncake/conn.py failed_sessions ('a session that fails once is dead', docs/sglang-bugs.md B10) "
       "applied by the decode to a prefill, with no probe to lift it")
def _dead_prefill_blacklisted():
    # Bug: a set of dead prefills (outside the core's state) that nothing ever removes from
    from backends.reference import decode_core as dc

    dead: set = set()

    def make_hb(original):
        def method(self, e):
            actions = original(self, e)
            if not e.ok and self.failures.get(e.prefill, 0) >= self.heartbeat_max_failures:
                dead.add(e.prefill)
            return actions
        return method

    def make_request(original):
        def method(self, e):
            r = self.rooms.get(e.room)
            if r is not None and r.status == dc.KVPoll.Bootstrapping and r.prefill in dead:
                return self._set(e.room, r, dc.KVPoll.Failed, f"prefill {r.prefill} was declared dead")
            return original(self, e)
        return method
    wrap(dc.DecodeCore, "_on_HeartbeatResult", make_hb)
    wrap(dc.DecodeCore, "_on_RequestKV", make_request)


# ---- ABORT and ABORT_ACK --------------------------------------------------------------------

@_spec("abort-skipped-for-failed-room", "R-ABORT-1",
       "bug: the decode's abort sends no ABORT for a room that is already Failed (by its waiting timeout, the "
       "heartbeat, or a failure it heard of), so the prefill never fails that room and keeps writing to it "
       "(or waits on it forever when no chunk comes); no ABORT_ACK is ever asked for",
       "like: common/conn.py CommonKVReceiver.abort only notifies through ensure_abort_notified, whose docstring "
       "exists for 'an already-Failed room whose failure decode did not initiate'; a backend that notifies only "
       "when abort changes the status")
def _abort_skipped_for_failed_room():
    # Bug: _on_Abort returns early for a room already Failed
    from backends.reference import decode_core as dc

    def make(original):
        def method(self, e):
            r = self.rooms.get(e.room)
            if r is not None and r.status == dc.KVPoll.Failed:
                return []
            return original(self, e)
        return method
    wrap(dc.DecodeCore, "_on_Abort", make)


@_spec("abort-to-first-stage-only", "R-ABORT-1",
       "bug: the decode sends its ABORT to the first prefill rank of the room only (stage 0, or TP rank 0), not "
       "to every rank it registered with: the other stages' (ranks') rooms are never failed and keep writing, "
       "and their ABORT_ACK never comes",
       "like: common/conn.py _send_abort_notification loops over every bootstrap_info; a backend that notifies "
       "only the rank it bootstrapped from")
def _abort_to_first_stage_only():
    # Bug: the decode's abort() fans out to peer[room][:1]
    from backends.reference import adapter as ad
    from backends.reference import decode_core as dc

    def make(original):
        def method(self, room):
            if self.role != "decode":
                return original(self, room)

            def run() -> None:
                peers = self.peer.get(room)
                if peers and len(peers) > 1:
                    self.peer[room] = peers[:1]
                    try:
                        self._decode_event(dc.Abort(room))
                    finally:
                        self.peer[room] = peers
                else:
                    self._decode_event(dc.Abort(room))
            self._sync(run)
        return method
    wrap(ad.ReferenceRole, "abort", make)


@_spec("abort-waits-for-every-rank", "R-ABORT-1",
       "bug: with several decode ranks on a room, the prefill fails the room only once every rank has sent "
       "its ABORT; an ABORT from one rank is answered with an ABORT_ACK at once and the room keeps "
       "transferring, also into the aborting rank's pages",
       "like: common/conn.py _send_abort_acks ('several decode ranks share one room and each sends its own "
       "ABORT'); a backend that counts ABORTs like it counts ACKs before acting on them")
def _abort_waits_for_every_rank():
    # Bug: _on_AbortReceived defers the failure until every bound rank aborted, and acks each one at once
    from backends.reference import prefill_core as pc

    def make(original):
        def method(self, e):
            r = self.rooms.get(e.room)
            bound = r.dests.get(e.decode) if r is not None else None
            if bound is not None and bound.generation == e.generation and len(r.dests) > 1 \
                    and r.status not in (pc.KVPoll.Success, pc.KVPoll.Failed):
                seen = r.__dict__.setdefault("aborted_by", set())
                seen.add(e.decode)
                if not seen >= set(r.dests):
                    return [pc.Log("info", f"room {e.room}: ABORT from {e.decode}; other ranks still want it")] \
                        + self._ack(e.room, e.decode, e.generation)
            return original(self, e)
        return method
    wrap(pc.PrefillCore, "_on_AbortReceived", make)


@_spec("ack-to-first-destination", "R-ABORT-2",
       "bug: the prefill addresses an ABORT_ACK of a held room to the room's first registered decode rank, "
       "not to the rank that sent the ABORT: with several decode ranks, the other ranks never get their ACK "
       "(and the first may get one for a generation it did not abort)",
       "like: common/conn.py register_deferred_ack_target keeps ACK targets per decode endpoint; a backend that "
       "takes the target from the room's transfer info instead of the ABORT's sender")
def _ack_to_first_destination():
    # Bug: _ack rewrites the decode to the first destination of a held multi-destination room
    from backends.reference import prefill_core as pc

    def make(original):
        def method(self, room, decode, generation):
            r = self.rooms.get(room)
            if r is not None and len(r.dests) > 1:
                decode = next(iter(r.dests))
            return original(self, room, decode, generation)
        return method
    wrap(pc.PrefillCore, "_ack", make)


@_spec("reuse-drops-old-drain", "R-ABORT-2",
       "bug: when a room number is opened again, the prefill drops the drain record left by the room's previous "
       "lifecycle: an ABORT_ACK owed to the old generation is never sent, and an old-generation ABORT that "
       "arrives before the new lifecycle registers is answered at once while the old writes can still land",
       "like: common/conn.py update_status: a new room lifecycle pops _deferred_ack_targets and "
       "_staging_outstanding left by the previous request that used this bootstrap_room")
def _reuse_drops_old_drain():
    # Bug: _on_OpenSender forgets draining[room]
    from backends.reference import prefill_core as pc

    def make(original):
        def method(self, e):
            if e.room not in self.rooms:
                self.draining.pop(e.room, None)
            return original(self, e)
        return method
    wrap(pc.PrefillCore, "_on_OpenSender", make)


# ---- residue --------------------------------------------------------------------------------

@_spec("drain-record-at-zero", "R-RESIDUE-1",
       "bug: clearing a room that started transferring and did not succeed (aborted or failed between two "
       "chunks, nothing in flight) leaves a drain record with no outstanding write; nothing ever removes it, "
       "and a later ABORT of that room waits on it, so its ABORT_ACK is never sent",
       "like: docs/sglang-bugs.md B16: _staging_outstanding[room] left at 0 after a decode ABORT between two "
       "chunks (Mooncake, NIXL)")
def _drain_record_at_zero():
    # Bug: _on_Clear opens a drain record for an unfinished room even with no write in flight
    from backends.reference import prefill_core as pc

    def make(original):
        def method(self, e):
            r = self.rooms.get(e.room)
            unfinished = r is not None and r.sent > 0 and r.status != pc.KVPoll.Success and not r.outstanding
            actions = original(self, e)
            if unfinished:
                self.draining.setdefault(e.room, pc._Drain(set()))
            return actions
        return method
    wrap(pc.PrefillCore, "_on_Clear", make)


@_spec("cleared-room-writes-never-expire", "R-RESIDUE-1",
       "bug: the transfer timeout is applied only to writes of rooms the prefill still holds: a stuck write of "
       "a room cleared (after an ABORT or a failure) is never declared lost, so its write entry and drain "
       "record stay forever and an ABORT_ACK owed for it is never sent",
       "like: common/conn.py deadlines checked from CommonKVSender.poll(); once the sender is cleared nobody "
       "polls, and nixl/conn.py _await_handles has no deadline of its own")
def _cleared_room_writes_never_expire():
    # Bug: _expire_writes skips write entries whose room is not in self.rooms
    from backends.reference import prefill_core as pc

    def make(original):
        def method(self, now):
            hidden = {w: v for w, v in self.issued.items() if v[0] not in self.rooms}
            for w in hidden:
                del self.issued[w]
            try:
                return original(self, now)
            finally:
                self.issued.update(hidden)
        return method
    wrap(pc.PrefillCore, "_expire_writes", make)


# ---- liveness of threads --------------------------------------------------------------------

@_spec("foreign-tag-kills-prefill-loop", "R-LIVE-1",
       "bug: a well-formed message the prefill never receives (STATUS, ABORT_ACK, WRITE) is read as a "
       "registration; indexing its fields raises out of the prefill's control loop, which dies, so every later "
       "room to that prefill stays Bootstrapping",
       "like: docs/sglang-bugs.md B2: an ABORT_ACK pushed to the Mooncake prefill kills its bootstrap thread "
       "with IndexError (mooncake/conn.py start_prefill_thread indexes frames 3 and 7 of anything else)")
def _foreign_tag_kills_prefill_loop():
    # Bug: the prefill's frame handler has no branch for decode-bound tags and dies on them
    from backends.reference import adapter as ad

    def make(original):
        def method(self, frames):
            if frames and frames[0] in (b"STATUS", b"ABORT_ACK", b"WRITE"):
                raise PlantedLoopDeath(f"IndexError: {frames[0][:16]!r} read as a registration")
            return original(self, frames)
        return method
    wrap(ad.ReferenceRole, "_prefill_frames", make)


@_spec("late-write-for-cleared-room-kills-decode", "R-LIVE-2",
       "bug: the decode's control thread looks a WRITE's room up in its room table without a check; a write "
       "that arrives after the decode cleared its room (a delayed write, a drain after an abort) raises out of "
       "the loop and kills the decode's control thread",
       "like: docs/sglang-bugs.md B18 (mooncake/conn.py _handle_aux_data, mori AUX_DATA: data for a room the "
       "decode does not hold), here as a KeyError instead of a stray write")
def _late_write_for_cleared_room_kills_decode():
    # Bug: a WRITE for a room not in decode.rooms raises an uncaught error in _decode_frames
    from backends.reference import adapter as ad

    def make(original):
        def method(self, frames):
            if len(frames) > 1 and frames[0] == b"WRITE":
                try:
                    room = int(frames[1])
                except ValueError:
                    room = None
                if room is not None and room not in self.decode.rooms:
                    raise PlantedLoopDeath(f"KeyError: {room}")
            return original(self, frames)
        return method
    wrap(ad.ReferenceRole, "_decode_frames", make)
