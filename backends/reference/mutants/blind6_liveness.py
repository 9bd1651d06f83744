"""Blind set 6, control and liveness: planted bugs in the reference's bootstrap, timers,
heartbeats, ABORT/ABORT_ACK, room reuse, clear and residue, lost or late messages and peer
death, written from docs/protocol.md and sglang's disaggregation code without reading
pdconform's checks, scenarios or the other mutant sets (backends/reference/mutants/blind.py).

Each bug leaves the simplest path (one room, p1-d1, no faults) working with correct bytes; it
shows on a rarer path: an abort in some state, a reused room, a paused or restarted prefill,
a lost message, a timer at a non-default setting, a late write.
"""

from __future__ import annotations

from backends.reference.mutants._base import PlantedLoopDeath, wrap
from backends.reference.mutants.blind import planted

_spec = planted("blind-6")


@_spec("bootstrap-deadline-outlives-registration", "R-TIMEOUT-1",
       "bug: the prefill's bootstrap deadline (opened_at + bootstrap timeout) keeps running after "
       "the decode registered: a room still WaitingForInput when it passes (its prefill compute "
       "or chunks slower than the bootstrap timeout) is failed as 'decode did not register'. "
       "Shows only when a registered room waits for its first chunk longer than the bootstrap "
       "timeout (short timeout settings, held chunks).",
       "like: nixl/conn.py NixlKVSender.poll (PR #34692 bootstrap timeout measured from init_time "
       "while the room is not yet transferring, not only while bootstrapping)")
def _bootstrap_deadline_outlives():
    from backends.reference import prefill_core as pc
    from harness.spec.protocol import KVPoll

    def make(original):
        def _on_Tick(self, e):
            actions = original(self, e)
            for room, r in list(self.rooms.items()):
                if r.status == KVPoll.WaitingForInput and r.destinations and \
                        e.now - r.opened_at >= self.bootstrap_timeout_s:
                    actions += self._set(room, r, KVPoll.Failed, "decode did not register within the bootstrap "
                                                                 f"timeout of {self.bootstrap_timeout_s:g} s")
            return actions
        return _on_Tick

    wrap(pc.PrefillCore, "_on_Tick", make)


@_spec("waiting-timeout-floored-at-60s", "R-TIMEOUT-2",
       "bug: the decode clamps SGLANG_DISAGGREGATION_WAITING_TIMEOUT to at least 60 s (as the "
       "heartbeat interval is clamped to 2 s), while still reporting the configured value, so "
       "with a short waiting timeout a receiver whose prefill never finishes fails only after "
       "60 s. Shows only at waiting timeouts below 60 s; the default (300 s) is unchanged.",
       "like: decode.py / common/conn.py reading SGLANG_DISAGGREGATION_WAITING_TIMEOUT with a "
       "max(..., floor) guard copied from the heartbeat settings")
def _waiting_floor():
    from backends.reference import adapter

    def make(original):
        def start_decode(self, *args, **kwargs):
            facts = original(self, *args, **kwargs)
            self.decode.waiting_timeout_s = max(self.decode.waiting_timeout_s, 60.0)
            return facts
        return start_decode

    wrap(adapter.ReferenceRole, "start_decode", make)


@_spec("waiting-timer-disarmed-by-first-write", "R-LOSS-1",
       "bug: the decode enforces its waiting timeout only until the first byte of the room lands "
       "(progress means the prefill is alive), so once any write of a room arrived, a lost STATUS "
       "or a prefill that stops mid-room leaves the receiver waiting forever. Shows only when a "
       "room's writes land but its final STATUS never comes (lost status, partial transfers); "
       "rooms that see no write still time out.",
       "like: nixl/conn.py NixlKVReceiver.poll / check_status (timeout applied only while "
       "WaitingForInput, not once chunks are arriving)")
