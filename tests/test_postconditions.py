"""The generic post-conditions the judge adds to every scenario (harness.judge.postconditions)."""

from harness.judge import checks as c
from harness.judge import postconditions as pc
from harness.judge.judge import judge
from harness.spec.history import History
from harness.spec.protocol import KVPoll
from harness.spec.scenario import Scenario


def _wait(h: History, role: str, room: int, trail: list[str], reason: str | None = None) -> None:
    final = getattr(KVPoll, trail[-1])
    h.record("ok", "await_status", role, 1, args={"room": room},
             value={"status": int(final), "trail": trail, "waited_s": 0.1, "failure_reason": reason})


def test_a_flip_inside_one_wait_is_seen_though_the_wait_ends_on_its_status():
    """The old check read each poll's final status: Failed -> Success inside a wait for Success passed."""
    h = History()
    _wait(h, "decode", 9, ["WaitingForInput", "Failed", "Success"], reason="x")
    assert c.stays_terminal(9, ("decode",))(h.events)[0]  # today's per-scenario check: blind to it
    ok, detail, *_ = pc.every_trail_terminal(h.events)
    assert not ok and "decode room 9: Failed -> Success" in detail


def test_a_flip_between_two_waits_and_a_clear_that_starts_a_new_lifecycle():
    h = History()
    _wait(h, "prefill", 4, ["Transferring", "Success"])
    _wait(h, "prefill", 4, ["Transferring"])
    ok, detail, *_ = pc.every_trail_terminal(h.events)
    assert not ok and "Success -> Transferring" in detail
    h = History()
    _wait(h, "prefill", 4, ["Success"])
    h.record("ok", "clear", "prefill", 1, args={"room": 4})
    _wait(h, "prefill", 4, ["WaitingForInput"])
    assert pc.every_trail_terminal(h.events)[0]


def test_the_fresh_reads_at_clear_and_at_the_end_judge_the_managers_table_too():
    """sglang's poll() caches its first terminal answer: a table that turns Success into Failed
    is seen only by the fresh reads (poll and the table) before clear and at the final observe."""
    h = History()
    _wait(h, "decode", 4, ["Transferring", "Success"])
    h.record("ok", "clear", "decode", 1, args={"room": 4}, value={"before": {"poll": "Success", "map": "Failed"}})
    _wait(h, "decode", 4, ["WaitingForInput"])  # the next lifecycle of room 4: not a flip
    ok, detail, *_ = pc.every_trail_terminal(h.events)
    assert not ok and "decode room 4: Success -> Failed" in detail
    h = History()
    _wait(h, "decode-tp1", 6, ["Success"])
    h.record("ok", "clear", "decode", 1, args={"room": 6},
             value={"ranks": {"decode-tp1": {"before": {"poll": "Success", "map": "Success"}}}})
    _wait(h, "decode-tp1", 8, ["Failed"], reason="r")
    h.record("ok", "observe", "decode-tp1", 2, args={}, value={"statuses": {"8": {"poll": "Failed", "map": "Failed"}}})
    assert pc.every_trail_terminal(h.events)[0]  # held on every fresh read
    h.record("ok", "observe", "decode-tp1", 3, args={}, value={"statuses": {"8": {"poll": "Failed", "map": "Success"}}})
    ok, detail, *_ = pc.every_trail_terminal(h.events)
    assert not ok and "decode-tp1 room 8: Failed -> Success" in detail


def _reason_history(reason: str, cause: str) -> History:
    h = History()
    h.record("ok", "start_prefill", "prefill-a", 0, args={}, value={"bootstrap_addr": "127.0.0.1:8998"})
    h.record("invoke", "open_receiver", "decode", 1, args={"room": 5, "bootstrap_addr": "127.0.0.1:8998"})
    if cause == "kill":
        h.record("nemesis", "kill", "prefill-a", 2, args={"signal": "SIGKILL"})
    elif cause in ("abort", "fault-then-abort"):
        if cause == "fault-then-abort":  # a write may have failed the room first: the abort is not the sure cause
            h.record("ok", "engine-faults", "prefill-a", 2, args={"fail_transfers": [1]})
        h.record("invoke", "abort", "decode", 2, args={"room": 5})
    _wait(h, "decode", 5, ["WaitingForInput", "Failed"], reason=reason)
    return h


