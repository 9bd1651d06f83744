"""pytest configuration shared by every test.

* The harness self-test scenarios and implementation are visible
  (PDCONFORM_TEST_SCENARIOS=1), and child processes inherit that.
* Hypothesis profiles: ``ci`` (default, bounded for the default suite) and
  ``nightly`` (long runs): ``PDCONFORM_HYPOTHESIS_PROFILE=nightly make test``
  or ``make nightly``.
* ``pytest --impl NAME --scenario ID`` runs pdconform cells as tests
  (harness.pytest_plugin, registered as a pytest11 entry point by pyproject.toml).
"""

import os

from hypothesis import settings

os.environ["PDCONFORM_TEST_SCENARIOS"] = "1"

settings.register_profile("ci", deadline=None, max_examples=150, stateful_step_count=40, database=None)
settings.register_profile("nightly", deadline=None, max_examples=5000, stateful_step_count=100)
settings.load_profile(os.environ.get("PDCONFORM_HYPOTHESIS_PROFILE", "ci"))
