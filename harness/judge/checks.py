"""Checkers: pure functions from a cell history to check results.

A check names the requirement it enforces, an ID of docs/protocol.md; its level
(MUST or SHOULD) is the requirement's (harness.spec.requirements), never restated.
A checker that raises yields ``ok=None`` ("unknown") with the error, never a crash
of the report.  The verdict of a cell is folded from its check results by
harness.judge.judge.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from harness.judge.verdict import Level
from harness.spec.history import Event, Op, completions, killed_roles, rank_statuses, silent_ranks
from harness.spec.protocol import KVPoll, kvpoll_name
from harness.spec.requirements import requirement


@dataclass(frozen=True)
class CheckResult:
    """What one check found: ``ok`` True/False, or None when the checker could not tell;
    ``unsupported`` (with ``ok`` None): it could not be judged because the machine or the
    implementation cannot run what it needs (the detail says what), which makes the cell
    UNSUPPORTED unless another check failed or could not tell."""

    name: str
    requirement: str
    level: Level
    ok: bool | None  # None: the checker itself failed, or (unsupported) could not be run here
    detail: str
    unsupported: bool = False
    # the ``seq`` of the history event the check was decided on (the poll, the verification, the
    # observation); None when it judged the history as a whole.  The cell page pins the check there
    # and the first divergence is looked for at its step (harness.judge.divergence).
    at: int | None = None
    # the check holds an elapsed time to a bound (its checker is marked by :func:`timing_bound`): on a
    # starved machine it can fail for want of a core, so harness.judge.load may run its cell again alone
    timing: bool = False

    def to_dict(self) -> dict:
        return asdict(self)


Checker = Callable[[list[dict]], "tuple[bool | None | str, str] | tuple[bool | None | str, str, int | None]"]
# history events -> (ok, detail) or (ok, detail, seq of the event it was decided on); ok None:
# cannot tell; ok UNSUPPORTED: cannot be judged on this machine or implementation
UNSUPPORTED = "unsupported"

#: a bound scenarios pass for "no bound at all" (``failed_within(..., 0, NO_BOUND_S, words)`` checks the reason only)
NO_BOUND_S = 1e9


def timing_bound(fn: Checker, bounded: bool = True) -> Checker:
    """Mark checker ``fn`` as holding an elapsed time (a latency, a deadline) to a bound, when
    ``bounded``; ``fn``.  The mark is declared where a checker measures time, not listed by check
    name, so every check built from that checker carries it (:attr:`CheckResult.timing`)."""
    if bounded:
        fn.timing_bound = True  # type: ignore[attr-defined]
    return fn


def is_timing_bound(fn: Checker) -> bool:
    """Whether checker ``fn`` was marked by :func:`timing_bound`."""
    return bool(getattr(fn, "timing_bound", False))


@dataclass(frozen=True)
class Check:
    """A named checker bound to the requirement ``requirement`` of docs/protocol.md.

    Raises harness.spec.requirements.UnknownRequirement when docs/protocol.md lacks the ID."""

    name: str
    requirement: str
    fn: Checker
    level: Level = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "level", Level(requirement(self.requirement).level))

    def run(self, events: list[dict]) -> CheckResult:
        """The check's result on ``events``; a failed check the checker did not place is placed
        on the last event of the room or role its detail names (:func:`located`)."""
        try:
            ok, detail, *where = self.fn(events)
        except Exception as exc:  # a broken checker is "unknown", not a crash
            return CheckResult(self.name, self.requirement, self.level, None, f"checker error: {exc!r}")
        at = where[0] if where else None
        if ok == UNSUPPORTED:
            return CheckResult(self.name, self.requirement, self.level, None, detail, unsupported=True, at=at)
        if at is None and ok is False:
            at = located(events, detail)
        return CheckResult(self.name, self.requirement, self.level, None if ok is None else bool(ok), detail, at=at,
                           timing=is_timing_bound(self.fn))


def located(events: list[dict], detail: str) -> int | None:
    """The ``seq`` of the event a failed check's ``detail`` points at when its checker did not
    say: the last completion of a call on the room it names (a room id of the history), else
    the last observation of the role it names; None when it names neither."""
    import re
    named_rooms = {int(x) for x in re.findall(r"(?<![\d.])\d{3,}(?![\d.])", detail)}
    done = [e for e in events if e["type"] in (Event.OK, Event.FAIL, Event.NEMESIS)]
    for e in reversed(done):
        if (e.get("args") or {}).get("room") in named_rooms:
            return e["seq"]
    roles = sorted({e["role"] for e in done if e.get("role")}, key=len, reverse=True)
    role = next((r for r in roles if re.search(rf"(?<![\w-]){re.escape(r)}(?![\w-])", detail)), None)
    return None if role is None else observed_at(events, role)


def observed_at(events: list[dict], role: str) -> int | None:
    """The ``seq`` of ``role``'s last end-of-cell observation (None: it had none)."""
    return next((e["seq"] for e in reversed(events) if e["op"] == Op.OBSERVE and e["role"] == role
                 and e["type"] in (Event.OK, Event.FAIL)), None)


