"""abort-ack-after-drain: with deferred KV release on, ABORT_ACK comes once, and
only after every write of the room has drained.

The roles run with ``SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE=1`` (an
implementation without deferred release is UNSUPPORTED).  Every prefill transfer
is delayed 1 s.

* Room ``inflight``: two chunks are in the engine when the decode aborts.  The
  decode must receive exactly one ABORT_ACK, and not before the last write issued
  before it could have completed (issue time + delay) (R-ABORT-2).
* Room ``errored``: its first write fails (the transfer group errors) while its
  second chunk is queued; then the decode aborts.  Any ACK must again come after
  the drain and at most once (R-ABORT-2, MUST); an ACK should come at all, since a
  failed write has ended (R-ABORT-3, SHOULD: withholding it leaves the decode's
  pages to its release timeout).

Both rooms end Failed on both sides (R-ABORT-1); every decode page outside the
two rooms stays untouched.
"""

from __future__ import annotations

from harness.judge import checks as c
from harness.spec.protocol import KVPoll
from harness.spec.scenario import Scenario, register
from harness.spec.steps import (
    Abort,
    AwaitStatus,
    EngineFaults,
    InitSender,
    RequireFact,
    SendChunk,
    Sleep,
    StartRoles,
    VerifyPools,
)
from scenarios._flows import LAYOUT, RoomAllocator, open_and_request, pair_healthy

DELAY_S = 1.0
ENV = (("SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE", "1"),)
NO_DEFERRED = "the implementation has no deferred KV release, so it sends no ABORT_ACK to judge"


def _plan(seed: int):
    planner = RoomAllocator(seed)
    return planner.room(6, chunks=3), planner.room(6, chunks=3)


def _abort_while_busy(p, before_abort_s: float) -> list:
    first, second, _third = p.chunks
    return [
        InitSender(p.room, len(p.src), p.aux_src),
        SendChunk(p.room, first),
        SendChunk(p.room, second),
        AwaitStatus(p.room, "prefill", (KVPoll.Transferring, KVPoll.Success, KVPoll.Failed),
                    timeout_s=2.0, must_come=False),
        Sleep(before_abort_s),
        Abort(p.room, "decode"),
        AwaitStatus(p.room, "prefill", (KVPoll.Failed, KVPoll.Success), timeout_s=5.0, must_come=False),
        AwaitStatus(p.room, "decode", (KVPoll.Failed, KVPoll.Success), timeout_s=5.0, must_come=False),
        Sleep(DELAY_S * 3),  # drain, and time for a duplicate ACK to show
    ]


def steps(seed: int):
    inflight, errored = _plan(seed)
    return [
        StartRoles(layout=LAYOUT, env=ENV),
        RequireFact("prefill", "deferred_release", NO_DEFERRED),
        RequireFact("decode", "deferred_release", NO_DEFERRED),
        *open_and_request(inflight),
        *open_and_request(errored),
        EngineFaults("prefill", delay_s=DELAY_S),
        *_abort_while_busy(inflight, 0.3),
        EngineFaults("prefill", fail_nth=1, delay_s=DELAY_S),  # counted afresh: errored's first write fails
        *_abort_while_busy(errored, DELAY_S + 0.3),
        EngineFaults("prefill"),
        VerifyPools((), (), unchecked_kv=inflight.dst + errored.dst, unchecked_aux=(inflight.aux_dst, errored.aux_dst)),
    ]


def acks_safe(room: int, prefill: str = "prefill", decode: str = "decode", delay_s: float = DELAY_S):
    """ABORT_ACKs for ``room`` reached ``decode`` at most once from each prefill rank or
    stage (R-ABORT-2: exactly once per room generation; a second copy of the same generation
    from the same sender FAILs too, whatever the decode
    does with it), and none before every delayed write ``prefill``'s engine issued before
    it (any room) could have completed.  Needs the engine's fault log: a cell without one
    cannot tell."""

    def fn(events):
        faults = c.engine_faults(events, prefill)
        if not any(f["fault"] == "delay" for f in faults):
            return None, f"no delayed write was logged by {prefill}'s engine: the drain cannot be judged"
        acks = c.abort_acks(events, decode, room)
        generations = sorted({a.get("generation") for a in acks}, key=str)
        if len(generations) > 1:
            return False, (f"{decode} received ABORT_ACKs for room {room} naming {len(generations)} generations "
                           f"({', '.join(map(str, generations))}), expected one")
        senders = [a.get("sender") for a in acks]  # each prefill rank or stage ACKs for itself
        if len(senders) > len(set(senders)):
            return False, (f"{decode} received {len(acks)} ABORT_ACKs for room {room} generation "
                           f"{generations[0]} from {len(set(senders))} sender(s), expected exactly one each")
        if not acks:
            return True, f"no ABORT_ACK for room {room}, so none came early"
        issued = 0
        for ack in acks:  # each sender's ACK against its own engine's writes (a TP rank's, with ranks)
            ack_t = ack["t"]
            mine = [f for f in c.sender_faults(events, prefill, ack.get("sender"))
                    if f["fault"] == "delay" and f["t"] < ack_t]
            issued += len(mine)
            early = [f for f in mine if f["t"] + f.get("delay_s", delay_s) > ack_t]
            if early:
                f = early[0]
                return False, (f"ABORT_ACK arrived {f['t'] + f.get('delay_s', delay_s) - ack_t:.2f} s before "
                               f"transfer {f['transfer']} ({f['what']}) could complete: writes were still in flight")
        return True, (f"{len(acks)} ABORT_ACK(s), one per sender, each after all {issued} delayed write(s) its "
                      "sender issued before it could complete")

    return fn


def ack_arrives(room: int, decode: str = "decode"):
    def fn(events):
        acks = c.abort_acks(events, decode, room)
        if not acks:
            return False, f"{decode} received no ABORT_ACK for room {room} (its pages wait for the release timeout)"
        return True, f"{decode} received {len(acks)} ABORT_ACK(s) for room {room}"

    return fn


def checks(seed: int):
    inflight, errored = _plan(seed)
    out = []
    for name, p in (("inflight", inflight), ("errored", errored)):
        out += [
            c.Check(f"{name}-ack-after-drain-at-most-once", "R-ABORT-2", acks_safe(p.room)),
            c.Check(f"{name}-prefill-failed", "R-ABORT-1", c.reached_status(p.room, "prefill", KVPoll.Failed)),
            c.Check(f"{name}-decode-failed", "R-ABORT-1", c.reached_status(p.room, "decode", KVPoll.Failed)),
        ]
    out += [
        c.Check("inflight-ack-sent", "R-ABORT-2", ack_arrives(inflight.room)),
        c.Check("errored-ack-sent", "R-ABORT-3", ack_arrives(errored.room)),
        c.Check("other-pages-untouched", "R-LAYOUT-1", c.pools_exact()),
        *pair_healthy(bytes_exact=False),
    ]
    return out


SCENARIO = register(
    Scenario(
        id="abort-ack-after-drain",
        title="Deferred release: one ABORT_ACK per aborted room, only after its in-flight, errored and queued writes drain",
        steps=steps,
        checks=checks,
        timeout_s=150.0,
        topologies=(("p1-d1",), "its engine faults count and delay the prefill engine's transfers, whose number grows with head-sliced TP writes, and the ABORT_ACK is timed against any room's writes: on other TP shapes the delays reach the next room"),
    )
)
