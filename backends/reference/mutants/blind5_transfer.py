"""Blind set 5 (transfer path: the engine, the transfer worker, where bytes land, which engine serves a room):
written by a helper that had read docs/protocol.md, the reference and sglang's code but not the checks, the
scenarios or the catalogue; scored as written."""

from __future__ import annotations

from backends.reference.mutants._base import PlantedLoopDeath, wrap  # noqa: F401
from backends.reference.mutants.blind import planted

_spec = planted("blind-5")

#: write ids of the aux writes issued in this (role) process, until they complete or are declared lost
_AUX_WRITE_IDS: set[int] = set()


@_spec("aux-write-spared-by-stuck-write-timeout", "R-LOSS-1",
       "bug: the prefill exempts a room's aux write from the stuck-write timeout while the room is still "
       "Transferring (\"the aux write is tiny and goes last, the status follows it at once\"); when the aux "
       "message alone is lost, its completion never comes and the prefill room stays Transferring for ever "
       "instead of failing within the waiting timeout (a stuck KV write, or every write stuck, still fails it)",
       "like: mooncake/conn.py and nixl/conn.py send_aux (the aux goes on its own path, a ZMQ AUX_DATA message "
       "or a separate write, outside the KV batch whose completion the transfer worker waits on)")
def _aux_write_spared_by_stuck_write_timeout():
    from backends.reference import prefill_core as pc
    from harness.spec.protocol import KVPoll

    def make_write(orig):
        def _write(self, room, r, decode, src, dst, aux):
            action = orig(self, room, r, decode, src, dst, aux)
            if aux:
                _AUX_WRITE_IDS.add(action.write_id)
            return action
        return _write

    def make_expire(orig):
        def _expire_writes(self, now):
            spared = {}
            for write_id in [w for w in self.issued if w in _AUX_WRITE_IDS]:
                room = self.issued[write_id][0]
                r = self.rooms.get(room)
                if r is not None and r.status == KVPoll.Transferring and write_id in r.outstanding:
                    spared[write_id] = self.issued.pop(write_id)  # the aux of a live room: "about to finish"
            try:
                return orig(self, now)
            finally:
                self.issued.update(spared)
                _AUX_WRITE_IDS.intersection_update(self.issued)
        return _expire_writes

    wrap(pc.PrefillCore, "_write", make_write)
    wrap(pc.PrefillCore, "_expire_writes", make_expire)


@_spec("transfer-worker-closure-binds-latest-chunk", "R-LOAD-1",
       "bug: the prefill's transfer worker hands each chunk to the control thread in a closure over its loop "
       "variables (room, pages) instead of binding them; while the control thread lags behind (many rooms in "
       "flight) several queued closures run with the latest chunk taken, so one room's chunk is sent twice (its "
       "room fails) and other rooms' chunks are never sent (those rooms hang); one room at a time is unaffected",
       "like: mooncake/conn.py and nixl/conn.py transfer_worker (a worker that takes chunks off a FastQueue and "
       "defers the send of each to another thread)")
def _transfer_worker_closure_binds_latest_chunk():
    import queue

    from backends.reference import adapter

    def make(orig):
        def _transfer_worker(self):
            while not self.stopping.is_set():
                try:
                    room, pages = self.chunks.get(timeout=0.1)
                except queue.Empty:
                    continue
                self.points.hit("worker-take-chunk", room=room)
                self.side.submit(lambda: self._send_chunk_now(room, pages))  # late binding: the bug
        return _transfer_worker

    wrap(adapter.ReferenceRole, "_transfer_worker", make)


def _open_receiver(self, room: int, bootstrap_addr: str, timeout_s: float, pick, mine) -> None:
    """The reference decode's open_receiver, with the engine choice ``pick(stages, room)`` and the decode
    layout ``mine`` its transfer path believes in (the two mutants below change one each)."""
    from backends.reference import adapter as ad
    from backends.reference import decode_core as dc
    from harness.spec.layout_plan import Plan
    from harness.spec.protocol import KVPoll, Layout

    self.rooms_seen.append(room)
    stages = ad.landing.chosen_ranks(pick(ad.fetch_stages(bootstrap_addr, timeout_s), room), mine)
    self.peer[room] = [stage["endpoint"] for stage in stages]
    self.sources[room] = [Layout(**stage["layout"]) for stage in stages]
    results = [ad.landing.layout_plan(layout, mine) for layout in self.sources[room]]
    rejected = next((r for r in results if not isinstance(r, Plan)), None)
    self.status.setdefault(room, KVPoll.Bootstrapping)

    def open_room() -> None:
        self._decode_event(dc.OpenReceiver(room, bootstrap_addr, ad.time.monotonic(), stages=len(stages)))
        if rejected is None:
            self.plans[room] = results
        else:
            ad.log.error("room %s: layout rejected: %s", room, rejected.reason)
            self.decode.rooms[room].status = KVPoll.Failed
            self._record(room, KVPoll.Failed, f"layout rejected: {rejected.reason}")

    self.side.submit(open_room)


