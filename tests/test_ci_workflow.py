"""docs/ci.md's GitHub Actions workflows (docs/ci/*.yml) hold as written.

Read without running anything: docs/ci.md quotes each workflow file verbatim, so the two
cannot drift; each workflow asks for no more permissions than its steps use; `apt-get update`
comes before any `apt-get install`; pdconform's .venv is cached under a key made from
requirements/; and every `pdconform` and `make` command the workflows (and docs/ci.md's
prose) name is one the CLI accepts, parsed by the CLI's own option parser.

Run (e2e): each workflow's `run:` steps in order, as an unprivileged runner user (uid 65534
through `setpriv` when the tests run as root), in a scratch workspace that stands in for the
runner's: the sglang checkout is the installed sglang, pdconform's checkout is a copy of the
files `make setup` and `run` read, and its .venv points at this checkout's packages.  `uses:`
actions are not run: checkout, setup-python and cache are what the scratch workspace already
is, and the upload and JUnit steps are checked to find what they would publish.  `sudo` and
`gh` are stand-ins that record their calls (`sudo apt-get install` becomes `apt-get
--simulate install`, which resolves the packages without changing the machine; `apt-get
update` needs root and the network and is only recorded).  pdconform's command records its
arguments and runs for real, narrowed to `--scenario happy-path` (and `--impl reference`
when the workflow names no implementation); the full matrix, as written, is a nightly test.
The scratch .venv runs on an interpreter the runner user may run: the .venv's own base when
that user can reach it, else the system's python3.X of the same version (here the .venv's
base lives under /root).

And docs/ci.md's claim about runners without root (e2e, as root only): run unprivileged
with `--bind 127.0.0.1`, a Mooncake cell's engine listens on 0.0.0.0 / [::]; run through
the workflows' `unshare` line, nothing of the run listens in the machine's network.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

# PyYAML comes with sglang's pinned runtime set (requirements/sglang-*.txt), not pdconform's own
yaml = pytest.importorskip("yaml", reason="PyYAML is not installed (it comes with requirements/sglang-*.txt)")

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "ci.md"
WORKFLOWS = sorted((ROOT / "docs" / "ci").glob("*.yml"))
GATE = ROOT / "docs" / "ci" / "pdconform-gate.yml"
RUNNER_UID = 65534  # nobody: the runner user when the tests run as root
LISTEN_UID = 65533  # a uid of its own for the listening-socket test (nothing else here runs as it)
PRIVATE_NETWORK = "a private loopback-only network namespace per cell"  # results.json's `network` (harness.session)
STEP_TIMEOUT_S = 300
NIGHTLY_STEP_TIMEOUT_S = 1500

# The workflow as the tester found it in docs/ci.md (before issue 34): the checks below must
# catch what was wrong with it.
OLD_WORKFLOW = """
permissions:
  contents: read
  pull-requests: write
jobs:
  conformance:
    runs-on: ubuntu-24.04
    steps:
      - uses: actions/checkout@v4
      - name: Set up pdconform (torch CPU, engines, pinned runtime set)
        run: sudo apt-get install -y libibverbs1 && make -C pdconform setup
      - name: Show the test results
        if: always()
        uses: mikepenz/action-junit-report@v4
        with: {report_paths: pdconform-report/latest/junit.xml}
      - name: Post summary.md
        run: gh pr comment 1 --body-file pdconform-report/latest/summary.md
"""


# --------------------------------------------------------------------------- reading

def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def triggers(workflow: dict) -> dict:
    return workflow.get("on", workflow.get(True))  # YAML 1.1 reads the key `on` as True


def the_job(workflow: dict) -> dict:
    jobs = list(workflow["jobs"].values())
    assert len(jobs) == 1, "each gate workflow is one job"
    return jobs[0]


def job_steps(workflow: dict) -> list[dict]:
    return [step for job in workflow["jobs"].values() for step in job["steps"]]


def step_name(step: dict) -> str:
    return step.get("name") or step.get("uses") or step.get("run", "").splitlines()[0]


def without_heredocs(script: str) -> str:
    """``script`` with each here-document's body left out (its command line stays)."""
    out, end = [], None
    for line in script.splitlines():
        if end is not None:
            if line.strip() == end:
                end = None
            continue
        match = re.search(r"<<-?\s*['\"]?(\w+)['\"]?", line)
        if match:
            end = match.group(1)
            line = line[:match.start()]
        out.append(line)
    return "\n".join(out)


SHELL_OPERATORS = {";", "&&", "||", "|", "&", ">", ">>", "<", "(", ")", "!"}


