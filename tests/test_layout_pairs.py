"""Layout pairs drawn side by side (harness.spec.layout_pairs) and how a pair's transfer is
judged (harness.judge.layout_pairs): planted histories, one per rule of the classifier, each
failing without its rule; the draw (only pairs two sglang servers can be started as) and the
check's reason (every pair that went wrong listed)."""

from __future__ import annotations

from harness.judge import layout_pairs as judged
from harness.spec import layout_pairs as lp
from harness.spec.frames import sample
from harness.spec.layout_plan import Plan, Rejection
from harness.spec.protocol import KVPoll

P, D = "prefill-P0", "decode-P0"
MARK = {"seq": 0, "t": 0.0, "op": "layout-pair", "type": "info", "role": P,
        "args": {"prefill": P, "decode": D, "expected": "serve", "layout": "prefill MHA ... -> decode MHA ..."}}
REFUSED = {**MARK, "args": {**MARK["args"], "expected": "refuse", "reason": "page size"}}
PAGE_SIZE = ("Page size mismatch: prefill server has page_size=4, but decode server has page_size=2. "
             "Both servers must use the same --page-size value.")


def _at(t: float, event: dict) -> dict:
    return {"seq": int(t * 1000), "t": t, **event}


def _started(t: float = 0.5, waiting_timeout_s: float | None = 3.0) -> dict:
    value = {"mode": "decode"} | ({"waiting_timeout_s": waiting_timeout_s} if waiting_timeout_s is not None else {})
    return _at(t, {"op": "start_decode", "type": "ok", "role": D, "value": value})


def _asked(t: float) -> dict:  # the decode's request for the KV: where its waiting timeout starts
    return _at(t, {"op": "request_kv", "type": "invoke", "role": D, "args": {"room": 7}})


def _raised(t: float, role: str, op: str, error: str) -> dict:
    return _at(t, {"op": op, "type": "fail", "role": role, "args": {"room": 7}, "error": f"{role}.{op} raised {error}"})


def _poll(t: float, role: str, status: int, reason: str | None = None) -> dict:
    return _at(t, {"op": "await_status", "type": "ok", "role": role, "value": {"status": status, "failure_reason": reason}})


def _verify(t: float, ok: bool = True, pages: int = 0, named: int = 0) -> dict:
    return _at(t, {"op": "verify", "type": "ok", "role": D,
                   "value": {"ok": ok, "mismatch_pages": pages,
                             "mismatches": [f"decode layer 0 V page {i}" for i in range(named)]}})


def _outcome(marker: dict, events: list[dict]) -> str:
    return judged.classify(marker, [_started(), *events])[0]


def test_a_pair_served_byte_exact_is_right_and_a_misplaced_byte_is_wrong():
    both_ok = [_asked(1.0), _poll(1.2, D, KVPoll.Success), _poll(1.3, P, KVPoll.Success)]
    assert _outcome(MARK, [*both_ok, _verify(1.4)]) == judged.RIGHT
    assert _outcome(MARK, [*both_ok, _verify(1.4, ok=False, pages=1, named=1)]) == judged.WRONG
    assert _outcome(REFUSED, [*both_ok, _verify(1.4)]) == judged.WRONG  # served a pair the spec refuses


def test_a_wrong_pair_names_its_first_mismatches_and_counts_the_rest():
    events = [_asked(1.0), _poll(1.2, D, KVPoll.Success), _poll(1.3, P, KVPoll.Success),
              _verify(1.4, ok=False, pages=13, named=5)]
    outcome, detail = judged.classify(MARK, events)
    assert outcome == judged.WRONG
    assert "13 page(s) wrong: decode layer 0 V page 0; decode layer 0 V page 1 (+11 more)" in detail


def test_an_explicit_error_while_the_decode_opens_its_receiver_is_a_right_refusal():
    """sglang's bootstrap check (try_ensure_parallel_info) raises on the decode; the receiver
    never opens, so the decode's polls fail and the prefill ends by its bootstrap timeout."""
    events = [_raised(0.9, D, "open_receiver", f"RuntimeError: {PAGE_SIZE}"),
              _raised(0.95, D, "request_kv", "KeyError: 7"), _asked(0.92),
              _poll(3.0, P, KVPoll.Failed, "Request 7 timed out after 2.0s in KVPoll.Bootstrapping"),
              _at(3.1, {"op": "await_status", "type": "fail", "role": D, "error": "room 7 is not open"}),
              _verify(3.5)]
    outcome, detail = judged.classify(REFUSED, events)
    assert outcome == judged.RIGHT, detail
    assert "decode-P0.open_receiver raised: RuntimeError: Page size mismatch" in detail
    # the same refusal of a pair the spec serves is a visible refusal, not right
    assert judged.classify(MARK, events)[0] == judged.REFUSED_VISIBLY


