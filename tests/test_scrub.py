"""pdconform scrub: no original identifier survives anywhere in the copy (contents and file
names), every one maps to the same pseudonym in every file, the copy judges to the same
verdicts, and bad input is refused with exit 2 without touching anything."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
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


def test_an_out_inside_the_run_or_the_checkout_or_a_dangling_link_is_refused(stored_run, tmp_path):
    from harness import ROOT

    link = tmp_path / "link"
    link.symlink_to(tmp_path / "made-through-the-link")
    for out, message in ((stored_run / "scrubbed", "inside the run being scrubbed"),
                         (ROOT / "docs" / "scrubbed", "inside the pdconform checkout"),
                         (link, "exists")):
        done = _cli("scrub", str(stored_run), "--out", str(out))
        assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert not (stored_run / "scrubbed").exists() and not (ROOT / "docs" / "scrubbed").exists()
    assert not (tmp_path / "made-through-the-link").exists()


#: what a trace may hold that a backtracking pattern is slow on: a 2 MB frame of digits
#: (mori logs the oversized frame), hex with colons, colons, dotted digits, a path in the
#: wrong case, names that touch their boundary
ADVERSARIAL = (b"9", b"9:a", b":", b"1.", b"fd00::1234:5:", b"/HOME/ALICE", b"malice-", b"99.1.2.3.", b"Ab:")


def _adversarial_run(root: Path, per_kind: int) -> Path:
    from harness.report.outdir import MARKER

    run = root / "run"
    (run / "cells" / "x--y").mkdir(parents=True)
    (run / MARKER).write_text("")
    (run / "results.json").write_text(json.dumps({"hosts": [{"name": "gpu-node-17"}]}))
    body = [b"peer 10.20.30.40 at [fd00::1234:5]:7000, /home/alice/x, GPU-NODE-17"]
    body += [kind * (per_kind // len(kind)) for kind in ADVERSARIAL]
    (run / "cells" / "x--y" / "history.jsonl").write_bytes(b"\n".join(body) + b"\n")
    return run


def test_scrub_time_grows_linearly_on_adversarial_input(tmp_path):
    """4 times the input takes about 4 times as long (a quadratic pattern: 16 times, and
    hours on a 2 MB frame); the best of two tries, so a busy machine does not decide."""

    from harness.report.scrub import scrub

    seconds = {}
    for size in (1 << 19, 1 << 21):  # per kind: 4.5 MB and 18 MB in all
        run = _adversarial_run(tmp_path / str(size), size)
        tries = []
        for attempt in range(2):
            start = time.perf_counter()
            scrub(run, tmp_path / str(size) / f"out{attempt}")
            tries.append(time.perf_counter() - start)
        seconds[size] = min(tries)
        copy = (tmp_path / str(size) / "out0" / "cells" / "x--y" / "history.jsonl").read_bytes()
        assert len(copy) > len(ADVERSARIAL) * size * 0.9  # the noise itself comes through
        for original in (b"10.20.30.40", b"[fd00::1234:5]", b"/home/alice", b"GPU-NODE-17"):
            assert original not in copy, original
    assert seconds[1 << 21] < 60, seconds  # whatever the machine's load
    assert seconds[1 << 21] / seconds[1 << 19] < 8, seconds


def test_replacement_keeps_its_boundaries_and_case_rules():
    from harness.report.scrub import Identifiers, replacer

    ids = Identifiers(hosts={"gpu-node-17"}, addresses={"10.20.30.40", "fd00::abcd:6"}, users={"alice"},
                      paths={"/home/alice"})
    table = {"gpu-node-17": "h", "10.20.30.40": "10.0.0.9", "fd00::abcd:6": "fd00::9", "alice": "bob",
             "/home/alice": "/home/bob"}
    rewrite = replacer(table, ids)
    cases = {
        b"malice alice_x alice-x": b"malice bob_x alice-x",  # a name stands alone ("-" joins it to a word)
        b"GPU-NODE-17.example gpu-node-170": b"h.example gpu-node-170",  # any case; not inside a longer name
        b"peer-10.20.30.40 110.20.30.40 10.20.30.40.5 10.20.30.401": b"peer-10.0.0.9 110.20.30.40 "
                                                                       b"10.20.30.40.5 10.20.30.401",
        b"addr:FD00::ABCD:6: fd00::abcd:6:1 [fd00::abcd:6]:80": b"addr:fd00::9: fd00::abcd:6:1 [fd00::9]:80",
        b"/home/alice/x /home/alicex /HOME/ALICE %2Fhome%2Falice \\/home\\/alice":
            b"/home/bob/x /home/alicex /HOME/bob %2Fhome%2Fbob \\/home\\/bob",  # a path keeps its case
    }
    for text, expected in cases.items():
        assert rewrite(text) == expected, text