def _waiting_disarmed():
    from backends.reference import adapter
    from backends.reference import decode_core as dc
    from harness.spec.protocol import KVPoll

    def make_apply(original):
        def _apply_write(self, room, aux, dst, payload, stage=0):
            result = original(self, room, aux, dst, payload, stage)
            r = self.decode.rooms.get(room) if self.decode is not None else None
            if r is not None and result[0]:
                r.progress = True
            return result
        return _apply_write

    def _on_Tick(self, e):
        actions = []
        for room, r in self.rooms.items():
            if r.status == KVPoll.WaitingForInput and r.waiting_since is not None \
                    and not getattr(r, "progress", False) and e.now - r.waiting_since >= self.waiting_timeout_s:
                actions += self._set(room, r, KVPoll.Failed,
                                     f"no transfer result from prefill {r.prefill} within the waiting timeout "
                                     f"of {self.waiting_timeout_s:g} s")
        for prefill, last in list(self.last_probe.items()):
            if e.now - last >= self.heartbeat_interval_s:
                self.last_probe[prefill] = e.now
                actions.append(dc.ProbeHealth(prefill))
        return actions

    wrap(adapter.ReferenceRole, "_apply_write", make_apply)
    dc.DecodeCore._on_Tick = _on_Tick


@_spec("probe-success-keeps-miss-count", "R-HB-1",
       "bug: a health probe that answers does not reset the prefill's missed-probe count, so "
       "misses add up across separate short pauses (a GC pause, a busy host) and the decode fails "
       "every room bound to a prefill that never missed max-failures probes in a row. Shows only "
       "when a prefill misses probes more than once while rooms stay bound to it.",
       "like: mooncake/conn.py heartbeat_checker (heartbeat_failures[addr] reset only when the "
       "address is dropped, not on a successful probe)")
def _heartbeat_never_reset():
    from backends.reference import decode_core as dc

    def make(original):
        def _on_HeartbeatResult(self, e):
            if e.ok:
                return []  # the bug: the count stays
            return original(self, e)
        return _on_HeartbeatResult

    wrap(dc.DecodeCore, "_on_HeartbeatResult", make)


@_spec("clear-stops-probes-of-shared-prefill", "R-HB-1",
       "bug: clearing a room drops its prefill's heartbeat clock and miss count even while other "
       "rooms are still bound to that prefill, so the decode stops probing it and those rooms "
       "hang when the prefill dies (until the waiting timeout). Shows only when a room is cleared "
       "while others to the same prefill are in flight and that prefill then dies; probing "
       "resumes only when a new room opens.",
       "like: common/conn.py / mooncake/conn.py addr_to_rooms_tracker cleanup keyed by room: the "
       "prefill address removed from the heartbeat set on the first room's clear")
def _clear_stops_probes():
    from backends.reference import decode_core as dc

    def _on_Clear(self, e):
        r = self.rooms.pop(e.room, None)
        if r is not None:
            self.failures.pop(r.prefill, None)
            self.last_probe.pop(r.prefill, None)
        return []

    dc.DecodeCore._on_Clear = _on_Clear


@_spec("prefill-endpoints-cached-per-bootstrap-addr", "R-RESTART-1",
       "bug: the decode caches each bootstrap address's prefill endpoints (every rank's control "
       "port) at its first room and reuses them for every later room, purging the cache only "
       "when the heartbeat declares the prefill dead, so after a prefill restarts behind the same "
       "bootstrap address on new ports within the heartbeat window, new rooms register with "
       "ports nobody listens on. Shows only on a fast prefill restart.",
       "like: common/conn.py connection_pool / prefill_info cache (purged only by "
       "_handle_node_failure or a waiting timeout)")
def _endpoints_cached():
    from backends.reference import adapter
    from backends.reference import decode_core as dc

    cache: dict = {}
    fetch = adapter.fetch_stages

    def fetch_stages(bootstrap_addr, timeout_s):
        if bootstrap_addr not in cache:
            cache[bootstrap_addr] = fetch(bootstrap_addr, timeout_s)
        return cache[bootstrap_addr]

    def make(original):
        def _on_HeartbeatResult(self, e):
            actions = original(self, e)
            if not e.ok and self.failures.get(e.prefill, 0) >= self.heartbeat_max_failures:
                cache.pop(e.prefill, None)
            return actions
        return _on_HeartbeatResult

    adapter.fetch_stages = fetch_stages
    wrap(dc.DecodeCore, "_on_HeartbeatResult", make)


@_spec("old-generation-failure-status-applied", "R-REUSE-1",
       "bug: the decode checks a STATUS's generation only for Success; a Failed STATUS of an "
       "older lifecycle of the room ('failures are always safe to apply') fails the room's new "
       "lifecycle. Shows only when a room is reused after clear and a failure of its previous "
       "lifecycle arrives late (late status, a timeout or abort of the old generation).",
       "like: common/conn.py CommonKVReceiver status handling before the deferred-release "
       "generations (PRs #35049, #35360): update_status(room, Failed) with no generation check")
