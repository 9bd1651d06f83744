"""happy-path: one bootstrap room, KV in two chunks over several layers, plus aux data.

PASS iff both sides reach Success and every byte is where it belongs: decode
layer l's K (V) destination pages hold prefill layer l's K (V) source pages, the
aux slot holds the prefill's aux slot, and every other page and slot is untouched.
Then both schedulers release the request (``clear``), as they do after a Success, so the
generic post-condition no-residue-after-clear (R-RESIDUE-1) judges what a finished
room leaves behind.
"""

from __future__ import annotations

import random

from harness.judge import checks as c
from harness.judge.topology_checks import served_on_room_engine
from harness.spec.protocol import KVPoll
from harness.spec.scenario import Scenario, register
from harness.spec.steps import AwaitStatus, Clear, InitSender, OpenRoom, RequestKV, SendChunk, StartRoles, VerifyPools
from scenarios import _flows as flows

LAYOUT = flows.LAYOUT
NUM_PAGES = 5


def _plan(seed: int):
    """Room id, scattered source/destination pages, aux slots and the two chunks."""
    rng = random.Random(seed)
    room = rng.randrange(1, 2**62)
    src = sorted(rng.sample(range(LAYOUT.num_pages), NUM_PAGES))
    dst = rng.sample(range(LAYOUT.num_pages), NUM_PAGES)
    aux_src, aux_dst = rng.randrange(LAYOUT.aux_slots), rng.randrange(LAYOUT.aux_slots)
    split = rng.randrange(1, NUM_PAGES)
    return room, src, dst, aux_src, aux_dst, (src[:split], src[split:])


def steps(seed: int):
    room, src, dst, aux_src, aux_dst, chunks = _plan(seed)
    return [
        StartRoles(layout=LAYOUT),
        OpenRoom(room),
        RequestKV(room, tuple(dst), aux_dst),
        AwaitStatus(room, "prefill", (KVPoll.WaitingForInput, KVPoll.Failed)),
        InitSender(room, NUM_PAGES, aux_src),
        *[SendChunk(room, tuple(chunk)) for chunk in chunks],
        AwaitStatus(room, "prefill", (KVPoll.Success, KVPoll.Failed)),
        AwaitStatus(room, "decode", (KVPoll.Success, KVPoll.Failed)),
        VerifyPools(tuple(zip(src, dst)), ((aux_src, aux_dst),)),
        # Success is terminal: polling again, after the pools were read, still says Success.
        AwaitStatus(room, "prefill", (KVPoll.Success, KVPoll.Failed), timeout_s=0.0, must_come=False),
        AwaitStatus(room, "decode", (KVPoll.Success, KVPoll.Failed), timeout_s=0.0, must_come=False),
        Clear(room, "prefill"),
        Clear(room, "decode"),
    ]


def checks(seed: int):
    room = _plan(seed)[0]
    return [
        c.Check("steps-complete", "R-XFER-1", c.steps_completed()),
        c.Check("prefill-success", "R-XFER-1", c.reached_status(room, "prefill", KVPoll.Success)),
        c.Check("decode-success", "R-XFER-1", c.reached_status(room, "decode", KVPoll.Success)),
        *(c.Check(f"{side}-served-on-room-engine", "R-DP-1", served_on_room_engine(room, side))
          for side in ("prefill", "decode")),
        c.Check("bytes-exact", "R-LAYOUT-1", c.pools_exact()),
        c.Check("success-stays", "R-TERM-1", c.stays_terminal(room, ("prefill", "decode"))),
        c.Check("no-dead-thread", "R-LIVE-2", c.no_dead_threads()),
        c.Check("loops-alive", "R-LIVE-2", c.loops_alive()),
    ]


SCENARIO = register(
    Scenario(
        id="happy-path",
        title="One room, KV in two chunks over several layers plus aux: both Success, every byte in place",
        steps=steps,
        checks=checks,
        timeout_s=150.0,
    )
)