def commands(script: str, env: dict[str, str] | None = None) -> list[list[str]]:
    """The simple commands of a ``run:`` script, each as its words, as far as reading it
    without a shell can go: ``$(( ))`` becomes 16, ``$( )`` a placeholder word, ``$VAR``
    its value in ``env`` (left as written when unknown); redirections' targets are dropped."""
    env = env or {}
    text = without_heredocs(script).replace("\\\n", " ")
    text = re.sub(r"\$\(\(.*?\)\)", "16", text)
    text = re.sub(r"\$\([^()]*\)", "SUBSTITUTED", text)
    text = re.sub(r"\$\{?(\w+)\}?", lambda m: env.get(m.group(1), m.group(0)), text)
    found = []
    for line in text.splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        words, skip_next = [], False
        for word in lexer:
            if skip_next:
                skip_next = False
                continue
            if word in (">", ">>", "<"):
                skip_next = True  # the redirection's file
            if word in SHELL_OPERATORS or word in (">", ">>", "<"):
                if words:
                    found.append(words)
                words = []
                continue
            words.append(word)
        if words:
            found.append(words)
    return found


def pdconform_commands(script: str, env: dict[str, str] | None = None) -> list[list[str]]:
    """The arguments of every pdconform command in ``script``: ``pdconform ...`` and
    ``.venv/bin/pdconform ...``, the latter also as the command another one runs
    (``unshare ... .venv/bin/pdconform ...``)."""
    found = []
    for words in commands(script, env):
        for i, word in enumerate(words):
            if (word == "pdconform" and i == 0) or word.endswith("/bin/pdconform"):
                found.append(words[i + 1:])
                break
    return found


def option_values(argv: list[str], option: str) -> list[str]:
    return [argv[i + 1] for i, word in enumerate(argv[:-1]) if word == option]


def the_run_command(workflow: dict) -> list[str]:
    """The arguments of the workflow's `pdconform run`."""
    env = workflow_env(workflow)
    runs = [argv for step in job_steps(workflow) for argv in pdconform_commands(step.get("run", ""), env)
            if argv[:1] == ["run"]]
    assert len(runs) == 1, runs
    return runs[0]


def make_commands(script: str) -> list[list[str]]:
    return [words[words.index("make") + 1:] for words in commands(script) if "make" in words]


def apt_problems(steps: list[dict]) -> list[str]:
    """What is wrong with the workflow's use of apt-get: an install before any update (in
    the same step or an earlier one), or an install that would stop to ask."""
    problems, updated = [], False
    for step in steps:
        for words in commands(step.get("run", "")):
            if "apt-get" not in words:
                continue
            args = words[words.index("apt-get") + 1:]
            action = next((a for a in args if not a.startswith("-")), None)
            if action == "update":
                updated = True
            elif action == "install":
                if not updated:
                    problems.append(f"{step_name(step)!r}: apt-get install with no apt-get update before it")
                if not {"-y", "--yes", "--assume-yes"} & set(args):
                    problems.append(f"{step_name(step)!r}: apt-get install without -y")
    return problems


def permission_problems(workflow: dict) -> list[str]:
    """Where the workflow's permissions differ from what its steps use: contents: read to
    check out, checks: write for the JUnit action's check run, pull-requests: write to
    comment, and nothing else."""
    steps = job_steps(workflow)
    wanted = {"contents": "read"}
    if any("action-junit-report" in s.get("uses", "") for s in steps):
        wanted["checks"] = "write"
    if any("gh pr comment" in s.get("run", "") for s in steps):
        wanted["pull-requests"] = "write"
    given = workflow.get("permissions")
    problems = [] if given == wanted else [f"permissions {given!r}, the steps use {wanted!r}"]
    for name, job in workflow["jobs"].items():
        if "permissions" in job:
            problems.append(f"job {name} sets its own permissions {job['permissions']!r}")
    return problems


# --------------------------------------------------------------------------- the CLI

def cli_problem(argv: list[str], cwd: Path = ROOT) -> str | None:
    """Why ``pdconform ARGV`` would be refused as usage (None when it would not): parsed by the
    CLI's own command tree (typer's click) without running it, then the implementation and
    scenario names checked against the registries, and the expectations file it names."""
    import typer.main

    from harness import implementations
    from harness.cli import app
    from harness.spec.scenario import all_scenarios

    command = typer.main.get_command(app)
    ctx = command.context_class(command, info_name="pdconform")
    args, name = list(argv), "pdconform"
    while hasattr(command, "get_command"):  # a group: the next word names its command
        if not args:
            return "no command"
        name, args = args[0], args[1:]
        sub = command.get_command(ctx, name)
        if sub is None:
            return f"no command {name!r}"
        command = sub
        if hasattr(sub, "get_command"):
            ctx = sub.context_class(sub, info_name=name, parent=ctx)
    cwd_before = os.getcwd()
    os.chdir(cwd)
    try:
        with command.make_context(name, args, parent=ctx) as sub_ctx:
            params = dict(sub_ctx.params)
    except Exception as exc:  # the CLI's usage errors (typer's vendored click)
        return getattr(exc, "format_message", lambda: str(exc))()
    finally:
        os.chdir(cwd_before)
    impls = params.get("impl") or []
    impls = [impls] if isinstance(impls, str) else impls
    known = implementations.registered()
    for impl in impls:
        if impl not in known:
            return f"--impl {impl}: not an implementation ({', '.join(known)})"
    scenario_ids = {s.id for s in all_scenarios()}
    scenarios = params.get("scenario") or []
    for scenario in [scenarios] if isinstance(scenarios, str) else scenarios:
        if scenario.split("@")[0] not in scenario_ids:
            return f"--scenario {scenario}: not a scenario"
    expectations = params.get("expectations")
    if expectations is not None and str(expectations) != "none" and not (cwd / expectations).is_file():
        return f"--expectations {expectations}: no such file under {cwd}"
    return None


