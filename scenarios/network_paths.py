"""Network faults on one path between the prefill's host and the decode's host
(harness.hosts.linkfault: ``bootstrap``, ``control``, ``data``); every other path works.

Each needs roles on two hosts (``run --hosts netns:2``; UNSUPPORTED otherwise, and on a
host without the tool the fault needs: nftables for a cut or a loss, netem for delay,
duplication and reordering).

* network-bootstrap-unreachable: the prefill's bootstrap server becomes unreachable (its
  port, both ways) while room ``held`` waits for input and room ``moving`` has its first
  chunk written.  The decode's heartbeat probes go to that server, so both rooms must end
  Failed on the decode within its heartbeat window plus 10 s (unanswered probes: R-HB-1's
  longer slack), naming the prefill's
  bootstrap address (R-HB-1); control and data still work, which must not keep the rooms
  alive.  After the heal a new room succeeds.  The prefill's side of the two rooms is not
  judged: the spec does not say what a prefill does with a room its decode gave up on.
* network-heartbeat-delay: the bootstrap path is slow (500 +/- 100 ms each way) while two
  rooms register and wait two heartbeat windows: a late health answer is an answer, so
  nothing fails (R-NET-2); then both transfer and succeed.
* network-control-blip: the control path (the managers' ZMQ ports) is cut, both ways, for
  1.5 s while a room transfers (its registration done, two of its three chunks sent in the
  cut) and heals: far below every timeout and the heartbeat window (whose probes take the
  bootstrap path), so TCP delivers what waited and the room must succeed on both sides with
  every byte in place (R-NET-2).
* network-data-loss / network-data-reorder: the data path loses 5 % of its packets (or
  duplicates and reorders them) while two rooms transfer.  Each room must end Success with
  every byte in place, or Failed with a reason, on both sides within the waiting timeout
  plus 5 s, never Success with a wrong byte (R-XFER-2: Success only once every byte is in place).  pdconform's reference carries KV
  bytes on its control sockets: it has no data path, so the fault does not reach it.
"""

from __future__ import annotations

from harness.judge import checks as c
from harness.judge.fault_checks import exact_or_failed, failed_after_kill
from harness.spec.history import Op
from harness.spec.protocol import KVPoll
from harness.spec.scenario import Scenario, register
from harness.spec.steps import AwaitStatus, InitSender, NetworkFault, SendChunk, Sleep, StartRoles
from scenarios._flows import DONE, LAYOUT, RoomAllocator, await_done, full_room, open_and_request, pair_healthy, \
    room_succeeds, send_all, verify
from scenarios.network_partition import ENV, NETWORK_CELL, SLACK_S, UNANSWERED_SLACK_S, WAITING_TIMEOUT_S

WAIT_S = 20.0  # polling bound; the checks judge each latency against its own bound
P1D1 = (("p1-d1",), "the fault is between the one prefill host and the one decode host")
HEAL = NetworkFault("prefill", "decode")


def _cut_plan(seed: int):
    planner = RoomAllocator(seed)
    return planner.room(3), planner.room(6, chunks=3), planner.room(4, chunks=2)


def bootstrap_steps(seed: int):
    held, moving, after = _cut_plan(seed)
    return [
        StartRoles(layout=LAYOUT),  # no short waiting timeout: only the heartbeat may fail the rooms in time
        *open_and_request(held),
        *open_and_request(moving),
        InitSender(moving.room, len(moving.src), moving.aux_src),
        SendChunk(moving.room, moving.chunks[0]),
        AwaitStatus(moving.room, "prefill", (KVPoll.Transferring, KVPoll.Success, KVPoll.Failed), timeout_s=2.0,
                    must_come=False),
        Sleep(0.3),  # the first chunk lands before the cut
        NetworkFault("prefill", "decode", partition=True, path="bootstrap"),
        AwaitStatus(held.room, "decode", DONE, timeout_s=WAIT_S),
        AwaitStatus(moving.room, "decode", DONE, timeout_s=WAIT_S),
        HEAL,
        Sleep(1.0),
        *full_room(after),
        verify([after], unchecked_kv=held.dst + moving.dst, unchecked_aux=(held.aux_dst, moving.aux_dst)),
    ]


def bootstrap_checks(seed: int):
    held, moving, after = _cut_plan(seed)
    return [
        c.Check("steps-complete", "R-XFER-1", c.steps_completed()),
        c.Check("waiting-room-failed", "R-HB-1", failed_after_kill(held.room, "decode", "prefill", UNANSWERED_SLACK_S,
                                                                   op=Op.NETWORK)),
        c.Check("transferring-room-failed", "R-HB-1", failed_after_kill(moving.room, "decode", "prefill",
                                                                        UNANSWERED_SLACK_S,
                                                                        op=Op.NETWORK)),
        *room_succeeds(after, "R-NET-1", "after-heal"),
        *pair_healthy(),
    ]


def _two_rooms(seed: int):
    planner = RoomAllocator(seed)
    return planner.room(6, chunks=3), planner.room(3), planner.room(4, chunks=2)