@_spec("decode-resolves-prefill-engine-by-own-dp-size", "R-DP-1",
       "bug: the decode picks the prefill DP engine of a room as room mod its OWN DP size instead of the "
       "prefill's DP size the bootstrap server reports; with two prefill engines and one decode every room goes "
       "to engine 0 (odd rooms wait on a sender that is on engine 1, engine 0 gets a registration it never "
       "scheduled), with two decode engines and one prefill odd rooms ask an engine that does not exist",
       "like: decode.py _resolve_prefill_dp_rank (follow_bootstrap_room: the modulus must be the prefill's "
       "dp size from the bootstrap server's parallel info, not the local scheduler's)")
def _decode_resolves_prefill_engine_by_own_dp_size():
    from backends.reference import adapter

    def make_start(orig):
        def start_decode(self, layout, bootstrap_port, attn_tp=(1, 0), dp=(1, 0)):
            self.own_dp_size = max(1, int(dp[0]))
            return orig(self, layout, bootstrap_port, attn_tp, dp)
        return start_decode

    def make_open(orig):
        def open_receiver(self, room, bootstrap_addr, timeout_s):
            size = getattr(self, "own_dp_size", 1)

            def pick(stages, room_):
                return [st for st in stages if int(st.get("dp_rank", 0)) == room_ % size]

            _open_receiver(self, room, bootstrap_addr, timeout_s, pick, self.layout)
        return open_receiver

    wrap(adapter.ReferenceRole, "start_decode", make_start)
    wrap(adapter.ReferenceRole, "open_receiver", make_open)


@_spec("decode-replicated-kv-head-chosen-by-rank-modulo", "R-LAYOUT-1",
       "bug: with more decode TP ranks than KV heads, a decode rank works out the KV head its transfer takes "
       "as tp_rank mod heads instead of tp_rank div replicas; its pools are right but it asks for (and lands) "
       "the bytes of another head: with 2 heads on 4 decode ranks, ranks 1 and 2 hold the wrong head after "
       "Success; shapes with no replicated head are unaffected",
       "like: common/staging_buffer.py compute_head_slice_params and common/conn.py _get_mha_head_slice_blocks "
       "(the head a replica rank slices out of a prefill rank's pages)")
def _decode_replicated_kv_head_chosen_by_rank_modulo():
    from dataclasses import replace

    from backends.reference import adapter

    def make_start(orig):
        def start_decode(self, layout, bootstrap_port, attn_tp=(1, 0), dp=(1, 0)):
            out = orig(self, layout, bootstrap_port, attn_tp, dp)
            tp_size, tp_rank = int(attn_tp[0]), int(attn_tp[1])
            total = self.layout.model_kv_heads
            if not self.layout.mla and tp_size > total:
                self.xfer_layout = replace(self.layout, head_start=tp_rank % total)
            return out
        return start_decode

    def make_open(orig):
        def open_receiver(self, room, bootstrap_addr, timeout_s):
            from backends.reference.bootstrap import room_engine

            _open_receiver(self, room, bootstrap_addr, timeout_s, room_engine,
                           getattr(self, "xfer_layout", None) or self.layout)
        return open_receiver

    def make_apply(orig):
        def _apply_write(self, room, aux, dst, payload, stage=0):
            from backends.reference import landing

            mine = getattr(self, "xfer_layout", None) or self.layout
            plan_ = self.plans[room][stage] if not aux and room in self.plans else None
            source = (self.sources.get(room) or [mine])[stage] if not aux else None
            return landing.apply_write(self.buffers, mine, plan_, source, aux, dst, payload)
        return _apply_write

    wrap(adapter.ReferenceRole, "start_decode", make_start)
    wrap(adapter.ReferenceRole, "open_receiver", make_open)
    wrap(adapter.ReferenceRole, "_apply_write", make_apply)


@_spec("mla-kv-written-to-first-decode-rank-only", "R-LAYOUT-1",
       "bug: an MLA prefill rank with several decode ranks to serve writes the latent KV pages to the first "
       "decode rank only and counts the other ranks' KV writes done (\"every rank holds the same latent\"); the "
       "other decode ranks reach Success with their KV pages never written (their aux still lands); MHA and "
       "MLA with one decode rank per prefill rank are unaffected",
       "like: common/conn.py resolve_kv_replica_factor / get_mla_kv_ptrs_with_pp and the is_dummy "
       "registrations (MLA's replicated KV: which decode ranks a prefill rank must really write)")
def _mla_kv_written_to_first_decode_rank_only():
    from backends.reference import adapter
    from backends.reference import prefill_core as pc

    def make(orig):
        def _start_write(self, w):
            r = self.prefill.rooms.get(w.room)
            if (self.layout is not None and self.layout.mla and not w.aux and r is not None and len(r.dests) > 1
                    and w.decode != next(iter(r.dests))):
                done = pc.WriteDone(w.room, w.write_id, True)
                self.side.submit(lambda: self._prefill_event(done))
                return
            orig(self, w)
        return _start_write

    wrap(adapter.ReferenceRole, "_start_write", make)