def makefile_targets_and_variables() -> tuple[set[str], set[str]]:
    text = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([A-Za-z][\w-]*)\s*:(?!=)", text, re.M))
    variables = set(re.findall(r"^([A-Z_][A-Z0-9_]*)\s*[?:+]?=", text, re.M))
    return targets, variables


def make_problem(args: list[str]) -> str | None:
    targets, variables = makefile_targets_and_variables()
    words = list(args)
    while words:
        word = words.pop(0)
        if word == "-C":
            if not words or words.pop(0) != "pdconform":
                return "make -C must name the pdconform checkout"
        elif "=" in word:
            if word.split("=", 1)[0] not in variables:
                return f"{word}: not a variable of pdconform's Makefile"
        elif word.startswith("-"):
            return f"{word}: an option the test does not know"
        elif word not in targets:
            return f"{word}: not a target of pdconform's Makefile ({', '.join(sorted(targets))})"
    return None


def workflow_env(workflow: dict) -> dict[str, str]:
    """The environment the workflow's run steps see, as a runner on github.com sets it."""
    env = {"GITHUB_WORKSPACE": "/home/runner/work/sglang/sglang", "RUNNER_TEMP": "/home/runner/work/_temp",
           "GITHUB_REPOSITORY": "sgl-project/sglang"}
    env.update({k: str(v) for k, v in (workflow.get("env") or {}).items()})
    env.update({k: str(v) for k, v in (the_job(workflow).get("env") or {}).items()})
    return env


# --------------------------------------------------------------------------- static checks

def test_there_are_workflows_to_check():
    assert {p.name for p in WORKFLOWS} >= {"pdconform-gate.yml", "pdconform-gate-one-backend.yml",
                                           "pdconform-gate-no-root.yml"}


def test_docs_ci_quotes_every_workflow_file_verbatim():
    doc = DOC.read_text()
    blocks = re.findall(r"^```yaml\n(.*?)^```$", doc, re.S | re.M)
    files = {p.relative_to(ROOT).as_posix(): p.read_text() for p in WORKFLOWS}
    for rel, text in files.items():
        assert text in blocks, f"docs/ci.md does not quote {rel} verbatim"
        block_at = doc.index("```yaml\n" + text)
        assert f"`{rel}`" in doc[:block_at], f"docs/ci.md quotes {rel} before naming it"
    stray = [b.splitlines()[:3] for b in blocks if b not in files.values()]
    assert not stray, f"docs/ci.md has YAML blocks that are not a file under docs/ci/: {stray}"


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_asks_only_for_the_permissions_its_steps_use(path):
    workflow = load(path)
    assert permission_problems(workflow) == []
    assert "pull_request_target" not in triggers(workflow), "a gate runs the PR's code: never with a write token"


def test_the_permission_check_catches_the_old_workflow():
    problems = permission_problems(yaml.safe_load(OLD_WORKFLOW))
    assert problems == ["permissions {'contents': 'read', 'pull-requests': 'write'}, the steps use "
                        "{'contents': 'read', 'checks': 'write', 'pull-requests': 'write'}"]


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_apt_get_update_comes_before_apt_get_install(path):
    assert apt_problems(job_steps(load(path))) == []


def test_the_apt_check_catches_the_old_workflow():
    problems = apt_problems(job_steps(yaml.safe_load(OLD_WORKFLOW)))
    assert problems == ["'Set up pdconform (torch CPU, engines, pinned runtime set)': apt-get install with no "
                        "apt-get update before it"]
    same_step = [{"name": "s", "run": "sudo apt-get update\nsudo apt-get install -y libibverbs1"}]
    assert apt_problems(same_step) == []
    assert apt_problems([{"name": "s", "run": "sudo apt-get install libibverbs1 && sudo apt-get update"}]) == [
        "'s': apt-get install with no apt-get update before it", "'s': apt-get install without -y"]


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_the_venv_is_cached_under_a_key_of_requirements(path):
    steps = job_steps(load(path))
    caches = [i for i, s in enumerate(steps) if s.get("uses", "").startswith("actions/cache@")]
    assert len(caches) == 1, "one actions/cache step"
    cache = steps[caches[0]]["with"]
    assert cache["path"] == "pdconform/.venv"
    key = cache["key"]
    # what scripts/setup.sh's stamp covers: the pinned sets and pyproject.toml (and the script itself)
    for part in ("'pdconform/requirements/**'", "'pdconform/pyproject.toml'", "'pdconform/scripts/setup.sh'"):
        assert part in key, f"the cache key does not hash {part}"
    assert "${{ runner.os }}" in key
    # the venv's interpreter is setup-python's: its exact version is part of the key
    python_ids = [s.get("id") for s in steps if s.get("uses", "").startswith("actions/setup-python@")]
    assert python_ids and f"steps.{python_ids[0]}.outputs.python-version" in key
    setup = [i for i, s in enumerate(steps) if ["-C", "pdconform", "setup"] in make_commands(s.get("run", ""))]
    assert setup and caches[0] < setup[0], "the cache is restored before `make setup`"


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_every_pdconform_and_make_command_is_one_the_cli_accepts(path):
    workflow = load(path)
    env = workflow_env(workflow)
    seen = []
    for step in job_steps(workflow):
        for argv in pdconform_commands(step.get("run", ""), env):
            cwd = ROOT if step.get("working-directory") == "pdconform" else ROOT.parent
            assert cli_problem(argv, cwd) is None, f"{step_name(step)!r}: pdconform {shlex.join(argv)}: " \
                                                   f"{cli_problem(argv, cwd)}"
            seen.append(argv[0])
        for args in make_commands(step.get("run", "")):
            assert make_problem(args) is None, f"{step_name(step)!r}: make {shlex.join(args)}: {make_problem(args)}"
    assert seen == ["doctor", "run"]


