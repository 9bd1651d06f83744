"""Blind set 6, transfer path: planted bugs in how the reference moves a room's bytes (layouts,
TP head slices, draft KV, MLA, DP routing, aux, completions and their fan-out), written from
docs/protocol.md and sglang's disaggregation code without reading pdconform's checks,
scenarios or the other mutant sets (backends/reference/mutants/blind.py).

Each bug leaves the simplest path (one room, p1-d1, no faults) working with correct bytes; it
shows on a wider shape, a second room in flight, a slow or failed write, a dead peer.
"""

from __future__ import annotations

from backends.reference.mutants._base import wrap
from backends.reference.mutants.blind import planted

_spec = planted("blind-6")


@_spec("tp-head-slice-offset-from-decode-start", "R-LAYOUT-1",
       "bug: when a decode rank holds only some of a prefill rank's KV heads, the slice it cuts "
       "out of each token is offset by the decode rank's own first head instead of the prefill "
       "rank's, so decode TP rank 1 of p1-d2 (heads 2-3) lands heads 0-1; with a prefill "
       "narrower than the decode's heads (p2-d1) the slice is empty and the write is dropped. "
       "Shows only on heterogeneous TP (p1-d2, p2-d4, p4-d2, p2-d1); p1-d1 and MLA never slice.",
       "like: mooncake/conn.py send_kvcache_slice (src_head_start_offset / dst_head_start_offset "
       "computed from the wrong side's rank)")
def _tp_head_slice_offset():
    from backends.reference import landing

    def shared_heads(tensor, pages, mine, source):
        size = mine.page_size
        head = mine.page_bytes // (size * mine.kv_heads)
        first = max(mine.head_start, source.head_start)
        last = min(mine.head_start + mine.kv_heads, source.head_start + source.kv_heads)
        if first >= last:
            return None
        src = pages.view(pages.shape[0], size, source.kv_heads, head)
        # the bug: the source slice is indexed with the destination's head offset
        return (first, last, tensor.view(tensor.shape[0], size, mine.kv_heads, head),
                src[:, :, first - mine.head_start:last - mine.head_start])

    landing.shared_heads = shared_heads


@_spec("draft-v-block-shifted-by-draft-layers", "R-LAYOUT-2",
       "bug: on an MHA decode that holds draft KV, the destination index of each main-layer V "
       "buffer is shifted by the decode's draft layer count (the author assumed the buffer list "
       "is [K main, K draft, V main, V draft]), so main V pages land in the wrong layer's V or in "
       "the draft K buffers. Shows only when the decode has draft layers; without draft KV the "
       "shift is 0.",
       "like: PR #35281 (Mori draft-KV V offset); mooncake/conn.py get_mha_kv_ptrs_with_pp "
       "half-splitting kv_data_ptrs that carry draft buffers")
def _draft_v_shift():
    from backends.reference import landing
    from harness.spec.layout_plan import BufferPair, Plan

    def make(original):
        def apply_write(buffers, mine, plan, source, aux, dst, payload):
            if plan is not None and not aux and not mine.mla and mine.draft_layers:
                plan = Plan(tuple(BufferPair(p.src, p.dst + mine.draft_layers, p.buffer)
                                  if p.buffer.kind == "V" and not p.buffer.draft else p for p in plan.pairs))
            return original(buffers, mine, plan, source, aux, dst, payload)
        return apply_write

    wrap(landing, "apply_write", make)


@_spec("aux-sent-to-first-decode-rank-only", "R-XFER-2",
       "bug: the prefill writes a room's aux slot once, to the first decode rank that registered, "
       "and still counts the room done for every rank, so the other decode ranks of a wider "
       "decode read Success with their aux slot never written. Shows only when one prefill rank "
       "has several destinations (p1-d2, p2-d4, p1-d4-kv2, p1-d2-kv1).",
       "like: mooncake/conn.py transfer_worker (send_aux on is_last issued for one entry of "
       "transfer_infos[room] instead of every target)")
