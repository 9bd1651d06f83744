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
    (lambda p: make_tree(p / "x", version_file=None), "cannot tell the sglang version.*--sglang-version X"),
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
    assert data["sglang"] == {"version": "0.5.23", "path": str(tree / "sglang"), "source": "src", "commit": None,
                              "version_source": "tree: sglang/_version.py", "expectations_for": "0.5.23",
                              "bootstrap_token_env": None}
    summary = (tmp_path / "out" / "latest" / "summary.md").read_text()
    assert "sglang 0.5.23 (src" in summary


# ---- the version of a tree: where it is read, --sglang-version, the dev-version rule -----------------------------

INSTALLED = Path(installed_info().path)


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(cwd), "-c", "user.email=a@b", "-c", "user.name=t", *args], check=True,
                          capture_output=True, text=True).stdout.strip()


def make_checkout(root: Path, tag: str | None, commits_after: int = 0) -> Path:
    """An sglang checkout as a clone of main has it: python/sglang/version.py reads the version at
    run time (no literal), no _version.py, a pyproject.toml whose version is dynamic."""
    make_tree(root / "python", version_file=None)
    (root / "python" / "sglang" / "version.py").write_text(
        "try:\n    from sglang._version import __version__\nexcept ImportError:\n    __version__ = '0.0.0.dev0'\n")
    (root / "python" / "pyproject.toml").write_text('[project]\nname = "sglang"\ndynamic = ["version"]\n')
    git(root.parent, "init", "-q", str(root))
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "base")
    if tag:
        git(root, "tag", tag)
    for i in range(commits_after):
        git(root, "commit", "-q", "--allow-empty", "-m", f"after {i}")
    return root


