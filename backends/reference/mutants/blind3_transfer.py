"""Blind set 3 (transfer, layout, statuses, timers, reuse): written by a helper that had read docs/protocol.md and sglang's code but not the checks, the scenarios or the catalogue; scored as written."""

from __future__ import annotations

from backends.reference.mutants._base import PlantedLoopDeath, wrap  # noqa: F401
from backends.reference.mutants.blind import planted

_spec = planted("blind-3")


# ---- transfer and fan-out to decode ranks -------------------------------------------------

@_spec("aux-to-first-destination-only", "R-XFER-2",
       "bug: with several decode ranks for one room, the prefill writes the aux slot to the first registered "
       "rank only and still reports Success to every rank, so the other ranks read Success with a stale aux slot",
       "like: mooncake/conn.py transfer_worker sends aux per target (send_aux inside the per-req loop); a backend "
       "that treats aux as per-room metadata, as MLA's one-real-rank (is_dummy) rule does, sends it once")
def _aux_to_first_destination_only():
    # Bug: the last chunk's aux write is issued for the first destination only
    from backends.reference import prefill_core as pc

    def make(original):
        def method(self, e):
            actions = original(self, e)
            r = self.rooms.get(e.room)
            if r is None or len(r.dests) < 2 or not e.last:
                return actions
            first = next(iter(r.dests))
            kept = []
            for a in actions:
                if isinstance(a, pc.StartWrite) and a.aux and a.decode != first:
                    r.outstanding.discard(a.write_id)
                    self.issued.pop(a.write_id, None)
                    continue
                kept.append(a)
            return kept + self._maybe_success(e.room, r)
        return method
    wrap(pc.PrefillCore, "_on_SendChunk", make)


@_spec("mla-dummy-ranks-registered", "R-XFER-1",
       "bug: the decode takes every prefill TP rank of a stage as a source, also MLA's extra ranks that hold a "
       "copy of the same KV; it registers with them and waits for their Success, which never comes (they have "
       "no destination), so the room fails at the waiting timeout instead of succeeding",
       "like: common/conn.py CommonKVReceiver._setup_bootstrap_infos (is_dummy is set only for MLA's non-selected "
       "target_tp_ranks); a backend that marks every fetched rank real")
def _mla_dummy_ranks_registered():
    # Bug: chosen_ranks ignores which rank holds which heads and keeps every rank of each stage
    from backends.reference import landing

    def make(original):
        def chosen_ranks(ranks, mine):
            out = []
            for pp_rank in sorted({r.get("pp_rank", 0) for r in ranks}):
                out += [r for r in ranks if r.get("pp_rank", 0) == pp_rank]
            return out
        return chosen_ranks
    wrap(landing, "chosen_ranks", make)


@_spec("response-count-per-pp-stage", "R-XFER-2",
       "bug: the decode expects one Success per prefill pipeline stage, not one per prefill rank it takes KV "
       "from; with prefill attention TP wider than the decode's, it reads Success after the first TP rank's "
       "Success while the other rank's KV heads may still be landing (and releases after its first ABORT_ACK)",
       "like: common/conn.py required_prefill_response_num_table / apply_prefill_status (len(completed_ranks) < "
       "expected_response_num); a backend that sizes it by pp_size alone")
def _response_count_per_pp_stage():
    # Bug: the receiver's expected response count is the number of distinct pp ranks among its sources
    from backends.reference import adapter as ad
    from backends.reference import landing

    def make(original):
        def method(self, room, bootstrap_addr, timeout_s):
            original(self, room, bootstrap_addr, timeout_s)
            ranks = landing.chosen_ranks(ad.room_engine(ad.fetch_stages(bootstrap_addr, timeout_s), room), self.layout)
            stages = len({int(st.get("pp_rank", 0)) for st in ranks}) or 1

            def resize() -> None:
                r = self.decode.rooms.get(room)
                if r is not None:
                    r.stages = stages
            self.side.submit(resize)
        return method
    wrap(ad.ReferenceRole, "open_receiver", make)


@_spec("scatter-after-write-done", "R-XFER-2",
       "bug: the decode answers each WRITE as done on receipt and copies the bytes into its pools 0.3 s later "
       "from a copy timer, so the prefill concludes Success and the receiver reads Success before the last "
       "chunk's KV pages and aux slot are in its pools (they land right, but late)",
       "like: common/staging_handler.py arrival-driven scatter (apply_prefill_status calls "
       "submit_last_scatter_async 'before any poller can see Success'); a backend that acks the write before "
       "its scatter finishes")
def _scatter_after_write_done():
    # Bug: _apply_write reports success at once and lands the payload later on the control thread
    import logging
    import threading

    from backends.reference import adapter as ad
    from backends.reference import landing

    log = logging.getLogger("pdconform.reference")

    def make(original):
        def method(self, room, aux, dst, payload, stage=0):
            plan_ = self.plans[room][stage] if not aux and room in self.plans else None
            source = (self.sources.get(room) or [self.layout])[stage] if not aux else None

            def land() -> None:
                ok, why = landing.apply_write(self.buffers, self.layout, plan_, source, aux, dst, payload)
                if not ok:
                    log.info("room %s: late scatter refused: %s", room, why)

            threading.Timer(0.3, lambda: self.side.submit(land)).start()
            return True, ""
        return method
    wrap(ad.ReferenceRole, "_apply_write", make)