# ---- reusable checkers -------------------------------------------------------

def reached_status(room: int, role: str, status: int) -> Checker:
    """The last AwaitStatus for ``room`` on ``role`` saw ``status``."""

    def fn(events: list[dict]) -> tuple[bool, str]:
        waits = list(completions(events, op=Op.AWAIT_STATUS, role=role, room=room))
        if not waits:
            return False, f"{role} room {room} was never polled"
        last = waits[-1]
        seen = (last.get("value") or {}).get("status")
        if last["type"] == Event.FAIL:
            return False, f"{role} room {room}: polling failed: {last.get('error')}", last["seq"]
        if seen == status:
            return (True, f"{role} room {room} reached {kvpoll_name(status)} after {last['value']['waited_s']:.2f} s",
                    last["seq"])
        reason = (last.get("value") or {}).get("failure_reason")
        extra = f" (failure reason: {reason})" if reason else ""
        cut = last["args"].get("cut")
        if cut:
            extra += (f" (bound cut from {cut['from_s']:g} s: step {cut['after_step']}'s status never came; "
                      "--full-waits keeps it)")
        return False, (
            f"{role} room {room} ended at {kvpoll_name(seen)}, expected {kvpoll_name(status)} "
            f"within {last['args'].get('timeout_s')} s{extra}"
        ), last["seq"]

    return fn


def stays_terminal(room: int, roles: tuple[str, ...]) -> Checker:
    """Once a role's room was seen Success or Failed, every later poll saw the same status."""

    def fn(events: list[dict]) -> tuple[bool, str]:
        changed, at = [], None
        for role in roles:
            polls = [e for e in completions(events, op=Op.AWAIT_STATUS, role=role, room=room) if e["type"] == Event.OK]
            seen = [e["value"]["status"] for e in polls]
            terminal = next((s for s in seen if s in (KVPoll.Failed, KVPoll.Success)), None)
            if terminal is None:
                continue
            later = seen[seen.index(terminal):]
            if any(s != terminal for s in later):
                changed.append(f"{role} room {room}: {' -> '.join(kvpoll_name(s) for s in later)}")
                flip = polls[seen.index(terminal) + next(i for i, s in enumerate(later) if s != terminal)]["seq"]
                at = flip if at is None else min(at, flip)
        if changed:
            return False, "terminal status changed: " + "; ".join(changed), at
        return True, "terminal statuses held on every later poll"

    return fn