@pytest.mark.parametrize("write, version, source", [
    (lambda t: (t / "sglang" / "_version.py").write_text("__version__ = version = '0.5.24.dev3+g0a1b2c3'\n"),
     "0.5.24.dev3+g0a1b2c3", "tree: sglang/_version.py"),
    (lambda t: (t / "sglang" / "version.py").write_text('__version__ = "0.5.23.post1"\n'),
     "0.5.23.post1", "tree: sglang/version.py"),
    (lambda t: (t / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.22\n\nbody\n"),
     "0.5.22", "tree: PKG-INFO"),
    (lambda t: ((t / "sglang.egg-info").mkdir(), (t / "sglang.egg-info" / "PKG-INFO").write_text(
        "Name: sglang\nVersion: 0.5.24.dev0\n")), "0.5.24.dev0", "tree: sglang.egg-info/PKG-INFO"),
    (lambda t: (t / "pyproject.toml").write_text('[project]\nname = "sglang"\nversion = "0.5.17"\n'),
     "0.5.17", "tree: pyproject.toml"),
])
def test_the_version_is_read_from_the_tree_and_says_where(tmp_path, write, version, source):
    tree = make_tree(tmp_path / "t", version_file=None)
    write(tree)
    info = source_target(tree).info
    assert (info.version, info.version_source) == (version, source)


def test_a_placeholder_or_dynamic_version_is_no_information(tmp_path):
    tree = make_tree(tmp_path / "t", version_file="version.py", version="0.0.0.dev0")
    (tree / "pyproject.toml").write_text('[project]\nname = "sglang"\ndynamic = ["version"]\n')
    with pytest.raises(TargetError, match="cannot tell the sglang version"):
        source_target(tree)


def test_git_describe_gives_a_tagged_checkout_its_version(tmp_path):
    on_tag = make_checkout(tmp_path / "on-tag", "v0.5.23")
    info = source_target(on_tag).info
    assert (info.version, info.version_source) == ("0.5.23", "git describe: v0.5.23-0-g" + info.commit[:7])
    past = make_checkout(tmp_path / "past", "v0.5.23", commits_after=3)
    info = source_target(past).info
    # sglang's own build (setuptools-scm, guess-next-dev) calls that commit 0.5.24.dev3+gHASH
    assert info.version == f"0.5.24.dev3+g{info.commit[:7]}"
    assert info.version_source.startswith("git describe: v0.5.23-3-g")
    assert info.expectations_for is None  # set by the command line (harness.cli._target), not here


def test_a_checkout_without_tags_needs_the_option_and_records_it(tmp_path):
    checkout = make_checkout(tmp_path / "main", tag=None)
    with pytest.raises(TargetError, match=r"cannot tell the sglang version.*give it with --sglang-version X"):
        source_target(checkout)
    target = resolve_target(checkout, tree_version="0.5.24.dev0")
    assert (target.info.version, target.info.version_source) == ("0.5.24.dev0", "option --sglang-version")
    assert target.info.from_option and len(target.info.commit) == 40
    assert target.env[VERSION_ENV] == "0.5.24.dev0"


def test_the_option_wins_over_the_tree_and_says_what_the_tree_said(tmp_path):
    tree = make_tree(tmp_path / "t", version_file="_version.py", version="0.5.23")
    info = resolve_target(tree, tree_version="0.5.24.dev0").info
    assert info.version == "0.5.24.dev0"
    assert info.version_source == "option --sglang-version (the tree says 0.5.23: sglang/_version.py)"


def test_a_tree_inside_another_repository_does_not_take_its_tags(tmp_path):
    outer = make_checkout(tmp_path / "outer", "v9.9.9")
    tree = make_tree(outer / "vendored" / "wheel", version_file=None)
    with pytest.raises(TargetError, match="cannot tell"):
        source_target(tree)
    assert resolve_target(tree, tree_version="0.5.23").info.commit is None  # nor its commit


@pytest.mark.parametrize("kwargs, message", [
    ({"tree_version": "0.5.23"}, "--sglang-version names the version of an --sglang-src tree"),
    ({"src": "TREE", "tree_version": "main"}, r"--sglang-version 'main': not a version \(PEP 440"),
])
def test_bad_version_options(tmp_path, kwargs, message):
    if kwargs.get("src") == "TREE":
        kwargs["src"] = make_tree(tmp_path / "t", version_file=None)
    with pytest.raises(TargetError, match=message):
        resolve_target(**kwargs)


@pytest.mark.parametrize("version, shipped", [
    ("0.5.23", "0.5.23"), ("0.5.17", "0.5.17"),
    ("0.5.24.dev0", "0.5.23"), ("0.5.23.post1", "0.5.23"), ("0.5.23+abc", "0.5.23"), ("0.5.24rc1", "0.5.23"),
    ("0.5.24.dev12+g0a1b2c3", "0.5.23"), ("0.5.23.dev0", "0.5.17"), ("0.5.20.post1", "0.5.17"),
    ("0.5.20", None), ("0.5.17.dev0", None), ("0.4.0+cpu", None), ("main", None), (None, None),
])
def test_a_dev_post_or_local_version_takes_the_newest_shipped_release_at_or_below_it(version, shipped):
    """expectations/ ships 0.5.17 and 0.5.23; a plain release without a file of its own takes none."""
    from harness.judge.expectations import shipped_path

    path = shipped_path(version)
    assert (path.name if path else None) == (f"sglang-{shipped}.toml" if shipped else None)


def test_the_note_names_the_release_whose_expectations_judged_the_run():
    from harness.target.sglang import SglangInfo

    info = SglangInfo(version="0.5.24.dev0", path=None, expectations_for="0.5.23")
    assert info.expectations_note("/x/expectations/sglang-0.5.23.toml") == (
        "expectations of sglang 0.5.23 (newest shipped release at or below 0.5.24.dev0)")
    assert info.expectations_note("/x/mine.toml") == ""  # --expectations FILE: not the shipped fallback
    assert info.expectations_note(None) == ""
    assert SglangInfo(version="0.5.23", path=None, expectations_for="0.5.23").expectations_note(
        "/x/expectations/sglang-0.5.23.toml") == ""


# ---- the bootstrap token of sglang PR #39416 ---------------------------------------------------------------------

def test_the_bootstrap_token_is_detected_in_the_tree(tmp_path):
    from harness.target.sglang import BOOTSTRAP_TOKEN_ENV, bootstrap_token_env

    assert bootstrap_token_env(INSTALLED) is None  # 0.5.23 has none
    by_module = make_tree(tmp_path / "a")
    (by_module / "sglang" / "srt" / "disaggregation" / "common").mkdir(parents=True)
    (by_module / "sglang" / "srt" / "disaggregation" / "common" / "bootstrap_auth.py").write_text("")
    assert bootstrap_token_env(by_module / "sglang") == BOOTSTRAP_TOKEN_ENV
    by_env = make_tree(tmp_path / "b")
    (by_env / "sglang" / "srt").mkdir()
    (by_env / "sglang" / "srt" / "environ.py").write_text(f"    {BOOTSTRAP_TOKEN_ENV} = EnvStr(None)\n")
    assert bootstrap_token_env(by_env / "sglang") == BOOTSTRAP_TOKEN_ENV
    first, second = resolve_target(by_env), resolve_target(by_env)
    assert first.info.bootstrap_token_env == BOOTSTRAP_TOKEN_ENV
    token = first.cell_env()[BOOTSTRAP_TOKEN_ENV]
    assert len(token) >= 40 and token != second.env[BOOTSTRAP_TOKEN_ENV]  # fresh for each run
    assert token not in json.dumps(__import__("msgspec").to_builtins(first.info))  # never recorded
    assert BOOTSTRAP_TOKEN_ENV not in resolve_target().env  # the installed 0.5.23 gets none


# ---- whole runs against copies of the installed sglang ------------------------------------------------------------

@pytest.fixture(scope="session")
def sglang_copy(tmp_path_factory):
    """Makes copies of the installed sglang package (hard links: 220 MB copied in a fraction of a
    second; a file that differs is unlinked and written anew, so the installed one is never
    touched): ``copy(name, files={relative path: text or None to remove})`` -> the folder holding
    the copy's ``sglang/``."""
    base = tmp_path_factory.mktemp("sglang-copies")

    def copy(name: str, files: dict[str, str | None]) -> Path:
        root = base / name
        if not root.exists():
            root.mkdir()
            subprocess.run(["cp", "-al", str(INSTALLED), str(root / "sglang")], check=True)
            for rel, text in files.items():
                path = root / "sglang" / rel
                path.unlink(missing_ok=True)
                for stale in (path.parent / "__pycache__").glob(f"{path.stem}.*.pyc"):
                    stale.unlink()
                if text is not None:
                    path.write_text(text)
        return root

    return copy


DEV_VERSION = {"_version.py": None, "version.py": '__version__ = "0.5.24.dev0"\n__version_tuple__ = (0, 5, 24, "dev0")\n'}


def run_cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "harness.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def test_a_dev_tree_is_judged_by_the_newest_shipped_release_and_says_so(sglang_copy, tmp_path):
    """An unchanged copy of 0.5.23 that says 0.5.24.dev0 (as a checkout of main does): its cells are
    judged by 0.5.23's expectations, a known WARN included, and the run says so everywhere."""
    tree = sglang_copy("dev", DEV_VERSION)
    assert (INSTALLED / "_version.py").is_file()  # the installed package is untouched
    out = run_cli("run", "--sglang-src", tree, "--impl", "mooncake", "--scenario", "happy-path", "--scenario",
                  "abort-mid-transfer", "--jobs", "2", "--out", tmp_path / "out")
    assert out.returncode == 0, out.stdout + out.stderr
    note = "expectations of sglang 0.5.23 (newest shipped release at or below 0.5.24.dev0)"
    assert note in out.stderr and note in out.stdout and "2 cells: all as expected" in out.stdout
    data = json.loads((tmp_path / "out" / "latest" / "results.json").read_text())
    assert data["sglang"]["version"] == "0.5.24.dev0" and data["sglang"]["expectations_for"] == "0.5.23"
    assert data["sglang"]["version_source"] == "tree: sglang/version.py"
    assert Path(data["expectations"]).name == "sglang-0.5.23.toml"
    cells = {c["scenario"]: c for c in data["cells"]}
    assert cells["happy-path"]["verdict"] == "PASS" and cells["happy-path"]["engine"] == "real"
    assert cells["abort-mid-transfer"]["verdict"] == cells["abort-mid-transfer"]["expected"] == "WARN"
    assert note in (tmp_path / "out" / "latest" / "summary.md").read_text()


def test_a_tree_without_a_version_runs_with_the_option_and_not_without(sglang_copy, tmp_path):
    """A copy whose version.py reads the version at run time and has no _version.py, as a tagless
    clone of main: without --sglang-version a usage error naming the option; with it the cells run,
    results.json says where the version came from, and a reproduce line carries the option."""
    tree = sglang_copy("no-version", {"_version.py": None})
    out = run_cli("run", "--sglang-src", tree, "--impl", "mooncake", "--scenario", "happy-path",
                  "--out", tmp_path / "out", timeout=60)
    assert out.returncode == 2 and "cannot tell the sglang version" in out.stderr, out.stderr
    assert "--sglang-version X" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "out").exists()
    out = run_cli("run", "--sglang-src", tree, "--sglang-version", "0.5.23", "--impl", "mooncake", "--scenario",
                  "happy-path", "--out", tmp_path / "out")
    assert out.returncode == 0, out.stdout + out.stderr
    data = json.loads((tmp_path / "out" / "latest" / "results.json").read_text())
    assert (data["sglang"]["version"], data["sglang"]["version_source"]) == ("0.5.23", "option --sglang-version")
    assert data["cells"][0]["verdict"] == "PASS", data["cells"][0]["reason"]

    from harness.judge.results import load_run
    from harness.report.terminal import reproduce_command

    run = load_run(tmp_path / "out" / "latest" / "results.json")
    assert f"--sglang-src {tree} --sglang-version 0.5.23" in reproduce_command(run, run.cells[0])


