"""lost-*: one kind of control message of one room is lost on its way; the room still
concludes, and the pair still serves (R-LOSS-1).

sglang #29978: a lost STAGING_RSP or WATERMARK hung a transfer for ever.  Each scenario has
the sending role lose every message of one kind for room ``lost`` (harness.role.message_loss,
at the sender's ``zmq`` send: the message never leaves), then runs the room to its end as a
scheduler would:

* ``lost-registration``: the decode's registration of the room (its destination pages) never
  reaches the prefill;
* ``lost-status``: no KV status of the room reaches the decode (its Success included);
* ``lost-aux-data``: the room's AUX_DATA message never reaches the decode (backends that send
  the aux as a message: Mori by default, Mooncake with ``SGLANG_MOONCAKE_SEND_AUX_TCP``, which
  the scenario sets; UNSUPPORTED where the engine writes the aux);
* ``lost-abort``: the decode aborts the room after registering it, and its ABORT never reaches
  the prefill, whose scheduler goes on sending the room's chunks; ``lost-abort-deferred-release``
  the same with deferred KV release on, where the decode's abort waits for the prefill's answer
  (its ABORT_ACK) and the abort path is another one.

Bootstrap and waiting timeouts are 3 s.  Each side of the lost room must conclude within both
timeouts plus 5 s of the room's request (:data:`BOUND_S`): Failed with a reason, or Success
with every byte in place (checked on the room's own verification, taken with no settle, and by
the generic ``bytes-in-place-at-success``); then the loss is healed and a later room succeeds.
"""

from __future__ import annotations

from harness.judge import checks as c
from harness.judge import fault_checks as fc
from harness.spec.protocol import KVPoll
from harness.spec.scenario import Scenario, register
from harness.spec.steps import Abort, AwaitStatus, LoseMessages, OpenRoom, RequestKV, StartRoles, VerifyPools
from scenarios._flows import DONE, LAYOUT, RoomAllocator, full_room, pair_healthy, room_succeeds, send_all, verify

TIMEOUT_S = 3
SLACK_S = 5.0
#: seconds from the lost room's request within which each side must conclude
BOUND_S = 2 * TIMEOUT_S + SLACK_S
ENV = (("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", str(TIMEOUT_S)),
       ("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", str(TIMEOUT_S)),
       ("SGLANG_MOONCAKE_SEND_AUX_TCP", "true"))
#: scenario id -> (the role that sends the kind, the kind)
LOSSES = {"lost-registration": ("decode", "registration"), "lost-status": ("prefill", "status"),
          "lost-aux-data": ("prefill", "aux_data"), "lost-abort": ("decode", "abort"),
          "lost-abort-deferred-release": ("decode", "abort")}
DEFERRED = (("SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE", "1"),)


def _plan(seed: int):
    planner = RoomAllocator(seed)
    return planner.room(), planner.room()


def steps(seed: int, sid: str):
    lost, later = _plan(seed)
    sender, kind = LOSSES[sid]
    abort = [Abort(lost.room, "decode")] if kind == "abort" else []
    return [
        StartRoles(layout=LAYOUT, env=ENV + (DEFERRED if sid.endswith("-deferred-release") else ())),
        LoseMessages(sender, kind, room=lost.room, count=0),
        OpenRoom(lost.room),
        RequestKV(lost.room, lost.dst, lost.aux_dst),
        *abort,
        AwaitStatus(lost.room, "prefill", (KVPoll.WaitingForInput, *DONE), timeout_s=TIMEOUT_S + SLACK_S),
        *send_all(lost),
        AwaitStatus(lost.room, "decode", DONE, timeout_s=BOUND_S + 2, label="lost-decode"),
        AwaitStatus(lost.room, "prefill", DONE, timeout_s=BOUND_S + 2, label="lost-prefill"),
        VerifyPools(lost.kv_moves, ((lost.aux_src, lost.aux_dst),), settle_s=0.0, label="lost-room"),
        LoseMessages(sender, None),
        *full_room(later),
        # the lost room's pages may hold its bytes or not: only the later room's and the rest are judged
        verify([later], unchecked_kv=lost.dst, unchecked_aux=(lost.aux_dst,)),
    ]


def checks(seed: int, sid: str):
    lost, later = _plan(seed)
    kind = LOSSES[sid][1]
    ends = [c.Check(f"lost-room-{side}-concludes", "R-LOSS-1",
                    fc.concluded_within(lost.room, side, "request_kv", "decode", BOUND_S))
            for side in ("decode", "prefill")]
    if kind == "abort":  # the decode's own abort() ends its room Failed, lost ABORT or not (R-ABORT-1)
        ends.append(c.Check("lost-abort-decode-failed", "R-LOSS-1", c.status_at("lost-decode", (KVPoll.Failed,))))
    # an aborted room is Failed on the decode by its own abort(): its bytes are not owed
    exact = [] if kind == "abort" else [c.Check("lost-room-exact-or-failed", "R-LOSS-1",
                                                fc.exact_or_failed(lost.room, "decode", 0))]
    return [*ends, *exact, *room_succeeds(later, "R-LOSS-1", "later-room"), *pair_healthy()]


def _scenario(sid: str) -> Scenario:
    sender, kind = LOSSES[sid]
    return register(Scenario(
        id=sid,
        title=f"Every {kind} message of one room lost at the {sender}: the room concludes, the pair serves on",
        steps=lambda seed: steps(seed, sid),
        checks=lambda seed: checks(seed, sid),
        timeout_s=120.0,
        timeout_wait_s=TIMEOUT_S,
        topologies=(("p1-d1",), "one prefill and one decode show a lost message; its kinds are the same on every shape"),
    ))


SCENARIOS = [_scenario(sid) for sid in LOSSES]
