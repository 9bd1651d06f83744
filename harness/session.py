"""One run session, the same for ``pdconform run``/``repro``, the pytest plugin and ``bench``:
execute the cells, judge them once, write the result tree.

The path of one cell: :func:`run` (a fresh run folder under the --out folder,
harness.report.outdir) -> :func:`run_into` -> harness.drive.scheduler.run_matrix
(execution: each cell's process records ``history.jsonl``, the runner appends how it
ended and the load it ran under; a cell worse than expected only on timing bounds while
the machine starved it runs once more alone at the end, into ``alone/``,
harness.judge.load) -> :func:`judge_tree` (harness.judge.judge.judge_run: verdict, divergence,
expectation, from the histories alone) -> :func:`write_tree` (results.json, each
``cell.json`` and, unless asked not to, junit.xml, summary.md and index.html, all
atomically); then ``OUT/latest`` moves to the new run.  ``pdconform judge RUN_DIR`` is
:func:`rejudge`: the same judge and writer on a stored run.
"""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from harness import nofollow, program
from harness.drive.contain import NETNS_ENV, isolation_available
from harness.drive.runner import CellRun
from harness.drive.scheduler import Callbacks, Schedule, expected_durations, run_matrix
from harness.implementations import engine_settings, settings_env
from harness.judge.expectations import Expectations
from harness.judge.judge import judge_cell, judge_run
from harness.judge.load import cell_load, needs_alone, starved
from harness.judge.results import (RUNS, RunResult, cell_dir, dump_cell, dump_run, load_alone_histories, load_histories,
                                   load_run, on_pair_dir)
from harness.report.files import write_reports
from harness.report.outdir import OutDirError, RunFolder, run_folder_of, take_lock
from harness.spec import history as hist
from harness.spec.scenario import Scenario
from harness.target.role_context import BIND_ENV, LOOPBACK
from harness.target.sglang import SglangTarget


@dataclass
class RunConfig:
    """What one run executes and how.

    ``impls`` and ``scenarios`` (the cells are their product), ``out_dir`` (the --out folder:
    :func:`run` makes the run's own folder under it), ``target``
    (which sglang), ``seed``, ``jobs`` at a time, ``fork`` (from fork servers),
    ``full_waits``, ``engine_settings`` (name -> value, harness.implementations.EngineSetting;
    an unnamed setting keeps its default), ``expectations`` (None: every cell expected to
    PASS), ``duration_hint`` and ``priority`` (harness.drive.scheduler.Schedule), ``reports`` (False: only
    results.json and the cells' cell.json, as bench wants), ``bind`` (the IPv4 address roles
    listen on; None: loopback, :func:`cell_network`), ``docs_url`` (the base the reports'
    links to docs/ are made absolute with; "" keeps them relative), ``baseline`` (a stored
    run each cell is marked new / fixed / same against, check by check), ``hosts`` (the
    agents of a run across hosts, by rank: ``endpoint``, ``address``, ``host``; () every role
    local; ``bind`` is then the coordinator's address, harness.hosts.cluster), ``alone_reruns``
    (run a cell that failed only on timing bounds while starved once more alone at the end:
    harness.judge.load), ``isolated`` (every cell in a fresh process of its own; default: cells
    on warm role pairs where they can be, each whose result is not the expected one confirmed
    in a fresh cell, harness.drive.warm)."""

    impls: list[str]
    scenarios: list[Scenario]
    out_dir: Path
    target: SglangTarget
    seed: int = 0
    jobs: int = 1
    fork: bool = True
    full_waits: bool = False
    engine_settings: dict[str, int] = field(default_factory=dict)
    expectations: Expectations | None = None
    duration_hint: dict[tuple[str, str], float] = field(default_factory=dict)
    priority: dict[tuple[str, str], int] = field(default_factory=dict)
    reports: bool = True
    bind: str | None = None
    docs_url: str = ""
    baseline: tuple[Path, RunResult] | None = None  # run --baseline: where it was read, and the run
    hosts: tuple[dict, ...] = ()
    hosts_spec: str = ""  # run --hosts as given (netns:N or N): what a cell's reproduce command repeats
    hosts_listen: str = ""  # run --listen as given (with --hosts N): repeated too
    pool_device: str = "cpu"  # run --pool-device: where the roles' pools live (harness.role.pool_device)
    # a cell worse than expected only on timing bounds while starved runs once more alone at the end
    # (harness.judge.load.needs_alone); False where only the first verdicts count (bench, soak)
    alone_reruns: bool = True
    alone_jobs: int = 1  # reruns alone at once (harness.drive.scheduler.Schedule.alone_jobs)
    weigh: bool = False  # jobs count cells by their weight (harness.drive.scheduler.Schedule.weigh)
    isolated: bool = False

    def settings(self) -> dict[str, int]:
        """Every registered engine setting's value for this run (the defaults, then ``engine_settings``)."""
        return default_settings() | dict(self.engine_settings)


