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
