"""R-RESIDUE-2's generic post-condition (harness.judge.unscheduled) on planted histories, and
explore's rule that makes unscheduled registrations (harness.explore.program)."""

from __future__ import annotations

from harness.explore.program import ProgramMachine
from harness.judge import postconditions as pc
from harness.judge.unscheduled import ABORT_ARRIVAL_S, SLACK_S, registration_dropped, unscheduled_registration_dropped
from harness.spec.history import History
from harness.spec.steps import Abort, Clear, OpenRoom, RequestKV, VerifyPools

ROOM = 2**41
TIMEOUT_S = 3.0


def _cell(*, abort_at: float | None, observed_at: float, held: bool, lost_abort: bool = False,
          frozen: tuple[float, float] | None = None, opened: bool = False,
          cut: tuple[float, float | None] | None = None) -> History:
    """A decode registers ROOM at t=1; the prefill (bootstrap timeout 3 s) never opens a sender
    for it unless ``opened``; the decode aborts it at ``abort_at``; the prefill is observed at
    ``observed_at`` holding it or not."""
    h = History()
    h.record("ok", "start_prefill", "prefill", 0, t=0.0, value={"bootstrap_timeout_s": TIMEOUT_S})
    h.record("ok", "start_decode", "decode", 0, t=0.0, value={})
    if opened:
        h.record("ok", "open_sender", "prefill", 1, t=0.5, args={"room": ROOM})
    h.record("ok", "request_kv", "decode", 1, t=1.0, args={"room": ROOM})
    if frozen:
        h.record("nemesis", "freeze", "prefill", 2, t=frozen[0], args={})
        h.record("nemesis", "thaw", "prefill", 2, t=frozen[1], args={})
    if cut:  # a partition between the decode and the prefill, healed at cut[1]
        h.record("nemesis", "network", "decode", 2, t=cut[0], args={"a": "decode", "b": "prefill", "both_ways": True})
        if cut[1] is not None:
            h.record("nemesis", "network", "decode", 2, t=cut[1], args={"a": "decode", "b": "prefill", "heal": True})
    if lost_abort:
        h.record("info", "message-lost", "decode", None, t=1.1, value={"room": ROOM, "kind": "abort"})
    if abort_at is not None:
        h.record("ok", "abort", "decode", 3, t=abort_at, args={"room": ROOM})
        h.record("ok", "clear", "decode", 4, t=abort_at + 0.01, args={"room": ROOM})
    h.record("invoke", "observe", "prefill", None, t=observed_at, args={})
    h.record("ok", "observe", "prefill", None, t=observed_at + 0.05, args={},
             value={"role": "prefill", "loops": {}, "log_records": [], "dead_threads": [], "remembered": {},
                    "rooms": {ROOM: [f"transfer_infos[{ROOM}]"]} if held else {}, "residue_incomplete": ""})
    return h


def test_a_registration_kept_past_the_decodes_abort_fails():
    ok, detail, at = unscheduled_registration_dropped(_cell(abort_at=2.0, observed_at=2.0 + ABORT_ARRIVAL_S + 0.5,
                                                            held=True).events)
    assert ok is False and f"prefill room {ROOM}, never scheduled" in detail and "after the decode's ABORT" in detail
    assert at is not None
    assert unscheduled_registration_dropped(_cell(abort_at=2.0, observed_at=4.0, held=False).events)[0] is True


def test_a_registration_kept_past_its_bootstrap_timeout_and_slack_fails():
    late = 1.0 + TIMEOUT_S + SLACK_S + 0.2
    ok, detail, _ = unscheduled_registration_dropped(_cell(abort_at=None, observed_at=late, held=True).events)
    assert ok is False and "past its bootstrap timeout" in detail


def test_before_its_bound_a_kept_registration_is_not_judged():
    for cell in (_cell(abort_at=2.0, observed_at=2.0 + ABORT_ARRIVAL_S / 2, held=True),
                 _cell(abort_at=None, observed_at=1.0 + TIMEOUT_S, held=True),
                 # a lost ABORT never arrives: only the timeout bounds it
                 _cell(abort_at=2.0, observed_at=4.0, held=True, lost_abort=True),
                 # a prefill frozen 2 s: its timer stood still as long, and the ABORT waited
                 _cell(abort_at=2.0, observed_at=1.0 + TIMEOUT_S + SLACK_S + 1.0, held=True, frozen=(1.5, 3.5))):
        ok, detail, _ = unscheduled_registration_dropped(cell.events)
        assert ok is True and "none past its bound" in detail, detail


def test_a_partition_moves_the_timeout_bound_by_as_long_as_it_lasted():
    """A registration sent during a partition arrives at the heal: its bound counts from there."""
    past = 1.0 + TIMEOUT_S + SLACK_S + 1.0
    ok, detail, _ = unscheduled_registration_dropped(_cell(abort_at=None, observed_at=past, held=True,
                                                           cut=(0.9, 3.0)).events)
    assert ok is True and "none past its bound" in detail, detail
    ok, detail, _ = unscheduled_registration_dropped(_cell(abort_at=None, observed_at=past + 2.2, held=True,
                                                           cut=(0.9, 3.0)).events)
    assert ok is False and "past its bootstrap timeout" in detail
    # never healed in the cell: held to its end
    ok, detail, _ = unscheduled_registration_dropped(_cell(abort_at=None, observed_at=past + 2.2, held=True,
                                                           cut=(0.9, None)).events)
    assert ok is True and "none past its bound" in detail, detail


