"""Fork servers kept across a process's runs (harness.drive.kept_servers): the test suite's runs share them."""

import os
from pathlib import Path

import pytest

from cellruns import run_cells
from harness.drive import kept_servers
from harness.drive.forkserver_client import _running
from harness.spec.scenario import get_scenario


def _bases() -> dict:
    return {k: s for k, s in kept_servers._kept.items() if len(k) == 4}


@pytest.mark.fresh_fork_servers  # its own keeping, started and ended here
def test_a_kept_fork_server_serves_the_next_run_until_it_dies_and_close_all_ends_it(tmp_path):
    kept_servers.close_all()
    kept_servers.keep(True)
    try:
        scenarios = [get_scenario("selftest-leak-thread"), get_scenario("selftest-clean")]
        first = run_cells(["selftest"], scenarios, tmp_path / "a", jobs=2)
        (server,) = _bases().values()
        pid = server.process.pid
        assert _running(pid)  # the run ended; its fork server did not
        assert not list((tmp_path / "a").glob("forkserver-*.log"))  # it logs in its own socket folder
        assert server.log_path.parent == Path(server.socket_path).parent and server.log_path.is_file()
        second = run_cells(["selftest"], scenarios, tmp_path / "b", jobs=2)
        assert [c.verdict for c in first.cells] == [c.verdict for c in second.cells] == ["PASS", "PASS"]
        assert list(_bases().values()) == [server]  # the same process forked the second run's cells
        os.environ["PDCONFORM_KEPT_SERVER_PROBE"] = "1"  # another environment: another fork server
        try:
            run_cells(["selftest"], scenarios[1:], tmp_path / "d", jobs=1)
        finally:
            del os.environ["PDCONFORM_KEPT_SERVER_PROBE"]
        assert len(_bases()) == 2
        server.process.kill()
        server.process.wait(10)
        third = run_cells(["selftest"], scenarios[1:], tmp_path / "e", jobs=1)
        assert third.cells[0].verdict == "PASS"
        assert server not in _bases().values() and len(_bases()) == 2  # the dead one replaced
        folders, pids = [s.log_path.parent for s in _bases().values()], [s.process.pid for s in _bases().values()]
        other = run_cells(["reference"], [get_scenario("happy-path")], tmp_path / "f", jobs=1)
        assert other.cells[0].verdict == "PASS" and len(_bases()) == 3  # another preload: another server
    finally:
        kept_servers.close_all()
    assert not any(f.exists() for f in folders) and not any(_running(p) for p in pids) and not kept_servers._kept


def test_keeping_is_capped_and_the_oldest_is_closed():
    class Fake:
        def __init__(self):
            self.closed = False

        def close(self):
            self.closed = True

    kept_servers.keep(True)
    saved = dict(kept_servers._kept)
    kept_servers._kept.clear()
    try:
        fakes = [Fake() for _ in range(kept_servers.MAX_KEPT + 2)]
        for i, fake in enumerate(fakes):
            kept_servers.put(("python", (), f"group{i}"), fake)
        assert [f.closed for f in fakes] == [True, True] + [False] * kept_servers.MAX_KEPT
        assert len(kept_servers._kept) == kept_servers.MAX_KEPT
    finally:
        kept_servers._kept.clear()
        kept_servers._kept.update(saved)
