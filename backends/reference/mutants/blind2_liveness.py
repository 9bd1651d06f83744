"""Blind set 2 (liveness, heartbeat, aborts, fan-out, residue, failure reasons): written by a helper that had read docs/protocol.md and sglang's code but not the checks, the scenarios or the catalogue; scored as written."""
from __future__ import annotations

from backends.reference.mutants._base import PlantedLoopDeath, wrap
from backends.reference.mutants.blind import planted

_spec = planted("blind-2")


@_spec("heartbeat-misses-shared-across-prefills", "R-HB-1",
       "The decode counts missed health probes in one counter for all prefills: an answered probe of any "
       "prefill resets it, so a dead prefill probed next to a live one never reaches the failure count and "
       "its rooms are not failed.",
       "common/conn.py heartbeat_checker (heartbeat_failures, there per bootstrap_addr) written with one "
       "shared miss count")
def _heartbeat_misses_shared_across_prefills():
    # Bug: _on_HeartbeatResult decides on a miss count shared by every prefill of the core.
    from backends.reference import decode_core as dc
    from harness.spec.protocol import KVPoll

    def make(original):
        misses: dict = {}  # id(core) -> misses in a row, whichever prefill answered

        def method(self, e):
            if not any(r.prefill == e.prefill for r in self.rooms.values()):
                return []
            if e.ok:
                misses[id(self)] = 0
                self.failures[e.prefill] = 0
                return []
            misses[id(self)] = misses.get(id(self), 0) + 1
            self.failures[e.prefill] = self.failures.get(e.prefill, 0) + 1
            if misses[id(self)] < self.heartbeat_max_failures:
                return []
            actions = []
            for room, r in self.rooms.items():
                if r.prefill == e.prefill:
                    actions += self._set(room, r, KVPoll.Failed,
                                         f"prefill {e.prefill} stopped answering its health endpoint")
            return actions
        return method
    wrap(dc.DecodeCore, "_on_HeartbeatResult", make)


@_spec("heartbeat-failure-matches-host", "R-HB-1",
       "When a prefill's health probes fail, the decode fails every room bound to a prefill on the same "
       "host (IP), not only the dead prefill's rooms: a live prefill beside it on that host loses its rooms.",
       "common/conn.py _handle_node_failure, which selects connection_pool keys by "
       "startswith(failed_bootstrap_addr) instead of an exact address")
def _heartbeat_failure_matches_host():
    # Bug: _on_HeartbeatResult also fails rooms whose prefill shares the dead prefill's host.
    from backends.reference import decode_core as dc
    from harness.spec.protocol import KVPoll

    def host(addr: str) -> str:
        return addr.rsplit(":", 1)[0]

    def make(original):
        def method(self, e):
            actions = original(self, e)
            if e.ok or self.failures.get(e.prefill, 0) < self.heartbeat_max_failures:
                return actions
            for room, r in self.rooms.items():
                if r.prefill != e.prefill and host(r.prefill) == host(e.prefill):
                    actions += self._set(room, r, KVPoll.Failed,
                                         f"prefill {e.prefill} stopped answering its health endpoint")
            return actions
        return method
    wrap(dc.DecodeCore, "_on_HeartbeatResult", make)


@_spec("health-probe-without-timeout", "R-HB-1",
       "The decode's health probe has no timeout: when a prefill stops answering without refusing (a "
       "partition, a frozen process), the probe blocks the heartbeat thread forever and no room bound to "
       "that prefill is failed within the heartbeat window.",
       "common/conn.py heartbeat_checker's session.get(..., timeout=(2, 3)); a backend probing without one "
       "(Mori's decode heartbeat, RFC #33861)")
def _health_probe_without_timeout():
    # Bug: _probe_loop calls urlopen without a timeout.
    from backends.reference import adapter as ad

    def make(original):
        def method(self):
            import time
            import urllib.request

            from backends.reference import decode_core as dc
            while True:
                prefill = self.probes.get()
                try:
                    with urllib.request.urlopen(f"http://{prefill}/health") as reply:
                        ok = reply.status == 200
                except OSError:
                    ok = False
                now = time.monotonic()
                self.side.submit(lambda p=prefill, ok=ok, now=now: self._decode_event(dc.HeartbeatResult(p, ok, now)))
        return method
    wrap(ad.ReferenceRole, "_probe_loop", make)