def test_a_failure_reason_must_name_the_cause_the_history_shows():
    ok, detail, at = pc.failure_reason_names_cause(_reason_history("KV transfer failed: peer lost", "kill").events)
    assert ok is False and "does not name the killed prefill 127.0.0.1:8998" in detail and at is not None
    named = "heartbeat to prefill 127.0.0.1:8998 failed twice"
    assert pc.failure_reason_names_cause(_reason_history(named, "kill").events)[0] is True
    # a longer port is not the address (names() matches it whole)
    assert pc.failure_reason_names_cause(_reason_history("prefill 127.0.0.1:89981 lost", "kill").events)[0] is False
    ok, detail, _ = pc.failure_reason_names_cause(_reason_history("transfer failed", "abort").events)
    assert ok is False and "does not say it was aborted" in detail
    assert pc.failure_reason_names_cause(_reason_history("Aborted by the decode", "abort").events)[0] is True
    assert pc.failure_reason_names_cause(_reason_history("write 3 failed", "fault-then-abort").events)[0] is True
    # no cause in the history (a timer, an engine error): the scenario's own checks judge it
    ok, detail, _ = pc.failure_reason_names_cause(_reason_history("x", "none").events)
    assert ok is True and "all 0" in detail


def test_every_failed_read_needs_a_reason_on_every_rank():
    h = History()
    _wait(h, "decode-0", 4, ["Failed"], reason="prefill 127.0.0.1:1 failed")
    _wait(h, "decode-1", 4, ["Failed"], reason="")
    ok, detail, *_ = pc.every_failure_has_reason(h.events)
    assert not ok and "decode-1 room 4" in detail and "decode-0" not in detail


def test_a_group_wait_judges_each_ranks_own_reason():
    """A group's wait reads its reason from its lowest rank; another rank that failed without a
    reason, or whose reason names the wrong cause, is judged on its own read."""
    h = _reason_history("prefill 127.0.0.1:8998 lost", "kill")
    ranks = {"decode.tp0": {"status": int(KVPoll.Failed), "trail": ["Failed"], "failure_reason": "prefill 127.0.0.1:8998 lost"},
             "decode.tp1": {"status": int(KVPoll.Failed), "trail": ["Failed"], "failure_reason": ""}}
    h.record("ok", "await_status", "decode", 3, args={"room": 5},
             value={"status": int(KVPoll.Failed), "trail": ["Failed"], "failure_reason": "prefill 127.0.0.1:8998 lost",
                    "ranks": ranks, "rank": "decode.tp0"})
    ok, detail, *_ = pc.every_failure_has_reason(h.events)
    assert not ok and "decode.tp1 room 5" in detail and "decode.tp0" not in detail
    ranks["decode.tp1"]["failure_reason"] = "KV transfer failed"
    assert pc.every_failure_has_reason(h.events)[0]
    ok, detail, _ = pc.failure_reason_names_cause(h.events)
    assert ok is False and "decode.tp1" in detail
    ranks["decode.tp1"]["failure_reason"] = "heartbeat to 127.0.0.1:8998 failed"
    assert pc.failure_reason_names_cause(h.events)[0] is True


def _scenario(opt_out=()) -> Scenario:
    return Scenario(id="x", title="x", steps=lambda seed: [],
                    checks=lambda seed: [c.Check("no-dead-thread", "R-LIVE-2", lambda events: (True, ""))],
                    opt_out=opt_out)


