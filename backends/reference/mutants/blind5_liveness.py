"""Blind set 5 (liveness: timers, lost messages, ABORT and its ACK, room reuse, registrations never
scheduled, heartbeats): written by a helper that had read docs/protocol.md, the reference and sglang's code
but not the checks, the scenarios or the catalogue; scored as written."""

from __future__ import annotations

from backends.reference.mutants._base import PlantedLoopDeath, wrap  # noqa: F401
from backends.reference.mutants.blind import planted

_spec = planted("blind-5")


@_spec("decode-waiting-clock-stopped-when-aux-lands", "R-LOSS-1",
       "bug: the decode takes the landing of a room's aux write (the last thing the prefill writes) as the "
       "transfer being over and stops the room's waiting clock, expecting the status right behind it; when that "
       "STATUS message is lost the room waits in WaitingForInput for ever instead of failing at the waiting "
       "timeout (a transfer that never starts, or whose KV never lands, still times out)",
       "like: mooncake/conn.py decode_thread and common/conn.py _check_waiting_timeout (the waiting deadline of "
       "a receiver, and what a backend counts as the transfer having arrived)")
def _decode_waiting_clock_stopped_when_aux_lands():
    from backends.reference import adapter
    from backends.reference import decode_core as dc

    def make_frames(orig):
        def _decode_frames(self, frames):
            orig(self, frames)
            if len(frames) == 8 and frames[0] == b"WRITE" and frames[4] == b"1":
                try:
                    room, generation = int(frames[1]), int(frames[2])
                except ValueError:
                    return
                r = self.decode.rooms.get(room)
                if r is not None and r.generation == generation:
                    r.aux_landed = True
        return _decode_frames

    def make_tick(orig):
        def _on_Tick(self, e):
            stopped = [(r, r.waiting_since) for r in self.rooms.values() if getattr(r, "aux_landed", False)]
            for r, _ in stopped:
                r.waiting_since = None  # no deadline: the data is in
            try:
                return orig(self, e)
            finally:
                for r, since in stopped:
                    r.waiting_since = since
        return _on_Tick

    wrap(adapter.ReferenceRole, "_decode_frames", make_frames)
    wrap(dc.DecodeCore, "_on_Tick", make_tick)


@_spec("decode-abort-concludes-only-on-prefill-answer", "R-LOSS-1",
       "bug: with deferred release on, the decode's abort() of a room whose registration went out sends the "
       "ABORT and leaves the room as it is until the prefill answers (its Failed STATUS or the ABORT_ACK), and "
       "takes such an 'aborting' room out of the waiting timeout; when that ABORT is lost the prefill never "
       "answers, so the room never concludes (or takes the prefill's later Success)",
       "like: common/conn.py CommonKVReceiver.abort / _send_abort_notification with "
       "register_deferred_abort_room (the decode's abort as a request to the prefill, tracked until its ACK)")
def _decode_abort_concludes_only_on_prefill_answer():
    from backends.reference import decode_core as dc
    from harness.spec.protocol import TERMINAL, KVPoll

    def make_abort(orig):
        def _on_Abort(self, e):
            r = self.rooms.get(e.room)
            if (r is not None and self.deferred_release and r.status not in TERMINAL and r.waiting_since is not None
                    and not r.awaiting_ack):
                r.awaiting_ack = True
                r.aborting = True
                return [dc.SendAbort(e.room, r.prefill, r.generation)]
            return orig(self, e)
        return _on_Abort

    def make_tick(orig):
        def _on_Tick(self, e):
            held = [(r, r.waiting_since) for r in self.rooms.values() if getattr(r, "aborting", False)]
            for r, _ in held:
                r.waiting_since = None  # the abort is under way: no waiting deadline
            try:
                return orig(self, e)
            finally:
                for r, since in held:
                    r.waiting_since = since
        return _on_Tick

    def make_ack(orig):
        def _on_AbortAckReceived(self, e):
            r = self.rooms.get(e.room)
            actions = orig(self, e)
            if r is not None and getattr(r, "aborting", False) and not r.awaiting_ack:
                r.aborting = False
                actions = self._set(e.room, r, KVPoll.Failed, "aborted") + actions
            return actions
        return _on_AbortAckReceived

    wrap(dc.DecodeCore, "_on_Abort", make_abort)
    wrap(dc.DecodeCore, "_on_Tick", make_tick)
    wrap(dc.DecodeCore, "_on_AbortAckReceived", make_ack)