def pools_exact(decode: str = "decode", which: int = -1) -> Checker:
    """The ``which``-th pool verification on ``decode`` (0 the first; default -1, the last)
    found every byte where it belongs."""

    def fn(events: list[dict]) -> tuple[bool, str]:
        checks = list(completions(events, op=Op.VERIFY, role=decode))
        if not checks:
            return False, "pools were never verified"
        if not -len(checks) <= which < len(checks):
            return False, f"pools were verified {len(checks)} time(s), not {which + 1 if which >= 0 else -which}"
        last = checks[which]
        if last["type"] == Event.FAIL:
            return None, f"verification could not run: {last.get('error')}", last["seq"]
        report = last["value"]
        if report["ok"]:
            return True, (
                f"{report['bytes_verified']} bytes arrived exactly; "
                f"{report['bytes_untouched_checked']} bytes that must stay untouched did"
            ), last["seq"]
        listed = "; ".join(report["mismatches"][:5])
        return False, f"{report['mismatch_pages']} page(s) wrong: {listed}", last["seq"]

    return fn


def steps_completed() -> Checker:
    """No step raised or timed out; the end-of-cell observation of a role the nemesis killed
    is no step (its absence is the scenario's doing, harness.spec.history.killed_roles)."""

    def fn(events: list[dict]) -> tuple[bool, str]:
        killed = killed_roles(events)
        failed = [e for e in events if e["type"] == Event.FAIL and not (e["op"] == Op.OBSERVE and e.get("role") in killed)]
        if not failed:
            return True, "every step completed"
        first = failed[0]
        return False, f"step {first['step']} {first['op']} on {first.get('role')} failed: {first.get('error')}", \
            first["seq"]

    return fn


def observations(events: list[dict]) -> tuple[dict[str, dict], list[str]]:
    """The last observation of every launched role, and why any role has none.

    A role that was launched but not observed (dead, frozen, not answering)
    is a problem, never silence that passes; roles the nemesis killed are left
    out.
    """
    killed = killed_roles(events)
    launched = [e["role"] for e in completions(events, op=Op.LAUNCH) if e["type"] == Event.OK and e["role"] not in killed]
    observed: dict[str, dict] = {}
    problems: dict[str, str] = {}
    for obs in completions(events, op=Op.OBSERVE):
        if obs["role"] in killed:
            continue
        if obs["type"] == Event.OK:
            observed[obs["role"]] = obs["value"]
            problems.pop(obs["role"], None)
        else:
            problems[obs["role"]] = obs.get("error") or "observation failed"
    for role in launched:
        if role not in observed and role not in problems:
            problems[role] = f"{role} was never observed"
    return observed, list(problems.values())


def no_dead_threads() -> Checker:
    """No thread in any role died with an exception, and every role could be observed."""

    def fn(events: list[dict]) -> tuple[bool, str]:
        observed, problems = observations(events)
        dead = [f"{role}: thread {d['thread']} died: {d['exception']}: {d['message']}"
                for role, value in observed.items() for d in value["dead_threads"]]
        bad = problems + dead
        died_in = next((role for role, value in observed.items() if value["dead_threads"]), None)
        return (not bad), ("; ".join(bad) if bad else f"no thread died in {len(observed)} role(s)"), \
            (observed_at(events, died_in) if died_in else None)

    return fn


def loops_alive() -> Checker:
    """Every role is alive at the end, and so is every control/worker thread its manager started."""

    def fn(events: list[dict]) -> tuple[bool, str]:
        observed, problems = observations(events)
        if problems:
            return False, "; ".join(problems)
        stopped = [f"{role}:{name}" for role, value in observed.items()
                   for name, alive in value["loops"].items() if not alive]
        if stopped:
            return False, "stopped: " + ", ".join(stopped)
        seen = sum(len(value["loops"]) for value in observed.values())
        return True, f"{len(observed)} role(s) and {seen} control/worker threads alive"

    return fn


