"""What a ``pdconform`` process imports before it runs a cell: neither torch (0.85 s) nor
hypothesis (0.2 s, with pytest and trio under it) unless it draws frames or layouts. The test
suite starts about a hundred such processes, and every CI gate starts one
(docs/performance.md, "`make test`, the mutant run and explore's rate")."""

import subprocess
import sys

# the CLI, a run's session and scheduler, the judge, every scenario (the registry reads them
# all, found programs included) and every implementation's registration
PROBE = """
import sys
import harness.cli, harness.cli.runs, harness.session, harness.drive.scheduler, harness.judge.judge
from harness.spec.scenario import scenario_ids, get_scenario
from harness.implementations import available
for sid in scenario_ids():
    get_scenario(sid)
available()
print(" ".join(sorted(m for m in ("torch", "hypothesis") if m in sys.modules)))
"""


def test_a_pdconform_process_imports_neither_torch_nor_hypothesis_before_a_cell():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"imported at start: {out.stdout.strip()} (make it lazy: see this file's docstring)"