def run(config: RunConfig, callbacks: Callbacks | None = None) -> RunResult:
    """Execute, judge and write one run into a fresh folder ``OUT/runs/<time>/`` under
    ``config.out_dir`` (harness.report.outdir.RunFolder), then point ``OUT/latest`` at it;
    its result tree (each cell's ``workdir`` is inside that folder).

    OutDirError when another run holds OUT; KeyboardInterrupt propagates after the running
    cells were killed (``latest`` and earlier runs are left as they were); OSError when the
    folder cannot be written."""
    run_folder = RunFolder(config.out_dir)
    with run_folder as folder:
        result = run_into(config, folder, callbacks)
        for note in run_folder.finish():  # run folders left unpruned, a trend page that is not ours
            if callbacks is not None and callbacks.on_note is not None:
                callbacks.on_note(note)
    return result


def cell_network(bind: str | None) -> tuple[str, dict[str, str]]:
    """What the cells' network is, in words, and the environment that makes it so.

    Default (``bind`` None or a loopback address): each cell gets a private network namespace
    with only ``lo`` when this machine allows one (harness.drive.contain), so nothing outside
    the cell reaches a role, whatever address it binds; else the host's network, said why.
    A non-loopback ``bind`` (``run --bind``, for roles on several hosts) must be reachable:
    no namespace, and every role listens on and advertises that address."""
    import ipaddress

    env = {BIND_ENV: bind or LOOPBACK}  # explicit: a PDCONFORM_BIND in the caller's environment does not leak in
    if bind and not ipaddress.ip_address(bind).is_loopback:
        return f"the host's network: roles listen on {bind} (--bind), reachable from other hosts", env
    why_not = isolation_available()
    if why_not is None:
        return "a private loopback-only network namespace per cell", {**env, NETNS_ENV: "1"}
    return why_not, env


def cell_target(target: SglangTarget, settings: dict[str, int], bind: str | None = None,
                hosts: tuple[dict, ...] = (), pool_device: str = "cpu") -> tuple[str, SglangTarget]:
    """The cells' network in words (:func:`cell_network`) and ``target`` with the environment
    every cell runs under: the engine ``settings``, that network, the agents its roles
    start on (``hosts``, harness.drive.remote.HOSTS_ENV) and where their pools live
    (``pool_device``, harness.role.pool_device), for ``run`` and ``explore`` alike, so a program
    cell is as contained as a matrix cell."""
    import json

    from harness.drive.remote import HOSTS_ENV
    from harness.role.pool_device import POOL_DEVICE_ENV

    network, network_env = cell_network(bind)
    if hosts:
        network = f"{len(hosts)} hosts ({', '.join(h['address'] for h in hosts)}): roles listen on their host's address"
        network_env = {**network_env, HOSTS_ENV: json.dumps(list(hosts))}
    devices = {POOL_DEVICE_ENV: pool_device}  # explicit: one in the caller's environment does not leak in
    return network, SglangTarget(python=target.python, info=target.info,
                                 env={**target.env, **settings_env(settings), **network_env, **devices})


def default_settings() -> dict[str, int]:
    """Every registered engine setting at its default (a run without ``--engine-setting``)."""
    return {name: s.default for name, s in engine_settings().items()}


def run_into(config: RunConfig, folder: Path, callbacks: Callbacks | None = None) -> RunResult:
    """Execute, judge and write one run into ``folder`` (made by the caller, e.g. bench's
    ``run-N``); its result tree."""
    settings = config.settings()
    network, target = cell_target(config.target, settings, config.bind, config.hosts, config.pool_device)
    meta = RunResult(sglang=target.info, seed=config.seed, program=program(), engine_settings=settings, full_waits=config.full_waits,
                     started_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), network=network,
                     docs_url=config.docs_url,
                     hosts=[{"rank": i, "name": h.get("host", ""), "address": h["address"]}
                            for i, h in enumerate(config.hosts)], hosts_spec=config.hosts_spec,
                     hosts_listen=config.hosts_listen, pool_device=config.pool_device)
    schedule = Schedule(target=target, seed=config.seed, jobs=config.jobs, fork=config.fork,
                        full_waits=config.full_waits, duration_hint=dict(config.duration_hint),
                        priority=dict(config.priority), pairs=not config.isolated, alone_jobs=config.alone_jobs,
                        weigh=config.weigh)
    if not config.isolated:
        callbacks = _with_confirm(config, callbacks)
    again = _starved_cells(config, folder, callbacks) if config.alone_reruns else None
    cells, duration = run_matrix(config.impls, config.scenarios, folder, schedule, callbacks, again=again)
    meta.duration_s = duration
    result, histories = judge_tree(meta, folder, cells_of(cells), {s.id: s for s in config.scenarios},
                                   config.expectations)
    if config.baseline is not None:
        from harness.report.run_diff import baseline_marks

        path, baseline = config.baseline
        result.baseline = {"path": str(path), "sglang": baseline.sglang.version,
                           "marks": baseline_marks(baseline, result)}
    write_tree(result, folder, histories, reports=config.reports)
    return result