# A copy patched to behave as sglang PR #39416 describes (not its code): the bootstrap server
# answers PUT /route with 401 unless it carries the token of SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN,
# failing closed when that is unset, and the prefill's registration sends it.
AUTH_MODULE = '''"""Stand-in for sglang PR #39416's module (pdconform test): its presence is what pdconform detects."""
import os


def get_bootstrap_auth_token():
    return os.environ.get("SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN") or None
'''
CONN = "srt/disaggregation/common/conn.py"
CONN_PATCHES = [
    ("import asyncio\n", "import asyncio\nimport os\n"),
    ("                response = requests.put(url, json=payload, timeout=5)\n",
     "                response = requests.put(url, json=payload, timeout=5, headers={'Authorization': 'Bearer ' + "
     "os.environ.get('SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN', '')})\n"),
    ("    async def _handle_route_put(self, request: web.Request):\n",
     "    async def _handle_route_put(self, request: web.Request):\n"
     "        token = os.environ.get('SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN')\n"
     "        if not token or request.headers.get('Authorization') != 'Bearer ' + token:\n"
     "            return web.Response(text='Unauthorized', status=401)\n"),
]


def test_every_rank_of_a_tree_that_wants_a_bootstrap_token_gets_the_same_one(sglang_copy, tmp_path):
    """A prefill of two TP ranks: rank 0 serves the bootstrap server, both register with PUT /route;
    the cell passes only if both ranks hold the same token (unset, the server refuses every PUT)."""
    conn = (INSTALLED / CONN).read_text()
    for old, new in CONN_PATCHES:
        assert conn.count(old) == 1, old
        conn = conn.replace(old, new)
    tree = sglang_copy("token", {CONN: conn, "srt/disaggregation/common/bootstrap_auth.py": AUTH_MODULE})
    out = run_cli("run", "--sglang-src", tree, "--impl", "mooncake", "--scenario", "happy-path@p2-d1",
                  "--out", tmp_path / "out")
    data = json.loads((tmp_path / "out" / "latest" / "results.json").read_text())
    assert data["sglang"]["bootstrap_token_env"] == "SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN"
    assert data["cells"][0]["verdict"] == "PASS", data["cells"][0]["reason"]
    assert out.returncode == 0, out.stdout + out.stderr


def test_doctor_reports_a_tree(sglang_copy, tmp_path):
    tree = sglang_copy("dev", DEV_VERSION)
    out = run_cli("doctor", "--sglang-src", tree, "--json", timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)
    assert report["sglang"] == {
        "version": "0.5.24.dev0", "path": str(tree / "sglang"), "source": "src", "commit": None,
        "version_source": "tree: sglang/version.py",
        "expectations": "expectations of sglang 0.5.23 (newest shipped release at or below 0.5.24.dev0)",
        "bootstrap_token": None}
    engines = {e["impl"]: e for e in report["engines"]}
    assert engines["mooncake"]["in_range"] and engines["mooncake"]["engine"] in ("real", "standin")
    bare = make_tree(tmp_path / "bare", version_file=None)
    out = run_cli("doctor", "--sglang-src", bare, timeout=60)
    assert out.returncode == 2 and "--sglang-version X" in out.stderr
    out = run_cli("doctor", "--sglang-src", bare, "--sglang-version", "0.5.20", timeout=180)
    assert "sglang   0.5.20 (" in out.stdout and "version from option --sglang-version" in out.stdout, out.stdout
    assert "0.5.20 is outside: its cells are UNSUPPORTED" in out.stdout
