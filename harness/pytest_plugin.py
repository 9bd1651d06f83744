"""pytest integration: cells as pytest tests, through the same runner as ``pdconform run``.

    pytest --impl mooncake --scenario dead-prefill          # one cell, one test
    pytest --impl nixl                                      # every scenario on NIXL
    pytest --scenario room-reuse --expectations none          # known bugs fail too

With ``--impl`` or ``--scenario`` only the cell tests run (``tests/test_cells.py``,
one per (scenario, impl), id ``test_cell[SCENARIO-IMPL]``); without them the cell tests are
deselected and the ordinary suite runs.  A cell passes when its verdict is the
expected one (PASS, or the expectations file's: by default the one shipped for the sglang
under test, ``--expectations none`` for none); a non-PASS verdict that is expected
is reported as xfail with the expectation's reason.  Each cell's logs and history go
under ``--cells-out`` (default ``reports/out/pytest``); path options outside the checkout
go in ``--opt=PATH`` form (see :func:`_moved_rootdir`).  Registered by the root
``conftest.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

CELL_FIXTURE = "pdconform_cell"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("pdconform", "pdconform cells as tests")
    group.addoption("--impl", action="append", default=None, metavar="NAME",
                    help="run pdconform cells of this implementation (repeatable)")
    group.addoption("--scenario", action="append", default=None, metavar="ID",
                    help="run pdconform cells of this scenario (repeatable)")
    group.addoption("--seed", type=int, default=0, help="seed of the pdconform cells (default 0)")
    group.addoption("--sglang-src", default=None, metavar="PATH", help="run the cells against this sglang tree")
    group.addoption("--sglang", default=None, metavar="VERSION", dest="sglang_version",
                    help="run the cells against this released sglang (cached environment)")
    group.addoption("--expectations", default=None, metavar="FILE",
                    help="expected verdicts (TOML; default: the file shipped for the sglang under test; none: no file)")
    group.addoption("--cells-out", default="reports/out/pytest", metavar="DIR",
                    help="directory for the cells' logs and histories")


def _requested(config: pytest.Config) -> bool:
    return bool(config.getoption("--impl") or config.getoption("--scenario"))


@dataclass(frozen=True)
class CellSpec:
    """One (scenario, impl) cell to run as a test."""

    scenario: str
    impl: str

    def __str__(self) -> str:
        return f"{self.scenario}[{self.impl}]"


def _cells(config: pytest.Config) -> list[CellSpec]:
    """The cells the options select; pytest.UsageError (exit 4) for an unknown name."""
    from harness.implementations import available, names
    from harness.spec.scenario import all_scenarios, scenarios_by_id

    impls = list(dict.fromkeys(config.getoption("--impl") or names()))
    asked = config.getoption("--scenario")
    known = scenarios_by_id(asked) if asked else {s.id: s for s in all_scenarios()}
    scenarios = list(dict.fromkeys(asked or [s.id for s in known.values() if not s.test_only and not s.nightly]))
    unknown = [i for i in impls if i not in available()] + [s for s in scenarios if s not in known]
    if unknown:
        raise pytest.UsageError(f"pdconform: unknown --impl/--scenario {', '.join(unknown)} "
                                f"(implementations: {', '.join(available())}; scenarios: `pdconform list`)")
    return [CellSpec(s, i) for s in scenarios for i in impls]


_CELLS = pytest.StashKey[list]()


PATH_OPTIONS = ("--cells-out", "--expectations", "--sglang-src")


def _moved_rootdir(config: pytest.Config) -> str | None:
    """The usage error to raise when a path option in space form moved pytest's rootdir, else None.

    pytest picks its rootdir and ini file before it parses plugin options, so in
    ``--cells-out /tmp/x`` it takes ``/tmp/x`` for a test path: when that path exists
    outside this checkout, the rootdir becomes ``/tmp/x`` and pyproject.toml's pytest
    settings are not read.  ``--cells-out=/tmp/x`` is parsed as one option."""
    if config.inipath is not None:
        return None
    args = list(config.invocation_params.args)
    spaced = [f"{a}={args[i + 1]}" for i, a in enumerate(args[:-1]) if a in PATH_OPTIONS]
    if not spaced:
        return None
    return (f"pdconform: pytest took a path option's value for a test path (rootdir {config.rootpath}) and did "
            f"not read pdconform's pyproject.toml; write it as {', '.join(spaced)}")


_SETUP = pytest.StashKey[tuple]()


def pytest_configure(config: pytest.Config) -> None:
    """Validate every pdconform option before collection, when cells are asked for: an unknown
    name, a bad --sglang-src/--sglang, --expectations or --cells-out, or a path option that
    moved pytest's rootdir (:func:`_moved_rootdir`), is a usage error (exit 4), not a
    per-test error."""
    config.stash[_CELLS] = []
    if not _requested(config):
        return
    if problem := _moved_rootdir(config):
        raise pytest.UsageError(problem)
    config.stash[_CELLS] = _cells(config)
    target = _target(config)
    config.stash[_SETUP] = (target, _expectations(config, target.info.version), _cells_out(config))


def _target(config: pytest.Config):
    from harness.target.sglang import TargetError, resolve_target

    try:
        return resolve_target(config.getoption("--sglang-src"), config.getoption("sglang_version"))
    except TargetError as exc:
        raise pytest.UsageError(f"pdconform: {exc}") from None


def _expectations(config: pytest.Config, version: str | None):
    """--expectations, by default the file shipped for the sglang under test (``none``: no
    file): harness.session.resolve_expectations."""
    from harness.judge.expectations import ExpectationsError
    from harness.session import resolve_expectations

    try:
        return resolve_expectations(config.getoption("--expectations"), version)
    except ExpectationsError as exc:
        raise pytest.UsageError(f"pdconform: {exc}") from None


def _cells_out(config: pytest.Config) -> Path:
    from harness.report.outdir import OutDirError, check_out

    try:
        return check_out(config.getoption("--cells-out"))
    except OutDirError as exc:
        raise pytest.UsageError(f"pdconform: {exc}") from None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if CELL_FIXTURE in metafunc.fixturenames:
        cells = metafunc.config.stash[_CELLS]
        metafunc.parametrize(CELL_FIXTURE, cells, ids=[f"{c.scenario}-{c.impl}" for c in cells])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Cell tests only with --impl/--scenario; every other test only without them."""
    requested = _requested(config)
    keep, drop = [], []
    for item in items:
        is_cell = CELL_FIXTURE in getattr(item, "fixturenames", ())
        (keep if is_cell == requested else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture(scope="session")
def pdconform_target(request: pytest.FixtureRequest):
    """The sglang the cells run against (harness.target.sglang), resolved once, before collection."""
    return request.config.stash[_SETUP][0]


@pytest.fixture(scope="session")
def pdconform_expectations(request: pytest.FixtureRequest):
    """The loaded --expectations file, or None."""
    return request.config.stash[_SETUP][1]


def run_cell_test(cell: CellSpec, config: pytest.Config, target, expectations) -> None:
    """Run ``cell`` through harness.session (as ``pdconform run`` does) and turn its verdict into a test outcome."""
    from harness import session
    from harness.judge.divergence import describe
    from harness.judge.results import cell_dir_name
    from harness.report.terminal import reproduce_command
    from harness.spec.scenario import get_scenario

    out = config.stash[_SETUP][2] / cell_dir_name(cell.scenario, cell.impl)
    run = session.run(session.RunConfig(impls=[cell.impl], scenarios=[get_scenario(cell.scenario)], out_dir=out,
                                        target=target, seed=config.getoption("--seed"), expectations=expectations,
                                        isolated=True))  # one cell: no pair to share
    result = run.cells[0]
    lines = [f"{result.verdict} (expected {result.expected}): {result.reason}"]
    if result.divergence:
        lines.append(describe(result.divergence))
    lines += [f"reproduce: {reproduce_command(run, result)}", f"cell directory: {result.workdir}"]
    if result.under_load:  # as expected run again alone (harness.judge.load): neither a pass nor a failure
        from harness.report.load import alone_line

        pytest.skip(f"worse only under load: {alone_line(result)}")
    if not result.as_expected:
        pytest.fail("\n".join(lines), pytrace=False)
    if result.verdict != "PASS":
        pytest.xfail(f"{result.verdict} as expected: {result.expected_reason} ({result.expected_link})")