def test_an_explicit_error_on_the_prefill_side_is_a_visible_refusal_too():
    events = [_raised(0.9, P, "open_sender", "ValueError: layout refused"), _asked(0.95),
              _poll(1.5, D, KVPoll.Failed, "Prefill refused the layout"), _verify(2.0)]
    assert _outcome(REFUSED, events) == judged.RIGHT


def test_the_decode_failing_with_a_reason_is_a_refusal_even_while_the_prefill_waits():
    events = [_asked(1.0), _poll(1.4, D, KVPoll.Failed, "KV layout mismatch"), _poll(5.4, P, KVPoll.WaitingForInput),
              _verify(5.5)]
    assert _outcome(REFUSED, events) == judged.RIGHT


def test_a_failure_by_a_timeout_is_never_a_refusal():
    for reason in ("Timed out waiting for prefill completion", "Request 7 timed out after 3.0s in KVPoll.WaitingForInput"):
        events = [_asked(1.0), _poll(1.5, D, KVPoll.Failed, reason), _poll(1.6, P, KVPoll.Failed, "x"), _verify(2.0)]
        outcome, detail = judged.classify(REFUSED, [_started(), *events])
        assert outcome == judged.REFUSED_SILENTLY and "only a timeout" in detail, detail
    # pdconform's own bound on the parallel info is a timeout as well
    events = [_raised(0.9, D, "open_receiver", "TimeoutError: prefill at x gave no parallel info within 5 s"),
              _asked(0.95), _verify(2.0)]
    assert _outcome(REFUSED, events) == judged.REFUSED_SILENTLY


def test_a_refusal_after_the_waiting_timeout_is_not_right():
    late = [_asked(1.0), _poll(4.5, D, KVPoll.Failed, "transfer failed for room 7"), _poll(4.6, P, KVPoll.Failed, "x"),
            _verify(5.0)]
    outcome, detail = judged.classify(REFUSED, [_started(waiting_timeout_s=3.0), *late])
    assert outcome == judged.REFUSED_SILENTLY and "past its 3 s waiting timeout" in detail, detail
    # the bound is the decode's own waiting timeout, as its manager reported it when it started
    assert judged.classify(REFUSED, [_started(waiting_timeout_s=10.0), *late])[0] == judged.RIGHT
    # a decode that reported none is held to the pair roles' setting (harness.spec.layout_pairs.ENV, 3 s)
    assert judged.classify(REFUSED, [_started(waiting_timeout_s=None), *late])[0] == judged.REFUSED_SILENTLY


def test_only_the_first_failed_call_counts_and_a_call_with_no_answer_is_a_hang():
    events = [_at(0.9, {"op": "open_receiver", "type": "fail", "role": D,
                        "error": "decode-P0: open_receiver got no answer within 35.0 s"}),
              _raised(36.0, D, "request_kv", "KeyError: 'room 7 is not open on this decode-P0'"), _asked(35.9),
              _verify(40.0)]
    assert _outcome(REFUSED, events) == judged.REFUSED_SILENTLY


def test_a_reasonless_failure_a_one_sided_hang_a_dead_thread_or_a_lost_role_is_silent():
    dead = _at(3.0, {"op": "observe", "type": "ok", "role": P,
                     "value": {"dead_threads": [{"thread": "transfer_worker", "exception": "RuntimeError"}]}})
    lost = _at(3.0, {"op": "observe", "type": "fail", "role": D, "error": "decode-P0 cannot be observed: gone"})
    both_failed = [_asked(1.0), _poll(1.5, D, KVPoll.Failed, "layout rejected"), _poll(1.6, P, KVPoll.Failed, "x")]
    assert _outcome(REFUSED, [*both_failed, _verify(2.0)]) == judged.RIGHT
    assert _outcome(REFUSED, [*both_failed, _verify(2.0), dead]) == judged.REFUSED_SILENTLY
    assert _outcome(REFUSED, [*both_failed, lost, _verify(2.0)]) == judged.REFUSED_SILENTLY
    assert _outcome(REFUSED, [_asked(1.0), _poll(1.5, D, KVPoll.Failed), _verify(2.0)]) == judged.REFUSED_SILENTLY
    hang = [_asked(1.0), _poll(5.0, D, KVPoll.WaitingForInput), _poll(9.0, P, KVPoll.Failed, "x"), _verify(9.5)]
    assert _outcome(REFUSED, hang) == judged.REFUSED_SILENTLY
    assert _outcome(MARK, hang) == judged.REFUSED_SILENTLY


