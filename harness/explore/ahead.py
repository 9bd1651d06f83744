"""Explore's programs run ahead on lanes, several hypothesis rounds at a time.

A round (harness.explore.session, ``EXAMPLES_PER_ROUND`` programs from one seed) is what
hypothesis replays to shrink a failure, so its programs are judged in round order.  Running
them need not wait for that: lanes take the programs of one round after another from one
feed, and a lane that finishes its program takes the next one, of whichever round.  With one
round per batch, every round ended at its slowest program (a kill's window, the long wait past
the bootstrap timeout, a pair starting again) while the other lanes idled: with the fault
rules, eight lanes then ran about 110 programs a minute on the reference, and sixteen hardly
more (docs/performance.md).

The feed stops at the budget's deadline, or once a program failed in a new way: the rounds up
to that program's are handed back to be judged (its round replayed and shrunk); programs of
later rounds that already ran are carried to the next batch, which feeds only the ones that
did not, and stops at a carried round that holds a failure still new (a program that failed
after the one the batch stopped for).  Rounds still carried when explore ends are judged then.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

from harness.explore.program_model import Program


@dataclass
class Round:
    """One round's programs run ahead: its ``seed``, its ``programs`` in the order the round
    writes them, and ``results`` (program JSON -> its failure's signature; None: it passed)
    for those that ran."""

    seed: int
    programs: list[Program]
    results: dict[str, dict | None] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        """Whether every program of the round ran."""
        return all(p.to_json() in self.results for p in self.programs)

    def count_known(self, failures: dict, key: Callable[[dict], str]) -> None:
        """Count each failure of the round's programs that ``failures`` (``key(signature)`` ->
        harness.explore.outcome.Failure) holds, without judging the round (explore's
        ``max_failures`` was reached: a new failure is not looked at)."""
        for sig in self.results.values():
            if sig is not None and key(sig) in failures:
                failures[key(sig)].count += 1


class RoundsAhead:
    """The feed of consecutive rounds for one implementation (see the module docstring).

    ``write_round(seed)``: the round's programs (harness.explore.session.Explorer.write_round);
    ``run(program, lane)``: runs and counts one program, its signature; ``is_new(sig)``: whether
    a signature is a failure not known yet; ``deadline``: time.monotonic() after which no
    program starts; ``carried``: seed -> a round an earlier batch of the same exploration fed
    in part (updated here: one dict per ``Explorer.explore`` call, as its rules and topology are
    the rounds')."""

    def __init__(self, write_round: Callable[[int], list[Program]], run: Callable[[Program, int], dict | None],
                 is_new: Callable[[dict], bool], deadline: float, carried: dict[int, Round]):
        self.write_round, self.run, self.is_new, self.deadline = write_round, run, is_new, deadline
        self.carried = carried
        self.new_failure = threading.Event()  # a program failed in a new way: no program starts any more
        self.rounds: list[Round] = []  # the rounds fed, in order
        self.failed_in: int | None = None  # the index in ``rounds`` of the first round a new failure showed in
        self._lock = threading.Lock()

    def feed(self, first_seed: int) -> Iterator[tuple[int, Round, Program]]:
        """(index in ``rounds``, round, program), round after round from ``first_seed``, until the deadline or a
        new failure; a carried round's programs that already ran are not fed again.  Called in
        a lane's thread under Lanes' lock (one round is written at a time)."""
        seed = first_seed
        while time.monotonic() < self.deadline and not self.new_failure.is_set():
            held = self.carried.pop(seed, None)
            one = held if held is not None else Round(seed, self.write_round(seed))
            self.rounds.append(one)
            if held is not None and any(sig is not None and self.is_new(sig) for sig in held.results.values()):
                with self._lock:  # a new failure an earlier batch ran after the one it stopped for: judged now
                    index = len(self.rounds) - 1
                    self.failed_in = index if self.failed_in is None else min(self.failed_in, index)
                    self.new_failure.set()
                return
            for program in one.programs:
                if program.to_json() not in one.results:
                    yield len(self.rounds) - 1, one, program
            seed += 1

    def work(self, item: tuple[int, Round, Program], lane: int) -> bool:
        """Run one fed program on ``lane`` and keep its result; whether the lane goes on."""
        index, one, program = item
        if time.monotonic() > self.deadline or self.new_failure.is_set():
            return False
        sig = self.run(program, lane)
        with self._lock:
            one.results[program.to_json()] = sig
            if sig is not None and self.is_new(sig):
                self.failed_in = index if self.failed_in is None else min(self.failed_in, index)
                self.new_failure.set()
        return True

    def judged_now(self) -> list[Round]:
        """The rounds to judge now, in order: every round fed, or those up to the first with a
        new failure; the later ones are carried (their programs that ran are not run again)."""
        if self.failed_in is None:
            return list(self.rounds)
        for later in self.rounds[self.failed_in + 1:]:
            self.carried[later.seed] = later
        return self.rounds[:self.failed_in + 1]


__all__ = ["Round", "RoundsAhead"]
