"""No write follows a link (harness.nofollow): a link planted where pdconform writes (the
lock, a run's results and reports, the trend page, a cell's folder, a found program, a log, a
history) is refused, one line and exit 2 from the command line, and what it points at is
left exactly as it was.  The tests run as root where the suite runs, as a CI runner would."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness import ROOT, nofollow
from harness.report.outdir import OutDirError, take_lock

NOOP = ["run", "--impl", "selftest", "--scenario", "selftest-noop"]


def pdconform(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


@pytest.fixture
def victim(tmp_path):
    """A file a link points at: it must stay as it is."""
    path = tmp_path / "victim"
    path.write_text("precious\n")
    return path


def unchanged(victim: Path) -> bool:
    return victim.read_text() == "precious\n"


# --- the primitives, one per kind of write --------------------------------------------------------

def test_write_atomic_refuses_a_link_at_the_file_and_in_its_path(tmp_path, victim):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "results.json").symlink_to(victim)
    with pytest.raises(nofollow.LinkRefused, match="symbolic link"):
        nofollow.write_atomic(tmp_path / "out" / "results.json", b"x")
    assert unchanged(victim) and (tmp_path / "out" / "results.json").is_symlink()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "out" / "cells").symlink_to(elsewhere)
    with pytest.raises(nofollow.LinkRefused):
        nofollow.write_atomic(tmp_path / "out" / "cells" / "x" / "cell.json", b"x")
    assert list(elsewhere.iterdir()) == []  # not even the folder was made through the link
    assert {p.name for p in (tmp_path / "out").iterdir()} == {"results.json", "cells"}  # no temporary file left


def test_write_atomic_writes_a_plain_file_with_the_mode_open_gives(tmp_path):
    path = tmp_path / "a" / "b" / "report.md"
    nofollow.write_atomic(path, b"one")
    nofollow.write_atomic(path, b"two")
    assert path.read_bytes() == b"two" and oct(path.stat().st_mode & 0o777) == oct(0o666 & ~_umask())
    assert [p.name for p in path.parent.iterdir()] == ["report.md"]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.parametrize("append", [False, True])
def test_a_log_or_history_is_never_opened_through_a_link(tmp_path, victim, append):
    (tmp_path / "history.jsonl").symlink_to(victim)
    with pytest.raises(nofollow.LinkRefused):
        nofollow.open_write(tmp_path / "history.jsonl", append=append)
    dangling = tmp_path / "prefill.log"
    dangling.symlink_to(tmp_path / "made-by-the-link")
    with pytest.raises(nofollow.LinkRefused):
        nofollow.open_write(dangling, append=append)
    assert unchanged(victim) and not (tmp_path / "made-by-the-link").exists()


def test_a_fifo_where_a_file_goes_is_refused_at_once(tmp_path):
    os.mkfifo(tmp_path / "cell.log")
    with pytest.raises(nofollow.LinkRefused, match="not a plain file"):
        nofollow.open_write(tmp_path / "cell.log")
    with pytest.raises(nofollow.LinkRefused, match="not a plain file"):
        nofollow.write_atomic(tmp_path / "cell.log", b"x")


@pytest.mark.parametrize("dangling", [False, True])
def test_the_lock_follows_no_link(tmp_path, victim, dangling):
    target = tmp_path / "nothing-here" if dangling else victim
    (tmp_path / ".pdconform.lock").symlink_to(target)
    with pytest.raises(OutDirError, match="symbolic link"):
        take_lock(tmp_path, "writing into")
    assert unchanged(victim) and not (tmp_path / "nothing-here").exists()


# --- through the command line: exit 2, one line, the target as it was -----------------------------

@pytest.mark.parametrize("dangling", [False, True])
def test_run_refuses_a_linked_lock(tmp_path, victim, dangling):
    out = tmp_path / "out"
    out.mkdir()
    target = tmp_path / "created-by-root" if dangling else victim
    (out / ".pdconform.lock").symlink_to(target)
    ran = pdconform(*NOOP, "--out", str(out))
    assert ran.returncode == 2 and "symbolic link" in ran.stderr and "Traceback" not in ran.stderr, ran.stderr
    assert len(ran.stderr.strip().splitlines()) == 1
    assert unchanged(victim) and not (tmp_path / "created-by-root").exists() and not (out / "runs").exists()


def test_run_refuses_a_linked_trend_page_before_running_anything(tmp_path, victim):
    out = tmp_path / "out"
    out.mkdir()
    (out / "trend.html").symlink_to(victim)
    ran = pdconform(*NOOP, "--out", str(out))
    assert ran.returncode == 2 and "trend.html is a symbolic link" in ran.stderr, ran.stderr
    assert unchanged(victim) and not (out / "runs").exists()


def test_a_foreign_trend_page_is_left_and_said(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "trend.html").write_text("mine")
    ran = pdconform(*NOOP, "--out", str(out))
    assert ran.returncode == 0 and "trend.html: not pdconform's, left as it is" in ran.stderr, ran.stderr
    assert (out / "trend.html").read_text() == "mine"


@pytest.mark.parametrize("planted", ["results.json", "summary.md", "index.html", "junit.xml", "cells"])
def test_judge_refuses_links_planted_in_a_stored_run(tmp_path, victim, planted):
    out = tmp_path / "out"
    assert pdconform(*NOOP, "--out", str(out)).returncode == 0
    run = (out / "latest").resolve()
    spot = run / planted
    if planted == "cells":  # a cell's folder replaced by a link to a folder of the victim's
        folder = tmp_path / "victim-folder"
        folder.mkdir()
        for cell in (run / "cells").iterdir():
            (cell / "history.jsonl").rename(folder / "history.jsonl")
            (folder / "cell.json").write_text("precious\n")
            cell.rename(tmp_path / "moved")
            cell.symlink_to(folder)
        target = folder / "cell.json"
    else:
        spot.unlink()
        spot.symlink_to(victim)
        target = victim
    judged = pdconform("judge", str(run))
    assert judged.returncode == 2 and "symbolic link" in judged.stderr and "Traceback" not in judged.stderr, \
        judged.stdout + judged.stderr
    assert target.read_text() == "precious\n"


def test_expectations_update_keeps_a_link_it_read_from_results_json(tmp_path, victim):
    """The file a run names is rewritten only where it is: a link there is refused, its target kept."""
    import json

    out = tmp_path / "out"
    assert pdconform(*NOOP, "--out", str(out)).returncode == 0
    run = (out / "latest").resolve()
    link = tmp_path / "expectations.toml"
    link.symlink_to(victim)
    results = json.loads((run / "results.json").read_text())
    results["expectations"] = str(link)
    results["cells"][0]["expected"] = "FAIL"  # a fix: the updater wants to remove an entry
    (run / "results.json").write_text(json.dumps(results))
    victim.write_text('sglang = "0.5.23"\n\n[[expect]]\nscenario = "selftest-noop"\nimpl = "selftest"\n'
                      'verdict = "FAIL"\nreason = "r"\nlink = "l"\n')
    before = victim.read_text()
    done = pdconform("expectations", "update", str(run))
    assert done.returncode == 2 and "symbolic link" in done.stderr, done.stdout + done.stderr
    assert victim.read_text() == before and "removed" not in done.stdout  # nothing claimed that was not written


def test_a_found_program_is_never_written_through_a_link(tmp_path, victim):
    from harness.explore.found import SUFFIX, program_id, write_found
    from harness.explore.program_model import Program
    from harness.spec.steps import StartRoles

    program = Program((StartRoles(),))
    folder = tmp_path / "found"
    folder.mkdir()
    (folder / f"{program_id(program, 'nixl')}{SUFFIX}").symlink_to(victim)
    with pytest.raises(nofollow.LinkRefused):
        write_found(program, "nixl", {"check": "c", "requirement": "R"}, folder, {})
    assert unchanged(victim)
