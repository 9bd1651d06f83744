"""Found programs: a failing program, shrunk, written out as a scenario file that replays.

A found file is a program (harness.explore.program_model, :meth:`Program.to_json`) plus what
found it: ``id`` (``found-IMPL-HASH``, the hash of its steps), ``impl``, ``signature`` (the
failure it showed: requirement, check, implementation, first frame of an exception if
any) and ``found_with`` (the explore command's seed and budget).  Found files live in
``scenarios/found/`` (or ``--found DIR``; :data:`FOUND_ENV` names extra folders); the
scenario package registers each one as a scenario of that id (scenarios/found_programs.py),
so ``pdconform run --scenario ID`` and ``pdconform repro ID`` replay it, and a cell given
the file's path runs it too (harness.spec.scenario.register_file_loader).  Found scenarios
are not in the default matrix (``nightly``): explore replays them first, as a corpus.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

from harness import ROOT
from harness.explore.program_model import PROGRAM_TIMEOUT_S, Program
from harness.explore.program_file import program_from_json
from harness.judge.results import write_atomic
from harness.spec.inputs import InputError, read_input
from harness.spec.scenario import Scenario

FOUND_DIR = ROOT / "scenarios" / "found"  # the corpus shipped with pdconform
FOUND_ENV = "PDCONFORM_FOUND_DIRS"  # more corpus folders, separated by os.pathsep (explore --found sets it)
SUFFIX = ".json"
NIGHTLY = "a program pdconform explore found: explore replays it first, run and repro when named"


def found_dirs() -> list[Path]:
    """The corpus folders: :data:`FOUND_DIR` and those :data:`FOUND_ENV` names, each once."""
    dirs = [FOUND_DIR, *(Path(d) for d in os.environ.get(FOUND_ENV, "").split(os.pathsep) if d)]
    seen: dict[str, Path] = {}
    for d in dirs:
        seen.setdefault(str(d.resolve()), d)
    return list(seen.values())


ID_PATTERN = re.compile(r"found-[A-Za-z0-9._-]{1,120}")  # what a found file's id (and file name) may be


def program_id(program: Program, impl: str) -> str:
    """``found-IMPL-HASH``: stable for the same steps on the same topology and implementation."""
    doc = json.loads(program.to_json())
    digest = hashlib.sha256(json.dumps([doc["topology"], doc["steps"]], sort_keys=True).encode()).hexdigest()
    return f"found-{impl}-{digest[:10]}"


#: a generated program's fault plan is drawn before the writes it may hit: one that never fired
#: leaves a fault-free program, judged as one (the matrix's scenarios prove each mechanism fires)
FAULTS_OPTIONAL = "a generated program's plan (the n-th write from now fails ...) may outlast its writes"


def scenario_of(program: Program, scenario_id: str, title: str = "") -> Scenario:
    """``program`` as a scenario: its steps on its topology (harness.spec.topology.apply) and
    the spec's checks for it, whatever the seed.  ValueError for an unknown topology."""
    from harness.spec.topology import TOPOLOGIES, apply

    if program.topology not in TOPOLOGIES:
        raise ValueError(f"unknown topology {program.topology!r}")
    steps = apply(list(program.steps), TOPOLOGIES[program.topology])
    return Scenario(id=scenario_id, title=title or f"generated program of {len(steps)} steps",
                    steps=lambda seed: steps, checks=lambda seed: program.checks(),
                    timeout_s=PROGRAM_TIMEOUT_S, nightly=NIGHTLY, tags=("found",), faults_optional=FAULTS_OPTIONAL,
                    topologies=((program.topology,), "a program runs on the shape it was written for"))


def read_program_text(path: str | os.PathLike) -> str:
    """A program or found file's text, size-bounded (harness.spec.inputs); ValueError when unreadable."""
    try:
        return read_input(path, "program").decode("utf-8")
    except (InputError, UnicodeDecodeError) as exc:
        raise ValueError(str(exc)) from exc


def load_program(path: str | os.PathLike) -> Program:
    """The program of a program or found file; ValueError when it is none."""
    return program_from_json(read_program_text(path))


def load_file(path: str | os.PathLike) -> Scenario:
    """The scenario of a program or found file (its ``id``, else its file name without
    the suffix).  ValueError when it is not one (harness.spec.inputs bounds its size)."""
    text = read_program_text(path)
    program = program_from_json(text)
    doc = json.loads(text)
    stem = Path(path).name[: -len(SUFFIX)]
    name = doc.get("id", stem)
    if stem.startswith("found-") and (name != stem or not ID_PATTERN.fullmatch(str(name))):
        raise ValueError(f"a found file's id must be its file name, found-[A-Za-z0-9._-]: {str(name)[:80]!r}")
    signature = doc.get("signature") if isinstance(doc.get("signature"), dict) else {}
    title = (f"found by explore on {str(doc.get('impl', '?'))[:60]}: {str(signature.get('check', '?'))[:60]} "
             f"({str(signature.get('requirement', '?'))[:20]})") if signature else ""
    return scenario_of(program, name, title)


def found_files(dirs: list[Path] | None = None) -> list[Path]:
    """Every found file of the corpus folders, in name order."""
    out = []
    for d in dirs if dirs is not None else found_dirs():
        if d.is_dir():
            out += sorted(p for p in d.glob(f"found-*{SUFFIX}") if p.is_file() and not p.is_symlink())
    return out


def write_found(program: Program, impl: str, signature: dict, folder: Path, found_with: dict) -> Path:
    """Write ``program`` as a found file into ``folder`` (made if missing; atomically); its path."""
    sid = program_id(program, impl)
    doc = {"id": sid, "impl": impl, "signature": signature, "found_with": found_with, **json.loads(program.to_json())}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{sid}{SUFFIX}"
    write_atomic(path, (json.dumps(doc, indent=1) + "\n").encode())
    return path


def impl_of(path: Path) -> str | None:
    """The implementation a found file failed on (None: not said, or not a readable file)."""
    try:
        impl = json.loads(read_input(path, "program")).get("impl")
    except (InputError, ValueError, AttributeError, RecursionError):
        return None
    return impl if isinstance(impl, str) else None
