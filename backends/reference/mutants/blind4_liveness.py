"""Blind set 4 (threads, heartbeats, aborts, residue, liveness): written by a helper that had read docs/protocol.md, the reference and sglang's code but not the checks, the scenarios or the catalogue; scored as written."""

from __future__ import annotations

from backends.reference.mutants._base import PlantedLoopDeath, wrap  # noqa: F401
from backends.reference.mutants.blind import planted

_spec = planted("blind-4")


# ---- heartbeats -----------------------------------------------------------------------------

@_spec("heartbeat-misses-never-reset", "R-HB-1",
       "bug: a health probe that answers does not reset the prefill's count of failed probes, so misses add up "
       "across separate short pauses and a prefill that never missed max failures in a row has its rooms failed.",
       "like: common/conn.py heartbeat_checker (the 200 branch's heartbeat_failures[addr] = 0 moved into a "
       "backend's _on_heartbeat_success override that does not run)")
def _heartbeat_misses_never_reset():
    # Bug: an ok probe leaves the failure count as it was.
    from backends.reference import decode_core as dc

    def make(orig):
        def _on_HeartbeatResult(self, e):
            if e.ok:
                return []
            return orig(self, e)
        return _on_HeartbeatResult

    wrap(dc.DecodeCore, "_on_HeartbeatResult", make)


@_spec("probe-catches-urlerror-only", "R-HB-1",
       "bug: the decode's heartbeat thread catches only urllib's URLError around its probe; a prefill that "
       "accepts the connection but does not answer (frozen) makes the read time out with a bare TimeoutError, "
       "which kills the thread, so the frozen prefill's rooms are never failed by the heartbeat.",
       "like: common/conn.py heartbeat_checker (a narrowed except around session.get: requests' ReadTimeout vs "
       "ConnectionError)")
def _probe_catches_urlerror_only():
    # Bug: except urllib.error.URLError instead of OSError.
    import time
    import urllib.error
    import urllib.request

    from backends.reference import adapter as ad
    from backends.reference import decode_core as dc

    def _probe_loop(self):
        while True:
            prefill = self.probes.get()
            try:
                with urllib.request.urlopen(f"http://{prefill}/health", timeout=ad.HEALTH_TIMEOUT_S) as reply:
                    ok = reply.status == 200
            except urllib.error.URLError:
                ok = False
            now = time.monotonic()
            self.side.submit(lambda p=prefill, ok=ok, now=now: self._decode_event(dc.HeartbeatResult(p, ok, now)))

    ad.ReferenceRole._probe_loop = _probe_loop


@_spec("heartbeat-reason-omits-prefill", "R-REASON-1",
       "bug: rooms failed by the heartbeat get a generic reason ('health check failed') that does not name the "
       "prefill whose health endpoint stopped answering.",
       "like: common/conn.py _handle_node_failure (record_failure's message without the bootstrap_addr)")
def _heartbeat_reason_omits_prefill():
    # Bug: the failure reason drops the prefill address.
    from backends.reference import decode_core as dc
    from backends.reference.shared_events import StatusChanged
    from harness.spec.protocol import KVPoll

    def make(orig):
        def _on_HeartbeatResult(self, e):
            out = []
            for a in orig(self, e):
                if isinstance(a, StatusChanged) and a.status == KVPoll.Failed:
                    reason = "lost connection with the prefill instance: health check failed"
                    if a.room in self.rooms:
                        self.rooms[a.room].reason = reason
                    a = StatusChanged(a.room, a.status, reason)
                out.append(a)
            return out
        return _on_HeartbeatResult

    wrap(dc.DecodeCore, "_on_HeartbeatResult", make)


# ---- aborts -------------------------------------------------------------------------------

@_spec("abort-skipped-when-already-failed", "R-ABORT-1",
       "bug: the decode's abort() returns early for a room that is already Failed (by its waiting timeout, the "
       "heartbeat or a failure it heard of), so no ABORT reaches the prefill, which may still hold the room and "
       "write into its pages.",
       "like: common/conn.py CommonKVReceiver.abort (an early 'if self.conclude_state == KVPoll.Failed: return' "
       "before ensure_abort_notified)")
