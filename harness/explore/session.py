"""One ``pdconform explore`` run: the corpus first, then generated programs until the budget
is spent, each distinct failure shrunk and written out (harness.explore.found).

Per implementation: every found file of that implementation replays first (still failing,
or now passing: a fixed bug turns green visibly); then hypothesis writes programs
(:class:`harness.explore.program.ProgramMachine`) and each runs as one cell, forked from the
run's fork servers, judged by the spec's checks and the generic post-conditions.  A
failing program is shrunk by hypothesis, rule by rule, keeping the failure's signature
(:func:`signature_of`; a smaller program counts only when it fails so twice in a row, so a
race is not kept), at most :data:`SHRINK_RUNS` more cells; the smallest is written
out, and later programs failing the same way are only counted.  Every wait is bounded: a
program cell by its deadline, the whole run by ``budget_s`` (a shrink in progress finishes
within its own bound).  A program the reference fails is an *oracle failure*, pdconform's own
bug, reported and written apart (:data:`ORACLE_DIR`; docs/explore.md, "Oracle failures"): when
exploring the reference itself, every failure; when exploring another implementation, the
reference's run of a program that implementation failed (:meth:`Explorer._reference_fails_too`).
An interrupt (KeyboardInterrupt in the main thread, or :attr:`Explorer.stopping` set by a signal
handler) ends everything at once: :meth:`Explorer.stop`.
"""

from __future__ import annotations

import shutil
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

from hypothesis import HealthCheck, Phase, Verbosity, seed as hypothesis_seed, settings
from hypothesis.errors import Flaky
from hypothesis.stateful import get_state_machine_test

from harness.drive.forkserver_client import ForkServerError
from harness.drive.pair import RolePair
from harness.drive.runner import kill_running_cells, run_cell_isolated
from harness.drive.fork_servers import close_fork_servers, fork_group, start_fork_servers
from harness.explore.ahead import Round, RoundsAhead
from harness.explore.lanes import LANE_OVERRUN_S, STOP_JOIN_S, Lanes, end_leftovers, watch_leftovers
from harness.explore.found import found_dirs, found_files, impl_of, load_program, scenario_of, write_found
from harness.explore.oracle import ORACLE_DIR, OracleDiff
from harness.explore.outcome import Failure, ImplReport, signature_key, signature_of
from harness.explore.program import ProgramMachine
from harness.explore.program_model import Program
from harness.judge.judge import judge
from harness.judge.results import CellResult, write_atomic
from harness.session import cell_target, default_settings
from harness.spec import history as hist
from harness.spec.rooms import MAX_SHIFTS
from harness.spec.topology import TOPOLOGIES
from harness.target.sglang import SglangTarget

SHRINK_RUNS = 40  # cells one failure's shrinking may run, at most
SHRINK_S = 30.0  # seconds one failure's shrinking may take, at most
PROGRAM_RULES = 8  # rules hypothesis applies per program (the epilogue adds the steps that conclude it)
LANES = 8  # programs run at once per implementation (each lane its own pairs): they mostly wait
EXAMPLES_PER_ROUND = 25  # programs per hypothesis round; each round starts from its own seed