def test_a_pair_whose_roles_did_not_start_is_an_error_never_a_refusal():
    not_started = _at(0.5, {"op": "layout-start", "type": "fail", "role": P,
                            "error": "role decode-P0 did not start: its process ended (exit 1)"})
    for marker in (REFUSED, MARK):
        outcome, detail = judged.classify(marker, [not_started])
        assert outcome == judged.ERROR and "did not start" in detail


def test_a_pair_whose_bytes_were_never_checked_is_unverified():
    both_ok = [_asked(1.0), _poll(1.2, D, KVPoll.Success), _poll(1.3, P, KVPoll.Success)]
    assert _outcome(MARK, both_ok) == judged.UNVERIFIED
    failed = _at(1.4, {"op": "verify", "type": "fail", "role": D, "error": "TimeoutError"})
    assert _outcome(MARK, [*both_ok, failed]) == judged.UNVERIFIED


def _pair(i: int, events: list[dict], marker: dict = MARK, shrink: bool = False) -> list[dict]:
    p, d = f"prefill-P{i}", f"decode-P{i}"

    def own(e: dict) -> dict:
        return {**e, "seq": 1000 * (i + 1) + e["seq"] % 1000, "role": {P: p, D: d}.get(e.get("role"), e.get("role"))}

    head = {**marker, "seq": 1000 * (i + 1), "args": {**marker["args"], "prefill": p, "decode": d, "shrink": shrink,
                                                        "layout": f"layout of P{i}"}}
    return [head, own(_started()), *map(own, events)]


def test_the_check_lists_every_pair_that_went_wrong_not_only_the_shrunk_ones():
    right = [_asked(1.0), _poll(1.2, D, KVPoll.Success), _poll(1.3, P, KVPoll.Success), _verify(1.4)]
    wrong = [_asked(1.0), _poll(1.2, D, KVPoll.Success), _poll(1.3, P, KVPoll.Success),
             _verify(1.4, ok=False, pages=4, named=3)]
    hang = [_asked(1.0), _poll(5.0, D, KVPoll.WaitingForInput), _poll(9.0, P, KVPoll.WaitingForInput), _verify(9.5)]
    shrunk = {"seq": 9000, "t": 9.0, "op": "layout-pair-shrink", "type": "info", "role": None,
              "value": {"outcome": judged.WRONG, "layout": "small", "detail": "1 page(s) wrong"}}
    events = [*_pair(0, right), *_pair(1, wrong), *_pair(2, wrong), *_pair(3, hang),
              *_pair(4, wrong, shrink=True), shrunk]
    ok, detail, at = judged.pairs_as_specified()(events)
    assert ok is False and at == 2000  # placed on the first pair that went wrong
    assert detail.startswith("4 pairs drawn side by side: 1 right (0 of them refusals the spec asks for), 2 wrong, "
                             "0 refused visibly though the spec serves them, 1 refused silently")
    for tag in ("P1 [wrong] layout of P1", "P2 [wrong] layout of P2", "P3 [refused silently] layout of P3"):
        assert tag in detail, detail
    assert "4 page(s) wrong: decode layer 0 V page 0; decode layer 0 V page 1 (+2 more)" in detail
    assert "P0 [" not in detail and "P4 [" not in detail  # right pairs and shrink runs are not listed
    assert detail.endswith("; shrunk: [wrong] small: 1 page(s) wrong")


def test_a_pair_not_started_makes_the_check_unknown_unless_another_went_wrong():
    right = [_asked(1.0), _poll(1.2, D, KVPoll.Success), _poll(1.3, P, KVPoll.Success), _verify(1.4)]
    not_started = [_at(0.5, {"op": "layout-start", "type": "fail", "role": P, "error": "role did not start"})]
    wrong = [_asked(1.0), _poll(1.2, D, KVPoll.Success), _poll(1.3, P, KVPoll.Success),
             _verify(1.4, ok=False, pages=1, named=1)]
    ok, detail, _ = judged.pairs_as_specified()([*_pair(0, right), *_pair(1, not_started)])
    assert ok is None and "1 not started (harness error)" in detail and "P1 [error]" in detail
    ok, detail, _ = judged.pairs_as_specified()([*_pair(0, wrong), *_pair(1, not_started)])
    assert ok is False and "P0 [wrong]" in detail and "P1 [error]" in detail
    assert judged.pairs_as_specified()(_pair(0, right))[0] is True


