"""dead-decode: one of two decodes dies; the prefill fails its rooms and serves the other.

The prefill holds three rooms of decode A, all registered: one with its first chunk
written (Transferring), one with nothing written yet (WaitingForInput), one concluded
(Success on both sides, not yet cleared), and one room of decode B.  A's process is killed (SIGKILL).  The prefill's scheduler knows
nothing of it and sends every chunk still to send: the writes go to a dead peer.
Both of A's rooms must read Failed on the prefill, with a reason, within the waiting
timeout plus 5 s of their last chunk (written after the death), never Success (R-PEER-1,
R-REASON-1), while the concluded room stays Success on every later read, fresh reads of the
manager's table included (R-TERM-1, the generic every-trail-terminal); they are polled before B's rooms, so the first Failed read is not late for
waiting on B; B's
room, whose chunks come right after A's, completes, and a new room to B succeeds (R-PEER-1: the prefill's loops and
transfer worker survive the dead peer); once every room is cleared, no state of them is left
(R-RESIDUE-1, the generic post-condition).  sglang's prefill has no heartbeat to its
decodes, so only the failed writes can tell it.
"""

from __future__ import annotations

from dataclasses import replace

from harness.judge import checks as c
from harness.spec.protocol import KVPoll
from harness.spec.scenario import Scenario, register
from harness.spec.steps import AwaitStatus, Clear, InitSender, KillRole, SendChunk, Sleep, StartRoles
from scenarios._flows import (LAYOUT, RoomAllocator, await_done, open_and_request, pair_healthy,
                              room_succeeds, send_all, verify)

WIDE = replace(LAYOUT, aux_slots=8)  # five rooms, each its own aux slot
A, B = "decode-a", "decode-b"
TIMEOUT_S = 8  # the waiting timeout (R-TIMEOUT-3's bound is it plus SLACK_S); B's rooms are served well inside it
SLACK_S = 5.0
ENGINE_TIMEOUT_S = 6  # Mooncake's own limit for a synchronous batch (MC_TRANSFER_TIMEOUT); others ignore it
#: each side of B's rooms (seconds): the spec bounds no delay the dead peer may cause them (NIXL's
#: prefill waits out a failed transfer's other handles), only that they are served
OTHER_ROOM_S = 15.0
ENV = (("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", str(TIMEOUT_S)), ("MC_TRANSFER_TIMEOUT", str(ENGINE_TIMEOUT_S)))


def _plan(seed: int):
    planner = RoomAllocator(seed, WIDE)
    return (planner.room(decode=A), planner.room(decode=A, chunks=2), planner.room(decode=B),
            planner.room(decode=B), planner.room(decode=A))


def steps(seed: int):
    a_waiting, a_transferring, b_held, b_new, a_done = _plan(seed)
    bound = TIMEOUT_S + SLACK_S + 2
    return [
        StartRoles(decodes=(A, B), layout=WIDE, env=ENV),
        *open_and_request(a_done), *send_all(a_done), *await_done(a_done),  # concluded before the kill
        *open_and_request(a_waiting),
        *open_and_request(a_transferring),
        InitSender(a_transferring.room, len(a_transferring.src), a_transferring.aux_src),
        SendChunk(a_transferring.room, a_transferring.chunks[0]),
        AwaitStatus(a_transferring.room, "prefill", (KVPoll.Transferring, KVPoll.Success, KVPoll.Failed),
                    timeout_s=2.0, must_come=False),
        *open_and_request(b_held),
        Sleep(0.3),  # the first chunk's write lands before the kill
        KillRole(A),
        *[SendChunk(a_transferring.room, chunk) for chunk in a_transferring.chunks[1:]],
        *send_all(a_waiting),
        *send_all(b_held),  # behind A's writes to the dead peer
        AwaitStatus(a_transferring.room, "prefill", (KVPoll.Failed, KVPoll.Success), timeout_s=bound),
        AwaitStatus(a_waiting.room, "prefill", (KVPoll.Failed, KVPoll.Success), timeout_s=bound),
        AwaitStatus(a_done.room, "prefill", (KVPoll.Success,), timeout_s=0.0, label="concluded-room-after-kill",
                    must_come=False),  # read again: R-TERM-1 (every-trail-terminal) judges it
        *await_done(b_held, OTHER_ROOM_S),
        *open_and_request(b_new), *send_all(b_new), *await_done(b_new, OTHER_ROOM_S),
        verify([b_held, b_new], decode=B),
        *[Clear(p.room, "prefill") for p in (a_waiting, a_transferring, a_done)],  # their decode is gone
        *[Clear(p.room, role) for p in (b_held, b_new) for role in ("prefill", B)],
    ]


def checks(seed: int):
    a_waiting, a_transferring, b_held, b_new, _ = _plan(seed)
    window = (0, TIMEOUT_S + SLACK_S)
    return [
        c.Check("transferring-room-failed", "R-PEER-1",
                c.failed_within(a_transferring.room, "prefill", "send_chunk", "prefill", *window, from_last=True)),
        c.Check("waiting-room-failed", "R-PEER-1",
                c.failed_within(a_waiting.room, "prefill", "send_chunk", "prefill", *window, from_last=True)),
        *room_succeeds(b_held, "R-PEER-1", "other-decode-room"),
        *room_succeeds(b_new, "R-PEER-1", "new-room-to-live-decode"),
        c.Check("bytes-exact", "R-LAYOUT-1", c.pools_exact(decode=B)),
        *pair_healthy(bytes_exact=False),
    ]


SCENARIO = register(
    Scenario(
        id="dead-decode",
        title="Decode A is killed: the prefill fails A's rooms as their writes meet a dead peer, and serves decode B",
        steps=steps,
        checks=checks,
        timeout_s=180.0,
    )
)
