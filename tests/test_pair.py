"""Long-lived role pairs (harness.drive.pair): a pair serves many programs on one set of roles,
each judged as a fresh cell would be; it ends after a program it cannot vouch for; what reuse
gives up is checked (the same programs alone and on a pair: the same verdicts), and a
failure only a pair shows is never shrunk or written out."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_explore import _programs

from harness.drive.pair import kept
from harness.spec.rooms import MAX_SHIFTS, ROOM_STRIDE
from harness.spec import steps as s
from harness.spec.history import Event


OK_OBS = {"prefill": {"type": Event.OK, "value": {"loops": {"control": True}, "dead_threads": []}}}


def test_a_pair_ends_after_a_program_it_cannot_vouch_for():
    plain = [s.StartRoles(), s.OpenRoom(1 << 40), s.Sleep(0.05), s.EngineFaults("prefill", delay_s=0.05)]
    done = {"outcome": "completed"}
    assert kept(plain, done, OK_OBS, alive=True) == ""
    assert "RestartRole" in kept(plain + [s.RestartRole("prefill")], done, OK_OBS, alive=True)
    assert "EngineFaults" in kept(plain + [s.EngineFaults("prefill", never_complete=True)], done, OK_OBS, True)
    assert "aborted" in kept(plain, {"outcome": "aborted"}, OK_OBS, alive=True)
    assert "ended" in kept(plain, done, OK_OBS, alive=False)
    dead = {"decode": {"type": Event.OK, "value": {"loops": {"control": False}, "dead_threads": []}}}
    assert "died" in kept(plain, done, dead, alive=True)
    thread = {"decode": {"type": Event.OK, "value": {"loops": {}, "dead_threads": [{"thread": "t"}]}}}
    assert "died" in kept(plain, done, thread, alive=True)
    assert "observed" in kept(plain, done, {"decode": {"type": Event.FAIL}}, alive=True)


def test_fault_free_programs_hold_no_fault_steps_and_shift_keeps_dp_engines():
    programs = _programs(30, faults=False)
    faulty = (s.EngineFaults, s.FreezeRole, s.RestartRole, s.InjectFrames)
    assert all(not isinstance(st, faulty) for p in programs for st in p.steps)
    assert all(st.seconds < 1 for p in programs for st in p.steps if isinstance(st, s.Sleep))
    p = max(programs, key=lambda p: len(p.steps))
    moved = p.shifted(7)
    pairs = [(a.room, b.room) for a, b in zip(p.steps, moved.steps) if hasattr(a, "room")]
    assert pairs and all(b == a + 7 * ROOM_STRIDE and b % 8 == a % 8 and b % 3 == a % 3 for a, b in pairs)
    assert max(b for _, b in pairs) < 2**63 and [c.name for c in moved.checks()] == [c.name for c in p.checks()]
    assert p.shifted(MAX_SHIFTS).steps[1].room < 2**63
    with pytest.raises(ValueError):
        p.shifted(MAX_SHIFTS + 1)


@pytest.mark.e2e
def test_programs_on_a_long_lived_pair_judge_as_they_do_alone(tmp_path):
    """The isolation reuse gives up, checked: the same fault-free programs (and a few with
    faults) give the same verdicts alone and on one pair; the pair's roles were reused."""
    from harness.explore.session import Explorer
    from harness.spec import history as hist
    from harness.target.sglang import installed_target

    programs = _programs(5, faults=False) + _programs(3)
    with Explorer(installed_target(), tmp_path / "out", tmp_path / "found") as explorer:
        explorer.start(["reference"])
        alone_cells = [explorer.run_program(p, "reference", f"alone-{i}", alone=True) for i, p in enumerate(programs)]
        alone = [cell.verdict for cell in alone_cells]
        paired, reused, why, paired_cells = [], 0, [], []
        for i, p in enumerate(programs):
            cell = explorer.run_program(p, "reference", f"pair-{i}")
            paired.append(cell.verdict)
            paired_cells.append(cell)
            if cell.verdict != alone[i]:  # what differed, said (a mismatch seen once under make test's load)
                why.append((i, cell.reason, cell.starved, alone_cells[i].reason))
            start = next(e for e in hist.load(Path(cell.workdir) / "history.jsonl") if e["op"] == hist.Op.CELL_START)
            reused += start["value"]["pair"]["reused"]
        red = [(i, c.reason) for i, c in enumerate(alone_cells) if c.verdict not in ("PASS", "WARN")]
        # a timing bound a starved machine broke is counted apart (harness.judge.load), here as in run
        loaded = {i for i, c in enumerate(alone_cells) if c.timing_only and c.starved}
        loaded |= {i for i, c in enumerate(paired_cells) if c.timing_only and c.starved}
        kept = [i for i in range(len(programs)) if i not in loaded]
        assert [paired[i] for i in kept] == [alone[i] for i in kept], (alone, paired, why, red)
        assert {alone[i] for i in kept} <= {"PASS", "WARN"}, (alone, red)
        assert len(kept) >= len(programs) - 2, f"too many cells starved to compare: {sorted(loaded)}"
        assert reused >= 4, "the pair's roles were started again for most programs"
        assert any(p.open for p in explorer.pairs.values())
        pairs = [(p.process.pid, p.socket_dir) for p in explorer.pairs.values() if p.open]
    for pid, folder in pairs:  # closed with the explorer: the pair's process group is gone, its socket folder too
        with pytest.raises(ProcessLookupError):
            os.killpg(pid, 0)
        assert not os.path.exists(folder)