@_spec("unscheduled-registration-aged-by-decode-last-contact", "R-RESIDUE-2",
       "bug: the prefill ages a registration whose sender was never opened by the last time it heard from that "
       "decode (each new registration from a decode re-stamps all of its pending ones) instead of by the "
       "registration's own arrival; while the decode keeps registering other rooms, a registration the "
       "scheduler never took is kept past its bootstrap timeout, for as long as the traffic goes on",
       "like: common/conn.py bootstrap-thread bookkeeping of decode registrations (transfer_infos / "
       "decode_kv_args_table kept per decode endpoint, refreshed by each message)")
def _unscheduled_registration_aged_by_decode_last_contact():
    from backends.reference import prefill_core as pc

    def make(orig):
        def _on_DecodeRegistered(self, e):
            actions = orig(self, e)
            for pending in self.registrations.values():
                if e.decode in pending:
                    reg, _ = pending[e.decode]
                    pending[e.decode] = (reg, self.clock)  # "last heard from this decode"
            return actions
        return _on_DecodeRegistered

    wrap(pc.PrefillCore, "_on_DecodeRegistered", make)


@_spec("bootstrap-deadline-kept-until-first-chunk", "R-TIMEOUT-1",
       "bug: the prefill keeps the bootstrap deadline running after the decode has registered, until the "
       "room's first chunk is sent (\"a room that has not started is still bootstrapping\"); a registered room "
       "whose prefill takes longer than the bootstrap timeout to produce its first chunk fails with a "
       "bootstrap-timeout reason although its decode registered on time",
       "like: common/conn.py CommonKVSender._check_bootstrap_timeout (its start time and the status it is "
       "applied in)")
def _bootstrap_deadline_kept_until_first_chunk():
    from backends.reference import prefill_core as pc
    from harness.spec.protocol import KVPoll

    def make(orig):
        def _on_Tick(self, e):
            actions = orig(self, e)
            for room, r in list(self.rooms.items()):
                if r.status == KVPoll.WaitingForInput and r.sent == 0 and not r.last_sent \
                        and e.now - r.opened_at >= self.bootstrap_timeout_s:
                    actions += self._set(room, r, KVPoll.Failed,
                                         f"room did not start within the bootstrap timeout of "
                                         f"{self.bootstrap_timeout_s:g} s")
            return actions
        return _on_Tick

    wrap(pc.PrefillCore, "_on_Tick", make)


@_spec("decode-waiting-deadline-rearmed-by-heartbeat", "R-TIMEOUT-2",
       "bug: every health probe a prefill answers re-arms the waiting deadline of the decode rooms bound to it "
       "(\"the prefill is alive, the transfer is coming\"); a room whose prefill is healthy but never sends the "
       "result waits for ever instead of failing at the waiting timeout",
       "like: common/conn.py heartbeat_checker / _on_heartbeat_success and CommonKVReceiver."
       "_check_waiting_timeout (liveness of the peer mixed up with progress of the room)")
def _decode_waiting_deadline_rearmed_by_heartbeat():
    from backends.reference import decode_core as dc
    from harness.spec.protocol import KVPoll

    def make(orig):
        def _on_HeartbeatResult(self, e):
            if e.ok:
                for r in self.rooms.values():
                    if r.prefill == e.prefill and r.status == KVPoll.WaitingForInput and r.waiting_since is not None:
                        r.waiting_since = max(r.waiting_since, e.now)
            return orig(self, e)
        return _on_HeartbeatResult

    wrap(dc.DecodeCore, "_on_HeartbeatResult", make)


