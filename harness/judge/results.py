"""The result tree: one structure that every report format is built from.

``results.json`` is :class:`RunResult` encoded as JSON (schema 2)::

    {"schema": 2, "sglang": {"version", "path", "source", "commit"}, "seed", "duration_s",
     "expectations": "path or null", "engine_settings": {"nixl_progress_delay_us": 100},
     "cells": [{"impl", "scenario", "verdict", "expected", "expected_reason", "expected_link",
                "engine", "duration_s", "bytes_verified", "reason", "divergence", ...,
                "load", "starved", "timing_only", "alone": {a cell entry, or null}}]}

The run's out directory holds, beside it, each cell's work directory
(``cells/SCENARIO--IMPL/``: ``history.jsonl``, ``cell.log``, role logs), the cells run
once more alone (``alone/SCENARIO--IMPL/``, harness.judge.load) and the
reports built from the two (``junit.xml``, ``summary.md``, ``index.html``).

It round-trips: :func:`load_run` reads back exactly what :func:`dump_run` wrote (but a lone
surrogate, which no UTF-8 file holds: U+FFFD, harness.spec.text.encodable).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import msgspec

from harness import nofollow
from harness.judge.verdict import Verdict
from harness.spec import history as hist
from harness.spec.inputs import read_input
from harness.spec.protocol import REFERENCE
from harness.spec.text import clean_tree, encodable
from harness.target.sglang import SglangInfo

SCHEMA = 2

VERDICTS = tuple(Verdict)  # PASS, WARN, UNSUPPORTED, FAIL, ERROR: load_run rejects any other


class CellResult(msgspec.Struct, kw_only=True):
    """One judged cell (harness.judge.judge.judge): a pure function of its history."""

    impl: str  # reference | mooncake | nixl | mori
    scenario: str
    verdict: Verdict
    expected: Verdict = Verdict.PASS  # from the expectations file (harness.judge.expectations); PASS without one
    expected_reason: str = ""  # why the expectations file expects a verdict other than PASS
    expected_link: str = ""  # the issue/PR that tracks it
    # the checks the expectations entry lists as failing (names as the reports show them); None: the
    # entry lists none (the verdict alone is compared) or the cell is expected to PASS
    expected_checks: Optional[list[str]] = None
    # checks the entry says fail only sometimes (a timing-dependent bug): neither new when they fail nor a fix
    # when they hold, and a verdict better than expected for want of them is as expected
    expected_sometimes: list[str] = msgspec.field(default_factory=list)
    # the known bug's class (docs/sglang-bugs.md: bug, hardening, hostile-peer, design, withdrawn); "" when none
    expected_class: str = ""
    engine: Optional[str] = None  # real | standin | reference (None: no role started)
    duration_s: float = 0.0
    inherent_wait_s: float = 0.0  # the scenario's own sleeps and timeouts (Scenario.inherent_wait_s)
    cpu_s: Optional[float] = None  # CPU seconds of the cell and its roles (forked cells only; None: not measured)
    bytes_verified: int = 0
    reason: str = ""
    divergence: Optional[dict[str, Any]] = None
    checks: list[dict[str, Any]] = msgspec.field(default_factory=list)
    workdir: Optional[str] = None
    # the load it ran under (harness.judge.load.cell_load: cores, load averages, run-queue wait in
    # seconds per role); None in runs made before it was recorded
    load: Optional[dict[str, Any]] = None
    starved: str = ""  # why it ran starved, in words (harness.judge.load.starved); "" when it did not
    timing_only: bool = False  # its only failures were timing bounds (harness.judge.load.timing_only)
    # the same cell run once more alone at the end of the run, judged the same way, when it was worse
    # than expected only on timing bounds and ran starved (harness.judge.load.needs_alone); None otherwise
    alone: Optional["CellResult"] = None
    # the warm role pair it ran on (harness.drive.warm): ``program`` (how many cells the pair served
    # before it), ``reused``, ``room_shift``; None when it ran isolated
    pair: Optional[dict[str, Any]] = None
    # its run on a warm pair, judged the same way, when that result was not the expected one and the
    # cell ran once more isolated (this cell's own fields are the isolated run's); None otherwise
    on_pair: Optional["CellResult"] = None
    # every fault the cell injected and whether it fired (harness.judge.fired.faults_of)
    faults: list[dict[str, Any]] = msgspec.field(default_factory=list)

    @property
    def as_expected(self) -> bool:
        """The verdict is the expected one and, where the expectations entry lists its failing
        checks, exactly those checks failed (a cell run again alone: see :attr:`under_load`)."""
        return _matches(self, self)

    @property
    def settled_as_expected(self) -> bool:
        """:attr:`as_expected` for the run regressions and fixes are told by: the alone run of a
        cell run again alone (:attr:`settled`), else the cell itself."""
        return _matches(self, self.alone or self)

    @property
    def failing_checks(self) -> list[str]:
        """The names of the checks that did not hold (failed, or could not tell), in order."""
        return failing_checks(self)

    @property
    def new_checks(self) -> list[str]:
        """Checks failing that the expectations entry does not list (for a cell run again alone,
        in its alone run): each one a regression, even inside a known cell.  [] when the entry
        lists no checks."""
        return _check_changes(self, self.alone or self)[0]

    @property
    def gone_checks(self) -> list[str]:
        """Checks the expectations entry lists that now hold (a partial fix)."""
        return _check_changes(self, self.alone or self)[1]

    @property
    def settled(self) -> Verdict:
        """The verdict regressions and fixes are told by: the alone run's, when the cell had one
        (its first verdict was a timing bound a starved machine broke), else the cell's."""
        return self.alone.verdict if self.alone is not None else self.verdict

    @property
    def under_load(self) -> bool:
        """Worse than expected only under load: run again alone it was not (``FAIL at load 31,
        PASS alone``; or a known cell with a new failing timing bound that holds alone).
        Counted apart: neither as expected nor a regression."""
        return self.alone is not None and not self.new_checks and Verdict(self.alone.verdict) <= self.expected \
            and (Verdict(self.verdict) > self.expected or bool(_check_changes(self, self)[0]))

    @property
    def overhead_s(self) -> float:
        """Wall time the harness and implementation added to the scenario's inherent waits (seconds)."""
        return round(self.duration_s - self.inherent_wait_s, 3)

    def to_dict(self) -> dict[str, Any]:
        return msgspec.to_builtins(self)


