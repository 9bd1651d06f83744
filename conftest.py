"""pytest configuration shared by every test.

* The harness self-test scenarios and implementation are visible
  (PDCONFORM_TEST_SCENARIOS=1), and child processes inherit that.
* Hypothesis profiles: ``ci`` (default, bounded for the default suite) and
  ``nightly`` (long runs): ``PDCONFORM_HYPOTHESIS_PROFILE=nightly make test``
  or ``make nightly``.
* ``pytest --impl NAME --scenario ID`` runs pdconform cells as tests
  (harness.pytest_plugin, registered as a pytest11 entry point by pyproject.toml).
* pytest's process writes bytecode (``__pycache__``, git-ignored) even where
  PYTHONDONTWRITEBYTECODE is set, so pytest caches the modules it rewrites for assertions
  (those imported after this file: the tests and most of pdconform, its pytest11 plugin's
  distribution) and plain imports get .pyc files too.  Without it every pytest process (each
  xdist worker, and the pytest runs some tests start) rewrites ~300 modules again, 6 s of
  CPU each.  Child processes keep the environment's setting.
* Runs made in a test process share fork servers (harness.drive.kept_servers): each run's own
  would import sglang again, about 40 % of the suite's CPU.  A test that is about a run's own
  fork server (its log, its death, an interrupt while it imports) is marked
  ``fresh_fork_servers`` and starts and ends its own, as ``pdconform`` does;
  PDCONFORM_TEST_FRESH_FORK_SERVERS=1 does that for every test (to measure what keeping saves).
* The suite never writes into the checkout's reports/ (a user's `make matrix` results
  live there): the session fails when anything under reports/ changed.
"""

import os
import sys
from pathlib import Path

import pytest
from hypothesis import settings

os.environ["PDCONFORM_TEST_SCENARIOS"] = "1"
sys.dont_write_bytecode = False  # pytest's rewrite cache (see above); the environment variable is left alone

settings.register_profile("ci", deadline=None, max_examples=150, stateful_step_count=40, database=None)
settings.register_profile("nightly", deadline=None, max_examples=5000, stateful_step_count=100)
settings.load_profile(os.environ.get("PDCONFORM_HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(autouse=True)
def _kept_fork_servers(request):
    """Runs of this test share the process's kept fork servers, unless it is marked fresh_fork_servers."""
    from harness.drive import kept_servers

    kept_servers.keep(request.node.get_closest_marker("fresh_fork_servers") is None
                      and not os.environ.get("PDCONFORM_TEST_FRESH_FORK_SERVERS"))
    yield


REPORTS = Path(__file__).resolve().parent / "reports"


def _reports_state() -> dict[str, tuple[int, int]]:
    """Every path under reports/ (links not followed) with its size and mtime."""
    state = {}
    for folder, dirs, files in os.walk(REPORTS):
        for name in dirs + files:
            path = os.path.join(folder, name)
            st = os.lstat(path)
            state[os.path.relpath(path, REPORTS)] = (st.st_size, st.st_mtime_ns)
    return state


def pytest_sessionstart(session):
    session.config._pdconform_reports = _reports_state()


def pytest_sessionfinish(session, exitstatus):
    before = getattr(session.config, "_pdconform_reports", None)
    if before is None or getattr(session.config.option, "impl", None) or getattr(session.config.option, "scenario", None):
        return  # cells run as tests write under --cells-out, by the user's choice
    after = _reports_state()
    changed = sorted(set(before.items()) ^ set(after.items()))
    if changed:
        names = sorted({path for path, _ in changed})
        print(f"\nthe test suite changed the checkout's reports/: {', '.join(names[:10])}")
        session.exitstatus = 1
