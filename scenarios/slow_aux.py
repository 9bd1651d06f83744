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

from dataclasses import replace

from harness.judge import checks as c
from harness.spec.scenario import Scenario, register
from harness.spec.steps import AwaitStatus, EngineFaults, Sleep, StartRoles
from scenarios._flows import DONE, LAYOUT, RoomAllocator, open_and_request, pair_healthy, room_succeeds, send_all, verify

AUX_DELAY_S = 1.0  # far above the few milliseconds between a Success poll and the verification


def _room(seed: int):
    return RoomAllocator(seed).room(4, chunks=1)


def steps(seed: int):
    room = _room(seed)
    return [
        StartRoles(layout=LAYOUT),
        EngineFaults("prefill", aux_delay_s=AUX_DELAY_S),
        *open_and_request(room),
        *send_all(room),
        AwaitStatus(room.room, "decode", DONE),
        replace(verify([room]), settle_s=0.0),  # what the decode scheduler reads at that poll: no second look
        AwaitStatus(room.room, "prefill", DONE),
        Sleep(AUX_DELAY_S + 0.5),
        verify([room]),  # the aux has landed by now, wherever it went
    ]


def checks(seed: int):
    return [
        c.Check("steps-complete", "R-XFER-1", c.steps_completed()),
        *room_succeeds(_room(seed), "R-XFER-1", "room"),
        c.Check("bytes-at-success", "R-XFER-2", c.pools_exact(which=0)),
        *pair_healthy(),
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