def failing_checks(cell: "CellResult") -> list[str]:
    """The names of ``cell``'s checks that did not hold: failed (``ok`` False) or could not tell
    (``ok`` None, not UNSUPPORTED)."""
    return [str(c.get("name")) for c in cell.checks if c.get("ok") is not True and not c.get("unsupported")]


def _matches(expected: "CellResult", seen: "CellResult") -> bool:
    """Whether ``seen`` is what ``expected``'s expectation says: the verdict, or a better one
    for want of checks that fail only sometimes; and, where the entry lists checks, exactly those."""
    if any(_check_changes(expected, seen)):
        return False
    verdict = Verdict(seen.verdict)
    return verdict == expected.expected or (bool(expected.expected_sometimes) and verdict < expected.expected)


def _check_changes(expected: "CellResult", seen: "CellResult") -> tuple[list[str], list[str]]:
    """(failing checks of ``seen`` that ``expected.expected_checks`` does not list, listed
    checks that hold in ``seen``), the checks that fail only sometimes left out of both;
    ([], []) when no list was given."""
    if expected.expected_checks is None:
        return [], []
    failing, sometimes = failing_checks(seen), set(expected.expected_sometimes)
    return ([n for n in failing if n not in expected.expected_checks and n not in sometimes],
            [n for n in expected.expected_checks if n not in failing and n not in sometimes])


