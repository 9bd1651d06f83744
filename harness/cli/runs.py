"""The commands that run, judge and compare cells: ``run``, ``repro``, ``judge``, ``diff``."""

from __future__ import annotations

import contextlib

from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape
from rich.text import Text

from harness.cli import (
    MAX_JOBS,
    MAX_SEED,
    BIND_OPTION,
    DEFAULT_OUT,
    ENGINE_SETTING_OPTION,
    EXPECTATIONS_OPTION,
    FULL_WAITS_OPTION,
    POOL_DEVICE_OPTION,
    SGLANG_SRC_OPTION,
    SGLANG_TREE_VERSION_OPTION,
    SGLANG_VERSION_OPTION,
    _bind,
    _pool_device,
    _expectations,
    _out_dir,
    _registry,
    _select,
    _settings,
    _stop_on_signals,
    _target,
    _usage_error,
    app,
    console,
    err,
)
from harness.drive.scheduler import duration_hint
from harness.judge.results import LATEST
from harness.report.safe import terminal


def _load_results(path: Path):
    """The RunResult at ``path`` (a results.json, a run folder or an --out folder); exit 2 when unreadable."""
    from harness.judge.results import load_run
    from harness.report.outdir import OutDirError, run_folder_of
    from harness.spec.inputs import InputError

    if path.is_dir() and not (path / "results.json").is_file():
        try:
            path = run_folder_of(path) / "results.json"
        except OutDirError as exc:
            raise _usage_error(str(exc))
    elif path.is_dir():
        path = path / "results.json"
    try:
        return load_run(path)
    except InputError as exc:
        raise _usage_error(str(exc))
    except ValueError as exc:  # msgspec.DecodeError / ValidationError, another schema
        raise _usage_error(f"{path} is not a pdconform results.json: {exc}")


def _print_verdicts(result, expectations_path, expectations_line: str = "") -> None:
    """The matrix, each non-PASS cell's reason, the cells not as expected, which expectations
    were used, and the closing line."""
    from harness.judge.expectations import fixes, regressions, under_load
    from harness.report.load import alone_line, load_warning
    from harness.report.terminal import closing_line, expectation_gap, matrix_table, reasons, reproduce_command

    console.print(matrix_table(result))
    for line in reasons(result):
        console.print(f"  {line}", markup=False, highlight=False)
    for title, cells in (("regression{s} (worse than expected)", regressions(result)),
                         (f"fixed (better than expected: `pdconform expectations update` rewrites "
                          f"{expectations_path or 'the expectations'})", fixes(result))):
        if cells:
            console.print(f"[bold red]{len(cells)} {escape(title.replace('{s}', 's' * (len(cells) != 1)))}:[/]")
            for c in cells:
                console.print(terminal(f"  {c.scenario} x {c.impl}: {expectation_gap(c)}   "
                                       f"({reproduce_command(result, c)})"), markup=False,
                               highlight=False)
    loaded = under_load(result)  # neither as expected nor a regression: listed apart (harness.judge.load)
    if loaded:
        console.print(f"[yellow]{len(loaded)} worse than expected only under load (run again alone):[/]")
        for c in loaded:
            console.print(terminal(f"  {c.scenario} x {c.impl}: {alone_line(c)}"), markup=False, highlight=False)
    if load_warning(result):
        err.print(f"[yellow]warning:[/] {escape(load_warning(result))}")
    if expectations_line:
        console.print(terminal(expectations_line), markup=False, highlight=False)
    console.print(terminal(closing_line(result)), markup=False, highlight=False)


def _docs_url(url: str) -> str:
    """The --docs-url, checked: an http(s) URL or nothing; anything else exits 2."""
    url = url.strip()
    if url and not url.startswith(("https://", "http://")):
        raise _usage_error(f"--docs-url {url}: give an http(s) URL, e.g. https://github.com/ORG/pdconform/blob/main")
    return url