def heartbeat_delay_steps(seed: int):
    long, short, _ = _two_rooms(seed)
    return [
        StartRoles(layout=LAYOUT),
        NetworkFault("prefill", "decode", delay_ms=500, jitter_ms=100, path="bootstrap"),
        *open_and_request(long),
        *open_and_request(short),
        Sleep(8.5),  # the heartbeat window twice over, every probe answered late: no room may fail of it
        *send_all(long),
        *send_all(short),
        *await_done(long, timeout_s=20.0),
        *await_done(short, timeout_s=20.0),
        HEAL,
        verify([long, short]),
    ]


def heartbeat_delay_checks(seed: int):
    long, short, _ = _two_rooms(seed)
    return [
        c.Check("steps-complete", "R-XFER-1", c.steps_completed()),
        *room_succeeds(long, "R-NET-2", "long-room"),
        *room_succeeds(short, "R-NET-2", "short-room"),
        *pair_healthy(),
    ]


def control_blip_steps(seed: int):
    room, _, _ = _two_rooms(seed)
    return [
        StartRoles(layout=LAYOUT, env=ENV),
        *open_and_request(room),
        InitSender(room.room, len(room.src), room.aux_src),
        SendChunk(room.room, room.chunks[0]),
        NetworkFault("prefill", "decode", partition=True, path="control"),
        *[SendChunk(room.room, chunk) for chunk in room.chunks[1:]],
        Sleep(1.5),
        HEAL,
        *await_done(room, timeout_s=WAITING_TIMEOUT_S + SLACK_S),
        verify([room]),
    ]


def control_blip_checks(seed: int):
    room, _, _ = _two_rooms(seed)
    return [
        c.Check("steps-complete", "R-XFER-1", c.steps_completed()),
        *room_succeeds(room, "R-NET-2", "blipped-room"),
        *pair_healthy(),
    ]


def data_path_steps(fault: NetworkFault):
    """The steps of a data-path fault scenario (module docstring) under ``fault``."""

    def steps(seed: int):
        big, small, after = _two_rooms(seed)
        bound = WAITING_TIMEOUT_S + SLACK_S
        others = lambda *rooms: dict(unchecked_kv=tuple(p for r in rooms for p in r.dst),  # noqa: E731
                                     unchecked_aux=tuple(r.aux_dst for r in rooms))
        return [
            StartRoles(layout=LAYOUT, env=ENV),
            *open_and_request(big),
            *open_and_request(small),
            fault,
            *send_all(big),
            *send_all(small),
            *[AwaitStatus(p.room, side, DONE, timeout_s=bound) for p in (big, small) for side in ("decode", "prefill")],
            HEAL,
            verify([big], **others(small)),  # verification 0: the big room alone
            verify([small], **others(big)),  # 1: the small room alone
            Sleep(1.0),
            *full_room(after),
            verify([after], **others(big, small)),  # 2
        ]

    return steps


def data_path_checks(seed: int):
    big, small, after = _two_rooms(seed)
    return [
        c.Check("steps-complete", "R-XFER-2", c.steps_completed()),
        c.Check("big-room-exact-or-failed", "R-XFER-2", exact_or_failed(big.room, "decode", 0)),
        c.Check("small-room-exact-or-failed", "R-XFER-2", exact_or_failed(small.room, "decode", 1)),
        c.Check("big-room-terminal-held", "R-TERM-1", c.stays_terminal(big.room, ("decode", "prefill"))),
        c.Check("small-room-terminal-held", "R-TERM-1", c.stays_terminal(small.room, ("decode", "prefill"))),
        *room_succeeds(after, "R-XFER-2", "after-heal"),
        c.Check("after-heal-bytes", "R-LAYOUT-1", c.pools_exact(which=2)),
        *pair_healthy(bytes_exact=False),
    ]


for _id, _title, _steps, _checks in (
    ("network-bootstrap-unreachable",
     "The prefill's bootstrap server is unreachable mid-transfer (control and data work): the decode fails the "
     "rooms naming the prefill within its heartbeat window; after the heal a new room succeeds",
     bootstrap_steps, bootstrap_checks),
    ("network-heartbeat-delay",
     "Heartbeat probes answered 500 ms late for two windows: no room fails, every room succeeds",
     heartbeat_delay_steps, heartbeat_delay_checks),
    ("network-control-blip",
     "The control path cut for 1.5 s mid-transfer, then healed: the room still succeeds with every byte in place",
     control_blip_steps, control_blip_checks),
    ("network-data-loss",
     "5 % of the data path's packets lost mid-transfer: every room Success with exact bytes, or Failed with a reason",
     data_path_steps(NetworkFault("prefill", "decode", loss_pct=5, path="data")), data_path_checks),
    ("network-data-reorder",
     "The data path duplicates and reorders packets mid-transfer: every room Success with exact bytes, or Failed "
     "with a reason",
     data_path_steps(NetworkFault("prefill", "decode", delay_ms=20, reorder_pct=25, duplicate_pct=5, path="data")),
     data_path_checks),
):
    register(Scenario(id=_id, title=_title, steps=_steps, checks=_checks, **NETWORK_CELL, topologies=P1D1))