@_spec("abort-ignored-before-first-chunk", "R-ABORT-1",
       "An ABORT for a bound room that has not sent a chunk yet (WaitingForInput) is answered with its "
       "ABORT_ACK but leaves the room as it is, so the prefill later transfers into the decode pages it "
       "released and reports Success.",
       "an abort handler that only stops rooms with transfers in flight (mooncake/conn.py "
       "_handle_abort_notification's room_active; Mori's ABORT handler, PR #29133)")
def _abort_ignored_before_first_chunk():
    # Bug: _on_AbortReceived only ACKs a WaitingForInput room with nothing outstanding.
    from backends.reference import prefill_core as pc
    from harness.spec.protocol import KVPoll

    def make(original):
        def method(self, e):
            r = self.rooms.get(e.room)
            bound = r.dests.get(e.decode) if r is not None else None
            if bound is not None and bound.generation == e.generation and r.status == KVPoll.WaitingForInput \
                    and not r.outstanding and e.room not in self.draining:
                return [pc.Log("info", f"room {e.room}: ABORT before any chunk; nothing to stop")] \
                    + self._ack(e.room, e.decode, e.generation)
            return original(self, e)
        return method
    wrap(pc.PrefillCore, "_on_AbortReceived", make)


@_spec("cleared-room-abort-acked-before-drain", "R-ABORT-2",
       "An ABORT for a room the prefill has already cleared is answered at once as 'nothing written', even "
       "while writes of that room are still draining, so the decode reuses pages those writes still reach.",
       "common/conn.py _maybe_ack_drained_abort / clear_deferred_abort_state: a cleared sender's drain "
       "state is not consulted (docs/sglang-bugs.md B6 audit, ACK before queued chunks drain)")
def _cleared_room_abort_acked_before_drain():
    # Bug: _on_AbortReceived hides self.draining[room] when the room is no longer held.
    from backends.reference import prefill_core as pc

    def make(original):
        def method(self, e):
            if e.room in self.rooms or e.room not in self.draining:
                return original(self, e)
            drain = self.draining.pop(e.room)
            try:
                return original(self, e)
            finally:
                self.draining[e.room] = drain
        return method
    wrap(pc.PrefillCore, "_on_AbortReceived", make)


@_spec("drain-kept-without-ack-owed", "R-RESIDUE-1",
       "A drain record (a room cleared with writes in flight) is deleted only when an ABORT_ACK is owed: "
       "after a plain clear mid-transfer the record stays in the prefill forever once its writes finish.",
       "the _staging_outstanding[room] counts left at 0 by mooncake/nixl transfer_worker "
       "(docs/sglang-bugs.md B16, B8)")
def _drain_kept_without_ack_owed():
    # Bug: _finish_drain returns without deleting a drained record that has no ack_to.
    from backends.reference import prefill_core as pc

    def make(original):
        def method(self, room, drain):
            if not drain.outstanding and not drain.ack_to:
                return []
            return original(self, room, drain)
        return method
    wrap(pc.PrefillCore, "_finish_drain", make)


@_spec("decode-keeps-failed-room-peers", "R-RESIDUE-1",
       "On the decode, clear() of a room that ended Failed skips the clean-up of the room's prefill "
       "endpoints and source layouts (only a Success room is cleaned), leaving per-room state behind.",
       "common/conn.py CommonKVReceiver.clear and the decode's addr_to_rooms_tracker, pruned on the "
       "success path and by _handle_node_failure only")
def _decode_keeps_failed_room_peers():
    # Bug: ReferenceRole.clear restores peer[room] and sources[room] on the decode when the room was Failed.
    from backends.reference import adapter as ad
    from harness.spec.protocol import KVPoll

    def make(original):
        def method(self, room):
            if self.role != "decode":
                return original(self, room)
            failed = self.status.get(room) == KVPoll.Failed
            peer, sources = self.peer.get(room), self.sources.get(room)
            result = original(self, room)
            if failed and peer is not None:
                self.peer[room] = peer
                if sources is not None:
                    self.sources[room] = sources
            return result
        return method
    wrap(ad.ReferenceRole, "clear", make)