def test_generic_checks_are_added_unless_declared_or_opted_out():
    names = [check.name for check in pc.checks_of(_scenario(), 0)]
    assert names == ["no-dead-thread", "every-trail-terminal", "every-failure-has-reason", "no-residue-after-clear",
                     "failure-reason-names-cause", "bytes-in-place-at-success", "ack-names-abort-generation",
                     "every-abort-answered", "every-abort-sent", "unscheduled-registration-dropped",
                     "every-message-whole", "decode-abort-fails-room"]
    opted = _scenario(opt_out=(("every-failure-has-reason", "reasons are this scenario's subject"),))
    assert [check.name for check in pc.checks_of(opted, 0)] == ["no-dead-thread", "every-trail-terminal",
                                                                "no-residue-after-clear", "failure-reason-names-cause",
                                                                "bytes-in-place-at-success",
                                                                "ack-names-abort-generation", "every-abort-answered",
                                                                "every-abort-sent", "unscheduled-registration-dropped",
                     "every-message-whole", "decode-abort-fails-room"]


def test_the_judge_fails_a_cell_on_a_generic_post_condition():
    h = History()
    h.record("info", "cell-start", None, None, value={"impl": "x"})
    _wait(h, "decode", 9, ["Failed", "Success"], reason="r")
    h.record("info", "cell-end", None, None, value={"outcome": "completed"})
    h.record("info", "cell-exit", None, None, value={"how": "exited", "returncode": 0, "duration_s": 1.0})
    result = judge(_scenario(), 0, h.events, impl="x")
    assert result.verdict == "FAIL" and "every-trail-terminal" in result.reason


def test_a_check_that_cannot_be_run_here_makes_the_cell_unsupported_never_pass():
    """draft-kv-layout: a layout the machine cannot serve is skipped; that is UNSUPPORTED."""
    from harness.judge.judge import verdict_of

    ok = c.Check("a", "R-XFER-1", lambda e: (True, "")).run([])
    skipped = c.Check("b", "R-LAYOUT-2", lambda e: (c.UNSUPPORTED, "layout X skipped: needs VRAM")).run([])
    failed = c.Check("d", "R-LAYOUT-1", lambda e: (False, "bytes wrong")).run([])
    assert skipped.ok is None and skipped.unsupported
    assert verdict_of([ok, skipped]) == ("UNSUPPORTED", "R-LAYOUT-2 b: layout X skipped: needs VRAM")
    assert verdict_of([ok, skipped, failed])[0] == "FAIL"  # a failure is never hidden by it


def test_a_scenario_without_its_own_thread_check_still_fails_on_a_dead_thread():
    """The generic no-dead-thread (R-LIVE-2), on a planted observation: a role's thread died."""
    bare = Scenario(id="x", title="x", steps=lambda seed: [],
                    checks=lambda seed: [c.Check("steps-complete", "R-XFER-1", lambda events: (True, ""))])
    h = History()
    h.record("info", "cell-start", None, None, value={"impl": "x"})
    h.record("ok", "launch", "prefill", 0, args={})
    h.record("ok", "observe", "prefill", 1, args={},
             value={"role": "prefill", "loops": {"worker#0": False}, "log_records": [], "rooms": {},
                    "dead_threads": [{"thread": "worker", "exception": "KeyError", "message": "room 5"}]})
    h.record("info", "cell-end", None, None, value={"outcome": "completed"})
    h.record("info", "cell-exit", None, None, value={"how": "exited", "returncode": 0, "duration_s": 1.0})
    result = judge(bare, 0, h.events, impl="x")
    assert result.verdict == "FAIL" and result.reason.startswith("R-LIVE-2 no-dead-thread")
    assert "thread worker died: KeyError" in result.reason


def _room_life(h: History, room: int, cleared_on=("prefill", "decode")) -> None:
    h.record("ok", "open_sender", "prefill", 1, args={"room": room})
    h.record("ok", "open_receiver", "decode", 1, args={"room": room})
    _wait(h, "decode", room, ["Success"])
    for role in cleared_on:
        h.record("ok", "clear", role, 2, args={"room": room})


