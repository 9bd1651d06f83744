"""Load is part of the record: what the machine's load did to a cell, decided from its history.

The runner stores in each cell's ``cell-exit`` event the load it ran under
(harness.drive.load: the load average at its start, end and peak, against the cores, and
the run-queue wait of each process of the cell).  Here, as pure functions of that history:

- :func:`cell_load`: that record summed up, per role (the pids of the roles' ``launch``
  events name them; the cell process is ``cell``);
- :func:`starved`: whether the cell ran starved, and why, by the rule below;
- :func:`timing_only`: whether the cell's only failures were timing bounds;
- :func:`needs_alone`: whether the run runs the cell once more alone (harness.session),
  so that a timing bound a starved machine broke is told from a broken implementation.

**Starved** (issue 34 item 5): a cell ran starved when either

1. the machine's 1-minute load average, at the cell's start, its end or any sample while it
   ran, was above the cores the run may use (more runnable tasks than cores: someone waited), or
2. the cell's own threads, summed, waited for a core (run-queue wait, ``schedstat``) at least
   :data:`STARVED_WAIT_SHARE` of the cell's wall time and at least :data:`STARVED_WAIT_MIN_S`:
   on average a quarter of a thread of the cell was ready to run and did not, the whole time it
   ran.  This catches a burst the 1-minute average smooths away.  The floor is there because a
   cell's processes wait for a core as they are forked: a sub-second cell on an idle machine
   waits most of its wall time.  Measured on a 2-core machine (docs/performance.md, "Load"):
   reference, Mooncake and NIXL cells (happy-path, waiting-timeout, dead-prefill) one at a time on
   an idle machine waited 0.14 - 0.71 s, at most 11 % of the wall time of those over 3 s; beside
   four busy processes the same cells waited 0.5 - 92 s, 24 - 466 % of their wall time.

**Timing only**: the cell did not PASS and every failure is a bound on elapsed time, not a
wrong value:

- every failed check (``ok`` False) carries :attr:`harness.judge.checks.CheckResult.timing`
  (its checker is marked by harness.judge.checks.timing_bound: a latency held to a bound) or
  failed at a wait that ran out its bound before its status came (an ``await_status`` that had
  to see it and did not: 24.6 s waited for a core in an 11.7 s cell at load 29), and no check
  could not tell; or
- the runner killed the cell at its deadline (a bound on the cell's wall time); or
- a role did not start within its bound (a ``launch`` that failed ``timed_out``); or
- a role call got no answer within the harness's own bound (a ``fail`` event ``timed_out``:
  ``observe got no answer within 10.0 s``, seen at loads of 39 to 197 on 2 cores): what
  failed after it (loops-alive, a dead thread that could not be seen) cannot be told apart
  from a starved harness, so the cell is run again alone, where a role that really hangs
  times out again and the cell stays a regression.

Not (yet) counted as timing: a fork server that did not answer a fork (docs/performance.md,
"Load"); it stays a regression.  A fault that never fired in a starved cell is run again alone
too (harness.judge.judge: it may have missed its moment to a room that timed out first).

**Run again alone** (:func:`needs_alone`): a cell worse than expected, timing only and starved.
"""

from __future__ import annotations

from typing import Any

from harness.spec.history import Event, Op

STARVED_WAIT_SHARE = 0.25  # run-queue wait of the cell's threads / its wall time at or above which it ran starved
STARVED_WAIT_MIN_S = 1.0  # ... and the least run-queue wait (seconds) that counts: forking alone costs up to ~0.7 s


def _exit_value(history: list[dict]) -> dict:
    return next((e.get("value") for e in reversed(history) if e.get("op") == Op.CELL_EXIT
                 and e.get("type") == Event.INFO and isinstance(e.get("value"), dict)), None) or {}


def _role_pids(history: list[dict]) -> dict[str, str]:
    """pid (as a string) -> role name, from the roles' successful ``launch`` events (a restarted role: each pid)."""
    return {str(e["value"]["pid"]): e["role"] for e in history
            if e.get("op") == Op.LAUNCH and e.get("type") == Event.OK and isinstance(e.get("value"), dict)
            and e["value"].get("pid") is not None}


def _processes(history: list[dict], record: dict) -> dict[str, dict]:
    """Per pid, the larger of the runner's last sample (``cell-exit``) and the cell's own reading
    as it ended (``cell-end`` ``load``) of each figure: both are lower bounds (harness.drive.load)."""
    end = next((e.get("value") for e in reversed(history) if e.get("op") == Op.CELL_END
                and e.get("type") == Event.INFO and isinstance(e.get("value"), dict)), None) or {}
    merged: dict[str, dict] = {}
    for source in (record.get("processes") or {}, end.get("load") or {}):
        for pid, figures in source.items():
            into = merged.setdefault(pid, {"run_s": 0.0, "wait_s": 0.0, "threads": 0})
            for key in into:
                into[key] = max(into[key], figures.get(key, 0))
    return merged