class Explorer(OracleDiff):
    """Runs programs on implementations (see the module docstring); ``out_dir`` holds the
    program cells (pdconform's own folder); ``found_dir`` receives found files;
    ``on_progress(report)`` is called after every program.  Program cells run as ``run``'s
    do: the default engine settings, and a private loopback-only network per cell where the
    machine allows one (``network`` says which).

    Interrupts: a signal handler sets :attr:`stopping` (the event ``stopping``, when given) and
    raises KeyboardInterrupt in the main thread; lanes then start no program, and the main thread's KeyboardInterrupt reaches
    :meth:`stop` (through :meth:`explore` or ``__exit__``), which ends every process and
    removes every temporary folder the explorer started, within about :data:`STOP_JOIN_S`
    seconds plus the kills.  Found programs already written stay."""

    def __init__(self, target: SglangTarget, out_dir: Path, found_dir: Path, seed: int = 0,
                 on_progress: Callable[[ImplReport], None] | None = None, note: Callable[[str], None] = print,
                 long_lived: bool = True, stopping: threading.Event | None = None):
        self.network, self.target = cell_target(target, default_settings())
        self.out_dir, self.found_dir, self.seed = out_dir, found_dir, seed
        self.on_progress = on_progress or (lambda report: None)
        out_dir.mkdir(parents=True, exist_ok=True)
        self.note = note
        self.servers: dict = {}
        self._impls: set[str] = set()  # the implementations start() started fork servers for
        self.topology = "p1-d1"
        self.long_lived = long_lived  # generated programs on long-lived role pairs (harness.drive.pair)
        self.pairs: dict[tuple[str, str, int], RolePair] = {}  # (impl, its StartRoles, lane) -> the pair serving it
        self.lanes = LANES  # pairs per implementation and StartRoles that run a round's programs at once
        self._lock = threading.Lock()
        self.known: dict[str, dict[str, Failure]] = {}  # impl -> failures its corpus still shows
        self.shifts = 0  # programs run on pairs so far: each gets rooms of its own (Program.shifted)
        self.faults = True  # ProgramMachine.faults: False writes fault-free programs only (bench's rate goal)
        self.shrink_s = SHRINK_S  # seconds one failure's shrinking may take (tests shorten it)
        self._oracle_init(seed)  # the oracle: the reference (harness.explore.oracle)
        self.stopping = stopping or threading.Event()  # set: interrupted, nothing starts any more (class docstring)
        self._lanes = Lanes(0, self.stopping)  # the running round's (_run_ahead)
        self._stopped = False  # stop() has run: a second call returns at once
        self._before: tuple[set[int], set] | None = None  # children and owned temp folders before start()

    def __enter__(self) -> "Explorer":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None and issubclass(exc_type, KeyboardInterrupt):
            self.stop()
            return
        try:
            self.close_pairs()
            close_fork_servers(self.servers)
        except KeyboardInterrupt:  # during the graceful close: the rest ends at once
            self.stop()
            raise
        if self._before is not None:  # what a killed cell's roles left behind came back here (start)
            for stray in end_leftovers(self._before, folders=False):
                self.note(f"ended a process a program cell left behind: {stray}")

    def stop(self) -> None:
        """End at once what this explorer started (an interrupt; from the main thread; a second call
        returns at once): set :attr:`stopping`, kill every pair and running cell, close the fork
        servers, give the lanes :data:`STOP_JOIN_S` seconds to end, end any process left and remove
        the temporary folders made since :meth:`start` (fork servers' and pairs').  Found programs
        already written stay."""
        with self._lock:  # a pair started after this is killed by the lane that started it (_pair)
            self.stopping.set()
            if self._stopped:
                return
            self._stopped = True
            pairs = list(self.pairs.values())
            self.pairs.clear()
        for pair in pairs:
            pair.kill()
        kill_running_cells()  # program cells forked fresh (alone, corpus): the lanes' and the main thread's
        close_fork_servers(self.servers)  # before the lanes' join: a lane waiting on a fork server ends at once
        lanes_done = self._lanes.join(STOP_JOIN_S)
        kill_running_cells()  # one a lane started while the first kills ran
        for pair in pairs:
            if lanes_done and not pair.busy:
                pair.close(grace_s=0)
            else:  # a lane still holds its socket (one thread per zmq socket): only its folder goes
                shutil.rmtree(pair.socket_dir, ignore_errors=True)
        if self._before is not None:
            end_leftovers(self._before)

    def _check_stopping(self) -> None:
        """KeyboardInterrupt once the explorer is stopping: no thread starts or reports anything more."""
        if self.stopping.is_set():
            raise KeyboardInterrupt("pdconform explore is stopping")

    def run_program(self, program: Program, impl: str, name: str = "program", alone: bool = False,
                    lane: int = 0) -> CellResult:
        """Run ``program`` as one cell on ``impl`` (in ``out_dir/impl/name``); the judged cell.  On
        the implementation's long-lived role pair ``lane`` for the program's StartRoles, with its
        rooms shifted (Program.shifted), unless ``alone`` or the explorer runs none (then forked
        fresh, as ``run`` and ``repro`` do).  KeyboardInterrupt once the explorer is stopping."""
        self._check_stopping()
        folder = self.out_dir / impl / name
        folder.mkdir(parents=True, exist_ok=True)
        with self._lock:
            self.shifts += 1
            shift = self.shifts
        on_pair = self.long_lived and not alone and shift <= MAX_SHIFTS
        if on_pair:
            program = program.shifted(shift)
        path = folder / "program.json"
        write_atomic(path, program.to_json().encode())
        return self.run_scenario_file(path, impl, folder / "cell", program, lane=lane if on_pair else None)

    def _pair(self, impl: str, scenario, lane: int, workdir: Path) -> RolePair:
        """``impl``'s open pair of ``lane`` for ``scenario``'s StartRoles, started (in ``workdir``)
        when there is none.  KeyboardInterrupt once the explorer is stopping."""
        key = (impl, repr(scenario.steps(0)[0]), lane)
        with self._lock:
            pair = self.pairs.get(key)
        if pair is not None and pair.open:
            return pair
        pair = RolePair(impl, workdir, self.target, self.servers.get(fork_group(impl)), stopping=self.stopping)
        with self._lock:  # stop() sets stopping and takes the pairs under this lock: each pair is ended once
            if not self.stopping.is_set():
                self.pairs[key] = pair
                return pair
        pair.kill()
        pair.close(grace_s=0)
        raise KeyboardInterrupt("pdconform explore is stopping")

    def start(self, impls: list[str]) -> None:
        """Start the fork servers of every implementation this explorer will run, at once (each
        once: a second call for the same group would leave the first server running)."""
        self._impls = set(impls) | {self.oracle}  # a failure is diffed against it (_reference_fails_too)
        if self._before is None:  # the orphans of killed cells' roles come back here, ended with the explorer
            self._before = watch_leftovers()
        if not self.servers:
            self.servers = start_fork_servers(sorted(self._impls), self.target, self.out_dir, self.note)

    def wait_ready(self) -> None:
        """Wait until every fork server has imported (bench: a rate must not time the imports);
        a server that cannot start is noted, its cells start fresh interpreters."""
        for group, server in self.servers.items():
            try:
                server.wait_ready()
            except ForkServerError as exc:
                self.note(f"{group} cells start as fresh interpreters: {exc}")

    def run_scenario_file(self, path: Path, impl: str, workdir: Path, program: Program | None = None,
                          lane: int | None = None) -> CellResult:
        """Run the program file ``path`` as one cell on ``impl`` in ``workdir`` (the cell reads
        the file: its scenario id is the path); the judged cell.  ``lane``: on that long-lived
        pair (:meth:`_pair`, in ``workdir``'s sibling ``pair``), which a cell other than PASS or
        WARN ends (a failure never leaves state behind for the next program); None: forked fresh.
        ValueError when ``path`` is not a program (harness.explore.program_file.program_from_json)."""
        scenario = scenario_of(program or load_program(path), str(path.resolve()))
        if impl not in self._impls:
            raise ValueError(f"{impl}: not among the implementations this explorer started (Explorer.start)")
        if lane is None:
            workdir = run_cell_isolated(impl, scenario, 0, workdir, target=self.target,
                                        fork_server=self.servers.get(fork_group(impl))).workdir
            return judge(scenario, 0, hist.load(workdir / "history.jsonl"), impl=impl, workdir=str(workdir))
        pair = self._pair(impl, scenario, lane, workdir.parent / "pair")
        pair.run(str(path.resolve()), workdir, scenario.timeout_s)
        self._check_stopping()  # a pair killed by an interrupt: its cell is no program's verdict
        cell = judge(scenario, 0, hist.load(workdir / "history.jsonl"), impl=impl, workdir=str(workdir))
        if cell.verdict not in ("PASS", "WARN"):
            pair.close()
        return cell

    def replay_corpus(self, impl: str, report: ImplReport) -> None:
        """Replay every found file of ``impl`` (the corpus), recording what each shows now
        (PASS, the signature it still fails with, UNSUPPORTED, or why it is unreadable); a
        failure it still shows is a known one, counted, not looked for again.  The oracle's corpus
        also holds the oracle failures written before (:meth:`oracle_dir`), and a failure of it is
        an oracle failure."""
        folders = found_dirs()
        if impl == self.oracle and all(d.resolve() != self.oracle_dir().resolve() for d in folders):
            folders.append(self.oracle_dir())
        for i, path in enumerate(f for f in found_files(folders) if impl_of(f) == impl):
            try:
                cell = self.run_scenario_file(path.resolve(), impl, self.out_dir / impl / f"corpus-{i}" / "cell")
            except ValueError as exc:
                report.corpus[path.name] = f"unreadable: {exc}"
                continue
            sig = signature_of(cell, impl)
            if sig is not None:
                report.failures.setdefault(signature_key(sig), Failure(sig, 0, load_program(path), path.resolve(),
                                                                       known=True, oracle=impl == self.oracle))
                self.known.setdefault(impl, {})[signature_key(sig)] = report.failures[signature_key(sig)]
            report.corpus[path.name] = str(cell.verdict) if sig is None else signature_key(sig)

    def explore(self, impl: str, budget_s: float, topology: str = "p1-d1", max_failures: int | None = None,
                corpus: bool = True) -> ImplReport:
        """The corpus (unless ``corpus`` is False: the failures an earlier replay of this explorer
        found are known all the same), then generated programs on ``impl`` on ``topology`` for
        ``budget_s`` seconds (or until ``max_failures`` distinct failures were found and
        shrunk); the report.  The implementation's pairs are closed at the end; on an interrupt
        (KeyboardInterrupt) everything is, at once (:meth:`stop`), and the interrupt propagates."""
        self.topology = topology
        report = ImplReport(impl, of_oracle=impl == self.oracle, topology=topology)
        start = time.monotonic()
        if corpus:
            self.replay_corpus(impl, report)
            report.corpus_s = time.monotonic() - start
        else:
            report.failures = {key: replace(f, count=0) for key, f in self.known.get(impl, {}).items()}
        try:
            self._explore(impl, report, start, budget_s, max_failures)
        except KeyboardInterrupt:
            self.stop()  # before close_pairs: an interrupted run asks no pair to stop gracefully
            raise
        finally:
            self.close_pairs(impl)
        return report

    def close_pairs(self, impl: str | None = None) -> None:
        """Close the long-lived pairs of ``impl`` (None: of every implementation)."""
        with self._lock:
            keys = [key for key in self.pairs if impl is None or key[0] == impl]
            pairs = [self.pairs.pop(key) for key in keys]
        for pair in pairs:
            pair.close()

    def _explore(self, impl: str, report: ImplReport, start: float, budget_s: float, max_failures: int | None) -> None:
        deadline, round_ = start + budget_s, 0
        def found() -> int:  # new distinct failures (the corpus's known ones are not looked for)
            return sum(not f.known for f in report.failures.values())

        def judge(ran: Round) -> None:  # a round run ahead; past max_failures only its known failures count
            if max_failures is None or found() < max_failures:
                self._round(impl, report, start, deadline, ran.seed, ran)
            else:
                ran.count_known(report.failures, signature_key)

        carried: dict = {}  # rounds a batch ran in part (harness.explore.ahead)
        while time.monotonic() < deadline and (max_failures is None or found() < max_failures):
            self._check_stopping()
            if self.lanes > 1 and self.long_lived:  # rounds run ahead on the lanes, then judged in order
                for ran in self._run_ahead(impl, report, start, deadline, self.seed + round_, carried):
                    judge(ran)
                    round_ += 1
            else:
                self._round(impl, report, start, deadline, self.seed + round_)
                round_ += 1
        for seed in sorted(carried):  # ran in part when the loop ended: judged, as a batch's late rounds are
            judge(carried.pop(seed))
        report.seconds = time.monotonic() - start

    def _run_counted(self, program: Program, impl: str, report: ImplReport, start: float, name: str,
                     alone: bool = False, lane: int = 0) -> dict | None:
        """Run one program (``alone``: forked fresh, never on a pair; ``lane``: which of the
        implementation's pairs), count it in ``report``, tell the progress callback; its failure's
        signature."""
        began = time.monotonic()
        cell = self.run_program(program, impl, name, alone=alone, lane=lane)
        self._check_stopping()  # an interrupted run reports nothing after its "interrupted" line
        with self._lock:
            if name in ("shrink", "confirm"):
                report.shrink_programs += 1
                report.shrinking_s += time.monotonic() - began
            report.programs += 1
            report.steps += len(program.steps)
            report.seconds = time.monotonic() - start
            self.on_progress(report)
        return signature_of(cell, impl)

    def _outcome(self, program: Program, impl: str, report: ImplReport, start: float, deadline: float,
                 state: dict, seen: dict, ahead: dict | None = None) -> dict | None:
        """Run ``program`` (once per round: ``seen`` remembers) and say whether hypothesis is to
        count it failing: the signature of the failure being found or shrunk, else None.  A
        smaller program replaces the best one only when it fails the same way twice in a row,
        so a race the first run won does not become the found program.  ``ahead``: programs of
        this round already run (:meth:`_run_ahead`) -> their signatures; not run again."""
        text = program.to_json()
        if text in seen:
            return seen[text]
        shrinking = state["sig"] is not None
        if ahead and not shrinking and text in ahead:
            sig = seen[text] = ahead.pop(text)
            return self._judged(program, impl, report, start, state, seen, sig)
        if state["sig"] is None and time.monotonic() > deadline:
            return None  # the budget is spent: the rest of the round writes programs and runs none
        if shrinking and (state["shrinks"] >= SHRINK_RUNS or time.monotonic() > state["found_at"] + self.shrink_s):
            # this failure's shrinking is over: the smallest so far is the one.  Told "passed",
            # hypothesis would go on trying (and building) candidates for a minute or more
            raise _ShrinkOver
        # shrinking runs alone: the program written out must fail as `repro` runs it, in a fresh cell
        sig = seen[text] = self._run_counted(program, impl, report, start, "shrink" if shrinking else "program",
                                             alone=shrinking)
        state["shrinks"] += shrinking  # every cell run while shrinking, failing or not
        return self._judged(program, impl, report, start, state, seen, sig)

    def _judged(self, program: Program, impl: str, report: ImplReport, start: float, state: dict, seen: dict,
                sig: dict | None) -> dict | None:
        """What hypothesis is told of ``program``, which ran and showed ``sig`` (see :meth:`_outcome`)."""
        text, shrinking = program.to_json(), state["sig"] is not None
        if sig is None:
            return None
        known = report.failures.get(signature_key(sig))
        if not shrinking and known is not None:
            known.count += 1  # an old failure again: counted, not shrunk again
            seen[text] = None
            return None
        if not shrinking and self.long_lived and not self._fails_alone(program, impl, report, start, sig):
            seen[text] = None
            return None
        if not shrinking and self._reference_fails_too(program, impl, report, sig, start):
            seen[text] = None
            return None
        if not shrinking:
            state["sig"], state["found_at"], state["best"] = sig, time.monotonic(), program
            report.failures[signature_key(sig)] = Failure(sig, 1, program, first_after_s=time.monotonic() - start,
                                                          first=program, oracle=impl == self.oracle)
            return sig
        if signature_key(sig) != signature_key(state["sig"]):
            seen[text] = None  # while shrinking, another failure: not the one being shrunk
            return None
        again = self._run_counted(program, impl, report, start, "shrink")
        state["shrinks"] += 1
        if again is None or signature_key(again) != signature_key(sig):
            seen[text] = None  # it does not fail every time: not a program to keep
            return None
        if program.size <= state["best"].size:
            state["best"] = program
        return sig

    def _fails_alone(self, program: Program, impl: str, report: ImplReport, start: float, sig: dict) -> bool:
        """Whether ``program``, which failed with ``sig`` on a long-lived pair, fails the same way
        in a fresh cell; when it does not, what reuse gave up showed (a state an earlier program
        left, or a race): counted in ``report.pair_only`` with its program, not shrunk."""
        again = self._run_counted(program, impl, report, start, "confirm", alone=True)
        if again is not None and signature_key(again) == signature_key(sig):
            return True
        report.pair_only.append((signature_key(sig), program))
        kept = self.out_dir / impl / f"pair-only-{len(report.pair_only)}.json"
        write_atomic(kept, program.to_json().encode())
        self.note(f"{impl}: a program failed on a long-lived pair ({signature_key(sig)}) but not in a fresh cell "
                  f"({signature_key(again) if again else 'PASS'}): not shrunk, counted as pair-only ({kept})")
        return False

    def _machine(self, on_program: Callable[[Program], dict | None]) -> type:
        """The round's state machine: writes a program on this explorer's topology and rules, and
        hands it to ``on_program`` at teardown (a signature: hypothesis is told it failed)."""
        explorer, prefill = self, TOPOLOGIES[self.topology].prefill

        class Run(ProgramMachine):
            restarts = prefill.tp == prefill.pp == prefill.dp == 1  # RestartRole replaces one process
            faults = explorer.faults

            def teardown(self) -> None:
                try:
                    sig = on_program(replace(self.program(), topology=explorer.topology))
                except Exception as exc:  # pdconform's own error: hypothesis would shrink it and, as the
                    raise _InternalError(exc) from exc  # replay differs, call it flaky and drop it
                if sig is not None:
                    raise AssertionError(signature_key(sig))

        return Run

    def _test(self, machine: type, phases: tuple) -> Callable[[], None]:
        return get_state_machine_test(machine, settings=settings(
            max_examples=EXAMPLES_PER_ROUND, stateful_step_count=PROGRAM_RULES, deadline=None, database=None,
            verbosity=Verbosity.quiet, suppress_health_check=list(HealthCheck), report_multiple_bugs=False,
            phases=phases))

    def _run_ahead(self, impl: str, report: ImplReport, start: float, deadline: float, first_seed: int,
                   carried: dict) -> list[Round]:
        """Run rounds' programs from ``first_seed`` on :attr:`lanes` pairs at once, no wait between rounds,
        until the budget is spent or one failed anew (harness.explore.ahead); the rounds to judge now, in order."""
        def run(program: Program, lane: int) -> dict | None:
            return self._run_counted(program, impl, report, start, f"lane-{lane}", lane=lane)
        ahead = RoundsAhead(self.write_round, run, lambda sig: signature_key(sig) not in report.failures,
                            deadline, carried)
        self._lanes = Lanes(self.lanes, self.stopping)
        try:
            self._lanes.run(ahead.feed(first_seed), ahead.work, max(deadline, time.monotonic()) + LANE_OVERRUN_S)
        except BaseException:  # an interrupt, or a lane that failed or hung: pdconform's own error ends explore
            self.stop()  # the lanes' pairs killed, their waits ended
            raise
        self._check_stopping()
        return ahead.judged_now()

    def write_round(self, round_seed: int) -> list[Program]:
        """The distinct programs a round of ``round_seed`` writes on this explorer's topology and
        rules, in order, none run (hypothesis's generate phase: the round writes them again)."""
        programs: dict[str, Program] = {}

        def keep(program: Program) -> None:  # None: hypothesis is told it passed
            programs.setdefault(program.to_json(), program)

        hypothesis_seed(round_seed)(self._test(self._machine(keep), (Phase.generate,)))()
        return list(programs.values())

    def _round(self, impl: str, report: ImplReport, start: float, deadline: float, round_seed: int,
               ran: Round | None = None) -> None:
        """One hypothesis run: programs until one fails in a new way (then shrunk) or the round
        ends.  ``ran``: the round's programs already run ahead on the lanes (:meth:`_run_ahead`);
        the round is then replayed by hypothesis (nothing that ran runs again) only when one of
        them failed, or when some did not run and the budget is not spent."""
        state: dict = {"sig": None, "best": None, "shrinks": 0, "found_at": 0.0}
        self._round_seed = round_seed
        seen: dict[str, dict | None] = {}  # program -> what hypothesis is told: a program runs once per round
        ahead = dict(ran.results) if ran is not None else None
        if ahead is not None and all(sig is None for sig in ahead.values()) and \
                (ran.complete or time.monotonic() > deadline):
            return
        test = self._test(self._machine(lambda program: self._outcome(program, impl, report, start, deadline,
                                                                      state, seen, ahead)),
                          (Phase.generate, Phase.shrink))
        flaky = False
        try:
            hypothesis_seed(round_seed)(test)()
        except AssertionError:
            pass
        except Flaky:  # the smallest program did not fail again on its replay: written out, marked
            flaky = True
        except _ShrinkOver:  # the shrinking bound ended the round; state["best"] is the program
            pass
        except _InternalError as exc:
            raise exc.__cause__ from None
        self._check_stopping()  # hypothesis may take an interrupt in its code for a failure (Flaky): not here
        for sig in (ahead or {}).values():  # run ahead, not replayed: this round's first failure ended it
            if sig is not None and signature_key(sig) in report.failures:
                report.failures[signature_key(sig)].count += 1
        if state["sig"] is not None:
            failure = report.failures[signature_key(state["sig"])]
            failure.program, failure.flaky = state["best"], flaky
            failure.shrink_s, failure.shrink_runs = time.monotonic() - state["found_at"], state["shrinks"]
            try:
                # the oracle's own failure is pdconform's bug: written apart, never into a backend's corpus
                failure.path = write_found(state["best"], impl, state["sig"],
                                           self.oracle_dir() if failure.oracle else self.found_dir,
                                           {"seed": round_seed, "shrink_runs": state["shrinks"]})
            except OSError as exc:  # the failure stays in the report; its program could not be kept
                self.note(f"could not write the found program of {impl} into {self.found_dir}: {exc}")


class _InternalError(BaseException):
    """pdconform's own exception while running or judging a program: not a finding, so explore stops with it."""


class _ShrinkOver(BaseException):
    """Raised out of a program's teardown when its failure's shrinking bound is spent: not an
    ``Exception``, so hypothesis does not take it for a failure of the program but stops."""


__all__ = ["Explorer", "ImplReport", "Failure", "signature_of", "SHRINK_RUNS", "SHRINK_S", "ORACLE_DIR"]
