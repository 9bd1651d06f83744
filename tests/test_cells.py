"""pdconform cells as pytest tests: ``pytest --impl NAME --scenario ID`` (harness.pytest_plugin).

Collected only when --impl or --scenario is given; the ordinary suite deselects it.
"""

from harness.pytest_plugin import run_cell_test


def test_cell(pdconform_cell, pdconform_target, pdconform_expectations, pytestconfig):
    run_cell_test(pdconform_cell, pytestconfig, pdconform_target, pdconform_expectations)
