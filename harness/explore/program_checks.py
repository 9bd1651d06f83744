"""The spec's checks for one generated program (harness.explore.program): which lifecycles
must succeed, which must only conclude, whose bytes are judged at the decode's Success
poll, and the ABORT_ACKs of deferred release.  Each check is a pure function of the
cell's history, as every scenario check is (harness.judge.checks).
"""

from __future__ import annotations

from collections import Counter

from harness.judge import checks as c
from harness.judge import fault_checks
from harness.spec.history import Event, Op, completions
from harness.spec.protocol import KVPoll, kvpoll_name
from harness.spec.rooms import DONE

KILL_SLACK_S = 5.0  # R-HB-1: a dead prefill's rooms fail within the decode's heartbeat window plus this


def lifecycle_checks(clean: tuple[str, ...], aborted: tuple[str, ...], at_risk: tuple[str, ...],
                     aborted_rooms: tuple[int, ...], deferred: bool,
                     after_restart: tuple[str, ...] = (),
                     killed: tuple[tuple[str, ...], tuple[str, ...]] = ((), ()),
                     orphaned: tuple[tuple[str, ...], tuple[str, ...]] = ((), ()),
                     decode_killed: bool = False, spared: tuple[str, ...] = (),
                     dead_prefill: str = "prefill", lost: tuple[str, ...] = ()) -> list[c.Check]:
    """The checks of a program whose lifecycles (labels ``L<i>``) are ``clean`` (nobody
    aborted them and no failed write could reach them), ``aborted`` (by the decode) or
    ``at_risk`` (a write the prefill's engine was told to fail may be theirs);
    ``aborted_rooms`` the room ids the decode aborted; ``deferred``: the roles run with
    deferred KV release, so ABORT_ACKs are judged; ``after_restart`` the clean lifecycles
    opened after the prefill was restarted on new ports; ``killed``: the lifecycles in flight at
    the prefill's kill that must fail (R-HB-1), and those that must only end, on the decode;
    ``orphaned``: the lifecycles in flight at the decode's kill with a chunk written after it,
    which must read Failed on the prefill, and the others, which must only end there (R-PEER-1);
    ``spared``: the lifecycles of the other prefill in flight at a prefill's kill, which must
    succeed on both sides (R-HB-1: rooms bound to other prefills are untouched); ``dead_prefill``:
    the prefill killed; ``lost``: the lifecycles one of whose control messages was lost, which must
    end on both sides (R-LOSS-1); ``decode_killed``: no pools are left to verify at the end, so bytes-exact is not judged (the
    lifecycles that concluded before the kill were verified at their Success poll: bytes-at-success).
    The aborted and at-risk rooms' checks come before the clean ones', so a stuck abort is not
    reported as a clean room's."""
    must_fail, must_end = killed
    orphans_fail, orphans_end = orphaned
    out = [
        c.Check("steps-complete", "R-XFER-1", c.steps_completed()),
        c.Check("aborted-rooms-conclude", "R-ABORT-1", all_reached(aborted, DONE)),
        c.Check("failed-write-rooms-conclude", "R-TIMEOUT-2", all_reached(at_risk, DONE)),
        c.Check("lost-message-rooms-conclude", "R-LOSS-1", all_reached(lost, DONE)),
        c.Check("rooms-fail-after-kill", "R-HB-1", failed_after_kill(must_fail, dead_prefill)),
        c.Check("rooms-end-after-kill", "R-HB-1", all_reached(must_end, DONE, roles=("decode",))),
        c.Check("other-prefill-rooms-succeed", "R-HB-1", all_reached(spared, (KVPoll.Success,))),
        c.Check("sender-rooms-fail-after-decode-kill", "R-PEER-1",
                all_reached(orphans_fail, (KVPoll.Failed,), roles=("prefill",))),
        c.Check("sender-rooms-end-after-decode-kill", "R-PEER-1", all_reached(orphans_end, DONE, roles=("prefill",))),
        c.Check("rooms-after-restart-succeed", "R-RESTART-1", all_reached(after_restart, (KVPoll.Success,))),
        c.Check("clean-rooms-succeed", "R-XFER-1", all_reached(clean, (KVPoll.Success,))),
        c.Check("bytes-at-success", "R-XFER-2", bytes_at_success()),
        *([] if decode_killed else [c.Check("bytes-exact", "R-LAYOUT-1", c.pools_exact())]),
    ]
    if deferred:
        out.append(c.Check("abort-ack-once", "R-ABORT-2", acks_once(aborted_rooms)))
    return out + [c.Check("loops-alive", "R-LIVE-2", c.loops_alive()),
                  c.Check("no-dead-thread", "R-LIVE-2", c.no_dead_threads())]


def _conclusion(events: list[dict], label: str, side: str) -> dict | None:
    """The last conclusion poll of lifecycle ``label`` on ``side`` (AwaitStatus carrying it):
    "decode", or "prefill" for whichever prefill served it (a program may have two, "prefill" and
    "prefill-b": harness.explore.program_model.PREFILLS)."""
    polls = [e for e in completions(events, op=Op.AWAIT_STATUS) if (e.get("args") or {}).get("label") == label
             and (e.get("role") == side if side == "decode" else (e.get("role") or "").startswith(side))]
    return polls[-1] if polls else None