def loops_alive_at(label: str, roles: tuple[str, ...]) -> Checker:
    """At the mid-cell observation ``label`` (an Observe step), every control/worker
    thread of ``roles`` was alive and none had died."""

    def fn(events: list[dict]) -> tuple[bool, str]:
        seen = {e["role"]: e for e in events if e["op"] == Op.OBSERVE_MID and (e.get("args") or {}).get("label") == label}
        problems, at = [], None
        for role in roles:
            event = seen.get(role)
            if event is None:
                problems.append(f"{role} was not observed {label}")
                continue
            if event["type"] != Event.OK:
                problems.append(event.get("error") or f"{role} could not be observed")
                at = event["seq"] if at is None else at
                continue
            value = event["value"]
            stopped = [name for name, alive in value["loops"].items() if not alive]
            dead = [f"{d['thread']} died: {d['exception']}: {d['message'][:120]}" for d in value["dead_threads"]]
            if stopped or dead:
                problems.append(f"{role} {label}: " + "; ".join(dead or [f"stopped: {', '.join(stopped)}"]))
                at = event["seq"] if at is None else at
        return (not problems), ("; ".join(problems) if problems else f"{', '.join(roles)} loops alive {label}"), at

    return fn


def status_at(label: str, expected: tuple[int, ...]) -> Checker:
    """The AwaitStatus step labelled ``label`` (harness.spec.steps.AwaitStatus) saw one of
    ``expected`` on every rank (:func:`rank_statuses`: the lowest of a group's ranks would
    hide a rank that is ahead, e.g. one that took a late message), but a rank that writes nothing
    (:func:`silent_ranks`) and got no message in the cell may read WaitingForInput: nothing to bind."""

    def fn(events: list[dict]) -> tuple[bool, str]:
        waits = [e for e in completions(events, op=Op.AWAIT_STATUS) if (e.get("args") or {}).get("label") == label]
        if not waits:
            return False, f"the poll {label!r} never ran"
        wait = waits[-1]
        where = f"{wait.get('role')} room {(wait.get('args') or {}).get('room')}"
        if wait["type"] != Event.OK:
            return False, f"{where}: polling failed at {label!r}: {wait.get('error')}", wait["seq"]
        seen, names, ranks = wait["value"]["status"], "/".join(kvpoll_name(x) for x in expected), rank_statuses(wait)
        silent = silent_ranks(events) & {e["role"] for e in events if e["op"] == Op.MESSAGE_AUDIT
                                         and (e.get("value") or {}).get("received") == 0}
        off = {rank: status for rank, status in ranks.items()
               if status not in expected and not (rank in silent and status == KVPoll.WaitingForInput)}
        if seen in expected and off:
            said = ", ".join(f"{rank} {kvpoll_name(status)}" for rank, status in sorted(off.items()))
            return False, (f"{where} was {kvpoll_name(seen)} at {label!r} as a group, but not on every rank: {said} "
                           f"(step {wait['step']}; expected {names})"), wait["seq"]
        return (seen in expected,
                f"{where} was {kvpoll_name(seen)} at {label!r} (step {wait['step']}; expected {names})", wait["seq"])

    return fn


def seen_at(poll: dict) -> float:
    """When an ``await_status`` completion's status was seen, on the history's clock ``t``
    (seconds): the role stamps the wall clock of the read that saw it (``seen_wall``), and the
    completion carries the wall clock it was recorded at, so calls made after the read (the
    failure reason) or a slow reply do not count as the backend's time.  A history without
    the stamp: the completion's own ``t``."""
    value = poll.get("value") or {}
    if "seen_wall" in value and "wall" in poll:
        return poll["t"] - max(0.0, poll["wall"] - value["seen_wall"])
    return poll["t"]


def _first_failed_after(events: list[dict], role: str, room: int, seq: int) -> tuple[dict | None, str]:
    """The first poll of ``role``'s ``room`` after event ``seq`` that saw Failed (None: none did),
    and the last status seen after it ("never polled" when no poll ran)."""
    waits = [e for e in completions(events, op=Op.AWAIT_STATUS, role=role, room=room)
             if e["type"] == Event.OK and e["seq"] > seq]
    failed = next((e for e in waits if e["value"]["status"] == KVPoll.Failed), None)
    return failed, kvpoll_name(waits[-1]["value"]["status"]) if waits else "never polled"