def test_the_command_check_refuses_what_the_cli_refuses():
    assert cli_problem(["run", "--jobs", "16", "--out", "x"]) is None
    assert "No such option: --bogus" in cli_problem(["run", "--bogus"])
    assert "--jobs" in cli_problem(["run", "--jobs", "many"])
    assert "not an implementation" in cli_problem(["run", "--impl", "nixxl"])
    assert "not a scenario" in cli_problem(["run", "--scenario", "happy-paths"])
    assert "no such file" in cli_problem(["run", "--expectations", "expectations/sglang-9.9.9.toml"])
    assert cli_problem(["repro", "--impl", "nixl"]) == "Missing argument 'scenario'."
    assert make_problem(["-C", "pdconform", "setup"]) is None
    assert make_problem(["-C", "pdconform", "install"]).startswith("install: not a target")


def test_every_command_docs_ci_names_is_one_the_cli_accepts():
    doc = re.sub(r"^```.*?^```$", "", DOC.read_text(), flags=re.S | re.M)  # the prose, not the workflows
    spans = re.findall(r"`([^`\n]+)`", doc)
    checked = 0
    for span in spans:
        for argv in pdconform_commands(span, {"GITHUB_WORKSPACE": "/ws", "RUNNER_TEMP": "/tmp"}):
            if not argv:
                continue  # the name, not a command
            assert cli_problem(argv) is None, f"docs/ci.md: `{span}`: {cli_problem(argv)}"
            checked += 1
        for args in make_commands(span):
            assert make_problem(args) is None, f"docs/ci.md: `{span}`: {make_problem(args)}"
    assert checked >= 5


# --------------------------------------------------------------------------- running the steps

def _as_runner(uid: int | None) -> list[str]:
    """The command prefix that runs a command as the unprivileged runner user ``uid``."""
    if uid is None:
        return []
    # `env` execs the command: setpriv's own exec still runs with root's capabilities (the path
    # lookup may enter folders the user may not), every exec after it does not
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "env"]


def _runner_uid(uid: int) -> int | None:
    """``uid`` when the tests run as root (and setpriv is there), None when they already run
    unprivileged (then they run the steps as themselves)."""
    if os.geteuid() != 0:
        return None
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: cannot run the steps as an unprivileged user")
    return uid


def _site_packages() -> Path:
    found = sorted((ROOT / ".venv" / "lib").glob("python3.*/site-packages"))
    if not found:
        pytest.skip("this checkout has no .venv (make setup)")
    return found[0]


def _base_python(prefix: list[str]) -> str:
    """An interpreter the runner user can run, of the .venv's Python version: the .venv's own
    base interpreter when that user can reach it, else the system's python3.X (on this machine
    the .venv's base lives under /root, which only root may enter)."""
    cfg = dict(line.split(" = ", 1) for line in (ROOT / ".venv" / "pyvenv.cfg").read_text().splitlines()
               if " = " in line)
    major_minor = ".".join(cfg["version"].split(".")[:2])
    for candidate in (cfg.get("executable"), f"/usr/bin/python{major_minor}", shutil.which(f"python{major_minor}")):
        if candidate and subprocess.run([*prefix, candidate, "-c", "import venv"], capture_output=True,
                                        timeout=60).returncode == 0:
            return candidate
    pytest.skip(f"no Python {major_minor} the runner user may run (the .venv's is {cfg.get('executable')})")


def _chown_tree(path: Path, uid: int | None) -> None:
    if uid is None:
        return
    for folder, dirs, files in os.walk(path):
        for name in [folder, *(os.path.join(folder, n) for n in dirs + files)]:
            os.chown(name, uid, uid, follow_symlinks=False)


