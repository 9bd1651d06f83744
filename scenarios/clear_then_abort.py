"""clear-then-abort: the prefill clears a room while its writes are in flight, then
the decode's ABORT arrives; and an ABORT for a room the prefill never served.

Deferred KV release on (``SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE=1``;
UNSUPPORTED without it); every prefill transfer delayed 1 s.

* Room ``cleared``: its whole request is sent, the prefill's scheduler clears the
  room while the writes are in the engine, then the decode aborts it.  Exactly one
  ABORT_ACK, not before the writes could have completed (R-ABORT-2, R-STALE-1).
* Room ``unserved``: the decode registers it but the prefill never creates a
  sender; the decode aborts it.  Nothing was written, so the ABORT is answered at
  once (one ACK within 2 s) and harmlessly: the prefill's loops live on and a new
  room completes (R-ABORT-2, R-ABORT-1, R-LIVE-2).
"""

from __future__ import annotations

from harness.judge import checks as c
from harness.spec.protocol import KVPoll
from harness.spec.scenario import Scenario, register
from harness.spec.steps import (
    Abort,
    AwaitStatus,
    Clear,
    EngineFaults,
    OpenRoom,
    RequestKV,
    RequireFact,
    Sleep,
    StartRoles,
)
from scenarios._flows import (
    LAYOUT,
    RoomAllocator,
    full_room,
    open_and_request,
    pair_healthy,
    room_succeeds,
    send_all,
    verify,
)
from scenarios.abort_ack_after_drain import DELAY_S, ENV, NO_DEFERRED, ack_arrives, acks_safe

PROMPT_S = 2.0


def _plan(seed: int):
    planner = RoomAllocator(seed)
    return planner.room(6, chunks=2), planner.room(), planner.room()


def steps(seed: int):
    cleared, unserved, after = _plan(seed)
    return [
        StartRoles(layout=LAYOUT, env=ENV),
        RequireFact("prefill", "deferred_release", NO_DEFERRED),
        RequireFact("decode", "deferred_release", NO_DEFERRED),
        *open_and_request(cleared),
        EngineFaults("prefill", delay_s=DELAY_S),
        *send_all(cleared),
        AwaitStatus(cleared.room, "prefill", (KVPoll.Transferring, KVPoll.Success, KVPoll.Failed),
                    timeout_s=2.0, must_come=False),
        Sleep(0.3),  # the writes are in the engine
        Clear(cleared.room, "prefill"),
        Abort(cleared.room, "decode"),
        AwaitStatus(cleared.room, "decode", (KVPoll.Failed, KVPoll.Success), timeout_s=5.0, must_come=False),
        Sleep(DELAY_S * 3),  # drain, and time for a duplicate ACK to show
        EngineFaults("prefill"),
        # a room the prefill never opens a sender for
        OpenRoom(unserved.room, open_sender=False),
        RequestKV(unserved.room, unserved.dst, unserved.aux_dst),
        AwaitStatus(unserved.room, "decode", (KVPoll.WaitingForInput, KVPoll.Failed), timeout_s=5.0, must_come=False),
        Sleep(0.3),  # the registration has reached the prefill
        Abort(unserved.room, "decode"),
        Sleep(PROMPT_S),
        *full_room(after),
        verify([after], unchecked_kv=cleared.dst, unchecked_aux=(cleared.aux_dst,)),
    ]


def ack_soon(room: int, after_op: str, role: str, bound_s: float, decode: str = "decode"):
    """One ABORT_ACK for ``room`` from each sender (prefill rank) reached ``decode`` within ``bound_s`` seconds of
    ``role``'s ``after_op`` for the room (history times are the driver's clock, ACK
    times wall clock: compared through the op's own wall-clock stamp)."""

    def fn(events):
        acks = c.abort_acks(events, decode, room)
        op = c.first_event(events, after_op, role, room)
        if op is None:
            return False, f"{role} never completed {after_op} for room {room}"
        if not acks:
            return False, f"{decode} received no ABORT_ACK for room {room}"
        senders = [a.get("sender") for a in acks]  # each prefill rank or stage ACKs for itself
        if len(senders) > len(set(senders)):
            return False, (f"{decode} received {len(acks)} ABORT_ACKs for room {room} from {len(set(senders))} "
                           "sender(s), expected one each")
        wall = op.get("wall")
        if wall is None:
            return None, "the history has no wall-clock stamp to time the ACK against"
        latency = max(a["t"] for a in acks) - wall
        if latency > bound_s:
            return False, f"the ABORT_ACK for room {room} came {latency:.1f} s after the ABORT (allowed {bound_s:g} s)"
        return True, f"one ABORT_ACK for room {room}, {max(latency, 0.0):.2f} s after the ABORT returned"

    return c.timing_bound(fn)


def checks(seed: int):
    cleared, unserved, after = _plan(seed)
    return [
        c.Check("cleared-ack-after-drain-at-most-once", "R-ABORT-2", acks_safe(cleared.room)),
        c.Check("cleared-ack-sent", "R-ABORT-2", ack_arrives(cleared.room)),
        c.Check("cleared-decode-failed", "R-ABORT-1", c.reached_status(cleared.room, "decode", KVPoll.Failed)),
        c.Check("unserved-answered-at-once", "R-ABORT-2", ack_soon(unserved.room, "abort", "decode", PROMPT_S)),
        *room_succeeds(after, "R-ABORT-1", "room-after-aborts"),
        *pair_healthy(),
    ]


SCENARIO = register(
    Scenario(
        id="clear-then-abort",
        title="Deferred release: clear with writes in flight then ABORT gets one ACK after the drain; "
              "an ABORT for an unserved room is answered at once",
        steps=steps,
        checks=checks,
        timeout_s=150.0,
        topologies=(("p1-d1",), "its delayed writes and ABORT_ACK timing assume one transfer per chunk; head-sliced TP writes are several, so the delays reach the next room"),
    )
)