def _observed(h: History, role: str, rooms: dict, remembered: dict | None = None, incomplete: str = "") -> None:
    h.record("ok", "launch", role, 0, args={})
    h.record("ok", "observe", role, None, args={},
             value={"role": role, "loops": {}, "log_records": [], "dead_threads": [], "rooms": rooms,
                    "remembered": remembered or {}, "residue_incomplete": incomplete})


def test_state_left_of_a_room_cleared_on_both_sides_fails_in_any_scenario():
    """Planted: the prefill keeps a staging counter of room 7 after both clears (PR #35281's
    stale ``_staging_outstanding``), in a cell whose scenario never asked about residue."""
    h = History()
    _room_life(h, 7)
    _observed(h, "prefill", {7: ["_staging_outstanding[7]"]})
    _observed(h, "decode", {})
    ok, detail, *_ = pc.no_residue_after_clear(h.events)
    assert ok is False and "prefill room 7: _staging_outstanding[7]" in detail
    clean = History()
    _room_life(clean, 7)
    _observed(clean, "prefill", {}, remembered={7: ["tombstones{}"]})  # ended-generation memory is allowed
    _observed(clean, "decode", {})
    assert pc.no_residue_after_clear(clean.events)[0] is True


def test_rooms_not_cleared_everywhere_are_not_judged_and_a_partial_walk_cannot_tell():
    h = History()
    _room_life(h, 7, cleared_on=("prefill",))  # the decode still holds its room: not the end of it
    _room_life(h, 8)
    h.record("ok", "open_sender", "prefill", 3, args={"room": 8})  # room 8 re-opened after its clears
    _observed(h, "prefill", {7: ["request_status[7]"], 8: ["request_status[8]"]})
    ok, detail, *_ = pc.no_residue_after_clear(h.events)
    assert ok is True and "no room was cleared" in detail
    partial = History()
    _room_life(partial, 7)
    _observed(partial, "prefill", {}, incomplete="depth limit reached at manager.a.b")
    assert pc.no_residue_after_clear(partial.events)[0] is None


def test_a_role_whose_last_observation_failed_is_not_judged_on_an_older_one():
    """Planted: the prefill held room 7 at the first observation, then died while it was
    observed again; no-dead-thread reports the death, residue does not blame the old view."""
    h = History()
    _room_life(h, 7)
    _observed(h, "prefill", {7: ["transfer_infos[7]"]})
    h.record("fail", "observe", "prefill", None, args={}, error="prefill cannot be observed: its process ended")
    _observed(h, "decode", {})
    assert pc.no_residue_after_clear(h.events)[0] is True


def test_a_killed_role_need_not_clear_but_its_surviving_peer_is_judged():
    """dead-decode's shape: the decode is SIGKILLed, the prefill clears the room and keeps
    state of it (planted); the residue is reported.  Without the kill, the decode's missing
    clear would leave the room unjudged."""
    h = History()
    _room_life(h, 7, cleared_on=("prefill",))
    h.record("nemesis", "kill", "decode", None, args={"signal": "SIGKILL"})
    _observed(h, "prefill", {7: ["_deferred_ack_poisoned_rooms{}"]})
    ok, detail, *_ = pc.no_residue_after_clear(h.events)
    assert ok is False and "prefill room 7: _deferred_ack_poisoned_rooms{}" in detail
    alive = History()
    _room_life(alive, 7, cleared_on=("prefill",))
    _observed(alive, "prefill", {7: ["_deferred_ack_poisoned_rooms{}"]})
    assert "no room was cleared" in pc.no_residue_after_clear(alive.events)[1]


