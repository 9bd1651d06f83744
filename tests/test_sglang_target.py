"""Which sglang the cells import: --sglang-src trees, --sglang releases, clear errors otherwise."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.target.sglang import (VERSION_ENV, TargetError, available_versions, installed_info, release_target,
                                   resolve_target, source_target)

ROOT = Path(__file__).resolve().parents[1]


def make_tree(root: Path, version_file: str | None = "_version.py", version="0.5.99") -> Path:
    pkg = root / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("MARK = 'pdconform-test-tree'\n")
    if version_file == "_version.py":
        (pkg / "_version.py").write_text(f"__version__ = version = '{version}'\n")
    elif version_file == "version.py":
        (pkg / "version.py").write_text(f'__version__ = "{version}"\n')
    return root


def test_checkout_uses_its_python_folder_and_records_the_commit(tmp_path):
    checkout = tmp_path / "sglang-checkout"
    make_tree(checkout / "python", "version.py", "0.5.17")
    subprocess.run(["git", "init", "-q", str(checkout)], check=True)
    subprocess.run(["git", "-C", str(checkout), "-c", "user.email=a@b", "-c", "user.name=t", "commit", "-q",
                    "--allow-empty", "-m", "x"], check=True)
    target = source_target(checkout)
    assert target.info.version == "0.5.17" and target.info.source == "src"
    assert target.info.path == str(checkout / "python" / "sglang")
    assert len(target.info.commit) == 40
    assert target.env == {"PYTHONPATH": str(checkout / "python"), VERSION_ENV: "0.5.17"}


def test_unpacked_wheel_version_from_dist_info(tmp_path):
    wheel = make_tree(tmp_path / "w", version_file=None)
    (wheel / "sglang-0.5.20.dist-info").mkdir()
    (wheel / "sglang-0.5.20.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.20\n")
    target = source_target(wheel)
    assert target.info.version == "0.5.20" and target.info.commit is None


def test_cells_import_the_tree_not_the_installed_package(tmp_path):
    target = source_target(make_tree(tmp_path / "t"))
    code = "import sglang, os; print(sglang.MARK, os.environ['PDCONFORM_SGLANG_VERSION'])"
    out = subprocess.run([target.python, "-c", code], env=target.cell_env(), capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["pdconform-test-tree", "0.5.99"], out.stderr
    # ... and the role context reads the tree's version, not the installed metadata
    code = "from harness.target.role_context import sglang_version; print(sglang_version())"
    out = subprocess.run([target.python, "-c", code], env=target.cell_env(), capture_output=True, text=True,
                         timeout=60, cwd=ROOT)
    assert out.stdout.strip() == "0.5.99", out.stderr


@pytest.mark.parametrize("make, message", [
    (lambda p: p, "no sglang package found"),
    (lambda p: make_tree(p / "x", version_file=None), "cannot tell the sglang version"),
    (lambda p: p / "missing", "not a directory"),
])
def test_bad_trees(tmp_path, make, message):
    with pytest.raises(TargetError, match=message):
        source_target(make(tmp_path))


def test_release_without_pins_is_refused_with_the_available_ones():
    with pytest.raises(TargetError, match=r"no pinned package set requirements/sglang-9\.9\.9\.txt.*0\.5\.23"):
        release_target("9.9.9", setup=False)
    assert "0.5.23" in available_versions()


def test_installed_release_needs_no_setup():
    target = release_target(installed_info().version)
    assert target.python == sys.executable and target.info.source == "installed"


def test_both_options_refused(tmp_path):
    with pytest.raises(TargetError, match="not both"):
        resolve_target(tmp_path, "0.5.23")


@pytest.mark.parametrize("args, message", [
    (["--sglang-src", "/nonexistent/sglang"], "not a directory"),
    (["--sglang", "9.9.9"], "no pinned package set"),
    (["--sglang", "0.5.23", "--sglang-src", "/tmp"], "not both"),
])
def test_cli_exit_2(args, message, tmp_path):
    out = subprocess.run([sys.executable, "-m", "harness.cli", "run", "--impl", "reference", "--scenario",
                          "happy-path", "--out", str(tmp_path / "out"), *args], capture_output=True, text=True,
                         timeout=60, cwd=ROOT)
    assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr, out.stderr


# 0.5.20 has a role-context strategy but neither shape of the Common classes; 0.4.0 has nothing
@pytest.mark.parametrize("version", ["0.5.20", "0.4.0"])
def test_a_tree_outside_the_adapters_range_gives_unsupported_backend_cells(tmp_path, version):
    """The range gate reads the tree's version (not the installed 0.5.23): the backend's cells
    are UNSUPPORTED naming that version and the range; the reference still runs."""
    tree = make_tree(tmp_path / "old", "version.py", version)
    out = subprocess.run([sys.executable, "-m", "harness.cli", "run", "--impl", "reference", "--impl", "mooncake",
                          "--scenario", "happy-path", "--sglang-src", str(tree), "--out", str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 1, out.stdout + out.stderr  # the UNSUPPORTED cell is not the PASS expected
    data = json.loads((tmp_path / "out" / "latest" / "results.json").read_text())
    assert data["sglang"]["version"] == version
    cells = {c["impl"]: c for c in data["cells"]}
    assert cells["reference"]["verdict"] == "PASS", cells["reference"]["reason"]
    assert cells["mooncake"]["verdict"] == "UNSUPPORTED"
    assert (f"sglang {version} is outside the releases the mooncake adapter supports (0.5.17 - 0.5.18, >= 0.5.22"
            in cells["mooncake"]["reason"]), cells["mooncake"]["reason"]


def test_results_record_the_source_tree(tmp_path):
    # the reference does not import sglang, so a tree with only a version is enough to run it
    tree = make_tree(tmp_path / "tree", version="0.5.23")
    out = subprocess.run([sys.executable, "-m", "harness.cli", "run", "--impl", "selftest", "--scenario",
                          "selftest-noop", "--sglang-src", str(tree), "--out", str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    data = json.loads((tmp_path / "out" / "latest" / "results.json").read_text())
    assert data["sglang"] == {"version": "0.5.23", "path": str(tree / "sglang"), "source": "src", "commit": None}
    summary = (tmp_path / "out" / "latest" / "summary.md").read_text()
    assert "sglang 0.5.23 (src" in summary