def _last_poll(events: list[dict], role: str, room: int) -> int | None:
    """The ``seq`` of the last completed poll of ``role``'s ``room`` (None: never polled)."""
    polls = list(completions(events, op=Op.AWAIT_STATUS, role=role, room=room))
    return polls[-1]["seq"] if polls else None


def first_event(events: list[dict], op: str, role: str, room: int | None = None, after_seq: int = -1) -> dict | None:
    """The first successful ``op`` event of ``role`` (for ``room`` when given) after ``after_seq``."""
    for e in events:
        if e["seq"] <= after_seq or e["op"] != op or e["role"] != role or e["type"] not in (Event.OK, Event.NEMESIS):
            continue
        if room is not None and (e.get("args") or {}).get("room") != room:
            continue
        return e
    return None


def failed_within(room: int, role: str, since_op: str, since_role: str, low_s: float, high_s: float,
                  reason_words: tuple[str, ...] = (), need_reason: bool = True, from_last: bool = False) -> Checker:
    """``room`` on ``role`` was first seen Failed between ``low_s`` and ``high_s``
    seconds after ``since_role``'s first ``since_op`` for the room (e.g. ``open_sender``; its
    last one with ``from_last``, e.g. the room's last ``send_chunk``),
    with a failure reason (containing one of ``reason_words``, when given) unless
    ``need_reason`` is False.  The implementation's clock may start anywhere inside
    that call, so "too early" counts from the call's start (its ``invoke`` event) and
    "too late" from its end."""

    def fn(events: list[dict]) -> tuple[bool, str]:
        start = first_event(events, since_op, since_role, room)
        while from_last and start is not None and (later := first_event(events, since_op, since_role, room,
                                                                   start["seq"])) is not None:
            start = later
        if start is None:
            return False, f"{since_role} never completed {since_op} for room {room}"
        called = next((e for e in reversed(events[:events.index(start)]) if e["type"] == Event.INVOKE
                       and e["op"] == since_op and e["role"] == since_role
                       and (e.get("args") or {}).get("room") == room), start)
        failed, last = _first_failed_after(events, role, room, start["seq"])
        if failed is None:
            return False, f"{role} room {room} never became Failed (last: {last})", _last_poll(events, role, room)
        latency = seen_at(failed) - start["t"]
        reason = failed["value"].get("failure_reason") or ""
        problems = []
        if seen_at(failed) - called["t"] < low_s:
            problems.append(f"Failed {seen_at(failed) - called['t']:.1f} s after {since_op} was called, "
                            f"before the {low_s:g} s deadline")
        elif latency > high_s:
            problems.append(f"Failed only {latency:.1f} s after {since_op} (allowed up to {high_s:g} s)")
        if not reason and (need_reason or reason_words):
            problems.append("no failure reason")
        elif reason_words and not any(w.lower() in reason.lower() for w in reason_words):
            problems.append(f"reason {reason!r} names none of {', '.join(reason_words)}")
        if problems:
            return False, f"{role} room {room}: " + "; ".join(problems), failed["seq"]
        return True, f"{role} room {room} Failed {latency:.1f} s after {since_op}: {reason!r}", failed["seq"]

    return timing_bound(fn, bounded=low_s > 0 or high_s < NO_BOUND_S)


def dropped_records(role: str, observation: dict) -> str:
    """Why a check that reads ``role``'s log records cannot tell: the recorder's cap was reached."""
    return (f"{role}'s recorder kept {len(observation['log_records'])} log records and dropped "
            f"{observation['log_records_dropped']} more: the dropped ones were not judged")


def raised_in(role: str, observation: dict) -> list[str]:
    """What ``role``'s observation says was raised: threads that died, records at ERROR or
    worse, and records of any level that carry a caught exception (R-STALE-1 counts an
    exception caught and logged inside a worker)."""
    dead = [f"thread {d['thread']} died: {d['exception']}: {d['message'][:160]}"
            for d in observation["dead_threads"]]
    logged = [f"{r['level']} {r['logger']}: {r['message'][:160]}"
              + (f" ({r['exception']} caught and logged)" if r.get("exception") else "")
              for r in observation["log_records"] if r["level"] in ("ERROR", "CRITICAL") or r.get("exception")]
    return dead + logged


