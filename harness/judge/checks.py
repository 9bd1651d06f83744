"""Checkers: pure functions from a cell history to check results, and the verdict.

A check names the requirement it enforces (an ID in docs/protocol.md) and its
level (MUST or SHOULD).  A checker that raises yields ``ok=None`` ("unknown")
with the error, never a crash of the report.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable

from harness.role.adapter import FAILED, SUCCESS, kvpoll_name
from harness.judge.history import completions

PASS, FAIL, WARN, UNSUPPORTED, ERROR = "PASS", "FAIL", "WARN", "UNSUPPORTED", "ERROR"
VERDICTS = (PASS, FAIL, WARN, UNSUPPORTED, ERROR)


@dataclass(frozen=True)
class CheckResult:
    name: str
    requirement: str
    level: str  # MUST | SHOULD
    ok: bool | None  # None: the checker itself failed
    detail: str

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Check:
    """A named checker bound to a requirement."""

    name: str
    requirement: str
    level: str
    fn: Callable[[list[dict]], tuple[bool | None, str]]  # ok None: cannot tell

    def run(self, events: list[dict]) -> CheckResult:
        try:
            ok, detail = self.fn(events)
        except Exception as exc:  # a broken checker is "unknown", not a crash
            return CheckResult(self.name, self.requirement, self.level, None, f"checker error: {exc!r}")
        return CheckResult(self.name, self.requirement, self.level, None if ok is None else bool(ok), detail)


# ---- reusable checkers -------------------------------------------------------

def reached_status(room: int, role: str, status: int) -> Callable[[list[dict]], tuple[bool, str]]:
    """The last AwaitStatus for ``room`` on ``role`` saw ``status``."""

    def fn(events: list[dict]) -> tuple[bool, str]:
        waits = list(completions(events, op="await_status", role=role, room=room))
        if not waits:
            return False, f"{role} room {room} was never polled"
        last = waits[-1]
        seen = (last.get("value") or {}).get("status")
        if last["type"] == "fail":
            return False, f"{role} room {room}: polling failed: {last.get('error')}"
        if seen == status:
            return True, f"{role} room {room} reached {kvpoll_name(status)} after {last['value']['waited_s']:.2f} s"
        reason = (last.get("value") or {}).get("failure_reason")
        extra = f" (failure reason: {reason})" if reason else ""
        cut = last["args"].get("cut")
        if cut:
            extra += (f" (bound cut from {cut['from_s']:g} s: step {cut['after_step']}'s status never came; "
                      "--full-waits keeps it)")
        return False, (
            f"{role} room {room} ended at {kvpoll_name(seen)}, expected {kvpoll_name(status)} "
            f"within {last['args'].get('timeout_s')} s{extra}"
        )

    return fn


def stays_terminal(room: int, roles: tuple[str, ...]) -> Callable[[list[dict]], tuple[bool, str]]:
    """Once a role's room was seen Success or Failed, every later poll saw the same status."""

    def fn(events: list[dict]) -> tuple[bool, str]:
        changed = []
        for role in roles:
            seen = [e["value"]["status"] for e in completions(events, op="await_status", role=role, room=room)
                    if e["type"] == "ok"]
            terminal = next((s for s in seen if s in (FAILED, SUCCESS)), None)
            if terminal is None:
                continue
            later = seen[seen.index(terminal):]
            if any(s != terminal for s in later):
                changed.append(f"{role} room {room}: {' -> '.join(kvpoll_name(s) for s in later)}")
        if changed:
            return False, "terminal status changed: " + "; ".join(changed)
        return True, "terminal statuses held on every later poll"

    return fn


def pools_exact(decode: str = "decode") -> Callable[[list[dict]], tuple[bool, str]]:
    """The last pool verification on ``decode`` found every byte where it belongs."""

    def fn(events: list[dict]) -> tuple[bool, str]:
        checks = list(completions(events, op="verify", role=decode))
        if not checks:
            return False, "pools were never verified"
        last = checks[-1]
        if last["type"] == "fail":
            return None, f"verification could not run: {last.get('error')}"
        report = last["value"]
        if report["ok"]:
            return True, (
                f"{report['bytes_verified']} bytes arrived exactly; "
                f"{report['bytes_untouched_checked']} bytes that must stay untouched did"
            )
        listed = "; ".join(report["mismatches"][:5])
        return False, f"{report['mismatch_pages']} page(s) wrong: {listed}"

    return fn