@_spec("stuck-write-keeps-transfer-worker-after-timeout", "R-TIMEOUT-3",
       "bug: the prefill's engine runs one write at a time and waits for its completion before posting the "
       "next; the transfer timeout fails the stuck write's room on time, but the worker goes on waiting for "
       "that write (only a completion or the decode's loss frees it), so every later write, of every later "
       "room, stays queued and those rooms never transfer",
       "like: nixl/conn.py _await_handles (polls a batch's handles with no deadline while they look healthy) "
       "called from transfer_worker")
def _stuck_write_keeps_transfer_worker_after_timeout():
    from collections import deque

    from backends.reference import adapter
    from backends.reference import prefill_core as pc

    post = adapter.ReferenceRole._start_write

    def engine(self):
        if not hasattr(self, "engine_backlog"):
            self.engine_busy = None  # (write id, decode) of the write the worker waits on
            self.engine_backlog = deque()
        return self.engine_backlog

    def make_start(orig):
        def _start_write(self, w):
            backlog = engine(self)
            if self.engine_busy is not None:
                backlog.append(w)
                return
            self.engine_busy = (w.write_id, w.decode)
            orig(self, w)
        return _start_write

    def make_event(orig):
        def _prefill_event(self, event):
            orig(self, event)
            backlog = engine(self)
            busy = self.engine_busy
            if busy is None:
                return
            if (isinstance(event, pc.WriteDone) and event.write_id == busy[0]) \
                    or (isinstance(event, pc.DecodeLost) and event.decode == busy[1]):
                self.engine_busy = None
                while self.engine_busy is None and backlog:
                    w = backlog.popleft()
                    if w.write_id in self.prefill.issued:  # not failed or declared lost while queued
                        self.engine_busy = (w.write_id, w.decode)
                        post(self, w)
        return _prefill_event

    wrap(adapter.ReferenceRole, "_start_write", make_start)
    wrap(adapter.ReferenceRole, "_prefill_event", make_event)


@_spec("decode-marked-unreachable-after-posted-write-times-out", "R-NET-1",
       "bug: when a write the prefill had put on the wire is declared lost by the transfer timeout, the prefill "
       "marks that decode unreachable and drops its registrations until the connection monitor reports the "
       "peer gone; a partition keeps the TCP connection up, so after the network heals no such event comes and "
       "every new room from that decode fails (a write that was never posted, a dead decode: unaffected)",
       "like: common/conn.py connection_pool / _handle_node_failure (a peer marked failed and only purged by a "
       "later failure event), Mooncake's failed-session bookkeeping in mooncake/conn.py")
def _decode_marked_unreachable_after_posted_write_times_out():
    from backends.reference import adapter
    from backends.reference import prefill_core as pc

    def books(self):
        if not hasattr(self, "posted_writes"):
            self.posted_writes = {}  # write id -> decode, for writes handed to the wire
            self.unreachable = set()
        return self.posted_writes, self.unreachable

    def make_send(orig):
        def _send_write(self, w):
            posted, _ = books(self)
            if w.write_id in self.prefill.issued:
                posted[w.write_id] = w.decode
            orig(self, w)
        return _send_write

    def make_event(orig):
        def _prefill_event(self, event):
            posted, unreachable = books(self)
            if isinstance(event, pc.Tick):
                watched = [w for w in posted if w in self.prefill.issued]
                orig(self, event)
                for write_id in watched:
                    if write_id not in self.prefill.issued:  # declared lost by the transfer timeout
                        decode = posted.pop(write_id)
                        if decode not in unreachable:
                            adapter.log.warning("decode %s marked unreachable: a write to it timed out", decode)
                        unreachable.add(decode)
                return
            if isinstance(event, pc.WriteDone):
                posted.pop(event.write_id, None)
            elif isinstance(event, pc.DecodeLost):
                unreachable.discard(event.decode)
                for write_id in [w for w, d in posted.items() if d == event.decode]:
                    del posted[write_id]
            orig(self, event)
        return _prefill_event

    def make_frames(orig):
        def _prefill_frames(self, frames):
            _, unreachable = books(self)
            if unreachable and len(frames) > 2 and frames[0] == b"REGISTER":
                try:
                    who = bytes(frames[2]).decode("ascii")
                except UnicodeDecodeError:
                    who = ""
                if who in unreachable:
                    adapter.log.info("registration from unreachable decode %s dropped", who)
                    return
            orig(self, frames)
        return _prefill_frames

    wrap(adapter.ReferenceRole, "_send_write", make_send)
    wrap(adapter.ReferenceRole, "_prefill_event", make_event)
    wrap(adapter.ReferenceRole, "_prefill_frames", make_frames)