def _aux_first_rank_only():
    from backends.reference import prefill_core as pc

    def make(original):
        def _on_SendChunk(self, e):
            actions = original(self, e)
            r = self.rooms.get(e.room)
            if r is None or len(r.dests) < 2:
                return actions
            first = next(iter(r.dests))
            kept = []
            for a in actions:
                if isinstance(a, pc.StartWrite) and a.aux and a.decode != first:
                    r.outstanding.discard(a.write_id)
                    self.issued.pop(a.write_id, None)
                    continue
                kept.append(a)
            if r.last_sent:
                kept += self._maybe_success(e.room, r)
            return kept
        return _on_SendChunk

    wrap(pc.PrefillCore, "_on_SendChunk", make)


@_spec("transfer-deadline-tracks-newest-write", "R-TIMEOUT-3",
       "bug: the prefill keeps one transfer deadline per room, re-armed by each new write and "
       "dropped when that newest write completes, so a stuck earlier write whose later writes "
       "(the aux) completed is never declared lost: the room hangs in Transferring on both "
       "sides. Shows only when one write of a room is held while later ones complete; if every "
       "write is stuck the newest one's deadline still fires.",
       "like: nixl/conn.py _await_handles (handles polled with no deadline) and a per-room "
       "deadline dict overwritten per chunk in a transfer worker")
def _deadline_newest_write():
    from backends.reference import prefill_core as pc
    from harness.spec.protocol import KVPoll

    newest: dict = {}  # id(core) -> {room: write id}: the room's one deadline

    def table(core) -> dict:
        return newest.setdefault(id(core), {})

    def make_write(original):
        def _write(self, room, r, decode, src, dst, aux):
            action = original(self, room, r, decode, src, dst, aux)
            table(self)[room] = action.write_id
            return action
        return _write

    def make_done(original):
        def _on_WriteDone(self, e):
            if table(self).get(e.room) == e.write_id:
                del table(self)[e.room]
            return original(self, e)
        return _on_WriteDone

    def make_clear(original):
        def _on_Clear(self, e):
            table(self).pop(e.room, None)
            return original(self, e)
        return _on_Clear

    def _expire_writes(self, now):
        if self.transfer_timeout_s is None:
            return []
        actions = []
        for write_id, (room, issued, decode) in list(self.issued.items()):
            if issued is None:
                self.issued[write_id] = (room, now, decode)
                continue
            if table(self).get(room) != write_id:  # the bug: only the room's newest write has a deadline
                continue
            if now - issued < self.transfer_timeout_s:
                continue
            del self.issued[write_id]
            table(self).pop(room, None)
            drain = self.draining.get(room)
            if drain is not None and write_id in drain.outstanding:
                drain.outstanding.discard(write_id)
                actions += self._finish_drain(room, drain)
            r = self.rooms.get(room)
            if r is not None and write_id in r.outstanding:
                r.outstanding.discard(write_id)
                actions += self._set(room, r, KVPoll.Failed, f"write {write_id} did not complete within the transfer "
                                                             f"timeout of {self.transfer_timeout_s:g} s")
        return actions

    wrap(pc.PrefillCore, "_write", make_write)
    wrap(pc.PrefillCore, "_on_WriteDone", make_done)
    wrap(pc.PrefillCore, "_on_Clear", make_clear)
    pc.PrefillCore._expire_writes = _expire_writes


@_spec("prefill-dp-rank-from-decode-dp-size", "R-DP-1",
       "bug: the decode resolves which prefill DP engine serves a room as room mod its *own* DP "
       "size instead of the prefill's (from the bootstrap server), so with a DP prefill and a "
       "single decode every room goes to prefill engine 0, and with a DP decode and a single "
       "prefill odd rooms find no prefill engine at all. Shows only when either side runs DP "
       "(p1dp2-d1, p1-d1dp2); DP 1 on both sides gives engine 0 either way.",
       "like: decode.py _resolve_prefill_dp_rank (using the decode's dp_size where the "
       "prefill's, read from the bootstrap server, is needed)")
def _dp_rank_from_decode():
    from backends.reference import adapter

    own = {"dp": 1}

    def make_start(original):
        def start_decode(self, layout, bootstrap_port, attn_tp=(1, 0), dp=(1, 0)):
            own["dp"] = max(1, int(dp[0]))
            return original(self, layout, bootstrap_port, attn_tp, dp)
        return start_decode

    def room_engine(stages, room):
        return [st for st in stages if int(st.get("dp_rank", 0)) == room % own["dp"]]

    wrap(adapter.ReferenceRole, "start_decode", make_start)
    adapter.room_engine = room_engine