def steps_completed() -> Callable[[list[dict]], tuple[bool, str]]:
    """No step raised or timed out."""

    def fn(events: list[dict]) -> tuple[bool, str]:
        failed = [e for e in events if e["type"] == "fail"]
        if not failed:
            return True, "every step completed"
        first = failed[0]
        return False, f"step {first['step']} {first['op']} on {first.get('role')} failed: {first.get('error')}"

    return fn


def killed_roles(events: list[dict]) -> set[str]:
    """Roles the nemesis killed (their absence at the end is the scenario's doing)."""
    return {e["role"] for e in events if e["type"] == "nemesis" and e["op"] == "kill"}


def observations(events: list[dict]) -> tuple[dict[str, dict], list[str]]:
    """The last observation of every launched role, and why any role has none.

    A role that was launched but not observed (dead, frozen, not answering)
    is a problem, never silence that passes; roles the nemesis killed are left
    out.
    """
    killed = killed_roles(events)
    launched = [e["role"] for e in completions(events, op="launch") if e["type"] == "ok" and e["role"] not in killed]
    observed: dict[str, dict] = {}
    problems: dict[str, str] = {}
    for obs in completions(events, op="observe"):
        if obs["role"] in killed:
            continue
        if obs["type"] == "ok":
            observed[obs["role"]] = obs["value"]
            problems.pop(obs["role"], None)
        else:
            problems[obs["role"]] = obs.get("error") or "observation failed"
    for role in launched:
        if role not in observed and role not in problems:
            problems[role] = f"{role} was never observed"
    return observed, list(problems.values())


def no_dead_threads() -> Callable[[list[dict]], tuple[bool, str]]:
    """No thread in any role died with an exception, and every role could be observed."""

    def fn(events: list[dict]) -> tuple[bool, str]:
        observed, problems = observations(events)
        dead = [f"{role}: thread {d['thread']} died: {d['exception']}: {d['message']}"
                for role, value in observed.items() for d in value["dead_threads"]]
        bad = problems + dead
        return (not bad), ("; ".join(bad) if bad else f"no thread died in {len(observed)} role(s)")

    return fn


def loops_alive() -> Callable[[list[dict]], tuple[bool, str]]:
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


def loops_alive_at(label: str, roles: tuple[str, ...]) -> Callable[[list[dict]], tuple[bool, str]]:
    """At the mid-cell observation ``label`` (an Observe step), every control/worker
    thread of ``roles`` was alive and none had died."""

    def fn(events: list[dict]) -> tuple[bool, str]:
        seen = {e["role"]: e for e in events if e["op"] == "observe-mid" and (e.get("args") or {}).get("label") == label}
        problems = []
        for role in roles:
            event = seen.get(role)
            if event is None:
                problems.append(f"{role} was not observed {label}")
                continue
            if event["type"] != "ok":
                problems.append(event.get("error") or f"{role} could not be observed")
                continue
            value = event["value"]
            stopped = [name for name, alive in value["loops"].items() if not alive]
            dead = [f"{d['thread']} died: {d['exception']}: {d['message'][:120]}" for d in value["dead_threads"]]
            if stopped or dead:
                problems.append(f"{role} {label}: " + "; ".join(dead or [f"stopped: {', '.join(stopped)}"]))
        return (not problems), ("; ".join(problems) if problems else f"{', '.join(roles)} loops alive {label}")

    return fn


