"""Output folders are safe (harness.report.outdir): a run writes a fresh run folder and moves
`latest` only when done; nothing pdconform did not write is deleted or followed; the checkout
is refused; a second run into the same folder is refused; inputs that are not regular files
are refused; a full disk is a one-line error that leaves no half-written file."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import ROOT
from harness.report.outdir import KEEP_RUNS, OutDirError, check_out, prune, take_lock


def pdconform(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


NOOP = ["run", "--impl", "selftest", "--scenario", "selftest-noop"]


def test_a_foreign_folder_keeps_everything_and_gets_a_run_folder(tmp_path):
    out = tmp_path / "mine"
    (out / "cells" / "precious").mkdir(parents=True)
    (out / "cells" / "precious" / "notes.txt").write_text("mine")
    for name in ("results.json", "summary.md", "index.html", "junit.xml"):
        (out / name).write_text("mine")
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("mine")
    (out / "reference-for-diff").symlink_to(victim)
    ran = pdconform(*NOOP, "--out", str(out))
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert (out / "cells" / "precious" / "notes.txt").read_text() == "mine"
    assert all((out / name).read_text() == "mine" for name in ("results.json", "summary.md", "index.html"))
    assert (victim / "keep.txt").read_text() == "mine" and (out / "reference-for-diff").is_symlink()
    run = (out / "latest").resolve()
    assert run.parent == out / "runs" and (run / ".pdconform-run").is_file() and (run / "results.json").is_file()


def test_a_refused_run_leaves_latest_and_earlier_runs_as_they_were(tmp_path):
    out = tmp_path / "out"
    assert pdconform(*NOOP, "--out", str(out)).returncode == 0
    before = os.readlink(out / "latest")
    results = (out / "latest" / "results.json").read_text()
    bad = pdconform(*NOOP, "--out", str(out), "--sglang-src", str(tmp_path / "no-such-tree"))
    assert bad.returncode == 2 and "not a directory" in bad.stderr
    assert os.readlink(out / "latest") == before and (out / "latest" / "results.json").read_text() == results
    assert len(list((out / "runs").iterdir())) == 1  # no run folder was even made


@pytest.mark.parametrize("where", ["", "harness", "docs", "tests/cellruns.py"])
def test_the_checkout_is_refused_as_out(where):
    with pytest.raises(OutDirError, match="inside the pdconform checkout|is a file"):
        check_out(ROOT / where if where else ROOT)
    assert check_out(ROOT / "reports" / "out") == ROOT / "reports" / "out"  # reports/ is where runs go


def test_out_entries_that_are_not_pdconforms_are_refused(tmp_path):
    (tmp_path / "a" / "runs").parent.mkdir()
    (tmp_path / "a" / "runs").write_text("x")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "latest").mkdir()
    (tmp_path / "b" / "latest" / "results.json").write_text("{}")
    for folder, message in (("a", "runs there is not pdconform's"), ("b", "an older pdconform")):
        out = pdconform(*NOOP, "--out", str(tmp_path / folder))
        assert out.returncode == 2 and message in out.stderr, out.stderr


def test_a_second_run_into_the_same_folder_is_refused(tmp_path):
    (tmp_path / "out").mkdir()
    fd = take_lock(tmp_path / "out", "writing into")  # a run in progress
    try:
        out = pdconform(*NOOP, "--out", str(tmp_path / "out"))
        assert out.returncode == 2 and f"another pdconform run (pid {os.getpid()}) is writing into" in out.stderr
    finally:
        os.close(fd)
    assert pdconform(*NOOP, "--out", str(tmp_path / "out")).returncode == 0  # free again


def _run_folders(out: Path, n: int) -> list[Path]:
    """``n`` run folders as RunFolder makes them (its marker, a results file, a cell's history)."""
    from harness.report.outdir import RunFolder

    made = []
    for i in range(n):
        folder = RunFolder(out)
        with folder as path:
            (path / "results.json").write_text("{}")
            (path / "cells" / "a--b").mkdir(parents=True)
            (path / "cells" / "a--b" / "history.jsonl").write_text("")
            (path / "cells" / "a--b" / "prefill-r1.log").write_text("")
            made.append(path.rename(path.with_name(f"2026120{i:02d}-000000")))  # each its own time
    return made


def test_only_run_folders_made_here_are_pruned_and_only_their_own_files(tmp_path):
    """Pruning removes pdconform's files by name, then the folder; a folder with a user's file
    in it, a user's `cp -a` copy of a run (it carries the marker), a folder without a marker and
    a link are left as they are, and the folders left for a foreign file are named."""
    runs = tmp_path / "runs"
    made = _run_folders(tmp_path, KEEP_RUNS + 3)
    (made[1] / "cells" / "a--b" / "notes.txt").write_text("mine")  # the user's file, deep inside
    subprocess.run(["cp", "-a", str(made[0]), str(runs / "000-my-copy")], check=True)
    (runs / "000-not-ours").mkdir()
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / ".pdconform-run").write_text("{}")
    (runs / "000-link").symlink_to(victim)
    pruned = prune(tmp_path, KEEP_RUNS)
    assert [p.name for p in pruned.removed] == [made[0].name, made[2].name]
    assert list(pruned.left) == [made[1]] and pruned.left[made[1]] == ["cells/a--b/notes.txt"]
    assert (made[1] / "cells" / "a--b" / "notes.txt").read_text() == "mine"
    assert (made[1] / "results.json").is_file()  # left whole, not emptied around the user's file
    assert (runs / "000-my-copy" / "results.json").is_file() and (runs / "000-not-ours").is_dir()
    assert victim.is_dir() and (victim / ".pdconform-run").is_file() and (runs / "000-link").is_symlink()