def test_a_labelled_status_is_judged_on_every_rank_not_on_the_group():
    """late-old-status@p1-d2: one decode rank took a late old Success for the reused room while
    the group (the lowest of its ranks) read WaitingForInput; the group alone hid it."""
    h = History()
    h.record("ok", "await_status", "decode", 1, args={"room": 3, "label": "after"},
             value={"status": int(KVPoll.WaitingForInput), "trail": ["WaitingForInput"], "waited_s": 0.0,
                    "ranks": {"decode": {"status": int(KVPoll.Success), "trail": ["Success"]},
                              "decode.tp1": {"status": int(KVPoll.WaitingForInput), "trail": ["WaitingForInput"]}}})
    ok, detail, _ = c.status_at("after", (KVPoll.WaitingForInput,))(h.events)
    assert not ok and "not on every rank: decode Success" in detail
    assert c.status_at("after", (KVPoll.WaitingForInput, KVPoll.Success))(h.events)[0]


def test_a_prefill_rank_that_writes_nothing_may_read_waiting_for_input_alone():
    """decode-first@p2-d1-kv1: one KV head held by both prefill ranks; the decode takes it from
    tp0 only, so tp1 has no registration to wait for and reads WaitingForInput while the group
    (tp0, whose registration was aborted) stays Bootstrapping.  tp0 ahead is still a failure."""
    from dataclasses import asdict

    from harness.spec.topology import rank_layout, topology
    t = topology("p2-d1-kv1")

    def history(tp0: KVPoll, tp1: KVPoll, tp1_received: int = 0) -> History:
        h = History()
        h.record("info", "message-audit", "prefill.tp1", None, value={"received": tp1_received, "not_whole": 0})
        for rank, role in enumerate(("prefill", "prefill.tp1")):
            h.record("invoke", "start_prefill", role, 0, args={"layout": asdict(rank_layout(t, "prefill", rank)),
                                                               "attn_tp": [2, rank]})
        h.record("invoke", "start_decode", "decode", 0, args={"layout": asdict(rank_layout(t, "decode"))})
        h.record("ok", "await_status", "prefill", 1, args={"room": 3, "label": "cancelled"},
                 value={"status": int(min(tp0, tp1)), "trail": [], "waited_s": 2.0,
                        "ranks": {"prefill": {"status": int(tp0)}, "prefill.tp1": {"status": int(tp1)}}})
        return h

    check = c.status_at("cancelled", (KVPoll.Bootstrapping, KVPoll.Failed))
    assert check(history(KVPoll.Bootstrapping, KVPoll.WaitingForInput).events)[0]
    ok, detail, _ = check(history(KVPoll.WaitingForInput, KVPoll.Bootstrapping).events)
    assert not ok and "prefill WaitingForInput" in detail
    assert not check(history(KVPoll.Bootstrapping, KVPoll.Success).events)[0]
    # a rank sent messages (sglang's dummy registration, an ABORT) is judged as every rank is
    assert not check(history(KVPoll.Bootstrapping, KVPoll.WaitingForInput, tp1_received=2).events)[0]


def _acks_history(acks: list[dict], sent: list[dict], inject_room: int | None = None) -> History:
    h = History()
    if inject_room is not None:
        h.record("nemesis", "inject-abort", "prefill", None, args={"room": inject_room})
    h.record("info", "aborts-sent", "decode", None, args={}, value=sent)
    h.record("info", "abort-acks", "decode", None, args={}, value=acks)
    return h


