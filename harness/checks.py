"""Checkers: pure functions from a cell history to check results, and the verdict.

A check names the requirement it enforces (an ID in docs/protocol.md) and its
level (MUST or SHOULD).  A checker that raises yields ``ok=None`` ("unknown")
with the error, never a crash of the report.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable

from harness.adapter import kvpoll_name
from harness.history import completions

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
    fn: Callable[[list[dict]], tuple[bool, str]]

    def run(self, events: list[dict]) -> CheckResult:
        try:
            ok, detail = self.fn(events)
        except Exception as exc:  # a broken checker is "unknown", not a crash
            return CheckResult(self.name, self.requirement, self.level, None, f"checker error: {exc!r}")
        return CheckResult(self.name, self.requirement, self.level, bool(ok), detail)


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
        return False, (
            f"{role} room {room} ended at {kvpoll_name(seen)}, expected {kvpoll_name(status)} "
            f"within {last['args'].get('timeout_s')} s{extra}"
        )

    return fn


def pools_exact(decode: str = "decode") -> Callable[[list[dict]], tuple[bool, str]]:
    """The last pool verification on ``decode`` found every byte where it belongs."""

    def fn(events: list[dict]) -> tuple[bool, str]:
        checks = list(completions(events, op="verify", role=decode))
        if not checks:
            return False, "pools were never verified"
        last = checks[-1]
        if last["type"] == "fail":
            return False, f"verification failed to run: {last.get('error')}"
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


def no_dead_threads() -> Callable[[list[dict]], tuple[bool, str]]:
    """No thread in any role died with an exception."""

    def fn(events: list[dict]) -> tuple[bool, str]:
        dead = []
        for obs in completions(events, op="observe"):
            if obs["type"] == "ok":
                for d in obs["value"]["dead_threads"]:
                    dead.append(f"{obs['role']}: thread {d['thread']} died: {d['exception']}: {d['message']}")
        return (not dead), ("; ".join(dead) if dead else "no thread died")

    return fn


def loops_alive() -> Callable[[list[dict]], tuple[bool, str]]:
    """Every control/worker thread the managers started is still alive at the end."""

    def fn(events: list[dict]) -> tuple[bool, str]:
        stopped = []
        seen = 0
        for obs in completions(events, op="observe"):
            if obs["type"] != "ok":
                return False, f"{obs['role']} could not be observed: {obs.get('error')}"
            for name, alive in obs["value"]["loops"].items():
                seen += 1
                if not alive:
                    stopped.append(f"{obs['role']}:{name}")
        if stopped:
            return False, "stopped: " + ", ".join(stopped)
        return True, f"{seen} control/worker threads alive"

    return fn


# ---- verdict -----------------------------------------------------------------

def verdict_of(results: list[CheckResult], run_error: str | None = None,
               unsupported: str | None = None) -> tuple[str, str]:
    """Fold check results into (verdict, reason).

    UNSUPPORTED when the adapter could not perform a step; ERROR when the cell
    could not run (``run_error``) or a checker crashed; FAIL when a MUST check
    failed; WARN when only SHOULD checks failed; else PASS.
    """
    if unsupported:
        return UNSUPPORTED, unsupported
    if run_error:
        return ERROR, run_error
    unknown = [r for r in results if r.ok is None]
    if unknown:
        return ERROR, f"{unknown[0].name}: {unknown[0].detail}"
    must = [r for r in results if r.ok is False and r.level == "MUST"]
    if must:
        return FAIL, f"{must[0].requirement} {must[0].name}: {must[0].detail}"
    should = [r for r in results if r.ok is False]
    if should:
        return WARN, f"{should[0].requirement} {should[0].name}: {should[0].detail}"
    return PASS, ""