def _expectations_line(loaded, given: Optional[Path], run=None) -> str:
    """Which expectations the cells were judged against, in one line (stdout, after the cells);
    with the ``run`` (a RunResult), why a file shipped for another release judged them
    (harness.target.sglang.SglangInfo.expectations_note)."""
    note = run.sglang.expectations_note(run.expectations) if run is not None else ""
    if loaded is None:
        return ("expectations: none, every cell expected to PASS" if given is not None
                else "expectations: none shipped for this sglang, every cell expected to PASS")
    path = Path(loaded.path)
    try:
        path = path.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        pass
    shipped = (f" ({note or 'shipped for this sglang'}; --expectations none judges every cell against PASS)"
               if given is None else "")
    return f"expectations: {path}{shipped}"


def _target_and_expectations(sglang_src: Optional[Path], sglang_version: Optional[str], tree_version: Optional[str],
                             expectations: Optional[Path]):
    """The sglang under test (harness.cli._target) and the expectations it is judged against
    (harness.cli._expectations), as ``(target, loaded)``; a note on stderr when the shipped file
    judging it was written for another release.  Bad input exits 2."""
    target = _target(sglang_src, sglang_version, tree_version)
    loaded = _expectations(expectations, target.info.version)
    note = target.info.expectations_note(loaded.path if loaded and expectations is None else None)
    if note:  # a dev, pre, post or local version: the newest shipped release at or below it judges it
        err.print(f"[yellow]note:[/] judged against the {escape(note)}")
    elif loaded and loaded.sglang and loaded.sglang != target.info.version:
        err.print(f"[yellow]note:[/] {escape(loaded.path)} was written for sglang {escape(loaded.sglang)}, "
                  f"this run uses {escape(str(target.info.version))}")
    return target, loaded


def _run_session(config, callbacks=None, progress=None):
    """harness.session.run, with an interrupt exiting 130 and a write failure exiting 2."""
    from harness import session
    from harness.report.outdir import OutDirError

    _stop_on_signals()
    try:
        return session.run(config, callbacks)
    except KeyboardInterrupt:
        if progress is not None:
            progress.stop()
        err.print("[bold red]interrupted[/]: the running cells and their roles were stopped; no results written")
        raise typer.Exit(code=130)
    except OutDirError as exc:  # another run holds --out
        if progress is not None:
            progress.stop()
        raise _usage_error(str(exc))
    except OSError as exc:  # --out went away or filled up mid-run
        if progress is not None:
            progress.stop()
        raise _usage_error(f"cannot write the run into {config.out_dir}: {exc.strerror or exc}")


HOSTS_OPTION = typer.Option(None, "--hosts", metavar="N|netns:N", help="Run the roles across hosts: netns:N makes N "
                            "network namespaces here (root) with an agent each (torchrun); N waits for N `pdconform "
                            "agent`s your launcher starts (docs/cluster.md).")
LISTEN_OPTION = typer.Option(None, "--listen", metavar="ADDR[:PORT]", help="With --hosts N: the address (default "
                             "port 29400) the agents reach this machine on.")
JOIN_TIMEOUT_OPTION = typer.Option(120.0, "--join-timeout", min=1.0, max=3600.0, help="With --hosts: seconds for every agent to "
                                   "join.")


ISOLATED_OPTION = typer.Option(False, "--isolated", help="Every cell in fresh role processes of its own (as repro runs "
                               "one). Default: cells share warm role pairs per implementation and StartRoles, and a "
                               "cell whose result is not the expected one is confirmed in a fresh cell before it is "
                               "reported (docs/performance.md).")


