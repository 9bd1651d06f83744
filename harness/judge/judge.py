"""The judge: a cell's verdict as a pure function of its scenario, seed and history.

Execution and judgement are apart (as Jepsen keeps its checker a function of the
stored history): the cell process only records (harness.drive.cell), the runner
appends how the process ended (:attr:`Op.CELL_EXIT`), and :func:`judge` decides,
once, in the parent: the verdict and its reason, the checks, the first divergence
from the reference's history for the same scenario and seed (harness.judge.divergence)
and the expectation (harness.judge.expectations).  ``pdconform judge RUN_DIR``
calls the same function on a stored run, so it reproduces every verdict.

The verdict, in order:

1. ERROR when the runner killed the cell at its deadline (the last step it reached is named);
2. ERROR when the cell process ended before its history did, or its steps raised something
   other than a step it cannot take (a crash; the exception or the log's tail is quoted);
3. UNSUPPORTED when the implementation could not perform a step (no check is reported: the
   steps after it never ran, so their checks would only say that);
4. ERROR when the cell could not go on (a role did not start) or declares no check;
5. FAIL when a MUST check failed (evidence beats a check that could not tell);
6. ERROR when a check could not tell; UNSUPPORTED when a check could not be judged on this
   machine or implementation (what it needed is named); WARN when only SHOULD checks
   failed; else PASS;
7. ERROR ("fault never fired") instead of PASS or WARN when a fault the cell injected never
   took effect (harness.judge.fired): such a cell tested nothing (not for a generated program,
   whose Scenario.faults_optional says why).  Every cell lists the faults it injected and whether each fired.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from harness.judge import divergence, postconditions
from harness.judge.fired import faults_of, never_fired
from harness.judge.load import cell_load, starved, timing_only
from harness.judge.checks import CheckResult
from harness.judge.expectations import Expectation, Expectations
from harness.judge.expectations import apply as apply_expectation
from harness.judge.results import CellResult, RunResult, alone_dir, cell_dir, on_pair_dir
from harness.judge.verdict import Level, Verdict
from harness.spec.text import clean, clean_tree
from harness.spec.history import START_OPS, Event, Op
from harness.spec.protocol import REFERENCE
from harness.spec.scenario import Scenario
from harness.spec.steps import STALL_CUT_S


def verdict_of(results: list[CheckResult]) -> tuple[Verdict, str]:
    """Fold the check results of a cell that ran to its end into (verdict, reason): steps 5
    and 6 of the module docstring, and ERROR when there is no check at all."""
    if not results:
        return Verdict.ERROR, "the scenario declares no check: nothing was judged"
    must = [r for r in results if r.ok is False and r.level == Level.MUST]
    if must:
        return Verdict.FAIL, f"{must[0].requirement} {must[0].name}: {must[0].detail}"
    unknown = [r for r in results if r.ok is None and not r.unsupported]
    if unknown:
        return Verdict.ERROR, f"{unknown[0].requirement} {unknown[0].name}: {unknown[0].detail}"
    unsupported = [r for r in results if r.unsupported]
    if unsupported:
        return Verdict.UNSUPPORTED, f"{unsupported[0].requirement} {unsupported[0].name}: {unsupported[0].detail}"
    should = [r for r in results if r.ok is False]
    if should:
        return Verdict.WARN, f"{should[0].requirement} {should[0].name}: {should[0].detail}"
    return Verdict.PASS, ""


def _value(events: list[dict], op: Op) -> dict | None:
    """The value of the last ``op`` info event (None when there is none, or it is not a dict)."""
    value = next((e.get("value") for e in reversed(events) if e["op"] == op and e["type"] == Event.INFO), None)
    return value if isinstance(value, dict) else None


def _last_step(events: list[dict]) -> str:
    """Where a cell was when it stopped: its last step and last event."""
    events = [e for e in events if e["op"] not in (Op.CELL_EXIT, Op.CELL_END)]
    steps = [e for e in events if e["op"] == Op.STEP]
    where = f"in step {steps[-1]['step']} {steps[-1]['args']['step']}" if steps else "before the first step"
    if not events or events[-1]["op"] in (Op.STEP, Op.CELL_START):
        return where
    last = events[-1]
    return f"{where}, last event: {last['op']} on {last.get('role')} ({last['type']})"


def _ended_early(exit_: dict | None, end: dict | None, events: list[dict]) -> str | None:
    """The ERROR reason of a cell that did not run to its end (steps 1 and 2), else None."""
    if exit_ is None and end is None:
        return "the cell's history has no end: its run was interrupted, or the cell never started"
    exit_ = exit_ or {}
    if exit_.get("how") == "deadline":
        return f"cell exceeded its deadline of {exit_['deadline_s']:.0f} s and was killed ({_last_step(events)})"
    if exit_.get("how") == "interrupted":
        return "run interrupted"
    if end is None:
        return (f"cell process exited with code {exit_.get('returncode')} before its history ended: "
                f"{exit_.get('log_tail', '')}")
    if end.get("outcome") == "crashed":
        return f"cell process crashed in step {end.get('step')}: {end.get('reason', '')}"
    return None


def _fail_fast_note(events: list[dict]) -> str:
    cuts = [e["args"]["cut"] for e in events if e["op"] == Op.AWAIT_STATUS and e["type"] == Event.INVOKE
            and "cut" in (e.get("args") or {})]
    if not cuts:
        return ""
    return (f" (fail fast: step {cuts[0]['after_step']}'s status never came, so {len(cuts)} later wait(s) "
            f"were cut to {STALL_CUT_S:g} s; --full-waits runs them in full)")


def _engine(events: list[dict]) -> str | None:
    """The engine the roles reported when their managers started (the last one said)."""
    engines = [(e.get("value") or {}).get("engine") for e in events if e["op"] in START_OPS and e["type"] == Event.OK]
    return next((x for x in reversed(engines) if x), None)


def judge(scenario: Scenario, seed: int, history: list[dict], *, impl: str | None = None,
          reference: list[dict] | None = None, expectation: Expectation | None = None,
          workdir: str | None = None) -> CellResult:
    """The :class:`CellResult` of one cell, from its history alone (see the module docstring).

    ``reference``: the reference's history for the same scenario and seed (None: no
    divergence is computed; the reference's own cells and self-test scenarios get none);
    ``expectation``: the expectations file's entry for the cell (None: PASS expected).
    ``impl``: the implementation (None: read from the history, :attr:`Op.CELL_START`, else
    :attr:`Op.CELL_EXIT`).  The load the cell ran under, whether it ran starved and whether its
    only failures were timing bounds are read from the same history (harness.judge.load).
    Pure: the same arguments give the same result."""
    start, exit_, end = _value(history, Op.CELL_START), _value(history, Op.CELL_EXIT), _value(history, Op.CELL_END)
    impl = impl or (start or exit_ or {}).get("impl", "?")
    early = _ended_early(exit_, end, history)
    checks: list[CheckResult] = []
    if early is not None:
        verdict, reason = Verdict.ERROR, early
    else:
        checks = [check.run(history) for check in postconditions.checks_of(scenario, seed)]
        verdict, reason = verdict_of(checks)
        if end.get("outcome") == "unsupported":  # the cell stopped at a step it cannot take: nothing was judged
            verdict, reason, checks = Verdict.UNSUPPORTED, end.get("reason", ""), []
        elif end.get("outcome") == "aborted":
            verdict, reason = Verdict.ERROR, end.get("reason", "")
        reason += _fail_fast_note(history)
    faults = faults_of(history)
    if early is None and verdict in (Verdict.PASS, Verdict.WARN) and never_fired(faults) and not scenario.faults_optional:
        verdict, reason = Verdict.ERROR, never_fired(faults)
    result = CellResult(
        impl=impl, scenario=scenario.id, verdict=verdict, engine=_engine(history),
        duration_s=(exit_ or {}).get("duration_s", 0.0), cpu_s=(exit_ or {}).get("cpu_s"),
        inherent_wait_s=scenario.inherent_wait_s(seed),
        bytes_verified=sum((e.get("value") or {}).get("bytes_verified", 0)
                           for e in history if e["op"] == Op.VERIFY and e["type"] == Event.OK),
        reason=reason, checks=[r.to_dict() for r in checks], workdir=workdir, faults=faults,
    )
    result.load = cell_load(history)
    result.pair = (start or {}).get("pair")
    # a fault that never fired in a starved cell may have missed its moment (a room that timed out first): rerun alone
    result.starved, result.timing_only = starved(result.load), verdict != Verdict.PASS and (timing_only(
        history, result.checks) or reason == never_fired(faults) != "")
    if reference and impl != REFERENCE and not scenario.test_only and verdict != Verdict.UNSUPPORTED:
        result.divergence = divergence.first_divergence(reference, history, result.checks)
    apply_expectation(result, expectation)  # its verdict, reason, link, failing checks and the bug's class
    # what the code under test said, safe to store and encode: no lone surrogate, no bidi control (harness.spec.text)
    result.reason, result.engine = clean(result.reason), result.engine and clean(result.engine)
    result.checks, result.divergence = clean_tree(result.checks), clean_tree(result.divergence)
    result.faults = clean_tree(result.faults)
    return result


def judge_cell(scenario: Scenario, seed: int, history: list[dict], impl: str, expectations: Expectations | None,
               reference: list[dict] | None = None, workdir: str | None = None) -> CellResult:
    """:func:`judge` for ``impl``'s cell of ``scenario``, with its entry of ``expectations``
    (None: PASS expected): what a run judges each cell with, and what ``run``'s live view
    shows as a cell ends (harness/cli/progress.py, without the reference's divergence)."""
    expectation = expectations.for_cell(impl, scenario.id) if expectations else None
    return judge(scenario, seed, history, impl=impl, reference=reference, expectation=expectation, workdir=workdir)


def judge_run(run: RunResult, out_dir: str | Path, cells: list[tuple[str, str]], scenarios: dict[str, Scenario],
              histories: dict[tuple[str, str], list[dict]], expectations: Expectations | None = None,
              alone: dict[tuple[str, str], list[dict]] | None = None,
              on_pair: dict[tuple[str, str], list[dict]] | None = None) -> RunResult:
    """``run`` (its run-level fields) with a judged cell for each ``(scenario id, impl)`` of
    ``cells``, in that order.  ``histories`` maps ``(scenario, impl)`` to events, with
    ``(scenario, "reference")`` for the divergence (harness.judge.results.load_histories);
    ``alone`` the histories of the cells run once more alone (harness.judge.load.needs_alone;
    harness.judge.results.load_alone_histories), each judged the same way into its cell's
    ``alone``; ``on_pair`` those of the cells' runs on a warm pair that were confirmed isolated,
    judged into the cell's ``on_pair``.  Pure apart from reading nothing: every input is passed in."""
    alone, on_pair = alone or {}, on_pair or {}
    judged = []
    for scenario_id, impl in cells:
        judge_one = partial(judge_cell, scenarios[scenario_id], run.seed, impl=impl, expectations=expectations,
                            reference=histories.get((scenario_id, REFERENCE)))
        cell = judge_one(histories.get((scenario_id, impl), []), workdir=str(cell_dir(out_dir, scenario_id, impl)))
        if (scenario_id, impl) in alone:
            cell.alone = judge_one(alone[(scenario_id, impl)], workdir=str(alone_dir(out_dir, scenario_id, impl)))
        if (scenario_id, impl) in on_pair:
            cell.on_pair = judge_one(on_pair[(scenario_id, impl)], workdir=str(on_pair_dir(out_dir, scenario_id, impl)))
        judged.append(cell)
    out = RunResult(**{f: getattr(run, f) for f in run.__struct_fields__ if f != "cells"}, cells=judged)
    out.expectations = expectations.path if expectations else run.expectations
    return out
