"""Blind planted bugs: mutants of the reference written by someone who had read docs/protocol.md
and sglang's code but not pdconform's checks (harness/judge/), its scenarios or the other
mutants, so their score measures the checks, not the taste of whoever wrote them
(docs/mutants.md).  Each entry of :data:`SPECS` is the keyword arguments of
``backends.reference.mutants.Mutant``: ``id``, ``requirement`` (the docs/protocol.md ID it
breaks), ``bug``, ``like`` (where a real backend had a bug of its kind), ``apply`` (a function
that patches the reference classes in the calling process) and ``blind`` (the set's name).
"""

from __future__ import annotations

SPECS: list[dict] = []

BLIND = "blind-1"


class _ThreadDeath(BaseException):
    """An uncaught error that ends the thread it is raised on (the reference's loops catch
    Exception only), as an exception kills a real backend's bare ``while True`` thread."""


def _patch(cls, name: str, make) -> None:
    """Replace ``cls.name`` with ``make(original)``."""
    setattr(cls, name, make(getattr(cls, name)))


def _spec(id: str, requirement: str, bug: str, like: str):
    """Register the decorated function as the ``apply`` of mutant ``id``."""
    def register(fn):
        SPECS.append(dict(id=id, requirement=requirement, bug=bug, like=like, apply=fn, blind=BLIND))
        return fn
    return register


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