@app.command()
def run(
    impl: Optional[List[str]] = typer.Option(None, "--impl", help="Implementation (repeatable); see `pdconform doctor`."),
    scenario: Optional[List[str]] = typer.Option(None, "--scenario", help="Scenario id (repeatable); see `pdconform list`."),
    topology: Optional[List[str]] = typer.Option(None, "--topology", help="Deployment topology (repeatable; default "
                                                 "p1-d1; 'default' or 'nightly' for a set); see `pdconform list "
                                                 "--topologies`. Cells read SCENARIO@TOPOLOGY."),
    out: Path = typer.Option(DEFAULT_OUT, "--out", help="Folder for the runs: each run writes a new OUT/runs/<time>/ "
                             "(results.json, reports, per-cell logs) and OUT/latest then points at it."),
    seed: int = typer.Option(0, "--seed", min=0, max=MAX_SEED, help="Seed for the scenarios' room ids, pages and faults."),
    expectations: Optional[Path] = EXPECTATIONS_OPTION,
    sglang_src: Optional[Path] = SGLANG_SRC_OPTION,
    sglang_version: Optional[str] = SGLANG_VERSION_OPTION,
    sglang_tree_version: Optional[str] = SGLANG_TREE_VERSION_OPTION,
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", min=1, max=MAX_JOBS, help="Cells run at once (default: the number "
                                       "of cores). Verdicts do not depend on it."),
    fork: bool = typer.Option(True, "--fork/--no-fork", help="Fork cells and roles from one process that imported "
                              "sglang once (default), or start a fresh interpreter for each."),
    engine_setting: Optional[List[str]] = ENGINE_SETTING_OPTION,
    full_waits: bool = FULL_WAITS_OPTION,
    bind: Optional[str] = BIND_OPTION,
    docs_url: str = typer.Option("", "--docs-url", help="Base URL of pdconform's docs/ (for example its repository's "
                                 "blob URL): summary.md and junit.xml then link bug entries and requirements "
                                 "absolutely, so they resolve from a pull request."),
    baseline: Optional[Path] = typer.Option(None, "--baseline", help="A stored run (another release's, the last "
                                            "one's): each cell is marked new, fixed or same against it, check by "
                                            "check, on the terminal and in summary.md."),
    hosts: Optional[str] = HOSTS_OPTION,
    listen: Optional[str] = LISTEN_OPTION,
    join_timeout: float = JOIN_TIMEOUT_OPTION,
    pool_device: str = POOL_DEVICE_OPTION,
    isolated: bool = ISOLATED_OPTION,
) -> None:
    """Run the selected cells (default: every implementation x every scenario), print the matrix
    and write results.json, junit.xml, summary.md and index.html into a new run folder under --out."""
    from harness.cli.progress import RunProgress
    from harness.drive.runner import default_jobs
    from harness.session import RunConfig

    impls, scenarios = _select(impl, scenario, topology)
    bind = _bind(bind)
    pool_device = _pool_device(pool_device)
    out = _out_dir(out)
    # every option is checked before a file is written
    target, loaded = _target_and_expectations(sglang_src, sglang_version, sglang_tree_version, expectations)
    hint = duration_hint(out / LATEST / "results.json", scenarios, impls, seed, loaded)
    config = RunConfig(impls=impls, scenarios=scenarios, out_dir=out, target=target, seed=seed,
                       jobs=jobs or default_jobs(), fork=fork, full_waits=full_waits,
                       engine_settings=_settings(engine_setting), expectations=loaded, duration_hint=hint,
                       bind=bind, docs_url=_docs_url(docs_url), pool_device=pool_device, isolated=isolated,
                       baseline=(baseline, _load_results(baseline)) if baseline is not None else None)
    with _hosts(hosts, listen, bind, join_timeout) as (host_bind, agents):
        config.bind, config.hosts, config.hosts_spec = host_bind or config.bind, agents, hosts or ""
        config.hosts_listen = listen or ""
        # stderr: a live view on a terminal, a line per finished cell off one (harness/cli/progress.py)
        with RunProgress(err, len(impls) * len(scenarios), seed, loaded, {sc.id: sc for sc in scenarios}) as progress:
            callbacks = progress.callbacks(on_note=lambda note: err.print(f"[yellow]note:[/] {escape(terminal(note))}"))
            result = _run_session(config, callbacks, progress)
    _print_run_end(result, loaded, expectations, out)
    raise typer.Exit(code=0 if result.all_as_expected else 1)