@_spec("decode-generation-counter-dropped-with-prefill-state", "R-REUSE-1",
       "bug: the decode numbers a room's lifecycles per prefill and drops that counter with the prefill's "
       "other state when the prefill's last room is cleared; a room re-created after that gets generation 1 "
       "again, the same as the lifecycle it replaces, so the prefill refuses its registration as an ended "
       "generation and a late message of the old lifecycle is taken for the new one (reuse while other rooms "
       "of the prefill stay open is unaffected)",
       "like: common/conn.py register_deferred_abort_room (the generation counter) and _handle_node_failure / "
       "CommonKVReceiver._clear (per-prefill state cleaned when nothing refers to it)")
def _decode_generation_counter_dropped_with_prefill_state():
    from backends.reference import decode_core as dc

    def make_open(orig):
        def _on_OpenReceiver(self, e):
            fresh = e.room not in self.rooms
            actions = orig(self, e)
            if fresh and e.room in self.rooms:
                counters = self.__dict__.setdefault("generation_by_prefill", {})
                counters[e.prefill] = counters.get(e.prefill, 0) + 1
                self.rooms[e.room].generation = counters[e.prefill]
            return actions
        return _on_OpenReceiver

    def make_clear(orig):
        def _on_Clear(self, e):
            r = self.rooms.get(e.room)
            actions = orig(self, e)
            if r is not None and not any(x.prefill == r.prefill for x in self.rooms.values()):
                self.__dict__.get("generation_by_prefill", {}).pop(r.prefill, None)
            return actions
        return _on_Clear

    wrap(dc.DecodeCore, "_on_OpenReceiver", make_open)
    wrap(dc.DecodeCore, "_on_Clear", make_clear)


@_spec("prefill-abort-waits-for-every-decode-rank", "R-ABORT-1",
       "bug: a prefill room with several decode ranks (decode TP wider than the prefill's, replicated KV heads, "
       "MLA) fails only once every one of those ranks has sent its ABORT (\"one rank alone cannot cancel the "
       "request\"); an ABORT from one rank leaves the room running and unanswered; with one decode rank per "
       "room nothing changes",
       "like: common/conn.py register_deferred_ack_target and _room_notify_targets (a room's decode ranks "
       "handled per rank, not as a group)")
def _prefill_abort_waits_for_every_decode_rank():
    from backends.reference import prefill_core as pc
    from harness.spec.protocol import TERMINAL

    def make_abort(orig):
        def _on_AbortReceived(self, e):
            r = self.rooms.get(e.room)
            bound = r.dests.get(e.decode) if r is not None else None
            if r is None or bound is None or bound.generation != e.generation or r.destinations <= 1 \
                    or r.status in TERMINAL:
                return orig(self, e)
            votes = self.__dict__.setdefault("abort_votes", {}).setdefault(e.room, {})
            votes[e.decode] = e.generation
            if len(votes) < r.destinations:
                return [pc.Log("info", f"room {e.room}: ABORT from {e.decode}; waiting for the room's other "
                                       f"{r.destinations - len(votes)} decode rank(s)")]
            del self.abort_votes[e.room]
            actions = []
            for decode, generation in votes.items():
                actions += orig(self, pc.AbortReceived(e.room, decode, generation))
            return actions
        return _on_AbortReceived

    def make_clear(orig):
        def _on_Clear(self, e):
            self.__dict__.get("abort_votes", {}).pop(e.room, None)
            return orig(self, e)
        return _on_Clear

    wrap(pc.PrefillCore, "_on_AbortReceived", make_abort)
    wrap(pc.PrefillCore, "_on_Clear", make_clear)


@_spec("abort-of-cleared-room-acked-before-drain", "R-ABORT-2",
       "bug: an ABORT for a room the prefill has already cleared is answered at once as 'not held, nothing "
       "written', without looking at the writes of that room still in flight; when the prefill clears a room "
       "before the decode's ABORT arrives, the ABORT_ACK goes out while a write into the decode's pages has "
       "not drained",
       "like: mooncake/conn.py _handle_deferred_abort_notification and common/conn.py _maybe_ack_drained_abort "
       "(an ABORT for a room no longer in request_status, with its transfer still counted outstanding)")
