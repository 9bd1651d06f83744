"""The KV/aux pattern names every misplaced byte: layer, K/V, page, and its source."""

import pytest
import torch

from harness.role import pattern as p


def test_every_word_decodes_to_its_origin():
    t = p.pattern(p.DECODE, p.V, 7, num_pages=5, page_bytes=64)
    words = t.view(torch.int64)
    tag = p.Tag.decode(int(words[3, 5]))
    assert (tag.side, tag.kind, tag.layer, tag.page, tag.word) == (p.DECODE, p.V, 7, 3, 5)
    assert tag.describe() == "decode layer 7 V page 3"


def test_exact_transfer_verifies():
    spec = p.BufferSpec(p.K, 2)
    moves = [(1, 4), (3, 0)]
    actual = p.expected_destination(spec, 8, 64, moves)
    report = p.PoolReport()
    p.verify_buffer(spec, actual, moves, report)
    assert report.ok
    assert report.bytes_verified == 2 * 64
    assert report.bytes_untouched_checked == 6 * 64


def test_misplaced_page_names_layer_kind_and_page():
    spec = p.BufferSpec(p.V, 1)
    moves = [(2, 5), (3, 6)]
    actual = p.expected_destination(spec, 8, 64, moves)
    # The V pages of the wrong layer (2) landed in decode layer 1's page 6.
    actual[6] = p.pattern(p.PREFILL, p.V, 2, 8, 64)[3]
    report = p.PoolReport()
    p.verify_buffer(spec, actual, moves, report)
    assert not report.ok and report.mismatch_pages == 1
    (m,) = report.mismatches
    assert m.describe() == (
        "decode layer 1 V page 6: expected prefill layer 1 V page 3, found prefill layer 2 V page 3 "
        "(8 bad 8-byte words from word 0)"
    )


def test_k_bytes_in_a_v_page_are_named():
    spec = p.BufferSpec(p.V, 0)
    actual = p.expected_destination(spec, 4, 64, [(0, 1)])
    actual[1] = p.pattern(p.PREFILL, p.K, 0, 4, 64)[0]
    report = p.verify_pools([(spec, actual)], [(0, 1)], [])
    assert "found prefill layer 0 K page 0" in report.mismatches[0].describe()


def test_write_into_untouched_page_is_caught():
    spec = p.BufferSpec(p.K, 0)
    actual = p.expected_destination(spec, 4, 64, [(0, 1)])
    actual[3, 8:16] = 0  # one stray word in a page that must stay untouched
    report = p.verify_pools([(spec, actual)], [(0, 1)], [])
    assert report.mismatch_pages == 1
    m = report.mismatches[0]
    assert (m.page, m.first_bad_word, m.bad_words) == (3, 1, 1)
    assert "expected decode layer 0 K page 3" in m.describe()
    assert "unrecognised bytes" in m.describe()


def test_aux_slot_mismatch_names_the_slot():
    spec = p.BufferSpec(p.AUX, 0)
    actual = p.expected_destination(spec, 4, 32, [(1, 2)])
    actual[2] = p.pattern(p.PREFILL, p.AUX, 0, 4, 32)[0]
    report = p.verify_pools([(spec, actual)], [], [(1, 2)])
    assert report.mismatches[0].describe().startswith(
        "decode aux buffer 0 slot 2: expected prefill aux buffer 0 slot 1, found prefill aux buffer 0 slot 0")


@pytest.mark.parametrize("page_bytes", [0, 12, -8])
def test_page_bytes_must_be_whole_words(page_bytes):
    with pytest.raises(ValueError, match="multiple of 8"):
        p.pattern(p.PREFILL, p.K, 0, 4, page_bytes)


def test_shifted_word_inside_the_right_page_names_the_words():
    spec = p.BufferSpec(p.K, 0)
    actual = p.expected_destination(spec, 4, 64, [(2, 1)])
    actual[1, 8:16] = actual[1, 16:24].clone()  # word 1 holds word 2's bytes
    report = p.verify_pools([(spec, actual)], [(2, 1)], [])
    text = report.mismatches[0].describe()
    assert "expected prefill layer 0 K page 2 word 1, found prefill layer 0 K page 2 word 2" in text


# --- attention TP: head slices --------------------------------------------------------------------

TOTAL_HEADS, PAGE_SIZE, HEAD_BYTES = 4, 4, 16