def _written(program) -> tuple[set[int], set[int]]:
    """(decode pages ``program`` writes and its checks expect written, decode pages its checks skip)."""
    verify = [st for st in program.steps if isinstance(st, s.VerifyPools)][-1]
    return {d for _, d in verify.kv_moves}, set(verify.unchecked_kv)


@pytest.mark.e2e
def test_a_pair_that_leaves_the_last_programs_bytes_is_caught_by_the_alone_comparison(tmp_path, monkeypatch):
    """The reuse leak the comparison exists for, planted: begin_program does not write the pools'
    pattern again (PLANT_STALE_POOLS_ENV), so a program on a reused pair sees the bytes an
    earlier one left.  Two generated programs on the same roles, the first writing a decode page
    the second neither writes nor skips: alone the second passes, after the first on the pair
    it fails the byte check."""
    from harness.explore.session import Explorer
    from harness.role.pools import PLANT_STALE_POOLS_ENV
    from harness.target.sglang import installed_target

    monkeypatch.setenv(PLANT_STALE_POOLS_ENV, "1")  # before the fork server starts: its roles inherit it
    programs = [p for p in _programs(30, faults=False) if any(isinstance(st, s.VerifyPools) for st in p.steps)]
    first, second = next((a, b) for a in programs for b in programs
                         if a.steps[0] == b.steps[0] and _written(a)[0] - _written(b)[0] - _written(b)[1])
    with Explorer(installed_target(), tmp_path / "out", tmp_path / "found", note=lambda line: None) as explorer:
        explorer.start(["reference"])
        alone = explorer.run_program(second, "reference", "alone", alone=True)
        before = explorer.run_program(first, "reference", "pair-first")
        after = explorer.run_program(second, "reference", "pair-second")
    assert alone.verdict in ("PASS", "WARN") and before.verdict in ("PASS", "WARN"), (alone.reason, before.reason)
    assert after.verdict == "FAIL", "stale pools passed on a reused pair"
    failed = {(ch["requirement"], ch["name"]) for ch in after.checks if ch["ok"] is False}
    assert any("bytes" in name or "pool" in name for _, name in failed), failed