def _abort_skipped_when_already_failed():
    # Bug: abort() of a Failed room does nothing.
    from backends.reference import decode_core as dc
    from harness.spec.protocol import KVPoll

    def make(orig):
        def _on_Abort(self, e):
            r = self.rooms.get(e.room)
            if r is not None and r.status == KVPoll.Failed:
                return []
            return orig(self, e)
        return _on_Abort

    wrap(dc.DecodeCore, "_on_Abort", make)


@_spec("abort-ack-to-first-bound-rank", "R-ABORT-2",
       "bug: the prefill sends a room's ABORT_ACK to the first decode rank bound to the room rather than to the "
       "rank whose ABORT it answers; with several decode ranks per prefill rank (decode TP wider) the other "
       "ranks never get their ACK (the first one's is deduplicated away).",
       "like: mooncake/conn.py _handle_deferred_abort_notification / common/conn.py _send_abort_ack (ack target "
       "taken from transfer_infos instead of the notification's decode_ip/decode_port)")
def _ack_to_first_destination():
    # Bug: _ack's target replaced by the room's first destination.
    from backends.reference import prefill_core as pc

    def make(orig):
        def _ack(self, room, decode, generation):
            r = self.rooms.get(room)
            if r is not None and r.dests:
                decode = next(iter(r.dests))
            return orig(self, room, decode, generation)
        return _ack

    wrap(pc.PrefillCore, "_ack", make)


@_spec("ack-cleared-room-before-drain", "R-ABORT-2",
       "bug: an ABORT for a room the prefill already cleared is answered at once, without looking at the writes "
       "of that room still in flight, so the decode reuses pages a delayed write then lands in.",
       "like: mooncake/conn.py _handle_abort_notification (a room missing from request_status taken as 'nothing "
       "written', without consulting the deferred drain counters)")
def _ack_cleared_room_before_drain():
    # Bug: the drain of a cleared room is hidden from the ABORT handler.
    from backends.reference import prefill_core as pc

    def make(orig):
        def _on_AbortReceived(self, e):
            if e.room in self.rooms or e.room not in self.draining:
                return orig(self, e)
            drain = self.draining.pop(e.room)
            try:
                return orig(self, e)
            finally:
                self.draining.setdefault(e.room, drain)
        return _on_AbortReceived

    wrap(pc.PrefillCore, "_on_AbortReceived", make)


@_spec("failed-write-poisons-ack", "R-ABORT-3",
       "bug: the prefill treats every write the engine reports failed as one that may still be writing and "
       "poisons the room's ABORT_ACK for the rest of its lifecycle, so a room whose write failed outright is never "
       "answered and the decode keeps its pages until its own release timeout.",
       "like: mooncake/conn.py _poison_unsettled_send / common/conn.py poison_deferred_ack_room (applied to an "
       "ended failure, not only to a timed-out batch that may still be running)")
def _failed_write_poisons_ack():
    # Bug: any failed write suppresses the room's ABORT_ACKs until clear.
    from backends.reference import prefill_core as pc

    def poisoned(core) -> set:
        if not hasattr(core, "_ack_poisoned"):
            core._ack_poisoned = set()
        return core._ack_poisoned

    def on_write_done(orig):
        def _on_WriteDone(self, e):
            if not e.ok and e.room in self.rooms:
                poisoned(self).add(e.room)
            return orig(self, e)
        return _on_WriteDone

    def ack(orig):
        def _ack(self, room, decode, generation):
            if room in poisoned(self):
                return []
            return orig(self, room, decode, generation)
        return _ack

    def on_clear(orig):
        def _on_Clear(self, e):
            poisoned(self).discard(e.room)
            return orig(self, e)
        return _on_Clear

    wrap(pc.PrefillCore, "_on_WriteDone", on_write_done)
    wrap(pc.PrefillCore, "_ack", ack)
    wrap(pc.PrefillCore, "_on_Clear", on_clear)


# ---- stale work, threads, start-up ----------------------------------------------------------