def _print_run_end(result, loaded, expectations: Optional[Path], out: Path) -> None:
    """The verdicts, the baseline's marks and where the results are (stdout)."""
    from harness.report.run_diff import baseline_lines

    _print_verdicts(result, loaded.path if loaded else None, _expectations_line(loaded, expectations, result))
    for line in baseline_lines(result):
        console.print(line, markup=False, highlight=False)
    console.print(f"results: {(out / 'latest').resolve() / 'results.json'}  reports: junit.xml, summary.md, "
                  f"index.html  (latest: {out / 'latest'})", highlight=False)


@contextlib.contextmanager
def _hosts(spec: Optional[str], listen: Optional[str], bind: Optional[str], join_timeout: float):
    """(coordinator address, agents) of ``run --hosts`` (harness.hosts.cluster); (None, ())
    without it.  Exit 2 for bad options, hosts that cannot be made or agents that do not join."""
    if spec is None:
        if listen is not None:
            raise _usage_error("--listen is for --hosts N")
        yield None, ()
        return
    if bind is not None:
        raise _usage_error("--bind and --hosts: the hosts' own addresses are used, give one or the other")
    from harness.hosts.agent import HostsError
    from harness.hosts.cluster import gathered

    _stop_on_signals()  # SIGTERM while the agents gather: the namespaces are removed as on Ctrl-C
    gathering = True  # an error while the hosts gather is bad usage; one of the run itself is not
    try:
        with gathered(spec, listen, join_timeout, note=lambda n: err.print(f"[yellow]note:[/] {escape(n)}")) as got:
            gathering = False
            yield got
    except (ValueError, HostsError, OSError) as exc:  # OSError: an address to listen on this host lacks
        if not gathering:
            raise
        raise _usage_error(f"--hosts: {exc.strerror or exc}" if isinstance(exc, OSError) else str(exc))


@app.command()
def repro(
    scenario: str = typer.Argument(..., help="Scenario id; see `pdconform list`."),
    impl: List[str] = typer.Option(..., "--impl", help="Implementation; see `pdconform doctor`."),
    seed: int = typer.Option(0, "--seed", min=0, max=MAX_SEED, help="Seed for the scenario's room ids, pages and faults."),
    out: Path = typer.Option(Path("reports/out/repro"), "--out", help="Directory for the cell's logs and history."),
    sglang_src: Optional[Path] = SGLANG_SRC_OPTION,
    sglang_version: Optional[str] = SGLANG_VERSION_OPTION,
    sglang_tree_version: Optional[str] = SGLANG_TREE_VERSION_OPTION,
    engine_setting: Optional[List[str]] = ENGINE_SETTING_OPTION,
    full_waits: bool = FULL_WAITS_OPTION,
    bind: Optional[str] = BIND_OPTION,
    expectations: Optional[Path] = EXPECTATIONS_OPTION,
    pool_device: str = POOL_DEVICE_OPTION,
) -> None:
    """Run one cell verbosely: the replayable step list, the history as it happens, the verdict.

    Exit 0 when the cell's verdict is the expected one (PASS, or what the expectations file,
    by default the one shipped for the sglang under test, says: a known bug), 1 otherwise,
    2 on bad usage.
    """
    from harness.drive.scheduler import Callbacks
    from harness.report.terminal import cell_text, event_line, reasons
    from harness.session import RunConfig

    if len(set(impl)) != 1:  # one cell: a second --impl would silently replace the first
        raise _usage_error(f"repro runs one cell: give one --impl (got {', '.join(impl)}); `pdconform run --scenario "
                           f"{scenario} --impl A --impl B` runs it on several")
    impl = impl[0]
    impls, scenarios = _select([impl], [scenario], what="scenario")
    sc = scenarios[0]
    bind = _bind(bind)
    pool_device = _pool_device(pool_device)
    out = _out_dir(out)
    target, loaded = _target_and_expectations(sglang_src, sglang_version, sglang_tree_version, expectations)
    console.print(f"[bold]{escape(sc.id)}[/] x [bold]{escape(impl)}[/], seed {seed}, sglang "
                  f"{escape(str(target.info.version))} ({target.info.source}: {escape(str(target.info.path))})",
                  highlight=False)
    console.print(f"{escape(sc.title)}  [dim]{', '.join(sc.requirements)}[/]")
    console.print("[bold]steps[/] (replayable: the scenario's step list for this seed)")
    for i, step in enumerate(sc.steps(seed)):
        console.print(f"  {i:>2}. {step!r}", markup=False, highlight=False)
    console.print("[bold]history[/] (t in s since the cell started)")
    config = RunConfig(impls=impls, scenarios=scenarios, out_dir=out, target=target, seed=seed, full_waits=full_waits,
                       engine_settings=_settings(engine_setting), bind=bind, expectations=loaded,
                       pool_device=pool_device, isolated=True)  # a reproduction is a fresh cell of its own
    result = _run_session(config, Callbacks(
        on_event=lambda event: console.print("  " + event_line(event), markup=False, highlight=False)))
    cell = result.cells[0]
    console.print(cell_text(cell))
    for check in cell.checks:
        mark = ("[green]ok[/]" if check.get("ok") else "[yellow]UNSUPPORTED[/]" if check.get("unsupported")
                else "[red]NOT OK[/]" if check.get("ok") is False else "[red]CANNOT TELL[/]")
        line = Text.from_markup(f"  {mark} ")
        line.append(terminal(f"{check.get('requirement')} {check.get('name')}: {check.get('detail', '')}"))
        console.print(line, highlight=False)
    for line in reasons(result):
        console.print(f"  {line}", markup=False, highlight=False)
    console.print(f"cell directory: {terminal(cell.workdir)}", highlight=False, markup=False)
    console.print(terminal(_expectations_line(loaded, expectations, result)), highlight=False, markup=False)
    raise typer.Exit(code=0 if cell.as_expected else 1)