def _old_generation_failure():
    from backends.reference import decode_core as dc
    from harness.spec.protocol import KVPoll

    def make(original):
        def _on_StatusReceived(self, e):
            r = self.rooms.get(e.room)
            if r is not None and e.status == KVPoll.Failed and r.prefill == e.prefill and e.generation != r.generation:
                return self._set(e.room, r, KVPoll.Failed, e.reason or f"prefill {e.prefill} reported a failure")
            return original(self, e)
        return _on_StatusReceived

    wrap(dc.DecodeCore, "_on_StatusReceived", make)


@_spec("decode-abort-skipped-for-failed-room", "R-ABORT-1",
       "bug: the decode's abort() of a room that is already Failed (its own waiting timeout, the "
       "heartbeat, a failure it heard of) sends no ABORT ('nothing left to abort'), though the "
       "prefill may still hold the room and write into its pages. Shows only when a room fails "
       "on the decode first and is aborted afterwards; aborting a live room still sends it.",
       "like: common/conn.py CommonKVReceiver.abort (returns early when conclude_state is "
       "already Failed)")
def _abort_skipped_failed():
    from backends.reference import decode_core as dc
    from harness.spec.protocol import KVPoll

    def make(original):
        def _on_Abort(self, e):
            r = self.rooms.get(e.room)
            if r is not None and r.status == KVPoll.Failed:
                return []
            return original(self, e)
        return _on_Abort

    wrap(dc.DecodeCore, "_on_Abort", make)


@_spec("abort-of-unheld-room-dropped-as-malformed", "R-ABORT-1",
       "bug: the prefill's control loop treats an ABORT naming a room it holds no sender for as a "
       "malformed frame: it logs a warning and drops it, with no ABORT_ACK, no tombstone and the "
       "room's pending registration kept. Shows only when an ABORT arrives for a room the prefill "
       "never opened or already cleared (clear-then-abort, unscheduled registrations).",
       "like: RFC #33861 (Mori dropped unguarded ABORT as malformed); mori/conn.py ABORT handler")
def _abort_unheld_malformed():
    from backends.reference import adapter
    from backends.reference.wire import MalformedFrame

    def make(original):
        def _prefill_frames(self, frames):
            if frames and frames[0] == b"ABORT" and len(frames) == 4:
                room = int(frames[1])
                if room not in self.prefill.rooms:
                    raise MalformedFrame(f"ABORT for room {room} that has no sender")
            return original(self, frames)
        return _prefill_frames

    wrap(adapter.ReferenceRole, "_prefill_frames", make)


@_spec("deferred-ack-owed-to-last-abort-only", "R-ABORT-2",
       "bug: while a room's writes drain, the prefill remembers one ABORT_ACK to send per room "
       "(the latest ABORT overwrites it), so when several decode ranks (or generations) abort the "
       "same room mid-transfer only the last one gets its ACK once the writes drain. Shows only "
       "when two ABORTs for one room arrive while writes are in flight (p1-d2 abort-mid-transfer).",
       "like: common/conn.py deferred ABORT_ACK bookkeeping (a dict room -> (endpoint, "
       "generation) instead of a list of waiters)")
def _ack_last_only():
    from backends.reference import prefill_core as pc

    def make(original):
        def _on_AbortReceived(self, e):
            actions = original(self, e)
            drain = self.draining.get(e.room)
            if drain is not None and len(drain.ack_to) > 1:
                drain.ack_to[:] = drain.ack_to[-1:]
            return actions
        return _on_AbortReceived

    wrap(pc.PrefillCore, "_on_AbortReceived", make)


@_spec("failed-write-never-counts-as-drained", "R-ABORT-3",
       "bug: a write the engine reported failed stays outstanding (and in the transfer-timeout "
       "table) instead of counting as drained, so the ABORT_ACK of a room with a failed write is "
       "withheld until the transfer timeout declares it lost. Shows only when a room with a "
       "failed write is aborted by its decode with deferred release on.",
       "like: common/conn.py poison_deferred_ack_room (missing: failed transfers not removed from "
       "the deferred-ACK wait set)")
