"""Explore's rounds run ahead (harness.explore.ahead): lanes take programs of one round after
another with no wait at a round's end; a new failure stops the feed, the rounds up to its own
are judged, and later rounds' programs that ran are carried, never run twice."""

from __future__ import annotations

import threading
import time

from harness.explore.ahead import Round, RoundsAhead
from harness.explore.lanes import Lanes


class _Prog:
    """A stand-in for harness.explore.program_model.Program: RoundsAhead reads only to_json()."""

    def __init__(self, text: str, seconds: float, fails: bool = False):
        self.text, self.seconds, self.fails = text, seconds, fails

    def to_json(self) -> str:
        return self.text


def _rounds(slow_first: float, fail_at: str = ""):
    """Rounds of 4 programs of 0.02 s; round 0's first takes ``slow_first`` seconds."""
    def write_round(seed: int) -> list[_Prog]:
        return [_Prog(f"{seed}-{i}", slow_first if seed == i == 0 else 0.02, f"{seed}-{i}" == fail_at)
                for i in range(4)]
    return write_round


def _run_into(ran: list, lock: threading.Lock):
    def run(program: _Prog, lane: int) -> dict | None:
        time.sleep(program.seconds)
        with lock:
            ran.append(program.text)
        return {"check": "x"} if program.fails else None
    return run


def test_lanes_go_on_into_the_next_round_while_a_slow_program_of_the_last_one_runs():
    ran, lock = [], threading.Lock()
    ahead = RoundsAhead(_rounds(1.0), _run_into(ran, lock), lambda sig: True, time.monotonic() + 0.6, {})
    Lanes(2, threading.Event()).run(ahead.feed(0), ahead.work, time.monotonic() + 10)
    # with a wait at each round's end, round 0's slow program would hold every lane past the budget
    assert len({text.split("-")[0] for text in ran}) >= 3, ran
    judged = ahead.judged_now()
    assert [r.seed for r in judged] == list(range(len(judged))) and all(r.complete for r in judged[:-1])


def test_a_new_failure_stops_the_feed_and_later_rounds_are_carried_not_run_again():
    ran, lock, carried = [], threading.Lock(), {}
    ahead = RoundsAhead(_rounds(0.3, fail_at="0-0"), _run_into(ran, lock), lambda sig: True,
                        time.monotonic() + 30, carried)
    Lanes(2, threading.Event()).run(ahead.feed(0), ahead.work, time.monotonic() + 10)
    judged = ahead.judged_now()
    assert [r.seed for r in judged] == [0] and judged[0].results["0-0"] == {"check": "x"}
    assert set(carried) == {r.seed for r in ahead.rounds[1:]} and carried, "the other lane ran on into round 1"
    before = list(ran)
    again = RoundsAhead(_rounds(0.0), _run_into(ran, lock), lambda sig: False, time.monotonic() + 0.3, carried)
    Lanes(2, threading.Event()).run(again.feed(1), again.work, time.monotonic() + 10)
    after = ran[len(before):]
    assert not set(after) & set(before), "a carried program ran twice"
    assert again.rounds[0].seed == 1 and again.rounds[0].complete


def test_a_round_is_complete_only_when_every_program_ran():
    one = Round(3, [_Prog("a", 0), _Prog("b", 0)])
    one.results["a"] = None
    assert not one.complete
    one.results["b"] = {"check": "x"}
    assert one.complete


def test_a_carried_round_with_a_failure_still_new_stops_the_next_feed_there():
    """A slow program of round 0 failed after one of round 1 had failed in another new way: the
    batch stops for round 0's; the next batch must judge round 1 at once, not feed on to the deadline."""
    carried = {1: Round(1, [_Prog("1-0", 0), _Prog("1-1", 0)], {"1-0": {"check": "y"}})}
    ran, lock = [], threading.Lock()
    ahead = RoundsAhead(_rounds(0.0), _run_into(ran, lock), lambda sig: sig["check"] == "y",
                        time.monotonic() + 30, carried)
    Lanes(2, threading.Event()).run(ahead.feed(1), ahead.work, time.monotonic() + 10)
    assert ran == [] and [r.seed for r in ahead.judged_now()] == [1] and not carried


def test_a_round_not_judged_counts_its_known_failures():
    class Known:
        count = 0

    known = {"x": Known()}
    one = Round(0, [_Prog("a", 0), _Prog("b", 0), _Prog("c", 0)], {"a": {"check": "x"}, "b": {"check": "new"}, "c": None})
    one.count_known(known, lambda sig: sig["check"])
    assert known["x"].count == 1 and set(known) == {"x"}