def test_an_abort_ack_must_echo_the_generation_of_an_abort_its_decode_sent():
    """R-ABORT-2: an ACK of a room the prefill no longer holds that names generation 0 (read
    from an empty room table) instead of the ABORT's is caught (planted); the right
    generation once per sender passes; a second ACK of one generation fails; an ACK of a
    room whose ABORT a scenario injected, or with no generation, is not judged."""
    sent = [{"room": 7, "generation": 3, "t": 0.0}]
    ok, detail, at = pc.ack_names_abort_generation(
        _acks_history([{"room": 7, "generation": 0, "sender": 0, "t": 1.0}], sent).events)
    assert ok is False and "names generation 0, its ABORTs named [3]" in detail and at is not None
    good = [{"room": 7, "generation": 3, "sender": 0, "t": 1.0}, {"room": 7, "generation": 3, "sender": 1, "t": 1.0}]
    assert pc.ack_names_abort_generation(_acks_history(good, sent).events)[0] is True
    twice = [{"room": 7, "generation": 3, "sender": 0, "t": 1.0}] * 2
    ok, detail, _ = pc.ack_names_abort_generation(_acks_history(twice, sent).events)
    assert ok is False and "a second ABORT_ACK of generation 3" in detail
    wrong = [{"room": 7, "generation": 0, "sender": 0, "t": 1.0}]
    assert pc.ack_names_abort_generation(_acks_history(wrong, sent, inject_room=7).events)[0] is True
    nameless = [{"room": 7, "generation": None, "sender": 0, "t": 1.0}]
    ok, detail, _ = pc.ack_names_abort_generation(_acks_history(nameless, sent).events)
    assert ok is True and "none to compare" in detail


def _abort_history(sent: list[dict], acks: list[dict], deferred: bool = True, killed: bool = False,
                   end_wall: float = 100.0) -> History:
    h = History()
    for role in ("prefill", "decode", "decode.tp1"):
        op = "start_prefill" if role == "prefill" else "start_decode"
        h.record("ok", op, role, 0, args={}, value={"deferred_release": deferred})
    if killed:
        h.record("nemesis", "kill", "prefill", 3, args={"signal": "SIGKILL"})
    for role in ("decode", "decode.tp1"):
        event = h.record("info", "aborts-sent", role, None, args={}, value=[a for a in sent if a["role"] == role])
        event["wall"] = end_wall
        h.record("info", "abort-acks", role, None, args={}, value=[a for a in acks if a["role"] == role])
    return h


def test_every_abort_a_decode_rank_sent_must_be_answered_at_that_rank():
    """R-ABORT-2 (every-abort-answered): the prefill answers the ABORT of decode rank 0 only
    (planted: its ACKs go to the room's first destination) and rank 1 waits for ever: caught;
    both ranks answered passes; an ABORT sent less than ACK_DUE_S before the end, one after a
    prefill kill, and one without deferred release are not judged."""
    sent = [{"role": "decode", "room": 5, "generation": 2, "t": 10.0},
            {"role": "decode.tp1", "room": 5, "generation": 2, "t": 10.0}]
    first_only = [{"role": "decode", "room": 5, "generation": 2, "sender": 0, "t": 10.1}]
    ok, detail, at = pc.every_abort_answered(_abort_history(sent, first_only).events)
    assert ok is False and "decode.tp1 room 5: no ABORT_ACK for the ABORT of generation 2" in detail and at
    both = first_only + [{"role": "decode.tp1", "room": 5, "generation": 2, "sender": 0, "t": 10.1}]
    ok, detail, _ = pc.every_abort_answered(_abort_history(sent, both).events)
    assert ok is True and "each of 2 ABORT(s)" in detail
    young = pc.every_abort_answered(_abort_history(sent, first_only, end_wall=10.0 + pc.ACK_DUE_S / 2).events)
    assert young[0] is True and "was due" in young[1]
    assert pc.every_abort_answered(_abort_history(sent, first_only, killed=True).events)[0] is True
    assert pc.every_abort_answered(_abort_history(sent, first_only, deferred=False).events)[0] is True


