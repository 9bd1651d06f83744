"""The fork server's start: a run starts its fork_servers without waiting, then waits per group."""

import os

import pytest

from harness.drive.fork_servers import fork_groups
from harness.drive.forkserver_client import ForkServer, ForkServerError


def test_a_zygote_started_without_waiting_becomes_ready_and_forks(tmp_path):
    fork_server = ForkServer(impls=["reference"], wait=False, log_dir=tmp_path, log_name="forkserver-reference.log")
    try:
        assert not fork_server.ready_now()  # importing torch takes seconds; the constructor did not wait
        client = fork_server.wait_ready()
        assert fork_server.ready_now() and fork_server.wait_ready() is client
        assert client.call({"op": "ping"})["pid"] == fork_server.info["pid"]
        assert fork_server.info["threads"] <= 2  # still safe to fork: no thread but torch's own
    finally:
        fork_server.close()
    assert (tmp_path / "forkserver-reference.log").exists()


def test_a_zygote_that_dies_while_importing_fails_every_wait_the_same_way(tmp_path):
    fork_server = ForkServer(python="/bin/false", wait=False, log_dir=tmp_path)
    try:
        with pytest.raises(ForkServerError, match="exited with code 1 while importing") as first:
            fork_server.wait_ready()
        with pytest.raises(ForkServerError) as second:
            fork_server.wait_ready()
        assert str(first.value) == str(second.value)
    finally:
        fork_server.close()


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

    fork_server = ForkServer(impls=[], wait=True, log_dir=tmp_path)
    try:
        client = fork_server.wait_ready()
        # each fork keeps the server busy for a moment, so the calls queue up
        with ThreadPoolExecutor(max_workers=200) as pool:
            forked = list(pool.map(lambda i: client.fork("cell", ["--bad-argument"], tmp_path / f"{i}.log"),
                                   range(200)))
        assert all(p.wait(timeout=30) == 2 for p in forked)  # each ran (and refused the argument)
    finally:
        fork_server.close()


def test_a_killed_runs_fork_server_folder_is_removed_at_the_next_start(tmp_path):
    import os
    import subprocess
    import tempfile
    from pathlib import Path

    from harness.drive.forkserver_client import DIR_PREFIX, OWNER_FILE, remove_stale_dirs

    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid that no longer runs
    stale = Path(tempfile.mkdtemp(prefix=DIR_PREFIX))
    (stale / OWNER_FILE).write_text(str(dead.pid))
    (stale / "fork_server.sock").write_text("")
    alive = Path(tempfile.mkdtemp(prefix=DIR_PREFIX))
    (alive / OWNER_FILE).write_text(str(os.getpid()))
    foreign = Path(tempfile.mkdtemp(prefix=DIR_PREFIX))  # no owner file: not ours to judge
    try:
        assert stale in remove_stale_dirs()
        assert not stale.exists() and alive.is_dir() and foreign.is_dir()
    finally:
        for folder in (alive, foreign):
            (folder / OWNER_FILE).unlink(missing_ok=True)
            folder.rmdir()


def test_a_client_that_gives_up_neither_ends_the_fork_server_nor_leaves_its_child_running(tmp_path):
    # A client whose fork call timed out closed its socket before the reply: the fork server
    # died of the broken pipe (every later cell of that run fell back to a fresh interpreter,
    # and at load 15 most of them timed out). Now it ends the child nobody heard of and goes on.
    import json
    import os
    import signal
    import socket
    import time

    from harness.drive.contain import children

    fork_server = ForkServer(impls=[], wait=True, log_dir=tmp_path)
    try:
        client = fork_server.wait_ready()
        server = client.call({"op": "ping"})["pid"]
        request = {"op": "fork", "kind": "role", "log": str(tmp_path / "role.log"), "env": {}, "pgid": None,
                   "cwd": str(tmp_path), "netns": None,
                   "argv": ["--impl", "selftest", "--role", "prefill", "--ready-file", str(tmp_path / "ready"),
                            "--parent-pid", str(os.getpid())]}
        os.kill(server, signal.SIGSTOP)  # the request is read only after its client has gone
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.connect(client.path)
                sock.sendall(json.dumps(request).encode() + b"\n")
        finally:
            os.kill(server, signal.SIGCONT)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and "ended child" not in (tmp_path / "forkserver.log").read_text():
            time.sleep(0.05)
        while time.monotonic() < deadline and children(server):
            time.sleep(0.05)
        assert children(server) == []  # the unclaimed role was killed and reaped
        assert client.call({"op": "ping"})["pid"] == server  # and the fork server still serves
        assert client.fork("cell", ["--bad-argument"], tmp_path / "next.log").wait(timeout=30) == 2
    finally:
        fork_server.close()


