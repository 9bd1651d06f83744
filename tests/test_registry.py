"""The registries: implementations and scenarios come from entry points, and a broken or
conflicting entry is a one-line error (exit 2), never a traceback or a silent choice."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness import implementations as im
from harness.target.sglang import VERSION_ENV, installed_target

ROOT = Path(__file__).resolve().parents[1]


def plugin(tmp_path: Path, name: str, entry_points: str, modules: dict[str, str]) -> dict:
    """A package on PYTHONPATH with a dist-info declaring ``entry_points`` (entry_points.txt text);
    the environment that makes it visible."""
    site = tmp_path / "site"
    for module, text in modules.items():
        path = site / (module.replace(".", "/") + ".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    dist = site / f"{name}-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(entry_points)
    return dict(os.environ, PYTHONPATH=str(site))


def pdconform(env, *args):
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env=env)


@pytest.mark.parametrize("entry, modules, message", [
    ("[pdconform.implementations]\nbroken = nosuchmodule_pdconform:IMPL\n", {}, "broken = nosuchmodule_pdconform:IMPL "
     "does not load: ModuleNotFoundError"),
    ("[pdconform.implementations]\nnotimpl = os:sep\n", {}, "is not an Implementation named 'notimpl'"),
    ("[pdconform.implementations]\nmooncake = fakeimpl:IMPLEMENTATION\n",
     {"fakeimpl": "from harness.implementations import Implementation\n"
                  "IMPLEMENTATION = Implementation('mooncake', 'x:Y', 'a second mooncake')\n"},
     "two implementations are registered as 'mooncake'"),
    ("[pdconform.scenarios]\nbad = badscenarios\n",
     {"badscenarios.__init__": "", "badscenarios.boom": "raise RuntimeError('boom at import')\n"},
     "scenario entry point bad = badscenarios: badscenarios.boom does not load: RuntimeError: boom at import"),
    ("[pdconform.scenarios]\ndup = dupscenarios\n",
     {"dupscenarios.__init__": "", "dupscenarios.again": "from scenarios import happy_path\n"
      "from harness.spec.scenario import Scenario, register\n"
      "register(Scenario(id='happy-path', title='x', steps=lambda s: [], checks=lambda s: []))\n"},
     "duplicate scenario id 'happy-path'"),
])
@pytest.mark.parametrize("command", [["list"], ["judge", "/nonexistent"], ["run", "--impl", "reference"]])
def test_a_broken_entry_point_is_a_one_line_usage_error(tmp_path, entry, modules, message, command):
    out = pdconform(plugin(tmp_path, "broken-plugin", entry, modules), *command)
    assert out.returncode == 2, out.stdout + out.stderr
    assert message in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_the_registry_lists_pdconforms_implementations_in_report_order():
    assert im.names() == ["reference", "mooncake", "nixl", "mori"]
    assert im.implementation("nixl").engine_settings[0].name == "nixl_progress_delay_us"
    with pytest.raises(KeyError, match="unknown implementation 'nope'"):
        im.implementation("nope")


def test_only_a_source_tree_target_tells_its_cells_a_version(monkeypatch):
    monkeypatch.setenv(VERSION_ENV, "0.5.20")  # left over in the user's shell
    assert VERSION_ENV not in installed_target().cell_env()