@_spec("write-failure-told-to-its-own-rank-only", "R-FANOUT-1",
       "bug: when one write of a room fails, the prefill marks the room Failed but sends the "
       "failure STATUS only to the decode rank that write was for; the room's other decode ranks "
       "hear nothing and wait out their waiting timeout. Shows only with several decode ranks per "
       "prefill rank (p1-d2, p2-d4) and a failed write (engine fault, dead decode rank).",
       "like: common/conn.py _room_notify_targets (failure sent to the failing session's "
       "endpoint rather than every entry of transfer_infos[room])")
def _fanout_own_rank():
    from backends.reference import prefill_core as pc

    def make(original):
        def _on_WriteDone(self, e):
            failing = self.issued.get(e.write_id, (None, None, None))[2]
            actions = original(self, e)
            if e.ok or failing is None:
                return actions
            return [a for a in actions if not (isinstance(a, pc.SendStatus) and a.decode != failing)]
        return _on_WriteDone

    wrap(pc.PrefillCore, "_on_WriteDone", make)


@_spec("idle-mla-rank-waits-for-registration", "R-XFER-1",
       "bug: a prefill TP rank that no decode rank takes KV from (MLA's extra ranks, a "
       "replicated KV head) is opened as if one decode rank would register, so it waits in "
       "Bootstrapping and fails at the bootstrap timeout instead of concluding after its last "
       "chunk. Shows only on MLA or replicated-head prefills of TP > 1 (p2-d1-mla, p2-d2-mla, "
       "p2-d1-kv1).",
       "like: common/conn.py CommonKVSender (required_dst_info_num taken as at least 1; sglang's "
       "decode sends dummy registrations so such ranks can finish)")
def _idle_mla_rank():
    from backends.reference import prefill_core as pc

    def make(original):
        def _on_OpenSender(self, e):
            if e.destinations < 1:
                e = pc.OpenSender(e.room, e.now, 1)
            return original(self, e)
        return _on_OpenSender

    wrap(pc.PrefillCore, "_on_OpenSender", make)


@_spec("chunk-for-failed-room-still-written", "R-STALE-1",
       "bug: the transfer path drops a queued chunk only when its room is gone; a chunk of a room "
       "that is still held but already Failed (aborted by the decode, a failed write, a timeout) "
       "is still written into the decode's pages, after the ABORT_ACK may have released them. "
       "Shows only when chunks are queued behind an abort or failure mid-transfer (multi-chunk "
       "rooms).",
       "like: mori/conn.py _run_chunk and nixl/conn.py transfer_worker (checking the room is "
       "known, not that it is still live)")
def _chunk_failed_room():
    from backends.reference import prefill_core as pc
    from harness.spec.protocol import KVPoll

    def make(original):
        def _on_SendChunk(self, e):
            r = self.rooms.get(e.room)
            if r is None or r.status != KVPoll.Failed or not r.dests or r.num_pages is None:
                return original(self, e)
            end = r.sent + len(e.pages)
            actions = []
            for decode, d in r.dests.items():
                if e.pages and end <= len(d.dst_pages):
                    actions.append(self._write(e.room, r, decode, e.pages, d.dst_pages[r.sent:end], aux=False))
                if e.last and r.src_aux is not None:
                    actions.append(self._write(e.room, r, decode, (r.src_aux,), (d.dst_aux,), aux=True))
            r.sent = end
            r.last_sent = r.last_sent or e.last
            return actions
        return _on_SendChunk

    wrap(pc.PrefillCore, "_on_SendChunk", make)


@_spec("aux-counted-done-when-queued", "R-XFER-2",
       "bug: the prefill counts a room's aux write complete as soon as it hands it to the engine "
       "(like a TCP aux send that returns 0 at once), so with a slow aux path it reports Success, "
       "and the decode reads Success, before the aux slot is in the decode's pool. Shows only "
       "when the aux write is delayed or lands after the KV (slow aux, delayed writes); on a "
       "plain path the aux frame still precedes the STATUS on the same connection.",
       "like: mooncake/conn.py send_aux_tcp (returns 0 after queuing AUX_DATA, the room is then "
       "concluded by sync_status_to_decode_endpoint)")
