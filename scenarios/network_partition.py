"""network-partition: the network between prefill and decode fails mid-transfer, then heals.

Needs roles on two hosts (``run --hosts netns:2``; UNSUPPORTED otherwise).  Room ``cut``
has its first chunk written; then every packet between the prefill's host and the
decode's host is lost, both ways (the harness still reaches both), and the prefill sends
the rest of the room.  Both sides must end ``cut`` Failed, with a reason, in bounded
time: the decode within its heartbeat window plus 10 s (the prefill's health endpoint
stops answering; its probes go unanswered, R-HB-1), the prefill within the waiting timeout plus 5 s (its writes
never complete, R-TIMEOUT-3); never Success, since the rest of the room cannot have
landed (R-NET-1).  The network heals; a new room ``after`` must then succeed with every
byte in place (R-NET-1), and nothing else of the decode's pools may change.

network-partition-one-way is the same with only the packets from the prefill's host to
the decode's lost (the decode's still arrive, its answers do not): the same ends are
due, in the same bounds (R-NET-1).
"""

from __future__ import annotations

from harness.judge import checks as c
from harness.judge.fault_checks import failed_after
from harness.spec.protocol import KVPoll
from harness.spec.scenario import Scenario, register
from harness.spec.steps import AwaitStatus, InitSender, NetworkFault, SendChunk, Sleep, StartRoles
from scenarios._flows import DONE, LAYOUT, RoomAllocator, await_done, open_and_request, pair_healthy, room_succeeds, \
    send_all, verify

WAITING_TIMEOUT_S = 8
HEARTBEAT_WINDOW_S = 4.0  # the harness's SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL x MAX_FAILURE (role_context)
SLACK_S = 5.0
# R-HB-1's slack when the probes go unanswered (dropped, not refused): each failed probe first
# waits out its own timeout (sglang's: 2 s to connect, 3 s to read), so detection takes up to
# max failures x (interval + probe timeout): 10 s with the harness's 2 s x 2
UNANSWERED_SLACK_S = 10.0
ENV = (("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", str(WAITING_TIMEOUT_S)),)
NEEDS_HOSTS = "a network fault needs prefill and decode on two hosts: run with --hosts netns:2 (docs/cluster.md)"
#: what every scenario with a network fault between the prefill's and the decode's host declares
NETWORK_CELL = dict(
    timeout_s=150.0,
    tags=("network",),
    nightly=NEEDS_HOSTS,
    alone="its network fault between the prefill host and the decode host reaches every cell on them",
)


def _plan(seed: int):
    planner = RoomAllocator(seed)
    return planner.room(6, chunks=3), planner.room(4, chunks=2)


def steps(seed: int, both_ways: bool = True):
    cut, after = _plan(seed)
    bound = WAITING_TIMEOUT_S + 2 * SLACK_S
    return [
        StartRoles(layout=LAYOUT, env=ENV),
        *open_and_request(cut),
        InitSender(cut.room, len(cut.src), cut.aux_src),
        SendChunk(cut.room, cut.chunks[0]),
        AwaitStatus(cut.room, "prefill", (KVPoll.Transferring, KVPoll.Success, KVPoll.Failed), timeout_s=2.0,
                    must_come=False),
        Sleep(0.3),  # the first chunk lands before the cut
        NetworkFault("prefill", "decode", partition=True, both_ways=both_ways),
        *[SendChunk(cut.room, chunk) for chunk in cut.chunks[1:]],
        AwaitStatus(cut.room, "decode", DONE, timeout_s=bound),
        AwaitStatus(cut.room, "prefill", DONE, timeout_s=bound),
        NetworkFault("prefill", "decode"),  # healed
        Sleep(1.0),
        *open_and_request(after),
        *send_all(after),
        *await_done(after, timeout_s=15.0),
        verify([after], unchecked_kv=cut.dst, unchecked_aux=(cut.aux_dst,)),
    ]


def checks(seed: int):
    cut, after = _plan(seed)
    return [
        c.Check("steps-complete", "R-XFER-1", c.steps_completed()),
        c.Check("cut-decode-fails", "R-NET-1", failed_after(cut.room, "decode", "network", "prefill",
                                                             HEARTBEAT_WINDOW_S + UNANSWERED_SLACK_S)),
        c.Check("cut-prefill-fails", "R-NET-1", failed_after(cut.room, "prefill", "network", "prefill",
                                                              WAITING_TIMEOUT_S + SLACK_S)),
        *room_succeeds(after, "R-NET-1", "after-heal"),
        *pair_healthy(),
    ]


SCENARIO = register(
    Scenario(
        id="network-partition",
        title="Prefill and decode partitioned mid-transfer: the room fails on both sides in time; after the heal a new room succeeds",
        steps=steps,
        checks=checks,
        **NETWORK_CELL,
        topologies=(("p1-d1",), "the partition is between the one prefill host and the one decode host"),
    )
)

ONE_WAY = register(
    Scenario(
        id="network-partition-one-way",
        title="Only the prefill's packets to the decode are lost mid-transfer: the room fails on both sides in time; "
              "after the heal a new room succeeds",
        steps=lambda seed: steps(seed, both_ways=False),
        checks=checks,
        **NETWORK_CELL,
        topologies=(("p1-d1",), "the partition is between the one prefill host and the one decode host"),
    )
)