@app.command()
def judge(
    run_dir: Path = typer.Argument(..., help="A stored run: its run folder (OUT/runs/<time>/), or an --out folder "
                                   "(its latest run)."),
    expectations: Optional[Path] = typer.Option(None, "--expectations", help="Judge against this expectations file "
                                                "instead of the one the run was judged against; none: "
                                                "every cell expected to PASS."),
) -> None:
    """Judge a stored run again from its histories, offline, and rewrite its results.json and reports.

    On an unchanged checkout every verdict comes out as the run gave it.  Exit codes as for `run`.
    """
    from harness.report.outdir import OutDirError
    from harness.session import RejudgeError, rejudge

    _registry()
    loaded = _expectations(expectations)
    _stop_on_signals()
    try:
        # --expectations none judges against none; without the option, the run's own
        result, folder = rejudge(run_dir, loaded, on_note=lambda note: err.print(f"[yellow]note:[/] {escape(terminal(note))}"),
                                 keep_runs=expectations is None)
    except (RejudgeError, OutDirError) as exc:
        raise _usage_error(str(exc))
    except KeyboardInterrupt:
        err.print("[bold red]interrupted[/]: the run's results may be part old, part new; judge it again")
        raise typer.Exit(code=130)
    except OSError as exc:
        raise _usage_error(f"cannot rewrite the results in {run_dir}: {exc.strerror or exc}")
    # say which expectations, when --expectations replaced the run's own (judge passes no version,
    # so without the option nothing shipped is looked up and the run's own are kept)
    _print_verdicts(result, result.expectations, _expectations_line(loaded, expectations) if expectations else "")
    console.print(f"results: {folder / 'results.json'} (judged again)", highlight=False)
    raise typer.Exit(code=0 if result.all_as_expected else 1)