def _failed_write_not_drained():
    from backends.reference import prefill_core as pc
    from harness.spec.protocol import KVPoll

    def make(original):
        def _on_WriteDone(self, e):
            if not e.ok:
                drain = self.draining.get(e.room)
                if drain is not None and e.write_id in drain.outstanding:
                    return [pc.Log("warning", f"room {e.room}: write {e.write_id} failed while draining: {e.reason}")]
                r = self.rooms.get(e.room)
                if r is not None and e.write_id in r.outstanding:
                    return self._set(e.room, r, KVPoll.Failed, f"write {e.write_id} failed: {e.reason}")
            return original(self, e)
        return _on_WriteDone

    wrap(pc.PrefillCore, "_on_WriteDone", make)


@_spec("prefill-abort-fails-concluded-room", "R-TERM-1",
       "bug: the prefill scheduler's abort() of a room sets it Failed unconditionally, so "
       "aborting a room that already reached Success (a request cancelled just after its transfer "
       "finished) flips its terminal status to Failed before clear. Shows only when the prefill "
       "aborts a concluded room.",
       "like: common/conn.py CommonKVSender.abort (record_failure + conclude_state = "
       "KVPoll.Failed with no terminal check)")
def _prefill_abort_flips():
    from backends.reference import prefill_core as pc
    from harness.spec.protocol import KVPoll

    def make(original):
        def _on_LocalAbort(self, e):
            r = self.rooms.get(e.room)
            if r is not None and r.status == KVPoll.Success:
                r.status, r.reason = KVPoll.Failed, "aborted by the prefill"
                return [pc.StatusChanged(e.room, KVPoll.Failed, r.reason)]
            return original(self, e)
        return _on_LocalAbort

    wrap(pc.PrefillCore, "_on_LocalAbort", make)


@_spec("unscheduled-registration-expiry-in-ms", "R-RESIDUE-2",
       "bug: the prefill's sweep of registrations for rooms it never opened compares their age "
       "in seconds with the bootstrap timeout converted to milliseconds, so a registration its "
       "scheduler never takes stays for 1000 x the bootstrap timeout. Shows only when a decode "
       "registers a room the prefill never opens (cancelled or routed elsewhere); a registration "
       "that meets its sender is bound as before.",
       "like: common/conn.py CommonKVManager transfer_infos for never-scheduled rooms (a "
       "*_TIMEOUT env read in seconds, compared with a time.time() * 1000 age)")
def _registration_expiry_ms():
    from backends.reference import prefill_core as pc
    from harness.spec.protocol import KVPoll

    def _on_Tick(self, e):
        self._see(e.now)
        for memory in (self.tombstones, self.retired):
            for key, expiry in list(memory.items()):
                if expiry is None:
                    memory[key] = e.now + self.bootstrap_timeout_s
                elif e.now >= expiry:
                    del memory[key]
        for room, pending in list(self.registrations.items()):
            for decode, (reg, arrived) in list(pending.items()):
                if arrived is None:
                    pending[decode] = (reg, e.now)
                elif e.now - arrived >= self.bootstrap_timeout_s * 1000:  # the bug: ms vs s
                    del pending[decode]
            if not pending:
                del self.registrations[room]
        actions = self._expire_writes(e.now)
        for room, r in list(self.rooms.items()):
            if r.status == KVPoll.Bootstrapping and e.now - r.opened_at >= self.bootstrap_timeout_s:
                actions += self._set(room, r, KVPoll.Failed, "decode did not register within the bootstrap "
                                                             f"timeout of {self.bootstrap_timeout_s:g} s")
        return actions

    pc.PrefillCore._on_Tick = _on_Tick


@_spec("failed-room-layout-kept-after-clear", "R-RESIDUE-1",
       "bug: the decode's clear() of a room that ended Failed keeps the room's resolved prefill "
       "rank layouts ('for the retry'), so every failed room leaves per-room state behind after "
       "clear on both sides. Shows only for rooms that end Failed (timeouts, aborts, dead peers, "
       "rejected layouts); a room cleared after Success is cleaned.",
       "like: common/conn.py CommonKVReceiver / decode.py per-room prefill info tables cleaned "
       "only on the success path")
def _layout_kept():
    from backends.reference import adapter
    from harness.spec.protocol import KVPoll

    def make(original):
        def clear(self, room):
            kept = None
            if self.role == "decode":
                kept = self._sync(lambda: self.sources.get(room) if self.status.get(room) == KVPoll.Failed else None)
            original(self, room)
            if kept is not None:
                self._sync(lambda: self.sources.__setitem__(room, kept))
        return clear

    wrap(adapter.ReferenceRole, "clear", make)