@_spec("bad-status-frame-kills-decode-loop", "R-LIVE-1",
       "A STATUS frame the decode cannot parse (wrong field count, non-numeric room, generation or status) "
       "escapes the decode's control loop and kills its control thread.",
       "mooncake/conn.py start_decode_thread / start_prefill_thread indexing and int()-ing frames without a "
       "guard (docs/sglang-bugs.md B2: a STATUS with status '1e3')")
def _bad_status_frame_kills_decode_loop():
    # Bug: _decode_frames turns a parse error of a STATUS frame into a thread death.
    from backends.reference import adapter as ad

    def make(original):
        def method(self, frames):
            try:
                return original(self, frames)
            except (ValueError, IndexError) as exc:
                if frames and frames[0] == b"STATUS":
                    raise PlantedLoopDeath(f"unguarded STATUS parse: {exc!r}") from exc
                raise
        return method
    wrap(ad.ReferenceRole, "_decode_frames", make)


@_spec("write-to-lost-decode-kills-control", "R-PEER-1",
       "After the engine reported a decode lost, the next write the prefill issues to that decode (the "
       "next chunk of a room whose earlier writes had completed) raises out of the prefill's control "
       "thread, which dies, so no later room is served.",
       "nixl/conn.py transfer_worker re-raising 'Unexpected transfer worker error'; mooncake/conn.py "
       "transfer_worker raising on a session that is not alive")
def _write_to_lost_decode_kills_control():
    # Bug: _start_write raises PlantedLoopDeath for a decode that a DecodeLost event named.
    from backends.reference import adapter as ad
    from backends.reference import prefill_core as pc

    lost: dict = {}  # id(role) -> decode endpoints reported lost

    def make_event(original):
        def method(self, event):
            if isinstance(event, pc.DecodeLost):
                lost.setdefault(id(self), set()).add(event.decode)
            return original(self, event)
        return method
    wrap(ad.ReferenceRole, "_prefill_event", make_event)

    def make_write(original):
        def method(self, w):
            if w.decode in lost.get(id(self), ()):
                raise PlantedLoopDeath(f"transfer to lost decode {w.decode}")
            return original(self, w)
        return method
    wrap(ad.ReferenceRole, "_start_write", make_write)


@_spec("write-failure-told-to-failing-rank-only", "R-FANOUT-1",
       "When a write to one decode rank of a room fails, the prefill sends the Failed status only to that "
       "rank; the room's other decode ranks hear nothing and wait out their waiting timeout.",
       "common/conn.py _room_notify_targets ('every non-dummy endpoint, not just the one a caller failed "
       "on') before that fix")
def _write_failure_told_to_failing_rank_only():
    # Bug: _on_WriteDone drops the Failed SendStatus actions to decodes other than the failed write's.
    from backends.reference import prefill_core as pc
    from harness.spec.protocol import KVPoll

    def make(original):
        def method(self, e):
            decode = self.issued.get(e.write_id, (None, None, None))[2]
            actions = original(self, e)
            if e.ok or decode is None:
                return actions
            return [a for a in actions if not (isinstance(a, pc.SendStatus) and a.status == KVPoll.Failed
                                               and a.decode != decode)]
        return method
    wrap(pc.PrefillCore, "_on_WriteDone", make)


@_spec("abort-fails-sender-without-reason", "R-REASON-1",
       "A prefill room failed by the decode's ABORT is marked Failed with an empty failure reason.",
       "mooncake/conn.py _handle_abort_notification and mori/conn.py _handle_abort_message: update_status "
       "without record_failure (docs/sglang-bugs.md B11)")