@pytest.mark.e2e
def test_a_failure_only_a_pair_shows_is_counted_not_shrunk(tmp_path, monkeypatch):
    """A planted pair-only failure (the pair's cell judged FAIL, the same program passing in a
    fresh cell): explore counts it as pair-only and writes no found program."""
    from harness.explore import session
    import msgspec

    real = session.Explorer.run_scenario_file

    def planted(self, path, impl, workdir, program=None, lane=None):
        cell = real(self, path, impl, workdir, program, lane)
        if lane is None:  # a fresh cell judges as it is
            return cell
        check = {"name": "bytes-exact", "requirement": "R-LAYOUT-1", "ok": False, "level": "MUST"}
        return msgspec.structs.replace(cell, verdict="FAIL", checks=[check])

    monkeypatch.setattr(session.Explorer, "run_scenario_file", planted)
    from harness.target.sglang import installed_target

    with session.Explorer(installed_target(), tmp_path / "out", tmp_path / "found", note=lambda line: None) as explorer:
        explorer.faults = False
        explorer.start(["reference"])
        report = explorer.explore("reference", 3.0, corpus=False, max_failures=1)
    assert report.pair_only and report.pair_only[0][0].startswith("R-LAYOUT-1|bytes-exact|reference")
    assert not report.failures and not list((tmp_path / "found").glob("*"))


def test_a_failure_the_reference_shows_too_is_disputed_not_found(tmp_path, monkeypatch):
    """The per-program diff against the reference: a planted failure that every cell shows, the
    reference's too, is pdconform's problem (the spec fixes a program's outcome and the reference
    is the spec's): explore counts it as disputed and writes no found program."""
    from harness import implementations
    from harness.explore import session
    import msgspec

    real = session.Explorer.run_scenario_file

    def planted(self, path, impl, workdir, program=None, lane=None):
        check = {"name": "bytes-exact", "requirement": "R-LAYOUT-1", "ok": False, "level": "MUST"}
        return msgspec.structs.replace(real(self, path, impl, workdir, program, lane), verdict="FAIL", checks=[check])

    monkeypatch.setattr(session.Explorer, "run_scenario_file", planted)
    monkeypatch.setenv(implementations.MUTANTS_ENV, "1")
    implementations.registered.cache_clear()
    from harness.target.sglang import installed_target

    mutant = "mutant.aux-slot-off-by-one"
    try:
        with session.Explorer(installed_target(), tmp_path / "out", tmp_path / "found", note=lambda line: None) as ex:
            ex.faults = False
            ex.start([mutant])
            report = ex.explore(mutant, 3.0, corpus=False, max_failures=1)
    finally:
        implementations.registered.cache_clear()
    assert report.disputed and report.disputed[0][1].startswith("R-LAYOUT-1|bytes-exact|reference")
    assert not report.failures and not list((tmp_path / "found").glob("found-*"))  # no finding of the backend's
    # the reference's own failure is an oracle failure, written apart (harness.explore.oracle)
    assert [f.path.parent for f in report.oracle.values()] == [tmp_path / "found" / "oracle"]
    assert (tmp_path / "out" / mutant / "disputed-1.json").is_file()


def test_an_error_of_pdconforms_own_while_judging_stops_explore(tmp_path, monkeypatch):
    """A bug in explore itself (here: planted in the reference diff) must not pass for a flaky
    program: hypothesis would shrink it, see another outcome on the replay and drop it."""
    from harness.explore import session

    def broken(self, *args):
        raise RuntimeError("planted: the reference diff broke")

    real = session.Explorer.run_scenario_file

    def failing(self, path, impl, workdir, program=None, lane=None):
        import msgspec

        check = {"name": "bytes-exact", "requirement": "R-LAYOUT-1", "ok": False, "level": "MUST"}
        return msgspec.structs.replace(real(self, path, impl, workdir, program, lane), verdict="FAIL", checks=[check])

    monkeypatch.setattr(session.Explorer, "run_scenario_file", failing)
    monkeypatch.setattr(session.Explorer, "_reference_fails_too", broken)
    from harness.target.sglang import installed_target

    with session.Explorer(installed_target(), tmp_path / "out", tmp_path / "found", note=lambda line: None) as ex:
        ex.faults = False
        ex.start(["reference"])
        with pytest.raises(RuntimeError, match="planted: the reference diff broke"):
            ex.explore("reference", 3.0, corpus=False, max_failures=1)