def all_reached(labels: tuple[str, ...], statuses: tuple[int, ...],
                roles: tuple[str, ...] = ("prefill", "decode")) -> c.Checker:
    """Each lifecycle's conclusion polls (AwaitStatus labelled with it) on ``roles`` reached
    one of ``statuses`` within their bound: every lifecycle of a reused room id is judged,
    not only the last."""
    names = "/".join(kvpoll_name(s) for s in statuses)

    def fn(events: list[dict]):
        for label in labels:
            for role in roles:
                last = _conclusion(events, label, role)
                if last is None:
                    return False, f"{role} never polled lifecycle {label} to its end"
                value = last.get("value") or {}
                room = last["args"].get("room")
                if last["type"] != Event.OK or not value.get("reached") or value.get("status") not in statuses:
                    said = value.get("status_name") or last.get("error") or "nothing"
                    return False, f"{role} room {room} (lifecycle {label}) read {said}, not {names}", last["seq"]
        return True, f"{len(labels)} lifecycle(s) reached {names} on {' and '.join(roles)}"

    return fn


def failed_after_kill(labels: tuple[str, ...], dead: str = "prefill") -> c.Checker:
    """Each lifecycle in ``labels`` (in flight at the kill of prefill ``dead``, its chunks not all
    sent) read Failed on the decode within the heartbeat window plus KILL_SLACK_S of the kill, with
    a reason naming that prefill's bootstrap address (R-HB-1; harness.judge.fault_checks, as
    dead-prefill judges it)."""
    def fn(events: list[dict]):
        for label in labels:
            poll = _conclusion(events, label, "decode")
            if poll is None:
                return False, f"decode never polled lifecycle {label} to its end"
            ok, detail, *where = fault_checks.failed_after_kill(poll["args"]["room"], "decode", dead,
                                                               KILL_SLACK_S)(events)
            if not ok:
                return False, f"lifecycle {label}: {detail}", *where
        return True, f"{len(labels)} lifecycle(s) in flight at {dead}'s kill Failed in time, naming it"

    return fn


def bytes_at_success() -> c.Checker:
    """Every lifecycle verified right at the decode's conclusion poll (a VerifyPools labelled
    with it, no settling) whose poll read Success had every byte of its room in place then:
    the decode scheduler reads the room's KV and aux at that poll (R-XFER-2).  A lifecycle
    whose poll read Failed is not judged here, nor are bytes that never land: when the
    program's last verification (after settling) finds wrong bytes too, the bug is where
    bytes go (bytes-exact, R-LAYOUT-1), not when, unless a row was still unwritten (the
    decode's own bytes) at the Success poll: that Success came before its bytes, whatever
    happened to them later."""

    def fn(events: list[dict]):
        final = [e for e in completions(events, op=Op.VERIFY, role="decode") if not (e.get("args") or {}).get("label")]
        misplaced_only = bool(final and final[-1]["type"] == Event.OK and not final[-1]["value"]["ok"])
        judged = 0
        for check in completions(events, op=Op.VERIFY, role="decode"):
            label = (check.get("args") or {}).get("label")
            poll = _conclusion(events, label, "decode") if label else None
            if poll is None or (poll.get("value") or {}).get("status") != KVPoll.Success:
                continue
            if check["type"] == Event.FAIL:
                return None, f"verification of lifecycle {label} could not run: {check.get('error')}", check["seq"]
            judged += 1
            report = check["value"]
            if misplaced_only and not report.get("unwritten_pages"):
                continue  # bytes that never landed where they belong: bytes-exact's (R-LAYOUT-1)
            if not report["ok"]:
                listed = "; ".join(report["mismatches"][:5])
                return False, (f"lifecycle {label} (room {poll['args'].get('room')}) read Success with "
                               f"{report['mismatch_pages']} page(s) not yet right: {listed}"), check["seq"]
        apart = " (bytes that never landed where they belong are bytes-exact's, R-LAYOUT-1)" if misplaced_only else ""
        return True, f"{judged} lifecycle(s) had every byte in place at their Success poll{apart}"

    return fn


def acks_once(rooms: tuple[int, ...]) -> c.Checker:
    """The decode received at most one ABORT_ACK per aborted room, generation and sender
    (R-ABORT-2: exactly once per room generation; the drain itself is abort-ack-after-drain's
    check, which knows which writes are the room's)."""

    def fn(events: list[dict]):
        acks = [a for room in sorted(set(rooms)) for a in c.abort_acks(events, "decode", room)]
        twice = [key for key, n in Counter((a.get("room"), a.get("generation"), a.get("sender")) for a in acks).items()
                 if n > 1]
        if twice:
            room, generation, sender = twice[0]
            return False, (f"the decode received more than one ABORT_ACK for room {room} generation {generation} "
                           f"from sender {sender}")
        return True, f"{len(acks)} ABORT_ACK(s) for {len(set(rooms))} aborted room id(s), none twice"

    return fn