def nth_status(room: int, role: str, n: int, expected: tuple[int, ...]) -> Callable[[list[dict]], tuple[bool, str]]:
    """The ``n``-th AwaitStatus (0-based; -1 the last) of ``room`` on ``role`` saw one of ``expected``."""

    def fn(events: list[dict]) -> tuple[bool, str]:
        waits = [e for e in completions(events, op="await_status", role=role, room=room)]
        if not -len(waits) <= n < len(waits):
            return False, f"{role} room {room} was polled {len(waits)} time(s)"
        wait = waits[n]
        if wait["type"] != "ok":
            return False, f"{role} room {room}: polling failed: {wait.get('error')}"
        seen = wait["value"]["status"]
        names = "/".join(kvpoll_name(x) for x in expected)
        return seen in expected, f"{role} room {room} was {kvpoll_name(seen)} at step {wait['step']} (expected {names})"

    return fn


def role_fact(events: list[dict], role: str, key: str):
    """A fact a role reported when its manager started (``start_prefill``/``start_decode``)."""
    for e in events:
        if e["role"] == role and e["op"] in ("start_prefill", "start_decode") and e["type"] == "ok":
            return (e.get("value") or {}).get(key)
    return None


def failed_after_kill(room: int, decode: str, dead: str, slack_s: float) -> Callable[[list[dict]], tuple[bool, str]]:
    """``room`` on ``decode`` became Failed within the decode's heartbeat window plus
    ``slack_s`` seconds of ``dead``'s kill, with a reason naming ``dead``'s bootstrap address."""

    def fn(events: list[dict]) -> tuple[bool, str]:
        kill = next((e for e in events if e["type"] == "nemesis" and e["op"] == "kill" and e["role"] == dead), None)
        if kill is None:
            return False, f"{dead} was never killed"
        window = role_fact(events, decode, "heartbeat_window_s")
        addr = role_fact(events, dead, "bootstrap_addr")
        waits = [e for e in completions(events, op="await_status", role=decode, room=room)
                 if e["type"] == "ok" and e["seq"] > kill["seq"]]
        failed = next((e for e in waits if e["value"]["status"] == FAILED), None)
        if failed is None:
            last = kvpoll_name(waits[-1]["value"]["status"]) if waits else "never polled"
            return False, f"{decode} room {room} did not become Failed after {dead} was killed (last: {last})"
        latency = failed["t"] - kill["t"]
        reason = failed["value"].get("failure_reason") or ""
        bound = (window or 0) + slack_s
        problems = []
        if window is None:
            problems.append(f"{decode} reported no heartbeat window")
        elif latency > bound:
            problems.append(f"took {latency:.1f} s, more than heartbeat window {window:.1f} s + {slack_s:.0f} s")
        if not addr or addr not in reason:
            problems.append(f"reason {reason!r} does not name {dead} ({addr})")
        if problems:
            return False, f"{decode} room {room}: " + "; ".join(problems)
        return True, f"{decode} room {room} Failed {latency:.1f} s after the kill (window {window:.1f} s): {reason!r}"

    return fn


def first_event(events: list[dict], op: str, role: str, room: int | None = None, after_seq: int = -1) -> dict | None:
    """The first successful ``op`` event of ``role`` (for ``room`` when given) after ``after_seq``."""
    for e in events:
        if e["seq"] <= after_seq or e["op"] != op or e["role"] != role or e["type"] not in ("ok", "nemesis"):
            continue
        if room is not None and (e.get("args") or {}).get("room") != room:
            continue
        return e
    return None


