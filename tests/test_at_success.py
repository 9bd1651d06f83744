"""Bytes in place at Success (R-XFER-2, issue 36 1b): the decode copies a room's destination
rows at its first Success read, and those copies are judged like the pools."""

from harness.judge import postconditions as pc
from harness.role import pattern
from harness.role.at_success import SuccessBytes
from harness.spec.history import History

PAGES, PAGE_BYTES, SLOTS, AUX_BYTES = 8, 64, 4, 32


def _pools(side: int):
    return [(pattern.BufferSpec(pattern.K, 0), pattern.pattern(side, pattern.K, 0, PAGES, PAGE_BYTES)),
            (pattern.BufferSpec(pattern.AUX, 0), pattern.pattern(side, pattern.AUX, 0, SLOTS, AUX_BYTES))]


def _land(decode, prefill, moves, aux_moves):
    for (src, dst) in moves:
        decode[0][1][dst] = prefill[0][1][src]
    for (src, dst) in aux_moves:
        decode[1][1][dst] = prefill[1][1][src]


def test_a_success_read_before_its_last_page_landed_is_caught_though_the_page_lands_later():
    prefill, decode, copies = _pools(pattern.PREFILL), _pools(pattern.DECODE), SuccessBytes()
    copies.requested(7, [2, 3], 1)
    _land(decode, prefill, [(0, 2)], [(0, 1)])  # page 3 not yet written
    copies.seen_success(7, decode)
    _land(decode, prefill, [(1, 3)], [])  # ... lands a moment later
    assert pattern.verify_pools(decode, [(0, 2), (1, 3)], [(0, 1)]).ok  # the settled pools pass
    then = copies.verify(decode, [(0, 2), (1, 3)], [(0, 1)])
    assert not then["ok"] and then["rooms"] == 1 and then["rows"] == 3
    assert any("page 3" in m for m in then["mismatches"]), then["mismatches"]


def test_a_success_read_with_every_byte_in_place_passes_and_a_later_read_is_not_copied_again():
    prefill, decode, copies = _pools(pattern.PREFILL), _pools(pattern.DECODE), SuccessBytes()
    copies.requested(7, [2, 3], 1)
    _land(decode, prefill, [(0, 2), (1, 3)], [(0, 1)])
    copies.seen_success(7, decode)
    decode[0][1][3] = 0  # a later scribble is the settled pools' business, not the copy's
    copies.seen_success(7, decode)
    assert copies.verify(decode, [(0, 2), (1, 3)], [(0, 1)])["ok"]
    copies.requested(7, [3], 2)  # a new lifecycle of room 7 voids the old copy of page 3
    assert copies.verify(decode, [(0, 2)], [(0, 1)], unchecked_kv=[3])["ok"]


def test_the_post_condition_names_early_bytes_and_leaves_bytes_wrong_at_both_moments_to_bytes_exact():
    h = History()
    h.record("ok", "verify", "decode", 1, args={}, value={
        "ok": True, "mismatches": [], "at_success": {"ok": False, "rooms": 1, "rows": 3, "mismatch_pages": 1,
                                                   "mismatches": ["layer 0 K page 3: decode tags"]}})
    ok, detail, at = pc.bytes_in_place_at_success(h.events)
    assert ok is False and "not in place at Success" in detail and "page 3" in detail and at is not None
    h = History()
    wrong = ["layer 0 K page 3: decode tags"]
    h.record("ok", "verify", "decode", 1, args={}, value={
        "ok": False, "mismatches": wrong, "at_success": {"ok": False, "rooms": 1, "rows": 3, "mismatch_pages": 1,
                                                        "mismatches": wrong}})
    assert pc.bytes_in_place_at_success(h.events)[0] is True


def test_a_row_still_unwritten_at_success_is_caught_though_it_never_lands():
    """A Success read while a named row still held the decode's own bytes is R-XFER-2 even
    when the row never lands (an aux slot sent to another rank only); bytes from the wrong
    place are not counted there."""
    prefill, decode, copies = _pools(pattern.PREFILL), _pools(pattern.DECODE), SuccessBytes()
    copies.requested(7, [2, 3], 1)
    _land(decode, prefill, [(0, 2), (1, 3)], [])  # the aux slot is never written
    copies.seen_success(7, decode)
    then = copies.verify(decode, [(0, 2), (1, 3)], [(0, 1)])
    assert then["unwritten_pages"] == 1 and "slot 1" in then["unwritten"][0], then
    final = pattern.verify_pools(decode, [(0, 2), (1, 3)], [(0, 1)]).to_dict()
    h = History()
    h.record("ok", "verify", "decode", 1, args={}, value={**final, "at_success": then})
    ok, detail, _ = pc.bytes_in_place_at_success(h.events)
    assert ok is False and "slot 1" in detail
    misplaced = _pools(pattern.DECODE)
    _land(misplaced, prefill, [(1, 2), (1, 3)], [(0, 1)])  # page 2 holds the wrong source page
    report = pattern.verify_pools(misplaced, [(0, 2), (1, 3)], [(0, 1)])
    assert report.mismatch_pages == 1 and report.unwritten_pages == 0


def test_a_slow_transfer_is_deferred_to_its_caller_or_slept_and_logged():
    import time

    import pytest

    from harness.role.faults import SLOW, EngineFaultCounter, EngineFaultPlan

    with pytest.raises(ValueError):
        EngineFaultPlan(slow_nth=0, slow_s=1.0)
    with pytest.raises(ValueError):
        EngineFaultPlan(slow_nth=1, slow_s=float("nan"))
    assert EngineFaultPlan(slow_nth=2, slow_s=0.5).engine_faults and not EngineFaultPlan(slow_nth=2).engine_faults
    counter = EngineFaultCounter(EngineFaultPlan(slow_nth=2, slow_s=0.2))
    assert counter.next_transfer("w1", defer_slow=True) is None
    assert counter.next_transfer("w2", defer_slow=True) == SLOW  # the caller completes it late
    start = time.monotonic()
    slept = EngineFaultCounter(EngineFaultPlan(slow_nth=1, slow_s=0.2))
    assert slept.next_transfer("w1") is None and time.monotonic() - start >= 0.2  # a synchronous engine waits
    assert [e["fault"] for e in counter.snapshot()] == ["slow"] and counter.snapshot()[0]["what"] == "w2"


def test_the_mori_standin_marks_only_its_nth_transfer_slow_and_logs_it():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "backends" / "mori" / "standin"))
    from mori.cpp import _faults

    try:
        _faults.set_standin_faults(slow_nth_transfer=1, slow_s=0.3)
        faults, fails = _faults.next_group()
        assert [_faults.next_transfer(faults, fails) for _ in range(3)] == [_faults.SLOW, None, None]
        assert [e["fault"] for e in _faults.standin_fault_log()] == ["slow"]
    finally:
        _faults.set_standin_faults()
