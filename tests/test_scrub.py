"""pdconform scrub: no original identifier survives anywhere in the copy (contents and file
names), every one maps to the same pseudonym in every file, the copy judges to the same
verdicts, and bad input is refused with exit 2 without touching anything."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from harness.report.scrub import COMMON_NAMES, MIN_NAME

ROOT = Path(__file__).resolve().parents[1]
HOST = "gpu-node-17.cluster.example.com"
PLANTED = [HOST, "10.20.30.40", "fd00::1234:5", "alice", "/home/alice", "10.20.30.42", "fd00::abcd:6",
           "10.20.30.43", "GPU-NODE-17", "gpu-node-17", "%2Fhome%2Falice", "\\/home\\/alice"]
#: where they hide in a trace: next to "-", "_" or ":", in capitals, URL-encoded, JSON-escaped
HIDDEN = ("peer-10.20.30.40 joined; node_10.20.30.42 up; connect to fd00::1234:5: refused; addr:fd00::abcd:6; "
          "from ::ffff:10.20.30.43; GPU-NODE-17.CLUSTER.EXAMPLE.COM; gpu-node-17_rank0; url=%2Fhome%2Falice%2Fx; "
          "json \\/home\\/alice\\/y; cache /home/sglang/.cache\n")


def _cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env={**os.environ, "COLUMNS": "200"})


def _verdicts(results: Path) -> dict:
    data = json.loads(results.read_text())
    return {(c["scenario"], c["impl"]): (c["verdict"], [(x["name"], x["ok"]) for x in c["checks"]])
            for c in data["cells"]}


@pytest.fixture(scope="module")
def stored_run(tmp_path_factory) -> Path:
    """A real run (a PASS and a FAIL cell) with identifiers planted where a cluster run has
    them: a role log line, the run's host placement, a file named after a host."""
    out = tmp_path_factory.mktemp("scrub") / "out"
    expectations = out.parent / "e.toml"
    expectations.write_text('[[expect]]\nimpl = "selftest"\nscenario = "selftest-role-dies"\nverdict = "FAIL"\n'
                            'reason = "the role is killed on purpose"\nlink = "tests"\n')
    ran = _cli("run", "--impl", "reference", "--impl", "selftest", "--scenario", "happy-path", "--scenario",
               "selftest-role-dies", "--out", str(out), "--expectations", str(expectations))
    assert ran.returncode == 0, ran.stdout + ran.stderr
    run_dir = (out / "latest").resolve()
    cell = next(p for p in (run_dir / "cells").iterdir() if p.name.startswith("happy-path--reference"))
    with open(cell / "prefill.log", "a") as log:
        log.write(f"peer {HOST} at 10.20.30.40 and [fd00::1234:5]:7000, user alice, cache /home/alice/.cache\n")
        log.write(HIDDEN)  # and a service account whose name is a word of the trace: /home/sglang
    (cell / f"{HOST}.log").write_text("a log named after its host\n")
    (cell / "peer-10.20.30.40.log").write_text("a log named after a peer's address\n")
    results = json.loads((run_dir / "results.json").read_text())
    results["hosts"] = [{"name": HOST, "address": "10.20.30.40", "roles": ["prefill"]}]
    (run_dir / "results.json").write_text(json.dumps(results, indent=2))
    return run_dir


def _originals(run_dir: Path) -> list[str]:
    """Every identifier the copy must not hold: the planted ones, this machine's names, the
    checkout, the interpreter's prefix, the folder the run was written under."""
    names = [n for n in {socket.gethostname(), socket.getfqdn()} if len(n) >= MIN_NAME and n not in COMMON_NAMES]
    return [*PLANTED, *names, str(ROOT), sys.prefix, str(run_dir.parent.parent)]


def test_no_identifier_survives_and_the_copy_judges_the_same(stored_run, tmp_path):
    copy = tmp_path / "shared"
    done = _cli("scrub", str(stored_run), "--out", str(copy))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "replaced" in done.stdout and "Traceback" not in done.stderr
    files = [p for p in copy.rglob("*") if p.is_file()]
    assert len(files) == len([p for p in stored_run.rglob("*") if p.is_file()])
    for original in _originals(stored_run):
        for path in files:
            assert original.encode() not in path.read_bytes(), f"{original!r} survives in {path}"
            assert original not in str(path.relative_to(copy)), f"{original!r} survives in a file name"
    before = _verdicts(stored_run / "results.json")
    judged = _cli("judge", str(copy))
    assert judged.returncode == 0, judged.stdout + judged.stderr
    assert _verdicts(copy / "results.json") == before
    assert {v for v, _ in before.values()} == {"PASS", "FAIL"}  # both kinds of verdict came through


def test_pseudonyms_are_consistent_across_files_and_seeded(stored_run, tmp_path):
    assert _cli("scrub", str(stored_run), "--out", str(tmp_path / "a")).returncode == 0
    assert _cli("scrub", str(stored_run), "--out", str(tmp_path / "b")).returncode == 0
    assert _cli("scrub", str(stored_run), "--out", str(tmp_path / "c"), "--seed", "7").returncode == 0
    host = json.loads((tmp_path / "a" / "results.json").read_text())["hosts"][0]
    cell = next(p for p in (tmp_path / "a" / "cells").iterdir() if p.name.startswith("happy-path--reference"))
    log = (cell / "prefill.log").read_text()
    assert host["name"] in log and host["address"] in log and (cell / f"{host['name']}.log").is_file()
    assert host["address"].count(".") == 3 and "[" in log and "]:7000" in log  # an address stays one, ports stay
    tree = {str(p.relative_to(tmp_path / "a")): p.read_bytes() for p in (tmp_path / "a").rglob("*") if p.is_file()}
    same = {str(p.relative_to(tmp_path / "b")): p.read_bytes() for p in (tmp_path / "b").rglob("*") if p.is_file()}
    assert tree == same
    other = json.loads((tmp_path / "c" / "results.json").read_text())["hosts"][0]
    assert other["name"] != host["name"]


def test_bad_input_is_refused_with_exit_2_and_nothing_is_touched(stored_run, tmp_path):
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "mine.txt").write_text("the user's file")
    for args in ([str(tmp_path / "nothing"), "--out", str(tmp_path / "x")], [str(stored_run), "--out", str(taken)]):
        done = _cli("scrub", *args)
        assert done.returncode == 2 and "error:" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert [p.name for p in taken.iterdir()] == ["mine.txt"] and not (tmp_path / "x").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging folder left behind
