"""pytest configuration shared by every test: the harness self-test scenarios are
visible (PDCONFORM_TEST_SCENARIOS=1), and child processes inherit that."""

import os

os.environ["PDCONFORM_TEST_SCENARIOS"] = "1"