def test_only_pairs_that_went_wrong_in_the_backend_are_shrunk(monkeypatch):
    from harness.drive.executors import layout_pairs as executor
    from harness.spec.steps import TransferPairs

    recorded = []
    outcomes = iter([judged.ERROR, judged.UNVERIFIED, judged.RIGHT, judged.REFUSED_SILENTLY])
    monkeypatch.setattr(executor, "_run_pair", lambda d, spec, tag, seed, shrink=False: (next(outcomes), ""))
    monkeypatch.setattr(executor, "_shrink", lambda d, spec, outcome, budget, tag, seed: (spec, outcome))

    class Driver:
        def record(self, type_, op, role, **fields):
            recorded.append(fields["value"]["outcome"])

    executor.transfer_pairs(Driver(), TransferPairs(count=4, seed=0))
    assert recorded == [judged.REFUSED_SILENTLY]


def test_sides_are_drawn_on_their_own_as_two_sglang_servers_can_be_started():
    specs = sample(lp.pair_specs(), 200, 3)
    for field in ("attention", "num_layers", "draft_layers", "page_size", "head_bytes", "kv_heads"):
        assert any(s["prefill"][field] != s["decode"][field] for s in specs), field
    # each side holds its whole model: a decode holding one stage would run PP > 1, which a lone role is not
    assert all(lp.unstartable(s) is None for s in specs)
    assert all(side["stage"] == [0, side["num_layers"]] for s in specs for side in s.values())
    kinds = {type(lp.expected(s)) for s in specs}
    assert kinds == {Plan, Rejection}
    for s in specs:
        if s["prefill"]["attention"] != s["decode"]["attention"] or s["prefill"]["num_layers"] != s["decode"]["num_layers"]:
            assert isinstance(lp.expected(s), Rejection), lp.describe(s)
    small = sample(lp.smaller_than(specs[0]), 20, 0)
    assert all(p["prefill"]["num_layers"] <= specs[0]["prefill"]["num_layers"] for p in small)
    assert all(lp.unstartable(p) is None for p in small)


def test_a_staged_decode_without_pp_is_named_as_a_server_sglang_cannot_be():
    spec = sample(lp.pair_specs(), 1, 0)[0]
    spec["prefill"] = spec["decode"] = {**spec["decode"], "num_layers": 2, "stage": [1, 2]}
    assert "stage [1, 2) of 2 layers" in lp.unstartable(spec)


def test_after_the_chunk_the_decode_is_read_before_the_prefill():
    spec = sample(lp.pair_specs(), 1, 0)[0]
    waits = [(s.role, s.statuses) for s in lp.transfer_steps(spec, P, D, seed=0) if type(s).__name__ == "AwaitStatus"]
    done = (KVPoll.Success, KVPoll.Failed)
    assert [role for role, statuses in waits if statuses == done] == [D, P]


def test_a_pair_the_engine_cannot_take_on_this_machine_is_not_judged_here():
    """NIXL's refusal of DRAM KV (an adapter's Unsupported) cuts the pair short; the thread it
    killed does not make it a silent refusal, and with nothing else wrong the check is
    UNSUPPORTED, as draft-kv-layout's skipped layouts are."""
    from harness.judge import checks

    cut = [_asked(1.0), _at(1.1, {"op": "await_status", "type": "fail", "role": P, "unsupported": True,
                                  "error": "prefill-P0.await_status raised Unsupported: needs VRAM: run on a GPU host"}),
           _at(1.2, {"op": "layout-pair", "type": "fail", "role": P, "unsupported": True,
                     "error": "transfer cut short: prefill-P0.await_status: needs VRAM: run on a GPU host"}),
           _at(1.5, {"op": "observe", "type": "ok", "role": P, "value": {"dead_threads": [
               {"thread": "Thread-7 (bootstrap_thread_guarded)", "exception": "NotImplementedError"}]}})]
    outcome, detail = judged.classify(MARK, [_started(), *cut])
    assert outcome == judged.UNSUPPORTED and "needs VRAM: run on a GPU host" in detail, detail
    cut_short = [{**e, "unsupported": False} for e in cut]
    assert judged.classify(MARK, [_started(), *cut_short])[0] == judged.REFUSED_SILENTLY  # a plain cut: its dead thread
    right = [_asked(1.0), _poll(1.2, D, KVPoll.Success), _poll(1.3, P, KVPoll.Success), _verify(1.4)]
    wrong = [*right[:3], _verify(1.4, ok=False, pages=1, named=1)]
    ok, detail, _ = judged.pairs_as_specified()([*_pair(0, right), *_pair(1, cut)])
    assert ok == checks.UNSUPPORTED and "1 not judged here" in detail and "P1 [unsupported]" in detail
    assert judged.pairs_as_specified()([*_pair(0, wrong), *_pair(1, cut)])[0] is False
