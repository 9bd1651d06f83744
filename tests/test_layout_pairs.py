"""Layout pairs drawn side by side (harness.spec.layout_pairs) and how a pair's transfer is
judged (harness.judge.layout_pairs): planted histories for each of the four outcomes."""

from __future__ import annotations

from harness.judge import layout_pairs as judged
from harness.spec import layout_pairs as lp
from harness.spec.frames import sample
from harness.spec.layout_plan import Plan, Rejection
from harness.spec.protocol import KVPoll

MARK = {"seq": 0, "op": "layout-pair", "type": "info", "role": "prefill-P0",
        "args": {"prefill": "prefill-P0", "decode": "decode-P0", "expected": "serve"}}


def _poll(role: str, status: int, reason: str | None = None) -> dict:
    return {"seq": 1, "op": "await_status", "type": "ok", "role": role,
            "value": {"status": status, "failure_reason": reason}}


def _verify(ok: bool) -> dict:
    return {"seq": 2, "op": "verify", "type": "ok", "role": "decode-P0",
            "value": {"ok": ok, "mismatch_pages": 0 if ok else 1, "mismatches": [] if ok else ["decode layer 0 V page 3"]}}


def _refused(served: bool) -> dict:
    return {**MARK, "args": {**MARK["args"], "expected": "serve" if served else "refuse", "reason": "num_layers"}}


def test_each_outcome_is_told_from_the_history():
    both_ok = [_poll("prefill-P0", KVPoll.Success), _poll("decode-P0", KVPoll.Success)]
    both_failed = [_poll("prefill-P0", KVPoll.Failed), _poll("decode-P0", KVPoll.Failed, "layout rejected")]
    dead = {"seq": 3, "op": "observe", "type": "ok", "role": "prefill-P0",
            "value": {"dead_threads": [{"thread": "transfer_worker", "exception": "RuntimeError"}]}}
    cases = [
        (MARK, [*both_ok, _verify(True)], judged.RIGHT),
        (MARK, [*both_ok, _verify(False)], judged.WRONG),
        (_refused(False), [*both_ok, _verify(True)], judged.WRONG),  # served a pair the spec refuses
        (_refused(False), [*both_failed, _verify(True)], judged.RIGHT),
        (MARK, [*both_failed, _verify(True)], judged.REFUSED_VISIBLY),  # the spec serves it
        (_refused(False), [_poll("prefill-P0", KVPoll.WaitingForInput), _poll("decode-P0", KVPoll.Failed, "x"),
                           _verify(True)], judged.REFUSED_SILENTLY),  # one side only
        (_refused(False), [*both_failed, _verify(True), dead], judged.REFUSED_SILENTLY),
        (MARK, [_poll("prefill-P0", KVPoll.Failed), _poll("decode-P0", KVPoll.Failed), _verify(True)],
         judged.REFUSED_SILENTLY),  # no reason anywhere
        (MARK, [*both_ok], judged.UNVERIFIED),  # the pools were never checked: never "right"
        (MARK, [*both_ok, {**_verify(True), "type": "fail", "value": None, "error": "TimeoutError"}], judged.UNVERIFIED),
        (_refused(False), [*both_failed, {"seq": 2, "op": "verify", "type": "fail", "role": "decode-P0",
                                          "error": "x"}], judged.UNVERIFIED),
        (MARK, [*both_ok, {"seq": 3, "op": "observe", "type": "fail", "role": "decode-P0", "error": "gone"},
                _verify(True)], judged.REFUSED_SILENTLY),  # a role that cannot be observed
    ]
    for marker, events, want in cases:
        assert judged.classify(marker, events)[0] == want, (marker["args"], events)


def test_sides_are_drawn_on_their_own_and_the_spec_refuses_what_it_cannot_serve():
    specs = sample(lp.pair_specs(), 200, 3)
    for field in ("attention", "num_layers", "draft_layers", "page_size", "head_bytes", "stage"):
        assert any(s["prefill"][field] != s["decode"][field] for s in specs), field
    kinds = {type(lp.expected(s)) for s in specs}
    assert kinds == {Plan, Rejection}
    for s in specs:
        if s["prefill"]["attention"] != s["decode"]["attention"] or s["prefill"]["num_layers"] != s["decode"]["num_layers"]:
            assert isinstance(lp.expected(s), Rejection), lp.describe(s)
    small = sample(lp.smaller_than(specs[0]), 20, 0)
    assert all(p["prefill"]["num_layers"] <= specs[0]["prefill"]["num_layers"] for p in small)
