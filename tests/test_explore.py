"""pdconform explore: generated programs are legal and replay as data; the reference
survives a short exploration; a planted bug is found, shrunk, written out and replays."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import get_state_machine_test

from harness.explore.program import ProgramMachine
from harness.explore.program_file import program_from_json
from harness.spec.steps import (Abort, AwaitStatus, Clear, EngineFaults, FreezeRole, InitSender, KillRole, OpenRoom,
                                SendChunk, ThawRole, VerifyPools)

#: how a misplaced write shows in a generated program: its own row is still unwritten when the room
#: reads Success (explore's bytes-at-success), and never written (bytes-exact); the first to fail names it
BYTES_CHECKS = {("R-XFER-2", "bytes-at-success"), ("R-LAYOUT-1", "bytes-exact")}


def _programs(n: int = 40, faults: bool = True):
    """``n`` programs as explore writes them (``faults`` False: fault-free ones), none run."""
    out = []

    class Collect(ProgramMachine):
        def teardown(self):
            out.append(self.program())

    Collect.faults = faults

    get_state_machine_test(Collect, settings=settings(max_examples=n, stateful_step_count=8, deadline=None,
                                                      database=None, phases=(Phase.generate,),
                                                      suppress_health_check=list(HealthCheck)))()
    return out


def test_generated_programs_are_legal_for_a_scheduler_and_replay_as_data():
    programs = _programs()
    assert len({p.to_json() for p in programs}) > 10  # programs, not one program many times
    for p in programs:
        assert program_from_json(p.to_json()) == p
        opened, inited, concluded, dst_pages, frozen, dead = set(), set(), set(), [], set(), ""
        unscheduled = set()
        for step in p.steps:
            dead = step.role if isinstance(step, KillRole) else dead
            if isinstance(step, (FreezeRole, ThawRole)):
                assert (step.role in frozen) == isinstance(step, ThawRole), "a freeze without its thaw"
                frozen ^= {step.role}
            assert not isinstance(step, EngineFaults) or step.role in p.steps[0].prefills
            room = getattr(step, "room", None)
            if isinstance(step, OpenRoom):
                assert room not in opened, "a room id reused before its lifecycle was cleared"
                opened.add(room)
                unscheduled |= {room} if not step.open_sender else set()
            elif isinstance(step, InitSender):
                assert room in opened and room not in inited
                inited.add(room)
            elif isinstance(step, SendChunk):
                assert room in inited, "a chunk before the sender's init"
            elif isinstance(step, Abort):
                assert room in opened and step.role == "decode"
                concluded |= {room} & unscheduled  # a registration no prefill took ends with its abort
            elif isinstance(step, AwaitStatus) and step.label:  # a conclusion poll, not a read in passing
                concluded.add(room)
            elif isinstance(step, Clear) and (step.role == "decode" or dead == "decode"):  # the lifecycle's last
                assert room in concluded, "cleared before both sides concluded"
                opened.discard(room)
                inited.discard(room)
                concluded.discard(room)
            elif isinstance(step, VerifyPools):
                dst_pages = [d for _, d in step.kv_moves] + list(step.unchecked_kv)
        assert len(dst_pages) == len(set(dst_pages)), "two lifecycles wrote the same decode page"
        opened -= unscheduled if dead == "decode" else set()  # a dead decode's registrations no prefill took: gone
        assert not opened and not frozen, "the program ends with a room not cleared or a role frozen"
        labels = [x[0] for x in p.lifecycles]
        polled = {s.label for s in p.steps if isinstance(s, AwaitStatus) and s.label}
        assert len(labels) == len(set(labels)) and polled == set(labels), "a lifecycle its checks cannot find"


def test_a_program_file_that_is_not_one_is_refused():
    good = json.loads(next(p for p in _programs(20) if p.steps[0].prefills == ("prefill",)).to_json())
    start = good["steps"][0]
    big = base64.b64encode(b"x" * 5000).decode()
    inject = {"step": "InjectFrames", "role": "prefill", "frames": [["eA==", "MQ=="]]}
    program_from_json(json.dumps({**good, "steps": [start, inject]}))  # a message a program may hold
    program_from_json(json.dumps({**good, "steps": [start, {"step": "KillRole", "role": "decode"}]}))  # a kill
    bad = [{"steps": [{"step": "Popen", "args": ["rm"]}], "lifecycles": []},  # not a step
           {**good, "steps": [{**start, "env": [["LD_PRELOAD", "/tmp/x.so"]]}, *good["steps"][1:]]},  # roles' env
           {**good, "steps": [start, {"step": "KillRole", "role": "decode.tp1"}]},  # a kill programs never make
           {**good, "steps": [start, *[{"step": "KillRole", "role": "prefill"}] * 2]},  # a second kill
           {**good, "steps": [start, {"step": "KillRole", "role": "prefill"},  # a restart after a kill
                              {"step": "RestartRole", "role": "prefill"}]},
           {**good, "steps": [start, {"step": "KillRole", "role": "decode"},  # a step naming the dead role
                              {"step": "Clear", "room": 2**40, "role": "decode"}]},
           {**good, "steps": [start, {"step": "Clear", "room": 2**40, "role": "prefill-b"}]},  # a role not started
           {**good, "steps": [start, {"step": "SendChunk", "room": 2**40, "pages": [1], "prefill": "decode"}]},
           {**good, "steps": [start, {"step": "VerifyPools", "kv_moves": [], "aux_moves": [], "settle_s": 1e9}]},
           {**good, "steps": [start, {"step": "Sleep", "seconds": 1e9}]},  # an unbounded wait
           {**good, "steps": [start, {"step": "EngineFaults", "role": "decode", "never_complete": True}]},  # decode's
           {**good, "steps": [start, {"step": "EngineFaults", "role": "prefill", "fail_group": 1}]},
           {**good, "steps": [start, {"step": "InjectFrames", "role": "prefill", "frames": [[big]]}]},  # > 4 KiB
           {**good, "steps": [start, {"step": "InjectFrames", "role": "prefill", "frames": [["eA=="]] * 2}]},
           {**good, "steps": [start, {"step": "InjectFrames", "role": "bootstrap", "frames": [["eA=="]]}]},
           {**good, "steps": [start, {"step": "EngineFaults", "role": "prefill", "delay_s": 1e6}]},
           {**good, "steps": [start, {"step": "FreezeRole", "role": "decode"}]},  # left frozen
           {**good, "steps": [start, {"step": "ThawRole", "role": "decode"}]},  # a thaw with no freeze
           {**good, "steps": [start, {"step": "RestartRole", "role": "prefill", "env": [["LD_PRELOAD", "x"]]}]},
           {**good, "lifecycles": [["L0", float("inf")], 7]}, "[]", "[" * 100000]
    for doc in bad:
        with pytest.raises(ValueError, match="not a pdconform program"):
            program_from_json(doc if isinstance(doc, str) else json.dumps(doc))


@pytest.mark.e2e
def test_a_planted_bug_is_found_shrunk_and_replays(tmp_path, monkeypatch):
    from harness import implementations

    monkeypatch.setenv(implementations.MUTANTS_ENV, "1")
    implementations.registered.cache_clear()  # the registry lists the mutants only when asked
    found = tmp_path / "found"
    try:
        _explore_reference_and_mutant(tmp_path, found)
    finally:
        implementations.registered.cache_clear()


def _explore_reference_and_mutant(tmp_path, found):
    """The reference's own exploration is test_explore_on_the_reference_from_the_command_line_finds_nothing;
    here the mutant is explored with fault-free programs (the bug needs none, and they run ten
    times faster) and a shrinking bound of 20 s, so the test takes a fraction of a default search."""
    from harness.drive.contain import isolation_available
    from harness.spec import history as hist
    from harness.explore.found import load_file
    from harness.explore.session import Explorer, signature_of
    from harness.target.sglang import installed_target

    with Explorer(installed_target(), tmp_path / "out", found) as explorer:
        explorer.faults, explorer.shrink_s = False, 20.0  # under make test's load a shrink cell takes 2-3 s
        explorer.start(["reference", "mutant.aux-slot-off-by-one"])
        explorer.wait_ready()  # under make test's load the fork server's imports take seconds
        bug = explorer.explore("mutant.aux-slot-off-by-one", 90.0, max_failures=1)
        assert bug.failures, "90 s of programs never wrote an aux slot"
        (failure,) = bug.failures.values()
        # the slot it should have written is still unwritten at Success (R-XFER-2) and never written (R-LAYOUT-1)
        assert (failure.signature["requirement"], failure.signature["check"]) in BYTES_CHECKS
        assert failure.path and failure.path.parent == found
        # The smallest failing program seen, never bigger than the first: hypothesis shrinks the failing
        # example of its own round, which with lanes running ahead may be bigger than the first a lane
        # found (seen: 91 steps against 14), so within the bound it does not always get below the first.
        first, smallest = failure.first, failure.program
        assert smallest.size <= first.size and failure.shrink_runs >= 2, (smallest.size, first.size, failure.shrink_runs)
        # bench's explore_shrink_s times this: bounded by shrink_s, plus the cells then running
        assert 0 < failure.shrink_s < explorer.shrink_s + 60 and failure.shrink_runs >= 1
        scenario = load_file(failure.path)
        assert scenario.id == failure.path.stem and scenario.nightly
        again = explorer.run_scenario_file(failure.path, "mutant.aux-slot-off-by-one", tmp_path / "again")
        assert signature_of(again, "mutant.aux-slot-off-by-one") == failure.signature
        start = next(e for e in hist.load(Path(again.workdir) / "history.jsonl") if e["op"] == hist.Op.CELL_START)
        if isolation_available() is None:  # a program cell is as contained as a matrix cell
            assert start["value"]["network"].startswith("private network namespace"), start["value"]["network"]
        assert signature_of(explorer.run_scenario_file(failure.path, "reference", tmp_path / "ref"), "reference") is None


def test_explore_refuses_bad_usage_with_exit_2():
    for args in (["--impl", "reference", "--budget", "soon"], ["--impl", "nope"],
                 ["--impl", "reference", "--topology", "p9-d9"]):
        done = subprocess.run([sys.executable, "-m", "harness.cli", "explore", *args], capture_output=True, text=True,
                              timeout=120, env={**os.environ, "COLUMNS": "200"})
        assert done.returncode == 2 and "error:" in done.stderr and "Traceback" not in done.stderr, args


@pytest.mark.e2e
def test_explore_on_the_reference_from_the_command_line_finds_nothing(tmp_path):
    done = subprocess.run([sys.executable, "-m", "harness.cli", "explore", "--impl", "reference", "--budget", "4s",
                           "--found", str(tmp_path / "found"), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=240, env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "reference" in done.stdout and "none" in done.stdout and "Traceback" not in done.stderr
    assert not list((tmp_path / "found").glob("found-*"))


def _killed_prefill_program():
    """Two rooms in flight when the prefill is SIGKILLed: L0 with its first chunk sent (it must
    read Failed, naming the prefill: rooms-fail-after-kill) and L1 with every chunk sent and its
    aux held back 5 s, so the kill comes first (it must end: rooms-end-after-kill).  The shape
    of what the kill rule writes (ProgramMachine.kill_prefill), by hand so the test does not wait
    on a draw; the 5 s aux delay is longer than the rules draw (0.3 s), to win the race with the kill."""
    from harness.explore.program_model import KILL_BOUND_S, LAYOUT, PROFILES, Program
    from harness.spec.protocol import KVPoll
    from harness.spec.rooms import DONE
    from harness.spec.steps import KillRole, RequestKV, VerifyPools

    rooms, srcs, dsts = (2**41 + 7, 2**41 + 8), ((3, 9), (4, 10)), ((0, 1), (2, 5))
    opened = tuple(s for room, dst, aux in zip(rooms, dsts, (0, 1)) for s in (
        OpenRoom(room), RequestKV(room, dst, aux),
        AwaitStatus(room, "prefill", (KVPoll.WaitingForInput, KVPoll.Failed)),
        InitSender(room, 2, 5 + aux)))
    concluded = tuple(s for n, room in enumerate(rooms) for s in (
        AwaitStatus(room, "decode", DONE, label=f"L{n}", timeout_s=KILL_BOUND_S),
        VerifyPools(tuple(zip(srcs[n], dsts[n])), ((5 + n, n),), settle_s=0.0, label=f"L{n}")))
    steps = (PROFILES["plain"], *opened, EngineFaults("prefill", aux_delay_s=5.0),
             SendChunk(rooms[0], srcs[0][:1]), SendChunk(rooms[1], srcs[1][:1]), SendChunk(rooms[1], srcs[1][1:]),
             KillRole("prefill"), *concluded,
             VerifyPools((), (), unchecked_kv=dsts[0] + dsts[1], unchecked_aux=(0, 1)),
             Clear(rooms[0], "decode"), Clear(rooms[1], "decode"))
    assert LAYOUT.num_pages > max(srcs[0] + srcs[1] + dsts[0] + dsts[1])
    return Program(steps, (("L0", False, False, "fail"), ("L1", False, False, "end")))


def _late_success_program():
    """The decode aborts a room (Failed at once) while its delayed writes are outstanding, both
    sides conclude, and a later poll reads the room again: the shape of what the poll rule
    (ProgramMachine.poll) adds to a program, with writes 2 s late (the rules draw 0.05 or 0.2 s)
    so that the ABORT finds them outstanding however loaded the machine."""
    from harness.explore.program_model import LAYOUT, PROFILES, Program
    from harness.spec.protocol import KVPoll
    from harness.spec.rooms import DONE
    from harness.spec.steps import RequestKV, VerifyPools

    room, src, dst = 2**41 + 11, (2, 6), (0, 1)
    steps = (PROFILES["plain"], OpenRoom(room), RequestKV(room, dst, 0),
             AwaitStatus(room, "prefill", (KVPoll.WaitingForInput, KVPoll.Failed)), InitSender(room, 2, 3),
             # the mutant is armed only by an ABORT that finds writes outstanding: each lands 2 s after
             # it is issued (the reference's delays run side by side), and the ABORT waits until the
             # prefill reads Transferring (its writes issued). Under CI's load 0.2 s writes finished
             # before a slow ABORT, and a fast ABORT overtook the chunks: the mutant passed both times
             EngineFaults("prefill", delay_s=2.0), SendChunk(room, src[:1]), SendChunk(room, src[1:]),
             AwaitStatus(room, "prefill", (KVPoll.Transferring, KVPoll.Success)), Abort(room, "decode"),
             AwaitStatus(room, "decode", DONE, label="L0"),
             AwaitStatus(room, "prefill", DONE, label="L0"),
             # the decode polls on through the drain: a Success read ends the wait at once, a
             # conforming decode reads Failed for 5 s
             AwaitStatus(room, "decode", (KVPoll.Success,), timeout_s=5.0, must_come=False),
             VerifyPools((), (), unchecked_kv=dst, unchecked_aux=(0,)), Clear(room, "prefill"), Clear(room, "decode"))
    assert LAYOUT.num_pages > max(src)
    return Program(steps, (("L0", True, False, ""),))


@pytest.mark.e2e
def test_the_kill_and_poll_rules_pass_the_reference_and_catch_their_mutants(tmp_path, monkeypatch):
    from harness import implementations
    from harness.explore.session import Explorer, signature_of
    from harness.target.sglang import installed_target

    cases = [(_killed_prefill_program(), "no-heartbeat-checker", ("R-HB-1", "rooms-fail-after-kill")),
             (_late_success_program(), "failed-raised-to-success", ("R-TERM-1", "every-trail-terminal"))]
    monkeypatch.setenv(implementations.MUTANTS_ENV, "1")
    implementations.registered.cache_clear()
    try:
        with Explorer(installed_target(), tmp_path / "out", tmp_path / "found") as explorer:
            explorer.start(["reference", *(f"mutant.{m}" for _, m, _ in cases)])
            explorer.wait_ready()
            for program, mutant, caught_by in cases:
                assert program_from_json(program.to_json()) == program  # a found file of it replays
                good = explorer.run_program(program, "reference", alone=True, name=mutant)
                assert good.verdict == "PASS", good.reason
                judged = {ch["name"]: ch["detail"] for ch in good.checks}
                assert judged[caught_by[1]].startswith(("1 lifecycle(s) in flight", "every terminal status held")), \
                    judged
                bad = explorer.run_program(program, f"mutant.{mutant}", alone=True)
                sig = signature_of(bad, f"mutant.{mutant}")
                assert sig and (sig["requirement"], sig["check"]) == caught_by, (mutant, bad.verdict, bad.reason,
                                                                                  bad.checks, bad.workdir)
                if mutant == "no-heartbeat-checker":  # the room whose chunks were all sent never ends either
                    assert judged["rooms-end-after-kill"].startswith("1 lifecycle(s) reached"), judged
                    ended = next(ch for ch in bad.checks if ch["name"] == "rooms-end-after-kill")
                    assert ended["ok"] is False and "lifecycle L1) read WaitingForInput" in ended["detail"], ended
    finally:
        implementations.registered.cache_clear()


def test_generated_kills_leave_the_dead_role_alone():
    killed = [p for p in _programs(300) if any(isinstance(s, KillRole) for s in p.steps)]
    # a kill of the second prefill: tests/test_program_checks.py builds one (generated ones are rarer)
    assert {s.role for p in killed for s in p.steps if isinstance(s, KillRole)} >= {"prefill", "decode"}, \
        "300 generated programs and not a kill of each role"
    for p in killed:
        at = next(i for i, s in enumerate(p.steps) if isinstance(s, KillRole))
        dead, after = p.steps[at].role, p.steps[at + 1:]
        assert not any(dead in (getattr(s, "role", None), getattr(s, "prefill", None)) for s in after), p
        assert dead != "decode" or not any(isinstance(s, VerifyPools) for s in after), p  # no pools left to read
        marks = ("sender-fail", "sender-end") if dead == "decode" else ("fail", "end")
        assert any(len(x) > 3 and x[3] in marks for x in p.lifecycles), "a kill with no room in flight"


def _sig(check: str, requirement: str, impl: str) -> dict:
    return {"requirement": requirement, "check": check, "impl": impl, "frame": ""}


def test_exit_codes_put_an_implementations_finding_before_oracle_failures():
    """docs/explore.md, "Oracle failures": 1 for an implementation's finding or a corpus program of
    it still failing, 3 when the only failures are the oracle's (its own exploration's failures,
    its corpus, or a program it failed beside another implementation), 0 for none."""
    from harness.explore.outcome import EXIT_FOUND, EXIT_ORACLE, Failure, ImplReport, exit_code
    from harness.explore.program_model import Program

    program = Program((), ())
    bug = Failure(_sig("bytes-exact", "R-LAYOUT-1", "nixl"), 1, program)
    theirs = Failure(_sig("no-residue-after-clear", "R-RESIDUE-1", "reference"), 1, program, oracle=True)
    clean, ref = ImplReport("nixl"), ImplReport("reference", of_oracle=True)
    assert exit_code([clean, ref]) == 0
    assert exit_code([ImplReport("nixl", corpus={"found-nixl-1.json": "PASS", "found-nixl-2.json": "WARN"})]) == 0
    assert exit_code([ImplReport("reference", of_oracle=True, failures={"k": theirs})]) == EXIT_ORACLE
    assert exit_code([ImplReport("reference", of_oracle=True, corpus={"f.json": "R-X|x|reference|"})]) == EXIT_ORACLE
    beside = ImplReport("nixl", oracle={"k": theirs})  # the reference failed a program nixl failed
    assert exit_code([beside]) == EXIT_ORACLE and beside.oracle_failures == [theirs] and not beside.findings
    assert exit_code([ImplReport("nixl", failures={"b": bug}), beside]) == EXIT_FOUND
    assert exit_code([ImplReport("nixl", failures={"b": bug}, oracle={"k": theirs})]) == EXIT_FOUND
    assert exit_code([ImplReport("nixl", corpus={"found-nixl-1.json": "R-X|x|nixl|"}), ref]) == EXIT_FOUND


def test_a_failure_is_disputed_only_by_the_same_check_twice_and_every_oracle_failure_is_kept(tmp_path, monkeypatch):
    """The reference's run beside an implementation's failure (Explorer._reference_fails_too), its
    cells scripted: whatever the reference fails is an oracle failure, counted and written under
    FOUND/oracle/; the implementation's failure is disputed (not its finding) only when the
    reference fails the same check (name and requirement) on two runs in a row."""
    from harness.explore import session
    from harness.explore.outcome import ImplReport
    from harness.target.sglang import installed_target

    program = _programs(3, faults=False)[0]
    mine = _sig("bytes-exact", "R-LAYOUT-1", "nixl")
    same, other = _sig("bytes-exact", "R-LAYOUT-1", "reference"), _sig("clean-rooms-succeed", "R-XFER-1", "reference")
    cases = [  # the reference's runs -> (disputed, how many runs, oracle failures)
        ([None], (False, 1, 0)),
        ([other], (False, 1, 1)),  # another check: no second run needed, nixl's finding counts
        ([same, None], (False, 2, 1)),  # a flake of the reference does not hide nixl's finding
        ([same, other], (False, 2, 2)),
        ([same, same], (True, 2, 1)),
    ]
    notes: list[str] = []
    explorer = session.Explorer(installed_target(), tmp_path / "out", tmp_path / "found", note=notes.append)
    for i, (runs, (disputed, n, oracle)) in enumerate(cases):
        script = list(runs)
        monkeypatch.setattr(session.Explorer, "_oracle_run", lambda self, p: script.pop(0))
        report = ImplReport("nixl")
        assert explorer._reference_fails_too(program, "nixl", report, mine, 0.0) is disputed, runs
        assert not script[:len(runs) - n] and len(script) == len(runs) - n, (runs, script)
        assert len(report.oracle) == oracle and len(report.oracle_failures) == oracle, runs
        assert bool(report.disputed) is disputed
        for f in report.oracle.values():
            assert f.oracle and f.beside == "nixl's bytes-exact (R-LAYOUT-1)" and f.disputes is disputed
            assert f.path.parent == tmp_path / "found" / "oracle" and f.path.name.startswith("found-reference-")
            doc = json.loads(f.path.read_text())
            assert doc["impl"] == "reference" and doc["found_with"]["while_exploring"] == "nixl"
            assert doc["signature"] == runs[0]  # one file per program: the reference's first failure of it
    assert not list((tmp_path / "found").glob("found-*"))  # nothing in the backends' corpus
    # exploring the oracle itself there is nothing to diff: its failure is the oracle failure
    monkeypatch.setattr(session.Explorer, "_oracle_run", lambda self, p: pytest.fail("the oracle diffed with itself"))
    assert explorer._reference_fails_too(program, "reference", ImplReport("reference", of_oracle=True), same) is False


def test_the_table_puts_an_oracle_failure_on_its_own_line_with_its_reproduce_line(tmp_path, monkeypatch):
    """explore's table (harness.cli.explore._print_reports) for the reference exploring itself
    with a failure: an "oracle failure" line naming the check, the count line and the
    reproduce line naming the oracle folder; what the nightly end-to-end test below checks
    of a real planted oracle bug, without its minute of exploring."""
    from harness.cli import console
    from harness.cli.explore import _print_reports
    from harness.explore.outcome import EXIT_ORACLE, Failure, ImplReport, exit_code
    from harness.explore.program_model import Program

    found = tmp_path / "found" / "oracle" / "found-reference-ab12.json"
    failure = Failure(_sig("bytes-exact", "R-LAYOUT-1", "reference"), 2, Program((), ()), path=found, oracle=True)
    report = ImplReport("reference", of_oracle=True, programs=9, failures={"k": failure})
    monkeypatch.setattr(console, "width", 400)
    with console.capture() as out:
        _print_reports([report])
    text = out.get()
    assert "oracle failure: the reference fails bytes-exact (R-LAYOUT-1)" in text and report.oracle_failures == [failure]
    assert "1 oracle failure(s)" in text and f"PDCONFORM_FOUND_DIRS={found.parent}" in text
    assert "repro found-reference-ab12 --impl reference" in text and exit_code([report]) == EXIT_ORACLE


@pytest.mark.nightly  # a minute of exploring a planted oracle bug; the table test above checks what it prints
@pytest.mark.e2e
def test_a_planted_oracle_bug_is_reported_as_an_oracle_failure(tmp_path, monkeypatch):
    """The oracle with a planted bug (mutant aux-slot-off-by-one standing in for the reference:
    harness.explore.oracle.REFERENCE) explored from the command line: its failure is an oracle
    failure, on its own line of the table, with exit 3 and its found file under FOUND/oracle/,
    never among the backends' found files; its reproduce line names that folder."""
    import signal

    from typer.testing import CliRunner

    from harness import cli, implementations
    from harness.cli import app
    from harness.explore import oracle, session

    planted = "mutant.aux-slot-off-by-one"
    monkeypatch.setenv(implementations.MUTANTS_ENV, "1")
    monkeypatch.setattr(oracle, "REFERENCE", planted)
    monkeypatch.setattr(session, "SHRINK_S", 10.0)  # bounded shrinking: the test is about the report
    monkeypatch.setattr(cli.console, "width", 400)  # the table's lines whole
    implementations.registered.cache_clear()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    found = tmp_path / "found"
    try:
        result = CliRunner().invoke(app, ["explore", "--impl", planted, "--budget", "60s", "--lanes", "4",
                                          "--found", str(found), "--out", str(tmp_path / "out")])
    finally:
        for signum, handler in handlers.items():  # explore handles them for its run (harness.cli.explore)
            signal.signal(signum, handler)
        implementations.registered.cache_clear()
    assert result.exit_code == 3, result.output[-3000:]
    # one planted bug may first fail either byte check, by program: one found file per signature
    files = list((found / "oracle").glob(f"found-{planted}-*.json"))
    assert files and not list(found.glob("found-*")), (files, list(found.iterdir()))
    for path in files:
        check = json.loads(path.read_text())["signature"]["check"]
        assert check in {name for _, name in BYTES_CHECKS}
        assert f"oracle failure: the reference fails {check} (R-" in result.output, result.output[-3000:]
    assert f"{len(files)} oracle failure(s)" in result.output and f"PDCONFORM_FOUND_DIRS={found / 'oracle'}" in result.output