def _rank(tp: int, rank: int) -> p.Heads:
    return p.Heads(TOTAL_HEADS, rank * (TOTAL_HEADS // tp), TOTAL_HEADS // tp, PAGE_SIZE)


def _slice_copy(src_page: torch.Tensor, src: p.Heads, dst_page: torch.Tensor, dst: p.Heads,
                head_offset_error: int = 0) -> None:
    """Copy the heads ``src`` and ``dst`` share, token by token, the way a head-sliced transfer
    (mooncake send_kvcache_slice) writes them; ``head_offset_error`` shifts the destination."""
    for token in range(PAGE_SIZE):
        for head in range(max(src.start, dst.start), min(src.start + src.count, dst.start + dst.count)):
            s = (token * src.count + head - src.start) * HEAD_BYTES
            d = (token * dst.count + head - dst.start + head_offset_error) * HEAD_BYTES
            dst_page[d:d + HEAD_BYTES] = src_page[s:s + HEAD_BYTES]


def test_prefill_tp2_into_decode_tp1_head_slices_verify_and_a_misplaced_slice_is_named():
    """Each prefill rank holds 2 of the 4 KV heads; the decode holds all 4.  A right transfer
    verifies byte for byte; rank 1's slice written at head 2's offset of token 1 ... named."""
    page_p, page_d = PAGE_SIZE * 2 * HEAD_BYTES, PAGE_SIZE * 4 * HEAD_BYTES
    whole = p.Heads(TOTAL_HEADS, 0, TOTAL_HEADS, PAGE_SIZE)
    ranks = [p.pattern(p.PREFILL, p.K, 0, 8, page_p, _rank(2, r)) for r in (0, 1)]
    decode = p.pattern(p.DECODE, p.K, 0, 8, page_d, whole)
    for r, pool in enumerate(ranks):
        _slice_copy(pool[3], _rank(2, r), decode[5], whole)
    spec = p.BufferSpec(p.K, 0, whole)
    report = p.PoolReport()
    p.verify_buffer(spec, decode, [(3, 5)], report)
    assert report.ok and report.bytes_verified == page_d

    # plant one misplaced head slice: prefill rank 0's head 1 of token 1 lands where head 0 belongs
    wrong = decode.clone()
    row = (1 * TOTAL_HEADS + 0) * HEAD_BYTES
    wrong[5, row:row + HEAD_BYTES] = ranks[0][3, (1 * 2 + 1) * HEAD_BYTES:(1 * 2 + 2) * HEAD_BYTES]
    report = p.PoolReport()
    p.verify_buffer(spec, wrong, [(3, 5)], report)
    (m,) = report.mismatches
    assert m.describe() == ("decode layer 0 K page 5: expected prefill layer 0 K page 3 token 1 head 0, found "
                            "prefill layer 0 K page 3 token 1 head 1 (2 bad 8-byte words from word 8)")


def test_prefill_tp1_into_decode_tp2_each_rank_checks_its_own_heads():
    page_p, page_d = PAGE_SIZE * 4 * HEAD_BYTES, PAGE_SIZE * 2 * HEAD_BYTES
    whole = p.Heads(TOTAL_HEADS, 0, TOTAL_HEADS, PAGE_SIZE)
    prefill = p.pattern(p.PREFILL, p.V, 1, 8, page_p, whole)
    for r in (0, 1):
        decode = p.pattern(p.DECODE, p.V, 1, 8, page_d, _rank(2, r))
        _slice_copy(prefill[2], whole, decode[0], _rank(2, r))
        report = p.PoolReport()
        p.verify_buffer(p.BufferSpec(p.V, 1, _rank(2, r)), decode, [(2, 0)], report)
        assert report.ok, report.to_dict()
    # decode rank 1 given rank 0's heads (the wrong slice of the prefill's page): every token named
    decode = p.pattern(p.DECODE, p.V, 1, 8, page_d, _rank(2, 1))
    _slice_copy(prefill[2], whole, decode[0], _rank(2, 0))  # copies heads 0-1 as if they were 2-3
    report = p.PoolReport()
    p.verify_buffer(p.BufferSpec(p.V, 1, _rank(2, 1)), decode, [(2, 0)], report)
    assert report.mismatches[0].describe() == (
        "decode layer 1 V page 0: expected prefill layer 1 V page 2 token 0 head 2, found prefill layer 1 V page 2 "
        "token 0 head 0 (16 bad 8-byte words from word 0)")


def test_heads_tags_without_tp_are_the_plain_ones():
    """A rank holding every head, or no Heads at all: the same tags as before TP existed."""
    whole = p.Heads(4, 0, 4, 4)
    assert torch.equal(p.pattern(p.PREFILL, p.K, 1, 3, 4 * 4 * 16, whole), p.pattern(p.PREFILL, p.K, 1, 3, 256))
    with pytest.raises(ValueError, match="is not 4 tokens x 4 heads"):
        p.pattern(p.PREFILL, p.K, 1, 3, 72, whole)
