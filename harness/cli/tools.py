"""The commands about the machine and the harness itself: ``doctor``, ``list``, ``bench``, ``simulate``, ``soak``, ``scrub``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape

from harness.cli import (
    MAX_JOBS,
    MAX_SEED,
    ENGINE_SETTING_OPTION,
    EXPECTATIONS_OPTION,
    SGLANG_SRC_OPTION,
    SGLANG_TREE_VERSION_OPTION,
    SGLANG_VERSION_OPTION,
    _out_dir,
    _run_folder,
    _registry,
    _select,
    _settings,
    _target,
    _usage_error,
    app,
    console,
    err,
)


@app.command()
def doctor(as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
           sglang_src: Optional[Path] = typer.Option(None, "--sglang-src", help="Report this sglang checkout (its "
                                                     "python/ folder) or unpacked wheel instead of the installed "
                                                     "sglang."),
           sglang_tree_version: Optional[str] = SGLANG_TREE_VERSION_OPTION) -> None:
    """Python, sglang version (and where it was read), path and commit, and for each engine: real,
    stand-in or unusable, and why."""
    from harness.doctor import diagnose
    from harness.report.safe import terminal

    target = _target(sglang_src, None, sglang_tree_version) if sglang_src is not None or sglang_tree_version else None
    report = diagnose(list(_registry().available().values()), target)
    if as_json:
        console.print_json(json.dumps(report))
    else:
        console.print(f"python   {report['python']['version']} ({report['python']['executable']})", highlight=False)
        sg = report["sglang"]
        console.print(terminal(f"sglang   {sg['version'] or 'NOT INSTALLED'} ({sg['path'] or '-'})"
                               + (f", {sg['source']}" if sg['source'] != "installed" else "")
                               + (f", commit {sg['commit']}" if sg.get("commit") else "")), highlight=False,
                      markup=False)
        if sg["version"]:
            console.print(terminal(f"         version from {sg['version_source'] or '-'}"
                                   + (f"; {sg['expectations']}" if sg.get("expectations") else "")
                                   + f"; bootstrap token: {sg['bootstrap_token'] or 'none (this sglang takes none)'}"),
                          highlight=False, markup=False)
        console.print(f"libibverbs.so.1  {'present' if report['libibverbs'] else 'missing'}")
        net = report["network"]
        console.print(f"network  [{'green' if net['isolated'] else 'yellow'}]{escape(net['detail'])}[/]")
        for e in report["engines"]:
            style = {"real": "green", "standin": "yellow", "reference": "green"}.get(e["engine"], "red")
            console.print(f"{e['impl']:<10}[{style}]{e['engine']:<10}[/]{escape(e['reason'])}  "
                          f"[dim]sglang {escape(e['sglang_range'])}[/]"
                          + ("" if e["in_range"] else f" [yellow]{escape(str(sg['version']))} is outside: its cells are "
                                                      "UNSUPPORTED[/]"))
    usable = report["sglang"]["version"] and all(e["engine"] != "unusable" for e in report["engines"])
    raise typer.Exit(code=0 if usable else 1)


@app.command("list")
def list_scenarios(as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
                   topologies: bool = typer.Option(False, "--topologies",
                                                   help="List the named deployment topologies instead.")) -> None:
    """Scenarios with id, title and the requirement IDs their checks cite (docs/protocol.md),
    then the generic post-conditions judged in every scenario and who opts out of which;
    with --topologies the named deployment shapes (harness/spec/topology.py)."""
    from harness.judge.postconditions import GENERIC
    from harness.spec.requirements import requirement
    from harness.spec.scenario import all_scenarios

    if topologies:
        _list_topologies(as_json)
        return
    _registry()
    rows = [{"id": s.id, "title": s.title, "requirements": list(s.requirements),
             "levels": {rid: requirement(rid).level for rid in s.requirements},
             "opt_out": dict(s.opt_out),
             "topologies": {"only": list(s.topologies[0]), "why": s.topologies[1]} if s.topologies else None,
             "nightly": s.nightly or None}
            for s in all_scenarios()]
    if as_json:
        console.print_json(json.dumps(rows))
        return
    width = max((len(row["id"]) for row in rows), default=0) + 2
    for row in rows:
        console.print(f"[bold]{row['id']:<{width}}[/]{escape(row['title'])}  [dim]{', '.join(row['requirements'])}[/]")
    generic = ", ".join(f"{name} ({rid})" for name, rid, _ in GENERIC)
    console.print(f"\nJudged in every scenario as well (harness/judge/postconditions.py): {generic}", highlight=False)
    for row in rows:
        for name, why in row["opt_out"].items():
            console.print(f"  {row['id']} opts out of {name}: {escape(why)}", highlight=False)
    console.print("\nEvery scenario also runs on the other topologies (`pdconform list --topologies`), except:",
                  highlight=False)
    for row in rows:
        if row["topologies"]:
            console.print(f"  {row['id']} runs on {', '.join(row['topologies']['only'])} only: "
                          f"{escape(row['topologies']['why'])}", highlight=False)
    later = [row for row in rows if row["nightly"]]
    if later:
        console.print("\nRun when named, or with `--topology nightly`, not in the default matrix:", highlight=False)
    for row in later:
        console.print(f"  {row['id']}: {escape(row['nightly'])}", highlight=False)


def _list_topologies(as_json: bool) -> None:
    from harness.spec.topology import TOPOLOGIES

    rows = [t.to_dict() for t in TOPOLOGIES.values()]
    if as_json:
        console.print_json(json.dumps(rows))
        return
    width = max(len(r["name"]) for r in rows) + 2
    for r in rows:
        sets = ", ".join(name for name, on in (("default", r["default"]), ("nightly", r["nightly"])) if on)
        sides = "  ".join(f"{side} tp {r[side]['tp']} pp {r[side]['pp']}"
                          + (" (layers " + " ".join(f"[{a},{b})" for a, b in r[side]["stages"]) + ")"
                             if r[side]["pp"] > 1 else "") + f" dp {r[side]['dp']}" for side in ("prefill", "decode"))
        m = r["prefill"]["model"]
        console.print(f"[bold]{r['name']:<{width}}[/]{sides}  [dim]{m['attention']}, {m['num_layers']} layers, "
                      f"{m['kv_heads']} KV heads x {m['head_bytes']} B, page {m['page_size']} tokens; "
                      f"{sets or 'on request'}[/]  {escape(r['about'])}", highlight=False)


@app.command()
def bench(
    repeat: int = typer.Option(3, "--repeat", min=1, max=100, help="Samples of each figure (full matrix runs, simulator runs)."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", min=1, max=MAX_JOBS, help="Cells run at once (default: cores)."),
    impl: Optional[List[str]] = typer.Option(None, "--impl", help="Implementations of the timed matrix (default all)."),
    scenario: Optional[List[str]] = typer.Option(None, "--scenario", help="Scenarios of the timed matrix (default all)."),
    topology: Optional[List[str]] = typer.Option(None, "--topology", help="Topologies of the timed matrix (default "
                                                 "p1-d1; 'default' or 'nightly' for a set), as `run --topology`."),
    seeds: int = typer.Option(2000, "--seeds", min=1, max=10_000_000, help="Simulator seeds per sample."),
    engine_mib: int = typer.Option(128, "--engine-mib", min=1, max=4096,
                                   help="MiB per engine throughput sample (a source and a destination buffer each)."),
    skip: Optional[List[str]] = typer.Option(None, "--skip", help="Leave out: matrix, simulator, engines, explore "
                                             "(its rates), isolation (verdicts alone and on long-lived role pairs), "
                                             "shrink (its time to shrink a planted bug)."),
    explore_seconds: float = typer.Option(20.0, "--explore-seconds", min=1.0, max=3600.0,
                                          help="Seconds of generated programs per implementation and sample."),
    out: Path = typer.Option(Path("reports/out/bench"), "--out", help="Directory for the runs and bench.json."),
    engine_setting: Optional[List[str]] = ENGINE_SETTING_OPTION,
    isolated: bool = typer.Option(False, "--isolated", help="The timed matrix with every cell in fresh role processes "
                                  "of its own, as `run --isolated` (default: on warm role pairs, as `make matrix`)."),
) -> None:
    """Measure the matrix wall time, per-cell overhead, simulator rate, engine throughput and
    explore's rate (median and spread of --repeat samples), against the project's goals;
    write bench.json."""
    from harness.bench.suite import BenchUsageError, figures_table, plan_bench, run_bench, write_bench_json
    from harness.drive.runner import default_jobs

    jobs = jobs or default_jobs()
    impls, scenarios = _select(impl, scenario, topology)
    out = _out_dir(out)
    try:  # every option is checked before a file is written
        plan = plan_bench(out, repeat, jobs, impls, scenarios, set(skip or []), seeds, engine_mib,
                          _settings(engine_setting), target=lambda: _target(None, None), isolated=isolated)
    except BenchUsageError as exc:
        raise _usage_error(str(exc))
    plan.explore_s = explore_seconds
    with _run_folder(out, "bench") as folder:
        plan.out_dir = folder
        if plan.matrix is not None:
            plan.matrix.out_dir = folder
        figures = run_bench(plan, on_progress=lambda m: err.print(f"[dim]{escape(m)}[/]"))
        path = write_bench_json(folder, figures, jobs, repeat)
    console.print(figures_table(figures, jobs, repeat))
    console.print(f"bench.json: {path}  (latest: {out / 'latest'})", highlight=False)


@app.command()
def simulate(
    seeds: int = typer.Option(1000, "--seeds", min=1, max=10_000_000, help="How many consecutive seeds to run."),
    seed: int = typer.Option(0, "--seed", min=0, max=MAX_SEED, help="First seed (alone with --seeds 1: replay that seed)."),
    trace: bool = typer.Option(False, "--trace", help="Print the step list of every run, not only failing ones."),
    planted_bug: Optional[str] = typer.Option(None, "--planted-bug", hidden=True,
                                              help="Test-only: run a reference core with a planted bug."),
) -> None:
    """Run seeded simulations of the reference prefill and decode cores over a faulty network.

    Prints runs per minute; for the first failing seed, its violations and the step
    list that replays it (`pdconform simulate --seeds 1 --seed S`).
    """
    import time

    from rich.progress import Progress

    registry = _registry()
    from harness.spec.protocol import REFERENCE

    sim = registry.implementation(REFERENCE).hook("simulator")
    if planted_bug is not None and planted_bug not in sim.PLANTED_BUGS:
        raise _usage_error(f"unknown --planted-bug {planted_bug} (known: {', '.join(sim.PLANTED_BUGS)})")
    config = sim.SimConfig(planted_bug=planted_bug)
    failures = []
    start = time.monotonic()
    with Progress(console=err, transient=True) as progress:
        task = progress.add_task("simulating", total=seeds)
        for s in range(seed, seed + seeds):
            result = sim.simulate(s, config)
            if trace:
                console.print(f"seed {s}: {'ok' if result.ok else 'VIOLATION'}", highlight=False)
                for line in result.trace:
                    console.print(f"  {line}", markup=False, highlight=False)
            if not result.ok:
                failures.append(result)
            progress.advance(task)
    elapsed = max(time.monotonic() - start, 1e-9)
    console.print(f"{seeds} seeded runs in {elapsed:.1f} s: {seeds / elapsed * 60:,.0f} runs/min; "
                  f"{len(failures)} with violations", highlight=False)
    if failures:
        _print_first_failure(failures, planted_bug)
    raise typer.Exit(code=1 if failures else 0)


def _print_first_failure(failures: list, planted_bug: Optional[str]) -> None:
    first = failures[0]
    console.print(f"first failing seed {first.seed}:", highlight=False)
    for v in first.violations:
        console.print(f"  VIOLATION {v}", markup=False, highlight=False)
    console.print("steps that replay it:", highlight=False)
    for line in first.trace:
        console.print(f"  {line}", markup=False, highlight=False)
    console.print(f"replay: pdconform simulate --seeds 1 --seed {first.seed}"
                  + (f" --planted-bug {planted_bug}" if planted_bug else ""), highlight=False)
    console.print(f"failing seeds: {', '.join(str(f.seed) for f in failures[:20])}"
                  + (" ..." if len(failures) > 20 else ""), highlight=False)


@app.command()
def soak(
    runs: int = typer.Option(10, "--runs", min=2, max=1000, help="How many times to run the matrix."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", min=1, max=MAX_JOBS, help="Cells run at once (default: cores)."),
    impl: Optional[List[str]] = typer.Option(None, "--impl", help="Implementation (repeatable; default all)."),
    scenario: Optional[List[str]] = typer.Option(None, "--scenario", help="Scenario id (repeatable; default all)."),
    seed: int = typer.Option(0, "--seed", min=0, max=MAX_SEED, help="Seed of every run (the same in each: only chance differs)."),
    sglang_src: Optional[Path] = SGLANG_SRC_OPTION,
    sglang_version: Optional[str] = SGLANG_VERSION_OPTION,
    sglang_tree_version: Optional[str] = SGLANG_TREE_VERSION_OPTION,
    engine_setting: Optional[List[str]] = ENGINE_SETTING_OPTION,
    expectations: Optional[Path] = EXPECTATIONS_OPTION,
    out: Path = typer.Option(Path("reports/out/soak"), "--out", help="Folder for the soaks: each writes "
                             "OUT/runs/<time>/ with run-1 ... run-N, soak.json and soak.md."),
) -> None:
    """Run the same matrix --runs times, each judged as `run` judges one (against the
    expectations; a starved cell worse than expected only on timing bounds run once more
    alone), and list every cell not as expected, every cell worse only under load with its
    alone result, and every cell whose verdict or reason (numbers masked) changed between
    runs, with the load average each run saw.

    Exit 0 when every cell of every run was as expected or timing under load and every flip
    is so explained, 1 otherwise, 2 on bad usage.
    """
    import os
    from collections import Counter

    from harness.drive.runner import default_jobs
    from harness.session import RunConfig, clean_clone_order
    from harness.report.safe import terminal
    from harness.cli.runs import _target_and_expectations
    from harness.soak import flips, run_counts, unexplained, write_soak
    from harness.soak import soak as soak_runs

    jobs = jobs or default_jobs()
    impls, scenarios = _select(impl, scenario)
    out = _out_dir(out)
    # every option is checked before a file is written
    target, loaded = _target_and_expectations(sglang_src, sglang_version, sglang_tree_version, expectations)
    config = RunConfig(impls=impls, scenarios=scenarios, out_dir=out, target=target, seed=seed, jobs=jobs,
                       engine_settings=_settings(engine_setting), reports=False, expectations=loaded,
                       duration_hint=clean_clone_order(target.info.version, scenarios, impls, seed))

    def on_run(run) -> None:
        counts, said = Counter(verdict for verdict, _ in run.cells.values()), run_counts(run)
        err.print(f"run {run.index}/{runs}: {run.duration_s:.0f} s, load {run.load_mean:.1f} "
                  f"(peak {run.load_max:.1f}), " + ", ".join(f"{n} {v}" for v, n in sorted(counts.items()))
                  + f"; red: {said['red as expected']} as expected, {said['red timing under load']} timing under "
                  f"load; {said['not as expected']} not as expected", highlight=False, markup=False)

    with _run_folder(out, "soak", ": the running cells were stopped; the finished runs are in the folder") as folder:
        done = soak_runs(config, runs, folder, on_run)
        _, md_path = write_soak(folder, done, jobs, os.cpu_count() or 1)
    console.print(terminal(md_path.read_text(), lines=True), markup=False, highlight=False)
    console.print(f"soak.json, soak.md: {md_path.parent}  (latest: {out / 'latest'})", highlight=False)
    raise typer.Exit(code=1 if unexplained(done) or any(not f.explained for f in flips(done)) else 0)


def _planted(mutant: Optional[List[str]]) -> dict[str, dict]:
    """impl name -> ``planted`` of the mutants ``pdconform mutants`` runs: those named by
    ``--mutant`` (a usage error for an unknown id), else all but the ones only a run across
    hosts reaches (said, not counted as survivors)."""
    planted = {name: impl.planted for name, impl in _registry().registered().items() if impl.planted}
    for name, bug in list(planted.items()):
        if bug.get("across_hosts") and bug["id"] not in (mutant or []):
            err.print(f"[yellow]note:[/] {escape(bug['id'])} not run: {escape(bug['across_hosts'])}")
            del planted[name]
    by_id = {bug["id"]: name for name, bug in planted.items()}
    unknown = [m for m in (mutant or []) if m not in by_id]
    if unknown:
        raise _usage_error(f"unknown --mutant {', '.join(unknown)} (known: {', '.join(by_id)})")
    return {by_id[m]: planted[by_id[m]] for m in dict.fromkeys(mutant)} if mutant else planted


@app.command()
def mutants(
    mutant: Optional[List[str]] = typer.Option(None, "--mutant", help="Mutant id (repeatable; default all)."),
    scenario: Optional[List[str]] = typer.Option(None, "--scenario", help="Scenario id (repeatable; default all)."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", min=1, max=MAX_JOBS, help="Cells run at once (default: 8 per core)."),
    seed: int = typer.Option(0, "--seed", min=0, max=MAX_SEED, help="Seed of every scenario."),
    out: Path = typer.Option(Path("reports/out/mutants"), "--out", help="Folder for the runs: each writes "
                             "OUT/runs/<time>/ with the cells, results.json, mutants.json and mutants.md."),
    all_cells: bool = typer.Option(False, "--all-cells", help="Run every cell of a caught mutant too (default: "
                                   "a mutant's cells stop at its first catch)."),
) -> None:
    """Run the scenarios against every planted-bug mutant of the reference and say which
    check caught each (harness.mutants): a mutant is caught when a cell fails a check citing
    the requirement the mutant breaks.  A mutant's cells not yet started when one of them
    caught it are skipped (harness.mutants.EarlyStop), unless ``--all-cells``; a catch made only
    on timing bounds while the machine starved it waits for its rerun alone (two reruns a core
    at once) before the mutant's other cells are skipped; cells that mostly wait on their
    timers count as part of a job (harness.drive.scheduler.cell_weight).

    Exit 0 when every mutant was caught and the unmutated reference passed everywhere, 1
    otherwise, 2 on bad usage.
    """
    import os
    import time

    from harness import implementations
    from harness.drive.scheduler import Callbacks
    from harness.mutants import EarlyStop, outcomes, write_mutants
    from harness.report.safe import terminal
    from harness.session import RunConfig, run_into
    from harness.spec.protocol import REFERENCE

    implementations.list_mutants()  # the registry (here and in every cell) lists the mutants
    planted = _planted(mutant)
    if not scenario:  # every scenario, and the cells that check the deployment shapes' requirements
        from harness.mutants import TOPOLOGY_CELLS
        from harness.spec.scenario import all_scenarios

        scenario = [s.id for s in all_scenarios() if not s.nightly] + list(TOPOLOGY_CELLS)
    _, scenarios = _select([REFERENCE], scenario)
    jobs = jobs or 8 * (os.cpu_count() or 1)  # reference cells mostly wait on timeouts (make matrix's share)
    out = _out_dir(out)
    target = _target(None, None)
    controls = list(dict.fromkeys(bug["of"] for bug in planted.values()))  # each mutant's parent
    stop = None if all_cells else EarlyStop(planted, {s.id: s for s in scenarios}, seed)
    # a catch is told from one run of each cell (EarlyStop); a cell that mostly waits on a timer takes part of a job
    # (cell_weight); reruns alone two a core: each mostly waits, and one that waited for a core confirms nothing
    config = RunConfig(impls=[*controls, *planted], scenarios=scenarios, out_dir=out, target=target, seed=seed,
                       jobs=jobs, reports=False, priority=stop.priority() if stop else {}, isolated=True,
                       alone_jobs=2 * (os.cpu_count() or 1), weigh=True)
    callbacks = Callbacks(on_cell=stop.on_cell, skip=stop.skip, on_alone=stop.on_alone) if stop else None
    begin = time.monotonic()
    with _run_folder(out, "mutants", ": the running cells were stopped") as folder:
        result = run_into(config, folder, callbacks)
        found, control = outcomes(result, planted)
        ran = sum(1 for c in result.cells if c.impl in planted)
        _, md_path = write_mutants(folder, found, control, round(time.monotonic() - begin, 1), jobs,
                                   len(planted) * len(scenarios) - ran if stop else None)
    console.print(f"mutants.json, mutants.md: {md_path.parent}  (latest: {out / 'latest'})", highlight=False)
    console.print(terminal(md_path.read_text(), lines=True), markup=False, highlight=False)  # it ends with score_line
    raise typer.Exit(code=0 if all(m.caught for m in found) and not control else 1)


@app.command()
def scrub(
    run_dir: Path = typer.Argument(..., help="A stored run: its run folder (OUT/runs/<time>/), or an --out folder "
                                   "(its latest run)."),
    out: Path = typer.Option(..., "--out", help="The folder to write the scrubbed copy into (must not exist)."),
    seed: int = typer.Option(0, "--seed", min=0, max=MAX_SEED, help="Seed of the pseudonyms: the same seed gives the same names."),
    also: Optional[List[str]] = typer.Option(None, "--also", help="Another name to replace, as a host name "
                                             "(repeatable): a cluster, a project, a short host name."),
) -> None:
    """Write a copy of a run safe to share: host names, IP addresses, user names and home or
    install paths replaced by consistent pseudonyms (harness.report.scrub); verdicts judge
    the same (`pdconform judge OUT`).

    Exit 0 when the copy was written, 2 on bad input (no run, an --out that exists).
    """
    from harness.report.safe import terminal
    from harness.report.scrub import ScrubError, scrub as scrub_tree

    try:
        report = scrub_tree(run_dir, out.expanduser(), seed, tuple(also or ()))
    except ScrubError as exc:
        raise _usage_error(str(exc))
    except OSError as exc:
        raise _usage_error(f"cannot scrub {run_dir} into {out}: {exc.strerror or exc}")
    counts = ", ".join(f"{n} {kind}" for kind, n in report.replaced.items())
    console.print(terminal(f"scrubbed {report.files} file(s) into {report.out}: replaced {counts}"), markup=False,
                  highlight=False)
    for name, why in sorted(report.left.items()):
        console.print(terminal(f"left as is: {name!r} ({why}; --also {name} replaces it)"), markup=False,
                      highlight=False)