def test_a_room_the_prefill_opened_is_r_residue_1s_not_this_checks():
    cell = _cell(abort_at=2.0, observed_at=9.0, held=True, opened=True)
    assert unscheduled_registration_dropped(cell.events)[1] == "no registration went unscheduled"


def test_a_reused_room_is_judged_on_its_last_lifecycle():
    """ROOM is served once (sender opened, both ends cleared), then the decode registers it again
    and no prefill opens a sender: the second registration is R-RESIDUE-2's, bounded from its
    own arrival and its own ABORT, not excused by the first lifecycle's sender."""
    def reused(held: bool, second_sender: bool = False) -> History:
        h = History()
        h.record("ok", "start_prefill", "prefill", 0, t=0.0, value={"bootstrap_timeout_s": TIMEOUT_S})
        h.record("ok", "start_decode", "decode", 0, t=0.0, value={})
        h.record("ok", "open_sender", "prefill", 1, t=0.5, args={"room": ROOM})
        h.record("ok", "request_kv", "decode", 1, t=0.6, args={"room": ROOM})
        h.record("ok", "clear", "prefill", 2, t=0.9, args={"room": ROOM})
        h.record("ok", "clear", "decode", 2, t=1.0, args={"room": ROOM})
        h.record("ok", "abort", "decode", 3, t=0.95, args={"room": ROOM})  # the first lifecycle's: not this one's
        if second_sender:
            h.record("ok", "open_sender", "prefill", 3, t=1.5, args={"room": ROOM})
        h.record("ok", "request_kv", "decode", 4, t=2.0, args={"room": ROOM})
        h.record("ok", "abort", "decode", 5, t=3.0, args={"room": ROOM})
        h.record("invoke", "observe", "prefill", None, t=3.0 + ABORT_ARRIVAL_S + 0.5, args={})
        h.record("ok", "observe", "prefill", None, t=3.6 + ABORT_ARRIVAL_S, args={},
                 value={"role": "prefill", "loops": {}, "log_records": [], "dead_threads": [], "remembered": {},
                        "rooms": {ROOM: [f"transfer_infos[{ROOM}]"]} if held else {}, "residue_incomplete": ""})
        return h

    ok, detail, _ = unscheduled_registration_dropped(reused(held=True).events)
    assert ok is False and "after the decode's ABORT" in detail, detail
    assert unscheduled_registration_dropped(reused(held=False).events)[0] is True
    # the second lifecycle's sender was opened (and not cleared): R-RESIDUE-1's room, not this check's
    assert unscheduled_registration_dropped(reused(held=True, second_sender=True).events)[1] == \
        "no registration went unscheduled"


def test_no_residue_after_clear_leaves_an_unscheduled_room_to_r_residue_2():
    """The decode cleared ROOM and the prefill never named it, so it counts as cleared on every
    role that named it; its state on the prefill is R-RESIDUE-2's, judged at that bound."""
    ok, detail, _ = pc.no_residue_after_clear(_cell(abort_at=2.0, observed_at=2.2, held=True).events)
    assert ok is True, detail


class _Draws:
    def __init__(self, **answers):
        self.answers = answers

    def draw(self, strategy, label: str):
        return self.answers[label]


def test_explore_registers_a_room_no_prefill_schedules_and_checks_its_pages_untouched():
    m = ProgramMachine()
    m.may_unschedule = True
    m.open_room(_Draws(**{"pages": 2, "room": 2**40, "source pages": [0, 1], "chunk cuts": set(), "aux source": 0,
                          "reuse a cleared room id": False, "prefill": "prefill"}))
    m.register_unscheduled(_Draws(prefill="prefill", room=ROOM, pages=3))
    m.abort_unscheduled(_Draws(**{"unscheduled room": ROOM}))
    steps = m.program().steps
    opened = [s for s in steps if isinstance(s, OpenRoom) and s.room == ROOM]
    assert len(opened) == 1 and not opened[0].open_sender
    pages = next(s.pages for s in steps if isinstance(s, RequestKV) and s.room == ROOM)
    assert len(pages) == 3 and not set(pages) & set(m.rooms[0].dst)
    assert Abort(ROOM, "decode") in steps and Clear(ROOM, "decode") in steps and Clear(ROOM, "prefill") not in steps
    final = [s for s in steps if isinstance(s, VerifyPools)][-1]
    assert not set(pages) & ({d for _, d in final.kv_moves} | set(final.unchecked_kv))  # checked untouched


def test_a_scenario_that_waits_out_the_bound_requires_the_room_judged():
    early = _cell(abort_at=2.0, observed_at=2.0 + ABORT_ARRIVAL_S / 2, held=True).events
    assert registration_dropped()(early)[0] is True
    ok, detail, _ = registration_dropped(required=True)(early)
    assert ok is None and "could not be judged" in detail
    late = _cell(abort_at=2.0, observed_at=4.0, held=False).events
    assert registration_dropped(required=True)(late)[0] is True
