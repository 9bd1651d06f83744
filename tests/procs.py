"""Finding the harness processes a test left behind (shared by the runner and e2e tests)."""

import os
import time

import psutil


def harness_processes(workdir) -> list:
    """Cell, role and fork_server processes of one test (other runs on the machine are not ours):
    started ones name ``workdir`` on their command line; ones forked by the fork server keep the
    fork_server's command line but write their output into ``workdir``."""
    found = []
    for proc in psutil.process_iter(["cmdline", "pid"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        try:
            stdout = os.readlink(f"/proc/{proc.info['pid']}/fd/1")
        except OSError:
            stdout = ""
        ours = str(workdir) in cmd or stdout.startswith(str(workdir))
        if ours and any(m in cmd for m in ("harness.drive.cell", "harness.drive.role_host", "harness.drive.forkserver")):
            found.append(proc)
    return found


def harness_processes_after(workdir, timeout_s: float = 10.0) -> list:
    """:func:`harness_processes` once they have had up to ``timeout_s`` seconds to go: a process
    whose parent was killed ends on its own watch (the cell's every 0.5 s, a role's on its
    parent's exit), later on a loaded machine than on an idle one; [] as soon as none is left."""
    deadline = time.monotonic() + timeout_s
    while (found := harness_processes(workdir)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return found