def _with_confirm(config: RunConfig, callbacks: Callbacks | None) -> Callbacks:
    """``callbacks`` with the ``confirm`` of harness.drive.scheduler.Callbacks: a cell that ran on
    a warm role pair whose verdict or failing checks are not the expected ones
    (CellResult.as_expected) runs once more in a fresh isolated cell."""
    from dataclasses import replace

    scenarios = {s.id: s for s in config.scenarios}

    def confirm(cell: CellRun) -> bool:
        path = cell.workdir / "history.jsonl"
        history = hist.load(path) if path.is_file() else []
        return not judge_cell(scenarios[cell.scenario], config.seed, history, cell.impl, config.expectations).as_expected

    return replace(callbacks or Callbacks(), confirm=confirm)


def _starved_cells(config: RunConfig, folder: Path, callbacks: Callbacks | None):
    """The ``again`` of harness.drive.scheduler.run_matrix: from the reported cells' histories,
    the cells to run once more alone (harness.judge.load.needs_alone), said on ``on_note``
    (run_alone leaves out, just before it would start, one the callbacks' ``skip`` no longer wants)."""
    scenarios = {s.id: s for s in config.scenarios}

    def again(cells: list[CellRun]) -> list[tuple[str, str]]:
        picked = []
        for cell in cells:
            history = hist.load(cell.workdir / "history.jsonl") if (cell.workdir / "history.jsonl").is_file() else []
            if not starved(cell_load(history)):  # the cheap test first: most cells are judged only once, later
                continue
            judged = judge_cell(scenarios[cell.scenario], config.seed, history, cell.impl, config.expectations)
            if needs_alone(judged):
                picked.append(judged)
        if picked and callbacks and callbacks.on_note:
            callbacks.on_note(f"{len(picked)} cell(s) worse than expected only on timing bounds while the machine "
                              f"starved them run once more alone: " + "; ".join(
                                  f"{c.scenario} x {c.impl} ({c.verdict}, {c.starved})" for c in picked))
        return [(c.scenario, c.impl) for c in picked]

    return again


def read_expectations(path: str | Path) -> Expectations:
    """An expectations file validated against the registered implementations and scenarios
    (the self-test ones when PDCONFORM_TEST_SCENARIOS=1); ExpectationsError otherwise."""
    from harness.implementations import available
    from harness.judge.expectations import load_expectations

    from harness.spec.scenario import scenario_ids

    return load_expectations(path, available(), scenario_ids())


def resolve_expectations(given: str | Path | None, version: str | None) -> Expectations | None:
    """The expectations a run, repro or pytest session judges against: the file ``given``;
    with none given the file shipped for sglang ``version`` when there is one (for a dev, pre,
    post or local version without its own, the newest shipped release's at or below it:
    harness.judge.expectations.shipped_path); ``none``: no file (every cell expected to PASS).
    ExpectationsError for a bad file."""
    from harness.judge.expectations import NO_EXPECTATIONS, shipped_path

    if given is not None and str(given).strip().lower() == NO_EXPECTATIONS:
        return None
    path = given if given else shipped_path(version)
    return read_expectations(path) if path else None


def clean_clone_order(version: str | None, scenarios: list[Scenario], impls: list[str],
                      seed: int = 0) -> dict[tuple[str, str], float]:
    """The cell order a clean clone's first run uses (harness.drive.scheduler.Schedule's
    ``duration_hint``): from the expectations shipped for sglang ``version``, the cells
    expected to fail first; {} when none are shipped."""
    from harness.judge.expectations import shipped_path

    shipped = shipped_path(version)
    if shipped is None:
        return {}
    return expected_durations(scenarios, impls, seed, read_expectations(shipped).verdict_for)


def cells_of(cells: list[CellRun]) -> list[tuple[str, str]]:
    """The ``(scenario, impl)`` keys of executed cells, in order."""
    return [(c.scenario, c.impl) for c in cells]


def judge_tree(meta: RunResult, out_dir: Path, cells: list[tuple[str, str]], scenarios: dict[str, Scenario],
               expectations: Expectations | None) -> tuple[RunResult, dict[tuple[str, str], list[dict]]]:
    """Judge every cell of a run from the histories under ``out_dir`` (read once, here);
    the result tree and the histories (the reports show them)."""
    histories = load_histories(out_dir, cells)
    alone, on_pair = load_alone_histories(out_dir, cells), load_alone_histories(out_dir, cells, on_pair_dir)
    return judge_run(meta, out_dir, cells, scenarios, histories, expectations, alone=alone, on_pair=on_pair), histories


