"""The backends' own KV pairing functions, reached through the adapters' manager shells,
pair plain layouts (one stage, no draft KV) one to one, like the reference planner.

This checks the shell wiring (a wrong shell would mis-pair even these); how the
backends pair pipeline stages and draft KV is the draft-kv-layout scenario's job.
Each backend is imported in its own process, as in a cell (the Mori stand-in goes
on ``sys.path``).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLAIN = [{"attention": kind, "num_layers": n, "stages": 1, "prefill": [0, n, 0], "decode": [0, n, 0]}
         for kind in ("MHA", "MLA") for n in (1, 3, 8)]
PROGRAM = """
import json, sys
from harness.judge import layout_check
from harness.role.recorder import RoleRecorder
from harness.implementations import load_role_adapter
specs = json.loads(sys.argv[2])
role = load_role_adapter(sys.argv[1], role="prefill", recorder=RoleRecorder())
print(json.dumps([layout_check.plan_difference(s, r) for s, r in zip(specs, role.plan_layouts(specs))]))
"""


@pytest.mark.parametrize("impl", ["mooncake", "nixl", "mori"])
def test_plain_layouts_pair_one_to_one(impl):
    done = subprocess.run([sys.executable, "-c", PROGRAM, impl, json.dumps(PLAIN)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [None] * len(PLAIN)