def cell_load(history: list[dict]) -> dict[str, Any] | None:
    """The load the cell ran under, from its ``cell-exit`` event: ``{"cores", "load_start",
    "load_end", "load_peak_1m" (load averages: 1, 5, 15 minutes), "duration_s" (wall),
    "run_s", "wait_s" (seconds on a core and waiting for one, summed over every thread seen
    of the cell and its roles), "roles": {"cell" | ROLE | "other": {"run_s", "wait_s",
    "threads"}}}``; None when the history has none (a run made before it was recorded, or a
    cell that never ended).  Pure."""
    exit_ = _exit_value(history)
    record = exit_.get("load")
    if not isinstance(record, dict):
        return None
    names = {**_role_pids(history), str(record.get("cell_pid")): "cell"}
    roles: dict[str, dict[str, float]] = {}
    for pid, figures in _processes(history, record).items():
        name = names.get(pid, "other")  # e.g. a process a role started
        into = roles.setdefault(name, {"run_s": 0.0, "wait_s": 0.0, "threads": 0})
        for key in into:
            into[key] = round(into[key] + figures.get(key, 0), 3)
    return {"cores": record.get("cores"), "load_start": record.get("load_start") or [],
            "load_end": record.get("load_end") or [], "load_peak_1m": record.get("load_peak_1m"),
            "duration_s": exit_.get("duration_s"),
            "run_s": round(sum(r["run_s"] for r in roles.values()), 3),
            "wait_s": round(sum(r["wait_s"] for r in roles.values()), 3), "roles": roles}


def starved(load: dict[str, Any] | None) -> str:
    """Why a cell with load record ``load`` (:func:`cell_load`) ran starved, in words
    (``load 31.0 on 2 cores``, ``waited 6.1 s for a core in 9.8 s``), by the module
    docstring's rule; "" when it did not, or nothing was recorded.  Pure."""
    if not load or not load.get("cores"):
        return ""
    why = []
    peak = max([x for x in (load.get("load_peak_1m"), *(load.get("load_start") or [])[:1],
                            *(load.get("load_end") or [])[:1]) if isinstance(x, (int, float))], default=0.0)
    if peak > load["cores"]:
        why.append(f"load {peak:.1f} on {load['cores']} core{'s' * (load['cores'] != 1)}")
    why.append(waited_for_core(load))
    return ", ".join(w for w in why if w)


def waited_for_core(load: dict[str, Any] | None) -> str:
    """The second starved rule alone (module docstring): the cell's own threads waited for a core
    at least :data:`STARVED_WAIT_SHARE` of its wall time and :data:`STARVED_WAIT_MIN_S`, in words;
    "" when not.  The rule a rerun is held to (:func:`rerun_starved`): a load average still
    lags a busy round when its reruns start.  Pure."""
    wall = (load or {}).get("duration_s") or 0.0
    if wall > 0 and load.get("wait_s", 0.0) >= max(STARVED_WAIT_SHARE * wall, STARVED_WAIT_MIN_S):
        return f"waited {load['wait_s']:.1f} s for a core in {wall:.1f} s"
    return ""


def rerun_starved(rerun) -> bool:
    """Whether ``rerun`` (a judged CellResult of a cell run again alone, or beside a few other
    reruns: harness.drive.scheduler.run_alone, ``pdconform mutants`` two a core) confirms nothing: it
    failed only on timing bounds and its own threads waited for a core (:func:`waited_for_core`)."""
    return rerun.verdict != "PASS" and rerun.timing_only and bool(waited_for_core(rerun.load))


def timing_only(history: list[dict], checks: list[dict]) -> bool:
    """Whether a cell's only failures were timing bounds (module docstring): its ``checks``
    (CheckResult dicts as judged from ``history``) and how its history ended.  Pure."""
    if _exit_value(history).get("how") == "deadline":
        return True
    if any(e.get("type") == Event.FAIL and e.get("timed_out") for e in history):  # a launch or a call: the bound
        return True
    failed = [c for c in checks if c.get("ok") is False]
    unknown = [c for c in checks if c.get("ok") is None and not c.get("unsupported")]
    # a check that failed at a wait which ran out its bound before its status came: that bound was on time too
    ran_out = {e["seq"] for e in history if e.get("op") == Op.AWAIT_STATUS and e.get("type") == Event.OK
               and (e.get("args") or {}).get("must_come", True) and (e.get("value") or {}).get("reached") is False}
    return bool(failed) and not unknown and all(c.get("timing") or c.get("at") in ran_out for c in failed)


def needs_alone(cell) -> bool:
    """Whether ``cell`` (a judged harness.judge.results.CellResult) is run once more alone at the
    end of its run: it ran starved and either is worse than expected and failed only on timing
    bounds, or is a known cell whose failing checks its entry does not list
    (CellResult.new_checks) are all timing bounds (a starved machine can add a late heartbeat
    verdict to a known byte bug).  A cell as expected is not (its known verdict stands either
    way), nor one that is better."""
    if cell.alone is not None or not cell.starved:
        return False
    if cell.verdict > cell.expected:
        return cell.timing_only
    new = set(cell.new_checks)
    return bool(new) and all(c.get("ok") is False and c.get("timing") for c in cell.checks if c.get("name") in new)