@_spec("bad-numeric-field-kills-control-loop", "R-LIVE-1",
       "bug: the control loops parse a frame's numeric and ASCII fields (room, generation, write "
       "id, page list, endpoint) outside the handler's guard, so a frame with a non-numeric or "
       "non-ASCII field raises out of the loop and kills the control thread; unknown tags and "
       "wrong field counts are still dropped. Shows only when such a frame arrives.",
       "like: common/conn.py / mooncake/conn.py bootstrap_thread and decode_thread "
       "(int(msg[0].decode('ascii')) with no try around the message)")
def _numeric_kills_loop():
    from backends.reference import adapter
    from backends.reference.wire import MalformedFrame

    def make(original):
        def handler(self, frames):
            try:
                return original(self, frames)
            except MalformedFrame:
                raise
            except ValueError as exc:  # int() or .decode("ascii") of a field: UnicodeDecodeError too
                raise PlantedLoopDeath(f"control loop died parsing a field: {exc!r}") from exc
        return handler

    wrap(adapter.ReferenceRole, "_prefill_frames", make)
    wrap(adapter.ReferenceRole, "_decode_frames", make)


@_spec("late-write-after-clear-kills-decode-loop", "R-LIVE-2",
       "bug: the decode looks up a WRITE's room in its per-room tables without a guard, so a write "
       "that lands after the decode cleared the room (a delayed write of an aborted room) raises "
       "out of the decode's control thread and kills it; every later room then times out. Shows "
       "only when a write arrives for a room the decode has already cleared.",
       "like: mori/conn.py decode-side handler / nixl/conn.py transfer_worker assert on "
       "transfer_infos (PR #35281)")
def _late_write_kills():
    from backends.reference import adapter

    def make(original):
        def _apply_write(self, room, aux, dst, payload, stage=0):
            if room not in self.peer:
                raise PlantedLoopDeath(f"KeyError: room {room} (write after clear)")
            return original(self, room, aux, dst, payload, stage)
        return _apply_write

    wrap(adapter.ReferenceRole, "_apply_write", make)


@_spec("staging-ctx-created-at-first-registration", "R-LIVE-4",
       "bug: with staging on, the prefill creates its staging context lazily when the first "
       "registration arrives, after its control thread started; a WATERMARK that arrives before "
       "any registration dereferences the missing context and kills the control thread. Shows "
       "only with staging on and a WATERMARK before the first room.",
       "like: PR #35281 review: mooncake/conn.py _staging_ctx assigned after the control thread "
       "starts (not fixed)")
def _staging_lazy():
    from backends.reference import adapter

    def make_start(original):
        def start_prefill(self, *args, **kwargs):
            facts = original(self, *args, **kwargs)
            self._sync(lambda: setattr(self, "staging_ctx", None))
            return facts
        return start_prefill

    def make_frames(original):
        def _prefill_frames(self, frames):
            if self.staging and self.staging_ctx is None and frames:
                if frames[0] == b"WATERMARK":
                    raise PlantedLoopDeath("AttributeError: 'NoneType' object has no attribute 'watermarks'")
                if frames[0] == b"REGISTER":
                    self.staging_ctx = {"watermarks": 0}
            return original(self, frames)
        return _prefill_frames

    wrap(adapter.ReferenceRole, "start_prefill", make_start)
    wrap(adapter.ReferenceRole, "_prefill_frames", make_frames)


@_spec("heartbeat-failure-reason-without-address", "R-REASON-1",
       "bug: rooms the decode fails because their prefill stopped answering its health probe "
       "carry a generic reason ('prefill heartbeat lost') that does not name which prefill, so "
       "with several prefills an operator cannot tell which one died. Shows only when a "
       "prefill dies or freezes with rooms bound to it.",
       "like: common/conn.py _handle_node_failure / record_failure with a fixed message")
def _hb_reason():
    from backends.reference import decode_core as dc
    from backends.reference.shared_events import StatusChanged
    from harness.spec.protocol import KVPoll

    reason = "prefill heartbeat lost: too many failed health probes"

    def make(original):
        def _on_HeartbeatResult(self, e):
            out = []
            for a in original(self, e):
                if isinstance(a, StatusChanged) and a.status == KVPoll.Failed:
                    r = self.rooms.get(a.room)
                    if r is not None:
                        r.reason = reason
                    a = StatusChanged(a.room, a.status, reason)
                out.append(a)
            return out
        return _on_HeartbeatResult

    wrap(dc.DecodeCore, "_on_HeartbeatResult", make)
