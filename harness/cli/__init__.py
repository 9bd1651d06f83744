"""The ``pdconform`` command line (typer): the app, the option checks every command shares, ``main``.

Each command checks its options (bad usage: one line on stderr, exit 2), hands the work
to the module that does it (harness.session for run/repro/judge, harness.bench.suite,
harness.report.run_diff, harness.doctor, the reference's simulator) and prints.
The commands live in harness/cli/runs.py (run, repro, judge, diff, expectations update)
and harness/cli/tools.py (doctor, list, bench, simulate, soak, mutants); what ``run``
shows while its cells run is harness/cli/progress.py.

Exit codes: 0 every cell as expected (or the command succeeded), 1 some cell not as
expected (or doctor found an unusable engine, or the simulator a violation), 2 bad
usage, 130 interrupted.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.markup import escape

from harness.report.safe import terminal

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Conformance harness for SGLang PD-disaggregation transfer backends.")
# Lines are never wrapped mid-word; when output is not a terminal (CI logs,
# pipes) the matrix gets 120 columns instead of rich's default 80.
console = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 120)
err = Console(stderr=True, soft_wrap=True)

DEFAULT_OUT = Path("reports/out")
# bounds of the numeric options, checked where they are parsed (exit 2 beyond them): a seed fits
# results.json's 64-bit integers; more cells at once than this only starve each other
MAX_SEED = 2**63 - 1
MAX_JOBS = 512


def _usage_error(message: str) -> typer.Exit:
    err.print(f"[bold red]error:[/] {escape(terminal(message))}")
    return typer.Exit(code=2)


def _registry():
    """harness.implementations, once the implementation and scenario registries have loaded;
    exit 2 (one line naming the entry point) when one of them does not."""
    from harness import implementations
    from harness.spec.scenario import ScenarioLoadError, all_scenarios

    try:
        implementations.registered()
        all_scenarios(include_test_only=True)
    except (implementations.RegistryError, ScenarioLoadError) as exc:
        raise _usage_error(str(exc))
    return implementations


def _target(sglang_src: Optional[Path], sglang_version: Optional[str], tree_version: Optional[str] = None):
    """Resolve --sglang-src (with --sglang-version, the tree's version when it does not say) /
    --sglang (harness.target.sglang), and note which release's shipped expectations the version
    takes by default (``info.expectations_for``, harness.judge.expectations.shipped_path); bad input
    exits 2.  A release outside an implementation's declared range is not bad input: its cells are
    UNSUPPORTED."""
    from harness.judge.expectations import shipped_path
    from harness.target.sglang import TargetError, resolve_target

    try:
        target = resolve_target(sglang_src, sglang_version, tree_version=tree_version)
    except TargetError as exc:
        raise _usage_error(str(exc))
    shipped = shipped_path(target.info.version)
    target.info.expectations_for = shipped.stem.removeprefix("sglang-") if shipped else None
    return target


def _select(impl: Optional[List[str]], scenario: Optional[List[str]], topology: Optional[List[str]] = None,
            what: str = "--scenario"):
    """The implementations and scenarios asked for (default: all), each scenario on every
    ``--topology`` asked for (default: p1-d1; ``default`` and ``nightly`` name the sets,
    harness/spec/topology.py), as ``SCENARIO@TOPOLOGY`` cells; a scenario id may name its
    topology itself.  Unknown names exit 2."""
    from harness.spec.scenario import all_scenarios
    from harness.spec.topology import TOPOLOGIES, TOPOLOGY_SEP, on_topology

    registry = _registry()
    impls = list(dict.fromkeys(impl or registry.names()))
    unknown = [i for i in impls if i not in registry.available()]
    if unknown:
        raise _usage_error(f"unknown --impl {', '.join(unknown)} (known: {', '.join(registry.names())})")
    sets = {"default": [t for t in TOPOLOGIES.values() if t.default],
            "nightly": [t for t in TOPOLOGIES.values() if t.nightly]}
    topologies, named = [], set()  # named: asked for by name, not through a set
    for name in topology or ["p1-d1"]:
        if name not in TOPOLOGIES and name not in sets:
            raise _usage_error(f"unknown --topology {name} (known: {', '.join(TOPOLOGIES)}, default, nightly; "
                               "see `pdconform list --topologies`)")
        topologies += sets.get(name) or [TOPOLOGIES[name]]
        named |= {name} if name in TOPOLOGIES else set()
    known = {s.id: s for s in all_scenarios()}
    nightly = "nightly" in (topology or [])  # a nightly run also takes the scenarios only it runs
    # a found program (harness.explore.found) runs only when named: explore replays the corpus itself;
    # a network scenario too (it needs roles on several hosts: `run --hosts ... --scenario network-...`)
    wanted = list(dict.fromkeys(scenario or [sid for sid, s in known.items() if not s.nightly or (
        nightly and "found" not in s.tags and "network" not in s.tags)]))
    cells = []
    for sid in wanted:
        base, sep, its = sid.partition(TOPOLOGY_SEP)
        if base not in known:
            raise _usage_error(f"unknown {what} {sid} (known: {', '.join(known)}, each also as SCENARIO@TOPOLOGY; "
                               "see `pdconform list`)")
        if sep and its not in TOPOLOGIES:
            raise _usage_error(f"unknown topology {its} in {what} {sid} (known: {', '.join(TOPOLOGIES)}; "
                               "see `pdconform list --topologies`)")
        for t in [TOPOLOGIES[its]] if sep else list(dict.fromkeys(topologies)):
            if known[base].runs_on(t.name):
                cells.append(on_topology(known[base], t))
            elif sep or (scenario and t.name in named):  # this scenario on this topology by name: say why not
                raise _usage_error(f"{base} does not run on topology {t.name}: {known[base].topologies[1]}")
    return impls, list({s.id: s for s in cells}.values())


def this_program() -> str:
    """How a reproduce line calls pdconform (harness.program: pasted into a fresh shell at the
    checkout root, it runs), the same in the terminal as in every report."""
    from harness import program

    return program()


def _expectations(path: Optional[Path], version: Optional[str] = None):
    """The expectations to judge against (harness.session.resolve_expectations: the
    --expectations file, else the one shipped for the sglang ``version`` under test,
    ``none`` for none); a bad file exits 2."""
    from harness.judge.expectations import ExpectationsError
    from harness.session import resolve_expectations

    try:
        return resolve_expectations(path, version)
    except ExpectationsError as exc:
        raise _usage_error(str(exc))


def _out_dir(out: Path) -> Path:
    """The checked --out folder (harness.report.outdir.check_out); nothing is touched.  Exit 2 when unusable."""
    from harness.report.outdir import OutDirError, check_out

    try:
        return check_out(out)
    except OutDirError as exc:
        raise _usage_error(str(exc))


def _stop_on_signals() -> None:
    def interrupted(signum, frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # SIGINT too: a job started with & ignores it
        signal.signal(signum, interrupted)


SGLANG_SRC_OPTION = typer.Option(None, "--sglang-src", help="Run against this sglang checkout (its python/ folder) "
                                 "or unpacked wheel instead of the installed sglang.")
SGLANG_VERSION_OPTION = typer.Option(None, "--sglang", help="Run against this released sglang version, set up once "
                                     "into the cached environment .venv-sglang-VERSION.")
SGLANG_TREE_VERSION_OPTION = typer.Option(
    None, "--sglang-version", metavar="X", help="The version of the --sglang-src tree, for a tree that does not say it "
    "(no version file, package metadata or vX.Y.Z git tag: a shallow clone of main) or says it wrong; it picks the "
    "shipped expectations (a dev, pre, post or local version takes the newest shipped release at or below it) and "
    "the adapters' sglang ranges. results.json records that the version came from this option.")
ENGINE_SETTING_OPTION = typer.Option(
    None, "--engine-setting", metavar="NAME=VALUE", show_default=False,
    help="Change an engine setting from pdconform's default (repeatable; `pdconform doctor` lists them): "
         "nixl_progress_delay_us=0 runs NIXL's progress thread as sglang does, a busy loop that keeps a core busy "
         "per NIXL role (docs/performance.md).")
FULL_WAITS_OPTION = typer.Option(
    False, "--full-waits", help="Let every wait run to its bound even after a status that must come never came "
    "(default: fail fast, later waits of that cell are cut to 1 s).")
BIND_OPTION = typer.Option(
    None, "--bind", metavar="ADDR", help="IPv4 address every role listens on and advertises (default: 127.0.0.1, "
    "each cell in a private loopback-only network when root). A non-loopback ADDR is reachable from other hosts: "
    "for roles on several hosts; give it only on a network you trust.")
POOL_DEVICE_OPTION = typer.Option(
    "cpu", "--pool-device", metavar="cpu|cuda", help="Where the roles' pattern-filled KV and aux pools live: cpu "
    "(default), or cuda: device memory, as sglang keeps KV (NIXL then registers it as VRAM, so the layouts this CPU "
    "machine marks 'needs VRAM' run). cuda needs a CUDA device on every host.")
EXPECTATIONS_OPTION = typer.Option(None, "--expectations", help="TOML file of expected verdicts (default: the file "
                                   "expectations/ ships for the sglang under test, if any; 'none': every cell "
                                   "expected to PASS); exit 1 on a regression or a fix.")


def _settings(pairs: Optional[List[str]]) -> dict[str, int]:
    """The engine settings ``--engine-setting NAME=VALUE`` asks for (harness.implementations.EngineSetting);
    an unknown name, or a value that is not a whole number from 0 to the setting's maximum, exits 2."""
    known = _registry().engine_settings()
    settings: dict[str, int] = {}
    for pair in pairs or []:
        name, sep, value = pair.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or name not in known:
            raise _usage_error(f"--engine-setting {pair[:60]}: give NAME=VALUE with NAME one of {', '.join(known) or '-'}")
        top = known[name].maximum
        if not (value.isascii() and value.isdigit()) or len(value) > 12 or int(value) > top:
            raise _usage_error(f"--engine-setting {name}={value[:24]}: the value must be a whole number from 0 to {top}")
        settings[name] = int(value)
    return settings


@contextlib.contextmanager
def _run_folder(out: Path, what: str, interrupted: str = ""):
    """A fresh run folder under ``out`` (harness.report.outdir.RunFolder) for the body to
    write into, made ``latest`` when the body has finished; an interrupt exits 130 (saying
    ``interrupted``), another run holding ``out`` or a write error exits 2 (naming ``what``)."""
    from harness.report.outdir import OutDirError, RunFolder

    _stop_on_signals()
    run_folder = RunFolder(out)
    try:
        with run_folder as folder:
            yield folder
            for note in run_folder.finish():  # run folders left unpruned, a trend page that is not ours
                err.print(f"note: {escape(terminal(note))}", highlight=False)
    except KeyboardInterrupt:
        err.print(f"[bold red]interrupted[/]{escape(interrupted)}")
        raise typer.Exit(code=130)
    except OutDirError as exc:
        raise _usage_error(str(exc))
    except OSError as exc:
        raise _usage_error(f"cannot write the {what} into {out}: {exc.strerror or exc}")


def _bind(addr: Optional[str]) -> Optional[str]:
    """``--bind ADDR`` checked (an IPv4 address this machine can listen on); exit 2 otherwise."""
    if addr is None:
        return None
    from harness.drive.ports import check_bind_address

    try:
        return check_bind_address(addr)
    except ValueError as exc:
        raise _usage_error(str(exc))


def _pool_device(value: str) -> str:
    """``--pool-device`` checked: cpu, or cuda where this machine has a CUDA device; exit 2 otherwise."""
    from harness.role.pool_device import POOL_DEVICES

    if value not in POOL_DEVICES:
        raise _usage_error(f"--pool-device {value[:20]!r}: one of {', '.join(POOL_DEVICES)}")
    if value == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise _usage_error("--pool-device cuda: no CUDA device here (torch.cuda.is_available() is False): "
                               "run on a GPU host, or leave the pools in host memory (--pool-device cpu)")
    return value


class _Stdout:
    """Standard output that a reader may stop reading (``pdconform run | head -1``): once the
    pipe is closed, what is left to print goes nowhere and the command ends with its own exit
    code (1 only for a regression), never a BrokenPipeError."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._close()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._close()

    def _close(self) -> None:
        devnull = open(os.devnull, "w")
        os.dup2(devnull.fileno(), self._stream.fileno())  # the interpreter's last flush at exit goes nowhere too
        self._stream = devnull

    def __getattr__(self, name):
        return getattr(self._stream, name)


def main() -> None:
    """Console-script entry point."""
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    sys.stdout = _Stdout(sys.stdout)
    app(prog_name="pdconform")




from harness.cli import explore, hosts, runs, tools  # noqa: E402,F401 - the commands register themselves on ``app``
from harness.cli import engine_contract  # noqa: E402,F401 - registers `pdconform engine-contract`