def failed_within(room: int, role: str, since_op: str, since_role: str, low_s: float, high_s: float,
                  reason_words: tuple[str, ...] = (), need_reason: bool = True) -> Callable[[list[dict]], tuple[bool, str]]:
    """``room`` on ``role`` was first seen Failed between ``low_s`` and ``high_s``
    seconds after ``since_role``'s first ``since_op`` for the room (e.g. ``open_sender``),
    with a failure reason (containing one of ``reason_words``, when given) unless
    ``need_reason`` is False.  The implementation's clock may start anywhere inside
    that call, so "too early" counts from the call's start (its ``invoke`` event) and
    "too late" from its end."""

    def fn(events: list[dict]) -> tuple[bool, str]:
        start = first_event(events, since_op, since_role, room)
        if start is None:
            return False, f"{since_role} never completed {since_op} for room {room}"
        called = next((e for e in reversed(events[:events.index(start)]) if e["type"] == "invoke"
                       and e["op"] == since_op and e["role"] == since_role
                       and (e.get("args") or {}).get("room") == room), start)
        waits = [e for e in completions(events, op="await_status", role=role, room=room)
                 if e["type"] == "ok" and e["seq"] > start["seq"]]
        failed = next((e for e in waits if e["value"]["status"] == FAILED), None)
        if failed is None:
            last = kvpoll_name(waits[-1]["value"]["status"]) if waits else "never polled"
            return False, f"{role} room {room} never became Failed (last: {last})"
        latency = failed["t"] - start["t"]
        reason = failed["value"].get("failure_reason") or ""
        problems = []
        if failed["t"] - called["t"] < low_s:
            problems.append(f"Failed {failed['t'] - called['t']:.1f} s after {since_op} was called, "
                            f"before the {low_s:g} s deadline")
        elif latency > high_s:
            problems.append(f"Failed only {latency:.1f} s after {since_op} (allowed up to {high_s:g} s)")
        if not reason and (need_reason or reason_words):
            problems.append("no failure reason")
        elif reason_words and not any(w.lower() in reason.lower() for w in reason_words):
            problems.append(f"reason {reason!r} names none of {', '.join(reason_words)}")
        if problems:
            return False, f"{role} room {room}: " + "; ".join(problems)
        return True, f"{role} room {room} Failed {latency:.1f} s after {since_op}: {reason!r}"

    return fn


def no_log_matching(role: str, pattern: str) -> Callable[[list[dict]], tuple[bool, str]]:
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
            return False, f"{role} logged {len(hits)} record(s) matching /{pattern}/: " + "; ".join(hits[:3])
        return True, f"no {role} log record matches /{pattern}/"

    return fn


def no_residue(roles: tuple[str, ...], rooms: tuple[int, ...] | None = None) -> Callable[[list[dict]], tuple[bool, str]]:
    """At the last observation of each of ``roles``, the manager holds no per-room state
    (for ``rooms`` when given); the bounded memory of ended generations is allowed
    (R-RESIDUE-1, R-REUSE-1)."""

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
        if left:
            return False, "state left after clear: " + "; ".join(left[:8])
        return True, f"no per-room state left in {', '.join(roles)}"

    return fn


def abort_acks(events: list[dict], decode: str, room: int) -> list[dict]:
    """The ABORT_ACKs ``decode`` received for ``room`` (recorded at the end of the cell)."""
    for e in events:
        if e["op"] == "abort-acks" and e["role"] == decode:
            return [a for a in e["value"] if a.get("room") == room]
    return []


def engine_faults(events: list[dict], role: str) -> list[dict]:
    """The engine faults injected in ``role`` (``transfer``, ``fault``, ``what``, ``t``...)."""
    return [e["value"] for e in events if e["type"] == "nemesis" and e["op"] == "engine-fault" and e["role"] == role]


# ---- verdict -----------------------------------------------------------------

def verdict_of(results: list[CheckResult], run_error: str | None = None,
               unsupported: str | None = None) -> tuple[str, str]:
    """Fold check results into (verdict, reason).

    UNSUPPORTED when the adapter could not perform a step; ERROR when the cell
    could not run (``run_error``) or declares no check; FAIL when a MUST check
    failed (evidence beats a check that could not tell); ERROR when a check
    could not tell; WARN when only SHOULD checks failed; else PASS.
    """
    if unsupported:
        return UNSUPPORTED, unsupported
    if run_error:
        return ERROR, run_error
    if not results:
        return ERROR, "the scenario declares no check: nothing was judged"
    must = [r for r in results if r.ok is False and r.level == "MUST"]
    if must:
        return FAIL, f"{must[0].requirement} {must[0].name}: {must[0].detail}"
    unknown = [r for r in results if r.ok is None]
    if unknown:
        return ERROR, f"{unknown[0].requirement} {unknown[0].name}: {unknown[0].detail}"
    should = [r for r in results if r.ok is False]
    if should:
        return WARN, f"{should[0].requirement} {should[0].name}: {should[0].detail}"
    return PASS, ""