@_spec("stale-chunk-lookup-raises", "R-STALE-1",
       "bug: the transfer path looks a chunk's room up with a plain index, so a chunk still queued when its room "
       "was cleared raises KeyError inside the control work (caught and logged) instead of being dropped quietly.",
       "like: nixl/conn.py transfer_worker (assert / self.transfer_infos[room] on a cleared room, PR #35281); "
       "mori/conn.py _run_chunk")
def _stale_chunk_lookup_raises():
    # Bug: self.prefill.rooms[room] instead of .get(room).
    from backends.reference import adapter as ad
    from backends.reference import prefill_core as pc

    def _send_chunk_now(self, room, pages):
        r = self.prefill.rooms[room]
        last = r.num_pages is not None and r.sent + len(pages) >= r.num_pages
        self._prefill_event(pc.SendChunk(room, tuple(pages), last))

    ad.ReferenceRole._send_chunk_now = _send_chunk_now


@_spec("decode-loop-dies-on-write-after-clear", "R-LIVE-2",
       "bug: the decode's control thread looks up the receiver of every WRITE it lands; a write that arrives "
       "after the room was cleared (aborted, then released while the prefill still drained) raises out of the "
       "loop and kills the thread, and every later room of that decode times out.",
       "like: mori/conn.py decode-side completion handling / nixl/conn.py decode notification thread (room "
       "lookup without a guard on a thread with no catch-all)")
def _decode_loop_dies_on_write_after_clear():
    # Bug: a WRITE for an unknown room is fatal to the decode control thread.
    from backends.reference import adapter as ad

    def make(orig):
        def _apply_write(self, room, aux, dst, payload, stage=0):
            if self.decode is not None and room not in self.decode.rooms:
                raise PlantedLoopDeath(f"room {room}: write for a receiver that no longer exists")
            return orig(self, room, aux, dst, payload, stage)
        return _apply_write

    wrap(ad.ReferenceRole, "_apply_write", make)


@_spec("watermark-without-staging-kills-loop", "R-LIVE-3",
       "bug: the prefill's control thread hands every WATERMARK to the staging context without checking that "
       "staging is on; with staging disabled the context is None and the thread dies on the first WATERMARK.",
       "like: mooncake/conn.py bootstrap_thread (WATERMARK dispatched to self._staging_ctx unguarded, PR #35281 "
       "review)")
def _watermark_without_staging_kills_loop():
    # Bug: no guard for staging_ctx None.
    from backends.reference import adapter as ad

    def make(orig):
        def _prefill_frames(self, frames):
            if frames and frames[0] == b"WATERMARK" and self.staging_ctx is None:
                raise PlantedLoopDeath("'NoneType' object has no attribute 'on_watermark'")
            return orig(self, frames)
        return _prefill_frames

    wrap(ad.ReferenceRole, "_prefill_frames", make)


@_spec("prefill-loop-dies-on-bad-room-field", "R-LIVE-1",
       "bug: the prefill's control thread parses a message's room field before its guarded handling, so an empty "
       "message, one with no fields or a non-numeric room raises out of the loop and kills the thread.",
       "like: mooncake/conn.py / nixl/conn.py bootstrap_thread (int(msg[0].decode('ascii')) outside the try, "
       "RFC #33861)")
def _prefill_loop_dies_on_bad_room_field():
    # Bug: int(frames[1]) outside the guarded handler.
    from backends.reference import adapter as ad

    def make(orig):
        def _prefill_frames(self, frames):
            if not frames:
                raise PlantedLoopDeath("IndexError: list index out of range")
            if frames[0] != b"WATERMARK":
                try:
                    int(frames[1])
                except (IndexError, ValueError) as exc:
                    raise PlantedLoopDeath(repr(exc)) from None
            return orig(self, frames)
        return _prefill_frames

    wrap(ad.ReferenceRole, "_prefill_frames", make)


# ---- peers, restarts ------------------------------------------------------------------------