def no_log_matching(role: str, pattern: str) -> Checker:
    """No WARNING-or-worse record of ``role`` (last observation) matches regex ``pattern``
    (case-insensitive)."""
    import re

    regex = re.compile(pattern, re.IGNORECASE)

    def fn(events: list[dict]) -> tuple[bool, str]:
        observed, problems = observations(events)
        if role not in observed:
            return False, "; ".join(problems) or f"{role} was never observed"
        hits = [f"{r['level']} {r['logger']}: {r['message'][:160]}" for r in observed[role]["log_records"]
                if regex.search(r["message"])]
        if hits:
            return False, f"{role} logged {len(hits)} record(s) matching /{pattern}/: " + "; ".join(hits[:3]), \
                observed_at(events, role)
        if observed[role].get("log_records_dropped"):
            return None, dropped_records(role, observed[role])
        return True, f"no {role} log record matches /{pattern}/"

    return fn


def no_residue(roles: tuple[str, ...], rooms: tuple[int, ...] | None = None, memory_expired: bool = False) -> Checker:
    """At the last observation of each of ``roles``, the manager holds no per-room state
    (for ``rooms`` when given); the bounded memory of ended generations (an observation's
    ``remembered``) is allowed, unless ``memory_expired``: the scenario waited out its bound
    (the bootstrap timeout, R-REUSE-1), so quiescence includes its expiry (R-RESIDUE-1)."""

    def fn(events: list[dict]) -> tuple[bool, str]:
        observed, problems = observations(events)
        left = []
        for role in roles:
            if role not in observed:
                left.append(next((p for p in problems if role in p), f"{role} was never observed"))
                continue
            for room, paths in sorted(observed[role]["rooms"].items(), key=lambda kv: str(kv[0])):
                if rooms is None or int(room) in rooms:
                    left.append(f"{role} room {room}: {', '.join(sorted(set(paths)))}")
            for room, paths in (observed[role].get("remembered") or {}).items() if memory_expired else ():
                if rooms is None or int(room) in rooms:
                    left.append(f"{role} room {room}: {', '.join(sorted(set(paths)))} (ended generations, past bound)")
        if left:
            return False, "state left after clear: " + "; ".join(left[:8])
        partial = [f"{role}: {observed[role]['residue_incomplete']}" for role in roles
                   if observed[role].get("residue_incomplete")]
        if partial:
            return None, "the residue walk did not see everything, so no residue cannot be told: " + "; ".join(partial)
        return True, f"no per-room state left in {', '.join(roles)}"

    return fn


def abort_acks(events: list[dict], decode: str, room: int) -> list[dict]:
    """The ABORT_ACKs ``decode`` received for ``room`` (recorded at the end of the cell)."""
    for e in events:
        if e["op"] == Op.ABORT_ACKS and e["role"] == decode:
            return [a for a in e["value"] if a.get("room") == room]
    return []


def engine_faults(events: list[dict], role: str) -> list[dict]:
    """The engine faults injected in ``role`` (``transfer``, ``fault``, ``what``, ``t``...);
    a role run as TP ranks: its rank 0's (:func:`sender_faults` for another rank)."""
    return [e["value"] for e in events if e["type"] == Event.NEMESIS and e["op"] == Op.ENGINE_FAULT and e["role"] == role]


def sender_faults(events: list[dict], role: str, sender: Any) -> list[dict]:
    """The engine faults of the rank of ``role`` that sent an ABORT_ACK naming ``sender`` (its
    attention-TP rank: the role process ``ROLE.tp<sender>``, rank 0 the role itself); the
    role's own when it runs no such rank."""
    from harness.spec.topology import rank_name

    ranked = engine_faults(events, rank_name(role, sender)) if isinstance(sender, int) and sender > 0 else []
    return ranked or engine_faults(events, role)