# ---- byte layout ---------------------------------------------------------------------------

@_spec("head-slice-source-offset-from-decode", "R-LAYOUT-1",
       "bug: when a decode rank holds fewer KV heads than the prefill rank, it cuts the shared heads out of the "
       "prefill's page at its own head offset instead of the prefill's: decode rank 1 of two gets head 0's "
       "bytes in its head 1 (silent; both sides report Success)",
       "like: common/conn.py _get_mha_head_slice_blocks (src head offset vs dst head offset); "
       "nixl/conn.py heterogeneous-TP slicing")
def _head_slice_source_offset_from_decode():
    # Bug: the source slice is indexed relative to mine.head_start instead of source.head_start
    from backends.reference import landing

    def make(original):
        def shared_heads(tensor, pages, mine, source):
            size = mine.page_size
            head = mine.page_bytes // (size * mine.kv_heads)
            first = max(mine.head_start, source.head_start)
            last = min(mine.head_start + mine.kv_heads, source.head_start + source.kv_heads)
            if first >= last:
                return None
            src = pages.view(pages.shape[0], size, source.kv_heads, head)
            return (first, last, tensor.view(tensor.shape[0], size, mine.kv_heads, head),
                    src[:, :, first - mine.head_start:last - mine.head_start])
        return shared_heads
    wrap(landing, "shared_heads", make)


@_spec("pp-peers-listed-reversed", "R-LAYOUT-2",
       "bug: the decode lists a prefill's ranks from the last pipeline stage (rank) to the first, while its "
       "layer plans and source layouts stay in stage order, so a WRITE from stage 0 is landed with the last "
       "stage's plan (layers of one stage written as another's; with prefill TP ranks, heads swapped)",
       "like: common/conn.py CommonKVReceiver._setup_bootstrap_infos iterates reversed(self.target_pp_ranks) "
       "('Enable higher PP ranks to be bootstrapped earlier') while other tables are built in stage order")
def _pp_peers_listed_reversed():
    # Bug: self.peer[room] is reversed after open_receiver; _stage() indexes plans/sources with it
    from backends.reference import adapter as ad

    def make(original):
        def method(self, room, bootstrap_addr, timeout_s):
            original(self, room, bootstrap_addr, timeout_s)
            peers = self.peer.get(room)
            if peers and len(peers) > 1:
                self.peer[room] = list(reversed(peers))
        return method
    wrap(ad.ReferenceRole, "open_receiver", make)


@_spec("dp-size-from-decode-side", "R-DP-1",
       "bug: the decode resolves a room's prefill engine as room mod its own DP size instead of the prefill's: "
       "with two decode engines and one prefill engine, odd rooms look for prefill engine 1, which does not "
       "exist, and are never registered; with two prefill engines and one decode, every room goes to engine 0",
       "like: decode.py _resolve_prefill_dp_rank (bootstrap_room % prefill_info.dp_size) beside the decode's own "
       "dp_size in the same scheduler")
def _dp_size_from_decode_side():
    # Bug: room_engine uses the decode's DP size (stashed at start_decode)
    from backends.reference import adapter as ad

    state = {"dp": 1}

    def make_start(original):
        def method(self, layout, bootstrap_port, attn_tp=(1, 0), dp=(1, 0)):
            state["dp"] = max(1, int(dp[0]))
            return original(self, layout, bootstrap_port, attn_tp=attn_tp, dp=dp)
        return method

    def make_engine(original):
        def room_engine(stages, room):
            engine = room % state["dp"]
            return [st for st in stages if int(st.get("dp_rank", 0)) == engine]
        return room_engine
    wrap(ad.ReferenceRole, "start_decode", make_start)
    wrap(ad, "room_engine", make_engine)


# ---- timers ---------------------------------------------------------------------------------

@_spec("bootstrap-deadline-on-manager", "R-TIMEOUT-1",
       "bug: the prefill keeps one bootstrap start time for all its rooms, the latest sender's: every new room "
       "restarts the deadline of the rooms still Bootstrapping, so an orphan sender fails only a bootstrap "
       "timeout after the last room was opened (never, under steady traffic)",
       "like: common/conn.py CommonKVSender._check_bootstrap_timeout reads the sender's own init_time; a backend "
       "that keeps it on the shared kv_mgr")
def _bootstrap_deadline_on_manager():
    # Bug: each OpenSender moves opened_at of every Bootstrapping room to now
    from backends.reference import prefill_core as pc

    def make(original):
        def method(self, e):
            actions = original(self, e)
            for r in self.rooms.values():
                if r.status == pc.KVPoll.Bootstrapping:
                    r.opened_at = max(r.opened_at, e.now)
            return actions
        return method
    wrap(pc.PrefillCore, "_on_OpenSender", make)