def test_a_run_names_the_folders_pruning_left(tmp_path):
    out = tmp_path / "out"
    made = _run_folders(out, KEEP_RUNS)
    (made[0] / "mine.txt").write_text("mine")
    ran = pdconform(*NOOP, "--out", str(out))
    assert ran.returncode == 0, ran.stderr
    assert f"{made[0]}: not pruned, it holds files pdconform did not write (mine.txt)" in ran.stderr
    assert (made[0] / "mine.txt").read_text() == "mine"


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "folder"])
def test_inputs_that_are_not_regular_files_are_refused_at_once(tmp_path, kind):
    path = tmp_path / "input"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    else:
        path = Path("/dev/zero")
    started = time.monotonic()
    for args in (NOOP + ["--out", str(tmp_path / "out"), "--expectations", str(path)],
                 ["diff", str(path), str(path)]):
        out = pdconform(*args, timeout=30)
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert time.monotonic() - started < 25  # nothing waited on the FIFO


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs (root only): room for a noop run's start, not for many of them."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def test_a_full_disk_is_one_line_and_leaves_no_half_written_report(small_disk):
    out = small_disk / "out"
    assert pdconform(*NOOP, "--out", str(out)).returncode == 0
    latest = os.readlink(out / "latest")
    filler = small_disk / "filler"
    with open(filler, "wb", buffering=0) as f:  # leave a few KiB: the next run's histories fit, its reports do not
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass
    ran = pdconform(*NOOP, "--out", str(out))
    assert ran.returncode == 2 and "No space left on device" in ran.stderr and "Traceback" not in ran.stderr
    errors = [line for line in ran.stderr.strip().splitlines() if not line.startswith("[")]  # progress: "[1/1] ..."
    assert len(errors) == 1, ran.stderr
    assert os.readlink(out / "latest") == latest  # the previous run is still the latest
    for run in (out / "runs").iterdir():
        for name in ("results.json", "summary.md", "index.html", "junit.xml"):
            if (run / name).exists():
                assert (run / name).stat().st_size > 0 and json.loads((run / "results.json").read_text())
        assert not [p.name for p in run.iterdir() if p.name.endswith(".tmp")]  # no temporary file left


def test_an_interrupt_while_the_reports_are_written_leaves_the_previous_run_latest(tmp_path, monkeypatch):
    """SIGINT (KeyboardInterrupt) after results.json and before the other reports: ``latest``
    still points at the previous run, and no temporary file is left in the new one."""
    from harness import session
    from harness.report.files import write_reports
    from harness.spec.scenario import get_scenario
    from harness.target.sglang import installed_target

    monkeypatch.setenv("PDCONFORM_TEST_SCENARIOS", "1")
    config = session.RunConfig(impls=["selftest"], scenarios=[get_scenario("selftest-noop")], out_dir=tmp_path,
                               target=installed_target())
    session.run(config)
    before = os.readlink(tmp_path / "latest")

    def interrupted(result, out_dir, histories):
        write_reports(result, out_dir, histories)  # junit.xml, summary.md, index.html, then the signal
        raise KeyboardInterrupt

    monkeypatch.setattr(session, "write_reports", interrupted)
    with pytest.raises(KeyboardInterrupt):
        session.run(config)
    assert os.readlink(tmp_path / "latest") == before
    runs = [p for p in (tmp_path / "runs").iterdir()]
    assert len(runs) == 2
    for run in runs:
        assert not [p.name for p in run.rglob("*") if ".tmp" in p.name], run
    assert json.loads((tmp_path / "latest" / "results.json").read_text())["cells"]


def test_the_latest_link_itself_names_its_run(tmp_path):
    from harness.report.outdir import OutDirError, run_folder_of

    run = tmp_path / "runs" / "20261201-000000"
    run.mkdir(parents=True)
    (run / ".pdconform-run").write_text("pdconform\n")
    (tmp_path / "latest").symlink_to(Path("runs") / run.name)
    assert run_folder_of(tmp_path / "latest") == run.resolve() == run_folder_of(tmp_path)
    elsewhere = tmp_path / "other"
    elsewhere.symlink_to(tmp_path / "runs" / run.name)  # a link of another name is not taken for latest
    with pytest.raises(OutDirError):
        run_folder_of(elsewhere)
