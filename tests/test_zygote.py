"""The fork server's start: a run starts its zygotes without waiting, then waits per group."""

import pytest

from harness.drive.scheduler import fork_groups
from harness.drive.forkserver_client import Zygote, ZygoteError


def test_a_zygote_started_without_waiting_becomes_ready_and_forks(tmp_path):
    zygote = Zygote(impls=["reference"], wait=False, log_dir=tmp_path, log_name="zygote-reference.log")
    try:
        assert not zygote.ready_now()  # importing torch takes seconds; the constructor did not wait
        client = zygote.wait_ready()
        assert zygote.ready_now() and zygote.wait_ready() is client
        assert client.call({"op": "ping"})["pid"] == zygote.info["pid"]
        assert zygote.info["threads"] <= 2  # still safe to fork: no thread but torch's own
    finally:
        zygote.close()
    assert (tmp_path / "zygote-reference.log").exists()


def test_a_zygote_that_dies_while_importing_fails_every_wait_the_same_way(tmp_path):
    zygote = Zygote(python="/bin/false", wait=False, log_dir=tmp_path)
    try:
        with pytest.raises(ZygoteError, match="exited with code 1 while importing") as first:
            zygote.wait_ready()
        with pytest.raises(ZygoteError) as second:
            zygote.wait_ready()
        assert str(first.value) == str(second.value)
    finally:
        zygote.close()


def test_implementations_that_import_no_sglang_get_their_own_fork_server():
    assert fork_groups(["mooncake", "nixl", "reference"]) == {"sglang": ["mooncake", "nixl"], "plain": ["reference"]}
    assert fork_groups(["reference", "selftest"]) == {"plain": ["reference", "selftest"]}


def test_a_forked_cell_reports_the_cpu_time_of_itself_and_its_roles(tmp_path):
    from cellruns import run_cells
    from harness.spec.scenario import get_scenario

    fork, fresh = (run_cells(["selftest"], [get_scenario("selftest-clean")], tmp_path / name, fork=forked).cells[0]
                   for name, forked in (("fork", True), ("fresh", False)))
    assert fork.verdict == "PASS" and fork.cpu_s is not None
    assert 0 < fork.cpu_s < 2 * fork.duration_s + 1  # two roles and the cell, mostly waiting
    assert fresh.cpu_s is None  # fresh interpreters: not measured, not guessed


def test_hundreds_of_simultaneous_calls_are_all_answered(tmp_path):
    # With --jobs in the dozens every cell and role may ask the fork server at the same
    # moment; a short listen queue refused the overflow at once (EAGAIN) and the cells
    # became ERROR.
    from concurrent.futures import ThreadPoolExecutor

    zygote = Zygote(impls=[], wait=True, log_dir=tmp_path)
    try:
        client = zygote.wait_ready()
        # each fork keeps the server busy for a moment, so the calls queue up
        with ThreadPoolExecutor(max_workers=200) as pool:
            forked = list(pool.map(lambda i: client.fork("cell", ["--bad-argument"], tmp_path / f"{i}.log"),
                                   range(200)))
        assert all(p.wait(timeout=30) == 2 for p in forked)  # each ran (and refused the argument)
    finally:
        zygote.close()
