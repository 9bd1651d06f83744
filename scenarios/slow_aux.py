"""slow-aux: the room's aux data reaches the decode a second after its KV pages.

The prefill's aux data (the request's metadata slot: first output token, logprobs)
travels on whatever path the backend uses, an engine write or a control message on
a connection of its own, and the fault holds it ``AUX_DELAY_S`` seconds on that path
(what arrives behind it on the same connection waits too). The decode scheduler
reads the aux slot as soon as its poll says Success, so the pools are verified right
at the decode's first Success (R-XFER-2), and once more after the delay has passed
(R-LAYOUT-1: the bytes land, late or not).

PASS iff both sides reach Success and both verifications find every byte in place.
"""

from __future__ import annotations

import random

from harness.judge import checks as c
from harness.spec.protocol import KVPoll
from harness.spec.scenario import Scenario, register
from harness.spec.steps import (AwaitStatus, EngineFaults, InitSender, OpenRoom, RequestKV, SendChunk, Sleep,
                                StartRoles, VerifyPools)
from scenarios import _flows as flows

LAYOUT = flows.LAYOUT
NUM_PAGES = 4
AUX_DELAY_S = 1.0  # far above the few milliseconds between a Success poll and the verification


def _plan(seed: int):
    """Room id, scattered source/destination pages and aux slots."""
    rng = random.Random(seed)
    room = rng.randrange(1, 2**62)
    src = sorted(rng.sample(range(LAYOUT.num_pages), NUM_PAGES))
    dst = rng.sample(range(LAYOUT.num_pages), NUM_PAGES)
    return room, src, dst, rng.randrange(LAYOUT.aux_slots), rng.randrange(LAYOUT.aux_slots)


def steps(seed: int):
    room, src, dst, aux_src, aux_dst = _plan(seed)
    at_success = VerifyPools(tuple(zip(src, dst)), ((aux_src, aux_dst),), settle_s=0.0)
    settled = VerifyPools(tuple(zip(src, dst)), ((aux_src, aux_dst),))
    return [
        StartRoles(layout=LAYOUT),
        EngineFaults("prefill", aux_delay_s=AUX_DELAY_S),
        OpenRoom(room),
        RequestKV(room, tuple(dst), aux_dst),
        AwaitStatus(room, "prefill", (KVPoll.WaitingForInput, KVPoll.Failed)),
        InitSender(room, NUM_PAGES, aux_src),
        SendChunk(room, tuple(src)),
        AwaitStatus(room, "decode", (KVPoll.Success, KVPoll.Failed), label="decode-done"),
        at_success,  # what the decode scheduler reads at that poll: no second look
        AwaitStatus(room, "prefill", (KVPoll.Success, KVPoll.Failed)),
        Sleep(AUX_DELAY_S + 0.5),
        settled,  # the aux has landed by now, wherever it went
    ]


def checks(seed: int):
    room = _plan(seed)[0]
    return [
        c.Check("steps-complete", "R-XFER-1", c.steps_completed()),
        c.Check("prefill-success", "R-XFER-1", c.reached_status(room, "prefill", KVPoll.Success)),
        c.Check("decode-success", "R-XFER-1", c.reached_status(room, "decode", KVPoll.Success)),
        c.Check("bytes-at-success", "R-XFER-2", c.pools_exact(which=0)),
        c.Check("bytes-exact", "R-LAYOUT-1", c.pools_exact()),
        c.Check("no-dead-thread", "R-LIVE-2", c.no_dead_threads()),
        c.Check("loops-alive", "R-LIVE-2", c.loops_alive()),
    ]


SCENARIO = register(
    Scenario(
        id="slow-aux",
        title="The aux data arrives a second after the KV: the decode says Success only once it has landed",
        steps=steps,
        checks=checks,
        timeout_s=150.0,
    )
)