def write_tree(result: RunResult, out_dir: Path, histories: dict[tuple[str, str], list[dict]],
               reports: bool = True) -> dict[str, Path]:
    """Write ``results.json``, every cell's ``cell.json`` and (``reports``) junit.xml, summary.md
    and index.html into ``out_dir``; their paths by name.  OSError when it cannot."""
    paths = {"results.json": out_dir / "results.json"}
    for cell in result.cells:
        folder = cell_dir(out_dir, cell.scenario, cell.impl)
        if folder.is_dir():
            dump_cell(cell, folder / "cell.json")
    dump_run(result, paths["results.json"])
    if reports:
        paths.update(write_reports(result, out_dir, histories))
    return paths


def _stored_run(path: Path) -> tuple[Path, RunResult]:
    """The run folder ``path`` names (itself, or an --out folder's latest) and its results;
    RejudgeError when it is no finished pdconform run."""
    from harness.spec.inputs import InputError

    try:
        folder = run_folder_of(path)
    except OutDirError as exc:
        raise RejudgeError(str(exc)) from None
    try:
        nofollow.refuse_link(folder / "results.json")  # a link planted there would be read, and written through
        return folder, load_run(folder / "results.json")
    except nofollow.LinkRefused as exc:
        raise RejudgeError(str(exc)) from None
    except InputError as exc:
        raise RejudgeError(f"{folder} holds no finished pdconform run: {exc}") from None
    except ValueError as exc:
        raise RejudgeError(f"{folder / 'results.json'} is not a pdconform results.json: {exc}") from None


def _rewrite_trend(folder: Path, on_note: Callable[[str], None] | None) -> None:
    """An --out folder's run judged again: its trend page shows the new verdicts (harness.report.trend)."""
    if folder.parent.name != RUNS:
        return
    from harness.report.trend import write_trend

    try:
        write_trend(folder.parent.parent)
    except OSError as exc:
        if on_note:
            on_note(f"the trend page could not be written: {exc.strerror or exc}")


class RejudgeError(ValueError):
    """A folder ``pdconform judge`` cannot re-judge; the message says why."""


def rejudge(path: Path, expectations: Expectations | None = None,
            on_note: Callable[[str], None] | None = None, keep_runs: bool = True) -> tuple[RunResult, Path]:
    """Judge a stored run again from its histories and rewrite its result tree; the result
    and the run folder.

    ``path``: a run folder, or an --out folder (its ``latest`` run).  The run-level facts
    (sglang, seed, settings, cell list) come from its results.json; ``expectations``
    replaces the ones the run was judged against (None: the run's own file, or, when it can
    no longer be read, the expected verdicts stored in the run; ``on_note`` says so; None
    with ``keep_runs`` False: none, every cell expected to PASS, as `--expectations none`).
    RejudgeError for a folder that is no pdconform run, was made by an older pdconform, or
    names a scenario or implementation this checkout does not have; OutDirError when
    another process is judging it."""
    from harness.implementations import available
    from harness.judge.expectations import Expectations, ExpectationsError
    from harness.spec.history import Op
    from harness.spec.scenario import scenarios_by_id

    folder, stored = _stored_run(path)
    results = folder / "results.json"
    known = scenarios_by_id((c.scenario for c in stored.cells), include_test_only=True)
    missing = sorted({c.scenario for c in stored.cells} - set(known))
    if missing:
        raise RejudgeError(f"{results} has cells of scenarios this checkout does not have: {', '.join(missing)}")
    if expectations is None and keep_runs and stored.expectations:
        try:
            expectations = read_expectations(stored.expectations)
        except ExpectationsError as exc:
            expectations = Expectations.of_run(stored)
            if on_note:
                on_note(f"the run's expectations file cannot be read, so the expected verdicts stored in the run "
                        f"are kept: {exc}")
    unknown = sorted({c.impl for c in stored.cells} - set(available(include_test_only=True)))
    if unknown:
        raise RejudgeError(f"{results} has cells of implementations that are not registered: {', '.join(unknown)}")
    cells = [(c.scenario, c.impl) for c in stored.cells]
    lock = take_lock(folder, "judging")
    try:
        result, histories = judge_tree(stored, folder, cells, known, expectations)
        older = [f"{sc} x {impl}" for sc, impl in cells if (events := histories.get((sc, impl)))
                 and not any(e["op"] == Op.CELL_START for e in events)]
        if older:
            raise RejudgeError(f"{folder} was made by an older pdconform (its histories have no cell-start: "
                               f"{', '.join(older[:3])}); run it again")
        if expectations is None:
            result.expectations = None
        write_tree(result, folder, histories)
        _rewrite_trend(folder, on_note)
    finally:
        os.close(lock)
    return result, folder