def test_a_wait_is_held_by_the_server_until_its_child_exits_and_others_are_answered_meanwhile(tmp_path):
    # A waiting client used to ask "status" 20 times a second (12,000 requests in a 78-cell
    # matrix, a fifth of the fork server's CPU); now the server holds one "wait" per waiter.
    import os
    import signal
    import subprocess
    import threading
    import time

    fork_server = ForkServer(impls=[], wait=True, log_dir=tmp_path)
    try:
        client = fork_server.wait_ready()
        role = client.fork("role", ["--impl", "selftest", "--role", "prefill", "--ready-file",
                                    str(tmp_path / "ready"), "--parent-pid", str(os.getpid())], tmp_path / "role.log")
        started = time.monotonic()
        with pytest.raises(subprocess.TimeoutExpired):
            role.wait(timeout=0.5)  # still running: the held wait ends at its timeout, not before
        assert 0.45 < time.monotonic() - started < 5
        ended: list[float] = []
        waiter = threading.Thread(target=lambda: (role.wait(timeout=30), ended.append(time.monotonic())))
        waiter.start()
        time.sleep(0.3)
        assert not ended and client.call({"op": "ping"})["ok"]  # a held wait does not block the others
        killed = time.monotonic()
        os.kill(role.pid, signal.SIGKILL)
        waiter.join(timeout=10)
        assert ended and ended[0] - killed < 1.0  # answered at the exit (SIGCHLD wakes the server)
        assert role.returncode == -signal.SIGKILL and role.wait(timeout=1) == -signal.SIGKILL
    finally:
        fork_server.close()


def test_nixl_cells_come_from_a_fork_server_of_their_own_that_alone_holds_ucx(tmp_path):
    # Loading nixl's UCX plugin patches libc's mmap family: it happens once, in NIXL's own
    # fork server (forked from the shared one), and never in the shared one, whose
    # Mooncake and Mori roles must run without UCX's memory hooks.
    from harness.drive.forkserver_client import OwnForkServer
    from harness.drive.fork_servers import fork_group

    assert fork_group("nixl") == "sglang-nixl" and fork_group("mooncake") == "sglang"

    def has_ucx(pid: int) -> bool:
        return any(line.rstrip().endswith("/libplugin_UCX.so") for line in open(f"/proc/{pid}/maps"))

    base = ForkServer(impls=["mooncake", "nixl"], wait=False, log_dir=tmp_path)
    own = OwnForkServer(base, "nixl", log_dir=tmp_path)
    try:
        assert not own.ready_now()  # nothing forks it before its base is ready
        client = own.wait_ready()
        pid = client.call({"op": "ping"})["pid"]
        assert pid == own.pid != base.info["pid"]
        assert has_ucx(pid) and not has_ucx(base.info["pid"])
        assert own.info["threads"] == 1  # loading UCX started no thread (torch's stayed in the base): safe to fork
    finally:
        own.close()
        base.close()
    from harness.drive.forkserver_client import _running

    assert not _running(own.pid)  # close() returned once it had ended


def test_a_fork_server_backs_its_preloaded_heap_with_huge_pages(tmp_path):
    # Each fork then copies a page-table entry per 2 MB instead of 512 (docs/performance.md).
    import subprocess
    import sys

    probe = ("import sys; from harness.drive.forkserver import collapse_to_huge_pages as c; "
             "b = bytearray(64 << 20); b[::4096] = b'x' * (len(b) // 4096); n = c(); "
             "huge = [int(l.split()[1]) for l in open('/proc/self/smaps_rollup') if l.startswith('AnonHugePages')][0]; "
             "print(n >> 20, huge >> 10)")
    done, huge = map(int, subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                                         timeout=60).stdout.split())
    thp = open("/sys/kernel/mm/transparent_hugepage/enabled").read() if os.path.exists(
        "/sys/kernel/mm/transparent_hugepage/enabled") else "[never]"
    if done == 0 and (tuple(map(int, os.uname().release.split(".")[:2])) < (6, 1) or "[never]" in thp):
        pytest.skip("no MADV_COLLAPSE here (Linux < 6.1 or THP never): the fork server skips it too")
    assert done >= 60 and huge >= 60  # MiB: the 64 MiB buffer, collapsed and mapped as huge pages