SUDO_SHIM = '''#!{python}
"""sudo on the runner; here: record the call, resolve apt-get installs without changing the machine."""
import json, os, shutil, sys
args = sys.argv[1:]
with open(os.environ["CI_SHIM_LOG"], "a") as log:
    log.write(json.dumps({{"tool": "sudo", "argv": args}}) + "\\n")
env = dict(os.environ)
while args and "=" in args[0] and not args[0].startswith("-"):
    name, value = args.pop(0).split("=", 1)
    env[name] = value
if args[:1] == ["apt-get"] and "install" in args:
    if not shutil.which("apt-get"):
        sys.exit(0)  # not a Debian machine: recorded only
    os.execvpe("apt-get", ["apt-get", "--simulate", *args[1:]], env)
if args[:1] == ["apt-get"] and "update" in args or args[:1] == ["sysctl"]:
    sys.exit(0)  # needs root (and apt the network): recorded only
sys.exit(f"sudo stand-in: the test does not know how to stand in for {{args}}")
'''

GH_SHIM = '''#!{python}
"""gh on the runner; here: record the call and check that the file it would post is there."""
import json, os, sys
args = sys.argv[1:]
with open(os.environ["CI_SHIM_LOG"], "a") as log:
    log.write(json.dumps({{"tool": "gh", "argv": args}}) + "\\n")
body = args[args.index("--body-file") + 1] if "--body-file" in args else None
if body is not None and not (os.path.isfile(body) and os.path.getsize(body)):
    sys.exit(f"gh stand-in: --body-file {{body}} is missing or empty")
'''

PDCONFORM_SHIM = '''#!{python}
"""pdconform: record the arguments (and the user namespace it runs in), then run the real
command; `run` narrowed to CI_SHIM_SELECTION where the workflow selects no such cells."""
import json, os, sys
argv = sys.argv[1:]
with open("/proc/self/uid_map") as f:
    uid_map = " ".join(f.read().split())
with open(os.environ["CI_SHIM_LOG"], "a") as log:
    log.write(json.dumps({{"tool": "pdconform", "argv": argv, "cwd": os.getcwd(), "euid": os.geteuid(),
                          "uid_map": uid_map}}) + "\\n")
narrow = json.loads(os.environ.get("CI_SHIM_SELECTION") or "{{}}")
if argv[:1] == ["run"]:
    for option, values in narrow.items():
        if "--" + option not in argv:
            for value in values:
                argv += ["--" + option, value]
os.execv(sys.executable, [sys.executable, "-m", "harness.cli", *argv])
'''