class RunResult(msgspec.Struct, kw_only=True):
    schema: int = SCHEMA
    sglang: SglangInfo
    seed: int
    duration_s: float = 0.0
    started_at: str = ""
    expectations: Optional[str] = None  # the expectations file the cells were judged against
    # engine settings of this run that differ from how sglang runs the engine, e.g.
    # {"nixl_progress_delay_us": 100} (harness.implementations.EngineSetting); {} in runs made before it existed
    engine_settings: dict[str, Any] = msgspec.field(default_factory=dict)
    full_waits: bool = False  # no fail-fast cut of waits after a stuck step (harness.spec.steps.STALL_CUT_S)
    # the cells' network: each in a private loopback-only namespace, or the host's and why (harness.drive.contain)
    network: str = ""
    # where the reports' relative links (docs/protocol.md#..., docs/sglang-bugs.md#...) point:
    # "" keeps them relative to the checkout; a URL (run --docs-url) makes them absolute
    docs_url: str = ""
    # run --baseline: {"path", "sglang", "marks": {"SCENARIO x IMPL": {"mark", "before", "checks"}}}
    # (harness.report.run_diff.baseline_marks); {} without a baseline
    baseline: dict[str, Any] = msgspec.field(default_factory=dict)
    # run --hosts: the hosts by rank, {"rank", "name", "address"}; each cell's history says
    # which host each role ran on (cell-end "placement"); [] when every role ran here
    hosts: list[dict[str, Any]] = msgspec.field(default_factory=list)
    hosts_spec: str = ""  # run --hosts as given (netns:N, or N); "" when every role ran here
    hosts_listen: str = ""  # run --listen as given (the coordinator's address with --hosts N)
    pool_device: str = "cpu"  # run --pool-device: where the roles' KV and aux pools lived (cpu, cuda)
    # how a reproduce line calls pdconform, pasted at the checkout root (harness.program): .venv/bin/pdconform;
    # "" in runs made before it was recorded (the lines then say pdconform)
    program: str = ""
    cells: list[CellResult] = msgspec.field(default_factory=list)

    @property
    def all_as_expected(self) -> bool:
        """Every cell's settled verdict (:attr:`CellResult.settled`) is the expected one: what
        ``run`` exits 0 on; a cell worse only under load (:attr:`CellResult.under_load`) is
        reported apart and does not make the run fail."""
        return all(cell.settled_as_expected for cell in self.cells)


# The layout of an --out folder and of each run folder in it, defined here and nowhere else
# (harness.report.outdir makes the folders, the scheduler the cell folders):
#   OUT/runs/<time>/                 one run: results.json, REPORT_FILES, cells/, reference-for-diff/, MARKER
#   OUT/latest -> runs/<time>        the last run that finished
#   OUT/.pdconform.lock              held while a run writes into OUT
RUNS = "runs"
LATEST = "latest"
MARKER = ".pdconform-run"  # in each run folder pdconform made (only such folders are ever removed)
LOCK = ".pdconform.lock"
CELLS_DIR = "cells"  # RUN/cells/SCENARIO--IMPL/: a reported cell's work directory
REFERENCE_FOR_DIFF_DIR = "reference-for-diff"  # RUN/reference-for-diff/SCENARIO/: a reference cell for the diff only
ALONE_DIR = "alone"  # RUN/alone/SCENARIO--IMPL/: a cell run once more alone (harness.judge.load.needs_alone)
ON_PAIR_DIR = "on-pair"  # RUN/on-pair/SCENARIO--IMPL/: a cell's run on a warm pair, confirmed isolated after
TREND_PAGE = "trend.html"  # OUT/trend.html: every stored run side by side (harness.report.trend)
#: every file a run writes into its run folder beside the cell folders
REPORT_FILES = ("results.json", "junit.xml", "summary.md", "index.html")
#: the names of the files pdconform writes anywhere in a run folder (the run's reports, each
#: cell's history, result, page and logs, each role's log and endpoint per rank, the reports of
#: bench, soak, mutants and explore's sweep, a write's temporary file): pruning removes these and
#: nothing else (harness.report.outdir.prune); fnmatch patterns, matched against a file's name
OWN_FILES = (*REPORT_FILES, MARKER, "history.jsonl", "cell.json", "cell.html", "cell.log", "program.json",
             "bench.json", "soak.json", "soak.md", "mutants.json", "mutants.md", "sweep.json", "sweep.md",
             "*.log", "*.endpoint", ".*.tmp")


def cell_dir_name(scenario: str, impl: str) -> str:
    """A cell's folder name under ``OUT/cells/``: ``SCENARIO--IMPL``."""
    return f"{scenario}--{impl}"