def _abort_of_cleared_room_acked_before_drain():
    from backends.reference import prefill_core as pc

    def make(orig):
        def _on_AbortReceived(self, e):
            if e.room not in self.rooms and e.room in self.draining:
                key = (e.room, e.decode, e.generation)
                actions = [pc.Log("info", f"ABORT for room {e.room} generation {e.generation}: the room is released "
                                          "already, nothing to wait for")]
                actions += self._ack(e.room, e.decode, e.generation)
                self.retired.pop(key, None)
                self.tombstones.setdefault(key, self._expiry())
                return actions
            return orig(self, e)
        return _on_AbortReceived

    wrap(pc.PrefillCore, "_on_AbortReceived", make)


@_spec("abort-ack-deduplicated-by-room-and-generation", "R-ABORT-2",
       "bug: the prefill remembers the ABORT_ACKs it sent by room and generation, not by decode rank; when "
       "several decode ranks of one room abort the same generation (decode TP wider than the prefill's), only "
       "the first rank gets its ACK and the others wait for one that never comes; one decode rank per room is "
       "unaffected",
       "like: common/conn.py register_deferred_ack_target / _send_abort_acks (ACK targets kept per decode "
       "endpoint so that each decode rank gets its own)")
def _abort_ack_deduplicated_by_room_and_generation():
    from backends.reference import prefill_core as pc

    def make(orig):
        def _ack(self, room, decode, generation):
            if self.deferred_release and any(k[0] == room and k[2] == generation and k[1] != decode
                                             for k in (*self.acked, *self.tombstones)):
                return []  # "answered already"
            return orig(self, room, decode, generation)
        return _ack

    wrap(pc.PrefillCore, "_ack", make)


@_spec("decode-heartbeat-loss-overwrites-success", "R-TERM-1",
       "bug: when a prefill misses its heartbeats, the decode marks every room bound to it Failed unless it is "
       "Failed already, Success included; a room that had concluded Success and is not cleared yet flips to "
       "Failed when its prefill dies",
       "like: common/conn.py _handle_node_failure (it must skip rooms whose status is Success)")
def _decode_heartbeat_loss_overwrites_success():
    from backends.reference import decode_core as dc
    from harness.spec.protocol import KVPoll

    def make(orig):
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
            reason = f"prefill {e.prefill} stopped answering its health endpoint"
            for room, r in self.rooms.items():
                if r.prefill == e.prefill and r.status != KVPoll.Failed:
                    r.status, r.reason = KVPoll.Failed, reason
                    actions.append(dc.StatusChanged(room, KVPoll.Failed, reason))
            return actions
        return _on_HeartbeatResult

    wrap(dc.DecodeCore, "_on_HeartbeatResult", make)


@_spec("health-probe-slow-answer-counted-as-miss", "R-NET-2",
       "bug: the decode counts a health probe that answers 200 but took longer than 0.5 s in all as a missed "
       "heartbeat (a latency budget on the probe); on a link with 150 ms of delay each probe takes two round "
       "trips (connect, request) and every one is a miss, so healthy prefills' rooms fail; on a fast link "
       "nothing changes",
       "like: common/conn.py heartbeat_checker (session.get with timeout=(2, 3): how long a probe may take "
       "before it counts as failed)")
def _health_probe_slow_answer_counted_as_miss():
    import time
    import urllib.request

    from backends.reference import adapter
    from backends.reference import decode_core as dc

    budget_s = 0.5

    def make(orig):
        def _probe_loop(self):
            while True:
                prefill = self.probes.get()
                started = time.monotonic()
                try:
                    with urllib.request.urlopen(f"http://{prefill}/health", timeout=adapter.HEALTH_TIMEOUT_S) as reply:
                        ok = reply.status == 200
                except OSError:
                    ok = False
                now = time.monotonic()
                if ok and now - started > budget_s:
                    ok = False  # too slow: counted as a miss
                self.side.submit(lambda p=prefill, ok=ok, now=now: self._decode_event(dc.HeartbeatResult(p, ok, now)))
        return _probe_loop

    wrap(adapter.ReferenceRole, "_probe_loop", make)