@_spec("waiting-since-wall-clock", "R-TIMEOUT-2",
       "bug: the decode stamps a room's metadata send with wall-clock time while its timer ticks run on the "
       "monotonic clock, so the elapsed wait is hugely negative and the waiting timeout never fires",
       "like: common/conn.py send_metadata sets init_time = time.time() while transfer metrics use "
       "time.perf_counter(); a backend mixing the two clocks")
def _waiting_since_wall_clock():
    # Bug: RequestKV carries time.time() where Tick carries time.monotonic()
    from backends.reference import adapter as ad
    from backends.reference import decode_core as dc

    def make(original):
        def method(self, room, pages, aux_slot):
            import time
            now = time.time()
            self.side.submit(lambda: self._decode_event(dc.RequestKV(room, tuple(pages), aux_slot, now)))
        return method
    wrap(ad.ReferenceRole, "request_kv", make)


@_spec("transfer-deadline-checked-on-chunks", "R-TIMEOUT-3",
       "bug: the prefill checks its writes' transfer timeout only when a new chunk arrives (in the worker), not "
       "on its timer, so a stuck write of the last chunk sent is never declared lost and its room stays "
       "Transferring until some later chunk happens to come",
       "like: nixl/conn.py transfer_worker / _await_handles: handle deadlines evaluated inside the worker loop, "
       "which only runs when the queue hands it work")
def _transfer_deadline_checked_on_chunks():
    # Bug: _expire_writes runs from _on_SendChunk instead of _on_Tick
    from backends.reference import prefill_core as pc

    def make_tick(original):
        def method(self, e):
            saved = self.transfer_timeout_s
            self.transfer_timeout_s = None
            try:
                return original(self, e)
            finally:
                self.transfer_timeout_s = saved
        return method

    def make_chunk(original):
        def method(self, e):
            expired = self._expire_writes(self.clock) if self.clock is not None else []
            return expired + original(self, e)
        return method
    wrap(pc.PrefillCore, "_on_Tick", make_tick)
    wrap(pc.PrefillCore, "_on_SendChunk", make_chunk)


@_spec("waiting-timeout-reason-dropped", "R-REASON-1",
       "bug: a decode room failed by the waiting timeout is marked Failed with an empty failure reason",
       "like: common/conn.py _check_waiting_timeout calls record_failure before update_status; paths that call "
       "update_status(Failed) alone (Mooncake/Mori ABORT handlers, docs/sglang-bugs.md B11) leave none")
def _waiting_timeout_reason_dropped():
    # Bug: the Tick's Failed transitions lose their reason
    from backends.reference import decode_core as dc
    from backends.reference.shared_events import StatusChanged

    def make(original):
        def method(self, e):
            out = []
            for a in original(self, e):
                if isinstance(a, StatusChanged) and a.status == dc.KVPoll.Failed:
                    r = self.rooms.get(a.room)
                    if r is not None:
                        r.reason = ""
                    a = StatusChanged(a.room, a.status, "")
                out.append(a)
            return out
        return method
    wrap(dc.DecodeCore, "_on_Tick", make)


# ---- terminal statuses and reuse ------------------------------------------------------------

@_spec("local-abort-overrides-success", "R-TERM-1",
       "bug: the prefill scheduler's own abort of a request whose transfer already concluded Success sets the "
       "sender's status to Failed (before clear)",
       "like: common/conn.py CommonKVSender.abort -> update_status(room, Failed), and update_status writes "
       "Failed over any current status (only poll()'s cached conclude_state hides it)")
def _local_abort_overrides_success():
    # Bug: LocalAbort writes Failed without the terminal guard of _set
    from backends.reference import prefill_core as pc
    from backends.reference.shared_events import StatusChanged

    def make(original):
        def method(self, e):
            r = self.rooms.get(e.room)
            if r is not None and r.status == pc.KVPoll.Success:
                r.status, r.reason = pc.KVPoll.Failed, "aborted by the prefill"
                return [StatusChanged(e.room, pc.KVPoll.Failed, r.reason)]
            return original(self, e)
        return method
    wrap(pc.PrefillCore, "_on_LocalAbort", make)


@_spec("early-registration-one-per-room", "R-XFER-1",
       "bug: the prefill parks at most one early registration per room (the latest), so when several decode "
       "ranks of a room register before the sender exists, all but the last are lost and the room waits in "
       "Bootstrapping for them until the bootstrap timeout",
       "like: common/conn.py keeps early registrations in transfer_infos[room] keyed by the decode endpoint; a "
       "backend whose pre-sender table holds one entry per room")
def _early_registration_one_per_room():
    # Bug: registrations[room] is replaced, not extended, when a registration beats its sender
    from backends.reference import prefill_core as pc

    def make(original):
        def method(self, e):
            key = (e.room, e.decode, e.generation)
            if e.room not in self.rooms and key not in self.tombstones and key not in self.retired:
                self.registrations[e.room] = {e.decode: (e, self.clock)}
                return []
            return original(self, e)
        return method
    wrap(pc.PrefillCore, "_on_DecodeRegistered", make)