class ScratchRunner:
    """A stand-in for a GitHub runner on this machine: its user, a Python that user can run,
    a .venv with this checkout's packages, and the sudo/gh stand-ins (see the module doc)."""

    def __init__(self, uid: int | None):
        self.uid = uid
        self.prefix = _as_runner(uid)
        self.base = Path(tempfile.mkdtemp(prefix="pdconform-ci-", dir="/tmp"))
        self.base.chmod(0o755)
        _chown_tree(self.base, uid)
        python = _base_python(self.prefix)
        self.venv = self.base / "venv"
        made = subprocess.run([*self.prefix, python, "-m", "venv", "--without-pip", str(self.venv)],
                              capture_output=True, text=True, timeout=120)
        assert made.returncode == 0, made.stderr
        site = next((self.venv / "lib").glob("python3.*/site-packages"))
        # pdconform's own code copied where the runner user can read it: a checkout under a folder only
        # root may enter (a fresh clone in a mktemp -d folder) is out of its reach; found before the
        # editable install's finder, which names the checkout
        code = self.base / "code"
        for folder in ("harness", "backends", "scenarios", "expectations", "docs", "requirements"):
            shutil.copytree(ROOT / folder, code / folder, ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy2(ROOT / "pyproject.toml", code / "pyproject.toml")
        _chown_tree(code, uid)
        (site / "aa-pdconform-code.pth").write_text(f"{code}\n")
        (site / "zz-pdconform-checkout.pth").write_text(f"import site; site.addsitedir({str(_site_packages())!r})\n")
        # the .venv `make setup` made here carries a stamp of the inputs it was made from; the
        # scratch .venv carries the same, so the workflow's `make setup` finds it set up, as after
        # a cache hit (when this tree's inputs changed since, setup would install: skipped below)
        for stamp in (ROOT / ".venv").glob(".pdconform-setup-*"):
            shutil.copy(stamp, self.venv / stamp.name)
        shim = self.venv / "bin" / "pdconform"
        shim.write_text(PDCONFORM_SHIM.format(python=self.venv / "bin" / "python"))
        self.shims = self.base / "shims"
        self.shims.mkdir()
        (self.shims / "sudo").write_text(SUDO_SHIM.format(python=python))
        (self.shims / "gh").write_text(GH_SHIM.format(python=python))
        for tool in (shim, self.shims / "sudo", self.shims / "gh"):
            tool.chmod(0o755)
        _chown_tree(self.base, uid)
        if uid is not None:  # the checkout's .venv is read in place: out of reach under a root-only folder
            probe = subprocess.run([*self.prefix, str(self.venv / "bin" / "python"), "-c", "import typer, torch"],
                                   capture_output=True, text=True, timeout=120)
            if probe.returncode != 0:
                self.close()
                pytest.skip(f"the checkout's .venv ({_site_packages()}) cannot be read by uid {uid} (a checkout "
                            "under a folder only root may enter, as a fresh clone in a mktemp -d folder)")
        sglang = importlib.util.find_spec("sglang")
        if sglang is None:
            pytest.skip("sglang is not installed in .venv")
        self.sglang_package = Path(sglang.submodule_search_locations[0])

    def close(self) -> None:
        shutil.rmtree(self.base, ignore_errors=True)

    def userns_allowed(self) -> bool:
        return subprocess.run([*self.prefix, "unshare", "--user", "--map-root-user", "--net", "true"],
                              capture_output=True, timeout=60).returncode == 0

    def workspace(self, name: str) -> "Workspace":
        ws = self.base / name
        (ws / "sglang" / "python").mkdir(parents=True)
        (ws / "sglang" / "python" / "sglang").symlink_to(self.sglang_package)  # the PR's checkout
        checkout = ws / "pdconform"
        checkout.mkdir()
        for name_ in ("Makefile", "pyproject.toml"):
            shutil.copy2(ROOT / name_, checkout / name_)
        for folder in ("scripts", "requirements", "expectations"):
            shutil.copytree(ROOT / folder, checkout / folder, ignore=shutil.ignore_patterns("__pycache__"))
        (checkout / ".venv").symlink_to(self.venv)
        for folder in ("_temp", "_home"):
            (ws / folder).mkdir()
        _chown_tree(ws, self.uid)
        return Workspace(self, ws)


class Workspace:
    """One job's workspace ($GITHUB_WORKSPACE) and what its steps did."""

    def __init__(self, runner: ScratchRunner, path: Path):
        self.runner, self.path = runner, path
        self.temp = path / "_temp"
        self.log = self.temp / "shim-calls.jsonl"
        self.summary = self.temp / "step-summary.md"
        for file in (self.log, self.summary):
            file.touch()
            file.chmod(0o666)
        self.steps: list[dict] = []

    def calls(self, tool: str) -> list[dict]:
        lines = self.log.read_text().splitlines()
        return [c for c in map(json.loads, lines) if c["tool"] == tool]

    def expression(self, text: str, env: dict[str, str]) -> str:
        """``text`` with each ``${{ expression }}`` replaced by its value for a pull request from a
        branch of the repository itself (the one case every step runs in)."""
        values = {
            "github.token": "test-token",
            "github.event.pull_request.number": "4242",
            "github.event.pull_request.head.repo.full_name == github.repository": "true",
            "github.event.pull_request.head.repo.full_name != github.repository": "false",
            "github.event_name == 'pull_request' && github.event.pull_request.head.repo.full_name != "
            "github.repository": "false",
            "runner.temp": str(self.temp),
        }

        def value(match):
            expr = match.group(1).strip()
            if expr.startswith("env."):
                return env[expr[4:]]
            assert expr in values, f"the test does not know the value of ${{{{ {expr} }}}}"
            return values[expr]

        return re.sub(r"\$\{\{(.*?)\}\}", value, str(text))

    def run_workflow(self, path: Path, selection: dict | None, timeout_s: float = STEP_TIMEOUT_S) -> None:
        """Every step of the workflow's job in order, as the runner would: a failed step skips
        the later ones unless their `if:` says always()."""
        workflow = load(path)
        job = the_job(workflow)
        shell = ((job.get("defaults") or workflow.get("defaults") or {}).get("run") or {}).get("shell")
        env = {
            "PATH": f"{self.runner.shims}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": str(self.path / "_home"), "USER": "runner", "LOGNAME": "runner", "LANG": "C.UTF-8",
            "CI": "true", "GITHUB_ACTIONS": "true", "GITHUB_WORKSPACE": str(self.path),
            "RUNNER_TEMP": str(self.temp), "GITHUB_STEP_SUMMARY": str(self.summary),
            "GITHUB_REPOSITORY": "sgl-project/sglang", "GITHUB_EVENT_NAME": "pull_request",
            "CI_SHIM_LOG": str(self.log), "CI_SHIM_SELECTION": json.dumps(selection or {}),
        }
        for scope in (workflow.get("env"), job.get("env")):
            env.update({k: self.expression(v, env) for k, v in (scope or {}).items()})
        failed = False
        for number, step in enumerate(job["steps"]):
            condition = str(step.get("if", "success()"))
            record = {"name": step_name(step), "uses": step.get("uses", ""), "ran": False}
            self.steps.append(record)
            if failed and "always()" not in condition:
                continue
            if "uses" in step:
                record.update(ran=True, **self.stand_in_for_action(step, env))
            else:
                step_env = dict(env)
                step_env.update({k: self.expression(v, env) for k, v in (step.get("env") or {}).items()})
                script = self.temp / f"step-{number}.sh"
                script.write_text(step["run"])
                script.chmod(0o644)
                argv = (["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)] if shell == "bash"
                        else ["bash", "-e", str(script)])
                proc = subprocess.run([*self.runner.prefix, *argv], cwd=self.path / step.get("working-directory", "."),
                                      env=step_env, capture_output=True, text=True, timeout=timeout_s)
                record.update(ran=True, rc=proc.returncode, output=proc.stdout + proc.stderr)
            if record.get("rc"):
                failed = True

    def stand_in_for_action(self, step: dict, env: dict[str, str]) -> dict:
        """What a `uses:` step would do, as far as it depends on the steps before it."""
        action = step["uses"].split("@")[0]
        if action in ("actions/checkout", "actions/setup-python", "actions/cache"):
            return {"rc": 0}  # the scratch workspace is what these leave behind (the cache key: a static test)
        given = {k: self.expression(v, env) for k, v in (step.get("with") or {}).items()}
        if action == "actions/upload-artifact":
            path = Path(given["path"])
            ok = path.is_dir() and any(path.iterdir())
            return {"rc": 0 if ok else 1, "output": f"upload {path}: {'found' if ok else 'nothing there'}"}
        if action == "mikepenz/action-junit-report":
            reports = glob.glob(given["report_paths"])
            return {"rc": 0 if len(reports) == 1 else 1, "output": f"junit reports: {reports}", "reports": reports}
        return {"rc": 1, "output": f"the test does not know the action {action}"}

    def explain(self) -> str:
        return "\n".join(f"--- {s['name']}: {'rc ' + str(s.get('rc')) if s['ran'] else 'skipped'}\n"
                         f"{s.get('output', '')[-3000:]}" for s in self.steps)


@pytest.fixture(scope="module")
def runner():
    made = ScratchRunner(_runner_uid(RUNNER_UID))
    try:
        checked = subprocess.run([*made.prefix, "scripts/setup.sh", "--check"], cwd=made.workspace("probe").path /
                                 "pdconform", capture_output=True, text=True, timeout=120,
                                 env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(made.base)})
        if checked.returncode != 0:
            pytest.skip("the scratch .venv does not pass `make setup`'s check here, so the workflow's `make setup` "
                        f"would install from PyPI: {checked.stderr.strip()}")
        yield made
    finally:
        made.close()


def _results(ws: Workspace) -> dict:
    return json.loads((ws.temp / "pdconform-report" / "latest" / "results.json").read_text())


def check_a_finished_run(ws: Workspace, path: Path) -> None:
    """What every workflow's steps must have done once they all ran."""
    workflow = load(path)
    assert all(s["ran"] and s.get("rc") == 0 for s in ws.steps), ws.explain()
    # the pdconform commands the shell really ran are ones the CLI accepts
    runs = ws.calls("pdconform")
    assert [c["argv"][0] for c in runs] == ["doctor", "run"], runs
    runner_uid = ws.runner.uid if ws.runner.uid is not None else os.geteuid()
    for call in runs:
        assert cli_problem(call["argv"], Path(call["cwd"])) is None, call
        # root of a user namespace mapped onto the unprivileged runner user, not the machine's root
        assert call["euid"] == 0 and call["uid_map"] == f"0 {runner_uid} 1", call
    # apt: updated before the install, the packages resolved (the sudo stand-in simulated the install)
    apt = [c["argv"] for c in ws.calls("sudo") if "apt-get" in c["argv"]]
    wants_apt = any("apt-get" in s.get("run", "") for s in job_steps(workflow))
    if wants_apt:
        actions = [next(a for a in argv[argv.index("apt-get") + 1:] if not a.startswith("-")) for argv in apt]
        assert actions == ["update", "install"], apt
    else:
        assert apt == [] and ws.calls("sudo") == [], "a workflow for runners without root uses sudo"
    results = _results(ws)
    assert results["network"] == PRIVATE_NETWORK
    assert results["sglang"]["source"] == "src" and results["sglang"]["path"].startswith(str(ws.path / "sglang"))
    assert results["expectations"].endswith("expectations/sglang-0.5.23.toml")
    assert results["docs_url"] == f"https://github.com/{workflow['env']['PDCONFORM_REPO']}/blob/main"
    # written by the runner user, not by root
    if ws.runner.uid is not None:
        assert (ws.temp / "pdconform-report" / "latest" / "results.json").stat().st_uid == ws.runner.uid
    summary = (ws.temp / "pdconform-report" / "latest" / "summary.md").read_text()
    assert ws.summary.read_text() == summary  # the run page shows summary.md
    junit = next(s for s in ws.steps if "action-junit-report" in s["uses"])
    cases = ET.parse(junit["reports"][0]).getroot().iter("testcase")
    assert len(list(cases)) == len(results["cells"])
    comments = ws.calls("gh")
    if any("gh pr comment" in s.get("run", "") for s in job_steps(workflow)):
        body = str(ws.temp / "pdconform-report" / "latest" / "summary.md")
        assert [c["argv"] for c in comments] == [["pr", "comment", "4242", "--repo", "sgl-project/sglang",
                                                  "--body-file", body]]
    else:
        assert comments == []


@pytest.mark.e2e
@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_the_workflow_steps_run_as_an_unprivileged_runner(runner, path):
    ws = runner.workspace(path.stem)
    ws.run_workflow(path, {"impl": ["reference"], "scenario": ["happy-path"]})
    if not runner.userns_allowed():
        # this machine refuses user namespaces: the workflow must stop before any cell runs
        check = next(s for s in ws.steps if s["name"].startswith("Check"))
        assert check["rc"] == 1 and "refuses user namespaces" in check["output"], ws.explain()
        assert [c["argv"][0] for c in ws.calls("pdconform")] == []
        pytest.skip("user namespaces are refused here: the workflow stops at its check, as it should")
    check_a_finished_run(ws, path)
    results = _results(ws)
    named = option_values(the_run_command(load(path)), "--impl")  # the one-backend gate's: nixl and reference
    assert {c["impl"] for c in results["cells"]} == set(named or ["reference"])
    assert {(c["scenario"], c["verdict"]) for c in results["cells"]} == {("happy-path", "PASS")}


@pytest.mark.nightly
def test_the_gate_runs_the_whole_matrix_as_written(runner):
    """pdconform-gate.yml as written, every cell of the matrix, as the unprivileged runner."""
    if not runner.userns_allowed():
        pytest.skip("user namespaces are refused here")
    ws = runner.workspace("nightly")
    ws.run_workflow(GATE, None, timeout_s=NIGHTLY_STEP_TIMEOUT_S)
    check_a_finished_run(ws, GATE)  # every step passed: every cell as the shipped expectations say
    cells = _results(ws)["cells"]
    assert {c["impl"] for c in cells} == {"reference", "mooncake", "nixl", "mori"}
    assert len({c["scenario"] for c in cells}) > 20


# --------------------------------------------------------------------------- docs/ci.md's claim about Mooncake

def _listeners_while(proc: subprocess.Popen, uid: int) -> set[str]:
    """Every TCP address a socket of ``uid`` listened on, in this machine's network namespace,
    while ``proc`` ran (/proc/net/tcp and tcp6, read every few milliseconds)."""
    seen: set[str] = set()

    def address(hex_addr: str) -> str:
        raw = bytes.fromhex(hex_addr.split(":")[0])
        if len(raw) == 4:
            return ".".join(str(b) for b in raw[::-1])
        words = [raw[i:i + 4][::-1] for i in range(0, 16, 4)]
        import ipaddress
        return str(ipaddress.IPv6Address(b"".join(words)))

    while proc.poll() is None:
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            with open(table) as f:
                for line in f.read().splitlines()[1:]:
                    fields = line.split()
                    if fields[3] == "0A" and fields[7] == str(uid):  # LISTEN
                        seen.add(address(fields[1]))
        time.sleep(0.003)
    return seen


@pytest.mark.nightly  # half a minute of CPU; make test runs the wrapper in the no-root workflow's steps and
@pytest.mark.e2e  # tests/test_containment.py's listener checks
def test_without_a_namespace_mooncake_listens_on_every_interface_and_the_workflow_wrapper_hides_it():
    """docs/ci.md, Runners without root: an unprivileged run shares the host's network and
    Mooncake's engine listens on 0.0.0.0 / [::] even with --bind 127.0.0.1; run through the
    workflows' user-namespace wrapper, nothing of the run listens in the host's network."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to run the cells as a uid of their own (other tests' sockets would count)")
    made = ScratchRunner(_runner_uid(LISTEN_UID))
    try:
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(made.base), "USER": "runner", "LANG": "C.UTF-8"}
        python = str(made.venv / "bin" / "python")
        # one happy-path cell: its engines listen for a few hundred milliseconds, long enough for the
        # poll (the unprivileged run shows that it catches them; the same cell runs namespaced)
        select = ["--impl", "mooncake", "--scenario", "happy-path", "--jobs", "1"]
        outcomes, userns = {}, made.userns_allowed()
        for how, wrapper in (("plain", []), ("namespaced", ["unshare", "--user", "--map-root-user", "--net", "sh",
                                                            "-ec", 'ip link set lo up; exec "$@"', "isolated"])):
            out, log = made.base / f"report-{how}", made.base / f"run-{how}.log"
            with open(log, "w") as log_file:
                proc = subprocess.Popen([*made.prefix, *wrapper, python, "-m", "harness.cli", "run", *select,
                                         "--bind", "127.0.0.1", "--out", str(out)], cwd=made.base, env=env,
                                        stdout=log_file, stderr=subprocess.STDOUT)
            timer = threading.Timer(STEP_TIMEOUT_S, proc.kill)  # the bound on the poll below
            timer.start()
            try:
                listeners = _listeners_while(proc, LISTEN_UID)
            finally:
                timer.cancel()
            assert proc.wait() == 0, log.read_text()
            results = json.loads((out / "latest" / "results.json").read_text())
            outcomes[how] = (listeners, results["network"])
            if not userns:
                break
        listeners, network = outcomes["plain"]
        assert network.startswith("not root: cells share the host's network")
        assert listeners & {"0.0.0.0", "::"}, f"Mooncake's engine listened only on {listeners}"
        assert "127.0.0.1" in listeners  # the roles' own sockets follow --bind
        if not userns:
            pytest.skip("user namespaces are refused here: only the unprivileged run's half could be checked")
        listeners, network = outcomes["namespaced"]
        assert network == PRIVATE_NETWORK
        assert listeners == set(), f"the namespaced run listened in the host's network on {listeners}"
    finally:
        made.close()