def cell_dir(out_dir: str | Path, scenario: str, impl: str) -> Path:
    """A reported cell's work directory in a run's out directory."""
    return Path(out_dir) / CELLS_DIR / cell_dir_name(scenario, impl)


def reference_for_diff_dir(out_dir: str | Path, scenario: str) -> Path:
    """Where the reference cell runs that only serves the diff (the reference not among the run's impls)."""
    return Path(out_dir) / REFERENCE_FOR_DIFF_DIR / scenario


def on_pair_dir(out_dir: str | Path, scenario: str, impl: str) -> Path:
    """Where a cell's run on a warm role pair is kept when its result was not the expected one
    and the cell ran once more isolated (harness.drive.scheduler; the isolated run is reported)."""
    return Path(out_dir) / ON_PAIR_DIR / cell_dir_name(scenario, impl)


def alone_dir(out_dir: str | Path, scenario: str, impl: str) -> Path:
    """Where a cell that ran starved runs once more alone, at the end of its run."""
    return Path(out_dir) / ALONE_DIR / cell_dir_name(scenario, impl)


def load_alone_histories(out_dir: str | Path, cells: list[tuple[str, str]],
                         where=alone_dir) -> dict[tuple[str, str], list[dict]]:
    """The histories of the cells of ``cells`` that were run once more alone (:func:`alone_dir`;
    ``where=on_pair_dir``: the runs on a warm pair confirmed isolated), keyed ``(scenario,
    impl)``; a cell without one gives no key.  Never raises."""
    paths = {key: where(out_dir, *key) / "history.jsonl" for key in cells}
    return {key: hist.load(path) for key, path in paths.items() if path.is_file()}


def write_atomic(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically, following no link (harness.nofollow.write_atomic:
    LinkRefused for a link in the path; OSError as it comes)."""
    nofollow.write_atomic(path, data)


def dump_run(run: RunResult, path: str | Path) -> None:
    """Write ``run`` as pretty JSON to ``path``, atomically (:func:`write_atomic`)."""
    write_atomic(path, msgspec.json.format(msgspec.json.encode(clean_tree(run, encodable)), indent=2) + b"\n")


def dump_cell(cell: CellResult, path: str | Path) -> None:
    """Write one cell's result as pretty JSON (``cells/SCENARIO--IMPL/cell.json``), atomically."""
    write_atomic(path, msgspec.json.format(msgspec.json.encode(clean_tree(cell, encodable)), indent=2) + b"\n")


def load_histories(out_dir: str | Path, cells: list[tuple[str, str]]) -> dict[tuple[str, str], list[dict]]:
    """The histories of a run's ``(scenario, impl)`` cells under ``out_dir``, keyed like
    ``cells``, and for each scenario without a reference cell the reference's history from
    ``OUT/reference-for-diff/SCENARIO/`` (keyed ``(scenario, "reference")``).  A missing or
    unreadable file gives no key (harness.spec.history.load); never raises."""
    out_dir = Path(out_dir)
    paths = {key: cell_dir(out_dir, *key) / "history.jsonl" for key in cells}
    for scenario in dict.fromkeys(sc for sc, _ in cells):
        if (scenario, REFERENCE) not in paths:
            paths[(scenario, REFERENCE)] = reference_for_diff_dir(out_dir, scenario) / "history.jsonl"
    return {key: hist.load(path) for key, path in paths.items() if path.is_file()}


def load_run(path: str | Path) -> RunResult:
    """Read a results.json (a regular file of at most harness.spec.inputs.MAX_INPUT_BYTES).
    harness.spec.inputs.InputError when it is not one; ValueError (msgspec.DecodeError or
    ValidationError) when it is not a results.json of this schema."""
    run = msgspec.json.decode(read_input(path, "results file"), type=RunResult)
    if run.schema != SCHEMA:
        raise ValueError(f"schema {run.schema}; this pdconform reads schema {SCHEMA} (rerun the run with it)")
    return run


def load_cell(path: str | Path) -> CellResult:
    return msgspec.json.decode(Path(path).read_bytes(), type=CellResult)