def _aux_done_when_queued():
    from backends.reference import adapter
    from backends.reference import prefill_core as pc

    def make_start(original):
        def _start_write(self, w):
            original(self, w)
            if w.aux:
                done = pc.WriteDone(w.room, w.write_id, True)
                self.side.submit(lambda: self._prefill_event(done))
        return _start_write

    def make_send(original):
        def _send_write(self, w):
            if w.aux and w.write_id not in self.prefill.issued:  # already "done": the engine still sends it
                self.prefill.issued[w.write_id] = (w.room, self.prefill.clock, w.decode)
                try:
                    return original(self, w)
                finally:
                    self.prefill.issued.pop(w.write_id, None)
            return original(self, w)
        return _send_write

    wrap(adapter.ReferenceRole, "_start_write", make_start)
    wrap(adapter.ReferenceRole, "_send_write", make_send)


@_spec("decode-success-on-first-prefill-rank", "R-XFER-2",
       "bug: the decode counts one Success STATUS as the room's, not one from each prefill rank it "
       "takes KV from, so with several prefill ranks (PP stages or TP ranks) it reads Success "
       "when the fastest rank finishes while another rank's layers or heads are still in flight. "
       "Shows only when a room has several prefill sources (p1pp2-d1, p2-d1, p4-d2) and one of "
       "them is slower.",
       "like: common/conn.py CommonKVReceiver (required_prefill_response_num left at 1 / "
       "prefill_response_tracker not consulted before Success)")
def _decode_first_rank_success():
    from backends.reference import decode_core as dc
    from harness.spec.protocol import KVPoll

    def make(original):
        def _on_StatusReceived(self, e):
            r = self.rooms.get(e.room)
            if (r is not None and e.status == KVPoll.Success and r.prefill == e.prefill
                    and r.waiting_since is not None and e.generation == r.generation):
                r.succeeded.add(e.stage)
                actions = self._set(e.room, r, KVPoll.Success)
                return actions + ([dc.ReleaseSafe(e.room)] if actions else [])
            return original(self, e)
        return _on_StatusReceived

    wrap(dc.DecodeCore, "_on_StatusReceived", make)


@_spec("aux-index-kept-per-decode-session", "R-LAYOUT-1",
       "bug: the prefill keeps the decode's destination aux slot per decode endpoint (session) "
       "rather than per room, so a second room registered by the same decode before the first "
       "room's last chunk overwrites it and the first room's aux lands in the second room's aux "
       "slot. Shows only with several rooms from one decode in flight at once (load, concurrent "
       "rooms); a lone room is unaffected.",
       "like: mooncake/conn.py decode_kv_args_table (per-session KVArgsRegisterInfo) vs "
       "transfer_infos[room] (per-room dst_aux_index)")
def _aux_per_session():
    from backends.reference import prefill_core as pc
    from harness.spec.protocol import KVPoll

    def make(original):
        def _bind(self, room, r, reg):
            for other_room, other in self.rooms.items():
                d = other.dests.get(reg.decode)
                if other_room != room and d is not None and not other.last_sent \
                        and other.status not in (KVPoll.Success, KVPoll.Failed):
                    d.dst_aux = reg.aux_slot  # the session's aux index, overwritten by the newest room
            return original(self, room, r, reg)
        return _bind

    wrap(pc.PrefillCore, "_bind", make)


@_spec("decode-disconnect-flushes-writes-as-ok", "R-PEER-1",
       "bug: when the connection to a decode closes, the prefill's engine completes that decode's "
       "outstanding writes as successful (flushed) instead of failed, so rooms bound to a killed "
       "decode end Success on the prefill with bytes that never landed. Shows only when a decode "
       "dies with writes in flight.",
       "like: nixl/conn.py _await_handles / mooncake transfer_worker treating a torn-down "
       "connection's handles as done")
def _lost_decode_done():
    from backends.reference import prefill_core as pc

    def _on_DecodeLost(self, e):
        actions = []
        for write_id, (room, _, decode) in list(self.issued.items()):
            if decode == e.decode:
                actions += self.handle(pc.WriteDone(room, write_id, True))
        return actions

    pc.PrefillCore._on_DecodeLost = _on_DecodeLost