def _abort_fails_sender_without_reason():
    # Bug: _on_AbortReceived blanks the reason of the Failed status it sets.
    import dataclasses

    from backends.reference import prefill_core as pc
    from harness.spec.protocol import KVPoll

    def make(original):
        def method(self, e):
            out = []
            for a in original(self, e):
                if isinstance(a, (pc.StatusChanged, pc.SendStatus)) and a.status == KVPoll.Failed \
                        and a.reason.startswith("aborted by decode"):
                    a = dataclasses.replace(a, reason="")
                    r = self.rooms.get(e.room)
                    if r is not None:
                        r.reason = ""
                out.append(a)
            return out
        return method
    wrap(pc.PrefillCore, "_on_AbortReceived", make)


@_spec("ended-generation-expiry-mutates-while-iterating", "R-LIVE-2",
       "The prefill's tick expires remembered ended generations while iterating the live dict, so the first "
       "expiry (a bootstrap timeout after a clear or an ABORT) raises 'dictionary changed size during "
       "iteration' and kills the prefill's control thread.",
       "common/conn.py _room_notify_targets' comment (iterating the live transfer_infos view would raise; "
       "it snapshots); unguarded loops in mooncake/conn.py start_prefill_thread")
def _ended_generation_expiry_mutates_while_iterating():
    # Bug: _on_Tick deletes from tombstones/retired while iterating .items() (no list() snapshot).
    from backends.reference import prefill_core as pc
    from harness.spec.protocol import KVPoll

    def make(original):
        def method(self, e):
            self._see(e.now)
            try:
                for memory in (self.tombstones, self.retired):
                    for key, expiry in memory.items():
                        if expiry is None:
                            memory[key] = e.now + self.bootstrap_timeout_s
                        elif e.now >= expiry:
                            del memory[key]
            except RuntimeError as exc:  # uncaught in a real backend's loop
                raise PlantedLoopDeath(f"tick: {exc}") from exc
            for room, pending in list(self.registrations.items()):
                for decode, (reg, arrived) in list(pending.items()):
                    if arrived is None:
                        pending[decode] = (reg, e.now)
                    elif e.now - arrived >= self.bootstrap_timeout_s:
                        del pending[decode]
                if not pending:
                    del self.registrations[room]
            actions = self._expire_writes(e.now)
            for room, r in list(self.rooms.items()):
                if r.status == KVPoll.Bootstrapping and e.now - r.opened_at >= self.bootstrap_timeout_s:
                    actions += self._set(room, r, KVPoll.Failed,
                                         f"decode did not register within the bootstrap timeout of "
                                         f"{self.bootstrap_timeout_s:g} s")
            return actions
        return method
    wrap(pc.PrefillCore, "_on_Tick", make)


@_spec("staging-context-made-on-first-room", "R-LIVE-4",
       "With staging on, the prefill builds its staging context only when the first room opens, after the "
       "control thread started; a WATERMARK that arrives before that finds no context and kills the "
       "prefill's control thread.",
       "mooncake/conn.py MooncakeKVManager.__init__: _staging_ctx assigned after start_prefill_thread "
       "(PR #35281 review; docs/sglang-bugs.md B1)")
def _staging_context_made_on_first_room():
    # Bug: start_prefill leaves staging_ctx None; open_sender creates it; WATERMARK on None dies.
    from backends.reference import adapter as ad

    def make_start(original):
        def method(self, *args, **kwargs):
            result = original(self, *args, **kwargs)
            if self.staging:
                self.staging_ctx = None
            return result
        return method
    wrap(ad.ReferenceRole, "start_prefill", make_start)

    def make_open(original):
        def method(self, *args, **kwargs):
            if self.staging and self.staging_ctx is None:
                self.staging_ctx = {"watermarks": 0}
            return original(self, *args, **kwargs)
        return method
    wrap(ad.ReferenceRole, "open_sender", make_open)

    def make_frames(original):
        def method(self, frames):
            if frames and frames[0] == b"WATERMARK" and self.staging and self.staging_ctx is None:
                raise PlantedLoopDeath("WATERMARK before the staging context exists")
            return original(self, frames)
        return method
    wrap(ad.ReferenceRole, "_prefill_frames", make_frames)