@app.command()
def diff(
    run_a: Path = typer.Argument(..., help="The first run: its results.json, its run folder, or an --out folder "
                                 "(its latest run)."),
    run_b: Path = typer.Argument(..., help="The second run, as the first."),
    markdown: bool = typer.Option(False, "--markdown", help="Print Markdown (for a PR comment) instead of a table."),
    all_cells: bool = typer.Option(False, "--all", help="Also list the cells only one run has (default: the cells "
                                   "both runs have)."),
) -> None:
    """The cells whose verdict, or failing checks, changed between two runs (for example sglang
    before and after a PR), check by check; only the cells both runs have unless --all.

    Exit 0 when no cell got worse (with --all, a cell of the first run missing from the second
    counts as worse), 1 when some cell got worse, 2 on bad input.
    """
    from harness.report.run_diff import changed_cells, changes_markdown, changes_table, unmatched

    _registry()
    runs = [_load_results(run_a), _load_results(run_b)]
    changes = changed_cells(*runs, all_cells=all_cells)
    if markdown:
        console.print(changes_markdown(runs[0], runs[1], changes), markup=False, highlight=False, soft_wrap=True)
    else:
        console.print(changes_table(runs[0], runs[1], changes))
    only_a, only_b = unmatched(*runs)
    if not all_cells and (only_a or only_b):
        console.print(f"{only_a} cell(s) only in A, {only_b} only in B (--all lists them)", highlight=False)
    raise typer.Exit(code=1 if any(c.worse for c in changes) else 0)


expectations_app = typer.Typer(no_args_is_help=True, help="Keep an expectations file in step with the runs.")
app.add_typer(expectations_app, name="expectations")


@expectations_app.command("update")
def expectations_update(
    run_dir: Path = typer.Argument(DEFAULT_OUT, help="A stored run: its run folder or an --out folder (its latest run)."),
    file: Optional[Path] = typer.Option(None, "--file", help="The expectations file to rewrite (default: the one "
                                        "the run was judged against)."),
) -> None:
    """Rewrite the expectations file after a fix: the entry of a cell the run saw PASS is
    removed, one that got better but not PASS gets its new verdict; every other entry, its
    reason, link and the file's comments stay.  Regressions are listed, never written (a new
    bug needs a reason and a link).  Exit 0 when the file is up to date, 2 on bad input."""
    import tomllib

    from harness.judge.expectations import regressions, updated_text
    from harness.judge.results import write_atomic

    result = _load_results(run_dir)
    path = file or (Path(result.expectations) if result.expectations else None)
    if path is None:
        raise _usage_error("the run was judged against no expectations file: name one with --file")
    if file is not None:  # the cells' expected verdicts are the named file's, not the run's
        from harness.judge.expectations import NO_EXPECTATIONS, with_expectations

        if str(file).strip().lower() == NO_EXPECTATIONS:
            raise _usage_error("--file none: name the expectations file to rewrite")
        _registry()
        with_expectations(result, _expectations(file))
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise _usage_error(f"cannot read {path}: {exc}")
    new, changes = updated_text(text, result)
    try:
        tomllib.loads(new)
    except tomllib.TOMLDecodeError as exc:  # an entry written in a shape the updater does not know
        raise _usage_error(f"{path}: the updated file would not parse ({exc}); edit it by hand")
    if changes:  # written first: a change is reported only once it is in the file
        try:
            # a file the user named is theirs, links and all; a path read from results.json is not followed
            write_atomic(path.resolve() if file is not None else path, new.encode("utf-8"))
        except OSError as exc:
            raise _usage_error(f"cannot write {path}: {exc.strerror or exc}")
    for line in changes:
        console.print(terminal(f"  {line}"), markup=False, highlight=False)
    for c in regressions(result):
        console.print(terminal(f"  not written: {c.scenario} x {c.impl} is {c.verdict}, expected {c.expected} "
                               "(a regression: add its entry with a reason and a link by hand)"),
                      markup=False, highlight=False)
    console.print(terminal(f"{path}: {len(changes)} entr{'y' if len(changes) == 1 else 'ies'} updated"
                           if changes else f"{path}: nothing to update"), markup=False, highlight=False)