@_spec("decode-caches-prefill-endpoints", "R-RESTART-1",
       "bug: the decode caches a prefill's rank endpoints per bootstrap address and purges the cache only when "
       "the heartbeat declares the prefill dead; a prefill that restarts on new ports faster than the heartbeat "
       "window keeps getting registrations on its old ports, so new rooms to it never succeed.",
       "like: common/conn.py CommonKVReceiver._setup_bootstrap_infos (connection_pool, purged only by "
       "_handle_node_failure or a waiting timeout)")
def _decode_caches_prefill_endpoints():
    # Bug: fetch_stages memoised per bootstrap address.
    from backends.reference import adapter as ad
    from backends.reference import decode_core as dc

    cache: dict = {}
    original = ad.fetch_stages

    def fetch_stages(bootstrap_addr, timeout_s):
        if bootstrap_addr not in cache:
            cache[bootstrap_addr] = original(bootstrap_addr, timeout_s)
        return cache[bootstrap_addr]

    ad.fetch_stages = fetch_stages

    def make(orig):
        def _on_HeartbeatResult(self, e):
            actions = orig(self, e)
            if self.failures.get(e.prefill, 0) >= self.heartbeat_max_failures:
                cache.pop(e.prefill, None)
            return actions
        return _on_HeartbeatResult

    wrap(dc.DecodeCore, "_on_HeartbeatResult", make)


@_spec("peer-lost-writes-complete-ok", "R-PEER-1",
       "bug: when the engine loses a decode's connection the prefill settles that decode's outstanding writes as "
       "completed instead of failed, so a room whose decode was killed mid-transfer reaches Success on the "
       "prefill with bytes that never landed.",
       "like: mooncake/conn.py transfer_worker (batch_transfer_sync's return on a torn-down session read as "
       "success); nixl/conn.py _await_handles (released handles reported DONE)")
def _peer_lost_writes_complete_ok():
    # Bug: DecodeLost produces ok=True completions.
    from backends.reference import prefill_core as pc

    def _on_DecodeLost(self, e):
        actions = []
        for write_id, (room, _, decode) in list(self.issued.items()):
            if decode == e.decode:
                actions += self.handle(pc.WriteDone(room, write_id, True))
        return actions

    pc.PrefillCore._on_DecodeLost = _on_DecodeLost


# ---- residue --------------------------------------------------------------------------------

@_spec("decode-clear-keeps-rank-sources", "R-RESIDUE-1",
       "bug: the decode's clear() forgets the room's prefill endpoints and plans but not the layouts of the "
       "prefill ranks it takes KV from, so every cleared room leaves an entry behind (a leak that grows with "
       "every request).",
       "like: common/conn.py CommonKVReceiver._clear (a per-room table such as required_prefill_response_num_table "
       "or prefill_response_tracker not popped)")
def _decode_clear_keeps_rank_sources():
    # Bug: sources[room] survives clear().
    from backends.reference import adapter as ad

    def make(orig):
        def clear(self, room):
            kept = self.sources.get(room) if self.role == "decode" else None
            orig(self, room)
            if kept is not None:
                self._sync(lambda: self.sources.setdefault(room, kept))
        return clear

    wrap(ad.ReferenceRole, "clear", make)


@_spec("lost-write-kept-after-clear", "R-RESIDUE-1",
       "bug: the prefill's transfer-timeout watchdog only walks the writes of rooms it still holds, so a write "
       "that never completes after its room was cleared is never declared lost: the room's drain and write "
       "record stay forever (and the write is still sent if it ever leaves the engine).",
       "like: nixl/conn.py transfer_worker / _await_handles (deadline tracked per transfer_infos entry, popped "
       "by clear())")
def _lost_write_kept_after_clear():
    # Bug: writes of cleared rooms hidden from _expire_writes.
    from backends.reference import prefill_core as pc

    def make(orig):
        def _expire_writes(self, now):
            hidden = {w: v for w, v in self.issued.items() if v[0] not in self.rooms}
            for w in hidden:
                del self.issued[w]
            try:
                return orig(self, now)
            finally:
                self.issued.update(hidden)
        return _expire_writes

    wrap(pc.PrefillCore, "_expire_writes", make)