def test_a_decode_abort_of_a_registered_room_must_send_its_abort_even_when_already_failed():
    """R-ABORT-1 (every-abort-sent): the decode's room timed out (WaitingForInput -> Failed), then
    the scheduler aborts it; planted: no ABORT goes out for an already-Failed room, so the
    prefill keeps writing into its pages: caught.  The ABORT sent passes; a room never
    registered (Bootstrapping only), one that read Success, and a cell without deferred release
    are not judged."""
    def history(trail: list[str], sent: list[dict], deferred: bool = True) -> History:
        h = History()
        h.record("ok", "start_decode", "decode", 0, args={}, value={"deferred_release": deferred})
        _wait(h, "decode", 8, trail, reason="waiting timeout" if trail[-1] == "Failed" else None)
        h.record("ok", "abort", "decode", 2, args={"room": 8})
        h.record("info", "aborts-sent", "decode", None, args={}, value=sent)
        return h

    timed_out = ["WaitingForInput", "Failed"]
    ok, detail, at = pc.every_abort_sent(history(timed_out, []).events)
    assert ok is False and "decode room 8: abort() of a registered room that never read Success sent no ABORT" in detail
    assert at is not None
    ok, detail, _ = pc.every_abort_sent(history(timed_out, [{"room": 8, "generation": 1, "t": 5.0}]).events)
    assert ok is True and "each of 1 abort() call(s)" in detail
    assert "no decode aborted" in pc.every_abort_sent(history(["Bootstrapping"], []).events)[1]
    assert "no decode aborted" in pc.every_abort_sent(history(["WaitingForInput", "Success"], []).events)[1]
    ok, detail, _ = pc.every_abort_sent(history(timed_out, [], deferred=False).events)
    assert ok is True and "none to judge" in detail
    concluded_unread = history(["WaitingForInput"], [])  # it had concluded before the abort, unread
    _wait(concluded_unread, "decode", 8, ["Success"])
    assert "no decode aborted" in pc.every_abort_sent(concluded_unread.events)[1]
    killed = history(timed_out, [])  # killed after its abort: no record of what it sent survives
    killed.record("nemesis", "kill", "decode", 3, args={"signal": "SIGKILL"})
    assert pc.every_abort_sent(killed.events)[0] is True


def test_every_message_whole_judges_every_cell_but_the_roles_it_pushed_frames_into():
    """R-LOAD-1 as a generic post-condition: a STATUS whose frames were interleaved with
    another's fails any cell; frames the cell injected itself (malformed on purpose) do not."""
    checker = dict((name, make) for name, _, make in pc.GENERIC)["every-message-whole"]()
    h = History()
    h.record("info", "message-audit", "decode", None,
             value={"received": 9, "not_whole": 1, "examples": ["[b'STATUS', b'5', b'STATUS']"]})
    h.record("info", "message-audit", "prefill", None, value={"received": 4, "not_whole": 0, "examples": []})
    ok, detail, *_ = checker(h.events)
    assert ok is False and "decode received 1 of 9 messages not whole" in detail
    h.record("nemesis", "inject", "decode", 2, args={"frames": 1})
    ok, detail, *_ = checker(h.events)
    assert ok is True and "all 4 received messages whole in 1 role" in detail
    assert checker(History().events)[0] is True  # no audit (a selftest cell): nothing to judge


def test_a_room_the_decode_aborted_reads_failed_there_until_its_clear():
    """R-ABORT-1's decode half: after abort(), a decode rank that had not read Success reads
    Failed, even when the ABORT never reached the prefill and the prefill's Success came in."""
    from harness.judge.decode_abort import decode_abort_fails_room

    def cell(after: str, before: str = "WaitingForInput") -> History:
        h = History()
        _wait(h, "decode", 5, [before])
        h.record("ok", "abort", "decode", 2, args={"room": 5})
        _wait(h, "decode", 5, [after])
        h.record("ok", "clear", "decode", 3, args={"room": 5})
        _wait(h, "decode", 5, ["Success"])  # a new lifecycle after the clear: not judged
        return h

    ok, detail, at = decode_abort_fails_room(cell("Success").events)
    assert ok is False and "decode room 5 read Success after the decode's abort()" in detail and at is not None
    assert decode_abort_fails_room(cell("WaitingForInput").events)[0] is False
    assert decode_abort_fails_room(cell("Failed").events)[0] is True
    assert decode_abort_fails_room(cell("Success", before="Success").events)[0] is True  # R-TERM-1 keeps it
