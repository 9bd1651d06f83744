"""failure-fan-out: a room with two decode destinations; a failure on one reaches both.

Two decode ranks (``decode-0``, ``decode-1``, as when the decode's attention TP is
twice the prefill's) each register their own pages for the same room.  Room
``healthy`` must complete on the prefill and on both decodes, each decode's pools
byte-exact (R-XFER-1, R-LAYOUT-1).  Room ``broken``: the first write (to one
destination) fails in the engine; both decodes must see Failed within 2 s of
the chunk, not after a timeout (R-FANOUT-1).

The decodes are attention-TP ranks 0 and 1 of one decode (TP 2) over a TP 1
prefill.  The layout is MLA: sglang then copies the whole KV to each rank
(``_kv_replica_factor``, common/conn.py), where MHA would slice the heads.
"""

from __future__ import annotations

from dataclasses import replace

from harness.judge import checks as c
from harness.spec.protocol import KVPoll
from harness.spec.scenario import Scenario, register
from harness.spec.steps import (
    AwaitStatus,
    EngineFaults,
    InitSender,
    OpenRoom,
    OpenSender,
    RequestKV,
    SendChunk,
    StartRoles,
    VerifyPools,
)
from scenarios._flows import DONE, LAYOUT, RoomAllocator, pair_healthy

DECODES = ("decode-0", "decode-1")
PROMPT_S = 2.0
MLA_LAYOUT = replace(LAYOUT, mla=True)


def _plan(seed: int):
    planner = RoomAllocator(seed)
    healthy, broken = planner.room(), planner.room()
    # the second rank's destination pages and aux slots, drawn from its own pool
    other = RoomAllocator(seed + 1)
    return healthy, broken, other.room(len(healthy.src)), other.room(len(broken.src))


def _room(p, q) -> list:
    """Open ``p`` for both decode ranks: decode-0 takes ``p``'s pages, decode-1 ``q``'s."""
    return [
        OpenSender(p.room, destinations=2),
        OpenRoom(p.room, decode=DECODES[0], open_sender=False),
        RequestKV(p.room, p.dst, p.aux_dst, decode=DECODES[0]),
        OpenRoom(p.room, decode=DECODES[1], open_sender=False),
        RequestKV(p.room, q.dst, q.aux_dst, decode=DECODES[1]),
        AwaitStatus(p.room, "prefill", (KVPoll.WaitingForInput, KVPoll.Failed), timeout_s=5.0, must_come=False),
        InitSender(p.room, len(p.src), p.aux_src),
        *[SendChunk(p.room, chunk) for chunk in p.chunks],
        AwaitStatus(p.room, "prefill", DONE),
        *[AwaitStatus(p.room, d, DONE) for d in DECODES],
    ]


def steps(seed: int):
    healthy, broken, healthy_1, broken_1 = _plan(seed)
    return [
        StartRoles(layout=MLA_LAYOUT, decodes=DECODES, decode_attn_tp=len(DECODES)),
        *_room(healthy, healthy_1),
        EngineFaults("prefill", fail_nth=1),
        *_room(broken, broken_1),
        VerifyPools(tuple(healthy.kv_moves), ((healthy.aux_src, healthy.aux_dst),), decode=DECODES[0],
                    unchecked_kv=broken.dst, unchecked_aux=(broken.aux_dst,)),
        VerifyPools(tuple(zip(healthy.src, healthy_1.dst)), ((healthy.aux_src, healthy_1.aux_dst),),
                    decode=DECODES[1], unchecked_kv=broken_1.dst, unchecked_aux=(broken_1.aux_dst,)),
    ]


def checks(seed: int):
    healthy, broken, _, _ = _plan(seed)
    out = [c.Check("healthy-prefill-success", "R-XFER-1", c.reached_status(healthy.room, "prefill", KVPoll.Success))]
    for d in DECODES:
        out += [
            c.Check(f"healthy-{d}-success", "R-XFER-1", c.reached_status(healthy.room, d, KVPoll.Success)),
            c.Check(f"{d}-bytes-exact", "R-LAYOUT-1", c.pools_exact(decode=d)),
            c.Check(f"broken-{d}-failed-promptly", "R-FANOUT-1",
                    c.failed_within(broken.room, d, "send_chunk", "prefill", 0, PROMPT_S, need_reason=False)),
        ]
    return out + [
        *pair_healthy(bytes_exact=False),
    ]


SCENARIO = register(
    Scenario(
        id="failure-fan-out",
        title="A room with two decode destinations: both complete, and a failure on one reaches both within 2 s",
        steps=steps,
        checks=checks,
        timeout_s=150.0,
        topologies=(("p1-d1",), "it starts its own decode attention-TP ranks, one role each (decode_attn_tp)"),
    )
)
