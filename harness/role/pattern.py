"""Deterministic KV/aux pool patterns that name every byte, and their verification.

Every 8-byte word of a pool holds a 64-bit tag that says where it was written::

    bit 62-63  side      1 = prefill, 2 = decode
    bit 60-61  kind      0 = K, 1 = V, 2 = aux
    bit 48-59  layer     model layer id (K/V) or aux buffer index (aux)
    bit 24-47  page      page (K/V) or aux slot index (aux)
    bit  0-23  word      8-byte word index inside the page/slot of the *whole model*

With attention TP a rank holds some of the model's KV heads (:class:`Heads`): a page is
``page_size`` tokens, each its heads one after another.  The word field then counts
words as if the page held every head of the model, so the same byte of the same head
carries the same tag on every rank that holds it, and a head slice written to the wrong
rank, head or token offset names the head it came from.  Without TP (one rank, every
head) it is the plain word index.

A decode pool starts filled with decode tags.  After a transfer of prefill page
``s`` into decode page ``d`` of the same layer and kind, page ``d`` must hold the
prefill tags of page ``s``; every other page must still hold its decode tags.
A misplaced byte therefore names both where it is and where it came from.

Pools are ``torch.uint8`` CPU tensors of shape ``[num_pages, page_bytes]``
(``page_bytes`` = bytes per page per buffer, a multiple of 8).  Pure functions:
no I/O, no sglang import.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

import torch

from harness.spec.protocol import layer_name

PREFILL, DECODE = 1, 2
K, V, AUX = 0, 1, 2
SIDE_NAMES = {PREFILL: "prefill", DECODE: "decode"}
KIND_NAMES = {K: "K", V: "V", AUX: "aux"}
WORD = 8
MAX_LAYER = (1 << 12) - 1
MAX_PAGE = (1 << 24) - 1


@dataclass(frozen=True)
class Heads:
    """Which of the model's ``total`` KV heads a rank's pages hold: ``count`` heads from
    global head ``start``, for pages of ``page_size`` tokens (harness.spec.topology)."""

    total: int
    start: int
    count: int
    page_size: int

    @classmethod
    def of(cls, layout) -> "Heads | None":
        """The heads of a :class:`~harness.spec.protocol.Layout`'s K/V pages; None when the
        rank holds every head (the word index is the plain one) or for MLA."""
        if layout.mla or layout.model_kv_heads == layout.kv_heads:
            return None
        return cls(layout.model_kv_heads, layout.head_start, layout.kv_heads, layout.page_size)

    def words_per_head(self, page_bytes: int) -> int:
        """8-byte words of one head of one token; ValueError when a page does not split so."""
        per_token, rest = divmod(page_bytes, self.page_size * self.count * WORD)
        if rest or per_token <= 0:
            raise ValueError(f"{page_bytes} bytes per page is not {self.page_size} tokens x {self.count} heads "
                             f"x a multiple of {WORD} bytes")
        return per_token

    def global_words(self, page_bytes: int) -> torch.Tensor:
        """For each local word of a page, its word index in the whole model's page."""
        wph = self.words_per_head(page_bytes)
        local = torch.arange(page_bytes // WORD, dtype=torch.int64)
        token, head, j = local // (self.count * wph), (local // wph) % self.count, local % wph
        return (token * self.total + self.start + head) * wph + j

    def where(self, global_word: int, page_bytes: int) -> str:
        """``token T head H`` of a whole-model word index."""
        wph = self.words_per_head(page_bytes)
        return f"token {global_word // (self.total * wph)} head {(global_word // wph) % self.total}"


def pattern(side: int, kind: int, layer: int, num_pages: int, page_bytes: int,
            heads: Heads | None = None) -> torch.Tensor:
    """Return a ``[num_pages, page_bytes]`` uint8 tensor of tags for one buffer; with
    ``heads``, the word field is the whole-model word index of each word (module docstring).

    Raises ValueError when ``page_bytes`` is not a positive multiple of 8 (of 8 x heads x
    page size with ``heads``) or an index does not fit its field.
    """
    if page_bytes <= 0 or page_bytes % WORD:
        raise ValueError(f"page_bytes must be a positive multiple of {WORD}, got {page_bytes}")
    if not 0 <= layer <= MAX_LAYER or num_pages - 1 > MAX_PAGE:
        raise ValueError(f"layer {layer} or page count {num_pages} does not fit the tag")
    words = page_bytes // WORD
    page = torch.arange(num_pages, dtype=torch.int64).unsqueeze(1)
    word = (torch.arange(words, dtype=torch.int64) if heads is None else heads.global_words(page_bytes)).unsqueeze(0)
    # side << 62 overflows int64 for side 2; build it from two halves.
    low = (kind << 60) | (layer << 48) | (page << 24) | word
    tags = low + torch.tensor(side, dtype=torch.int64).bitwise_left_shift(62)
    return tags.contiguous().view(torch.uint8).view(num_pages, page_bytes).clone()


@dataclass(frozen=True)
class Tag:
    """A decoded 64-bit word tag."""

    side: int
    kind: int
    layer: int
    page: int
    word: int

    @classmethod
    def decode(cls, value: int) -> "Tag":
        value &= (1 << 64) - 1
        return cls(
            side=value >> 62,
            kind=(value >> 60) & 0x3,
            layer=(value >> 48) & 0xFFF,
            page=(value >> 24) & 0xFFFFFF,
            word=value & 0xFFFFFF,
        )

    def describe(self) -> str:
        side = SIDE_NAMES.get(self.side)
        if side is None or self.kind not in KIND_NAMES:
            return "unrecognised bytes (no pattern tag)"
        if self.kind == AUX:
            return f"{side} aux buffer {self.layer} slot {self.page}"
        return f"{side} {layer_name(self.layer)} {KIND_NAMES[self.kind]} page {self.page}"


@dataclass(frozen=True)
class BufferSpec:
    """One registered buffer: which layer (or aux buffer index) and kind it holds, and,
    with attention TP, which KV heads its pages hold."""

    kind: int
    layer: int
    heads: Heads | None = None

    def name(self) -> str:
        if self.kind == AUX:
            return f"aux buffer {self.layer}"
        return f"{layer_name(self.layer)} {KIND_NAMES[self.kind]}"


@dataclass(frozen=True)
class Mismatch:
    """A destination page whose bytes are not what the transfer plan says.

    ``where`` names the destination (side, layer, K/V, page); ``expected`` and
    ``found`` name the source of the bytes by their tag.  ``unwritten``: the page was to
    receive bytes and its first wrong word still holds the decode's own tag (nothing landed
    there, as opposed to bytes from the wrong place).
    """

    buffer: str
    page: int
    first_bad_word: int
    bad_words: int
    expected: str
    found: str
    unwritten: bool = False

    def describe(self) -> str:
        unit = "slot" if self.buffer.startswith("aux") else "page"
        return (
            f"decode {self.buffer} {unit} {self.page}: expected {self.expected}, found "
            f"{self.found} ({self.bad_words} bad 8-byte words from word {self.first_bad_word})"
        )


@dataclass
class PoolReport:
    """Result of checking destination pools against a transfer plan.

    ``bytes_verified`` counts bytes of destination pages that were expected to
    receive data and hold exactly the right bytes; ``bytes_untouched_checked``
    counts bytes of pages that had to stay untouched and did; ``unwritten_pages`` counts
    pages that were to receive bytes and still hold the decode's own (R-XFER-2 when the room
    reads Success then).
    """

    bytes_verified: int = 0
    bytes_untouched_checked: int = 0
    mismatches: list[Mismatch] = field(default_factory=list)
    mismatch_pages: int = 0
    unwritten_pages: int = 0

    @property
    def ok(self) -> bool:
        return self.mismatch_pages == 0

    def to_dict(self) -> dict:
        return {
            "ok": self.ok,
            "bytes_verified": self.bytes_verified,
            "bytes_untouched_checked": self.bytes_untouched_checked,
            "mismatch_pages": self.mismatch_pages,
            "mismatches": [m.describe() for m in self.mismatches],
            "unwritten_pages": self.unwritten_pages,
            "unwritten": [m.describe() for m in self.mismatches if m.unwritten],
        }


def expected_destination(
    spec: BufferSpec,
    num_pages: int,
    page_bytes: int,
    moves: Sequence[tuple[int, int]],
) -> torch.Tensor:
    """The bytes a decode buffer must hold after ``moves`` = [(src_page, dst_page)]: in each
    received page, the prefill's bytes of the same heads (``spec.heads``) of the source page."""
    out = pattern(DECODE, spec.kind, spec.layer, num_pages, page_bytes, spec.heads)
    if moves:
        src = pattern(PREFILL, spec.kind, spec.layer, max(s for s, _ in moves) + 1, page_bytes, spec.heads)
        for s, d in moves:
            out[d] = src[s]
    return out


def verify_buffer(
    spec: BufferSpec,
    actual: torch.Tensor,
    moves: Sequence[tuple[int, int]],
    report: PoolReport,
    max_listed: int = 20,
    unchecked: Sequence[int] = (),
) -> None:
    """Compare one destination buffer with the plan; add results to ``report``.

    ``actual`` is the ``[num_pages, page_bytes]`` uint8 destination tensor (on any
    device: it is read back to host memory); ``unchecked`` pages are not judged (a
    transfer a fault cut short may or may not have written them).
    """
    actual = actual.cpu()  # a pool in device memory (run --pool-device cuda) is judged from a copy
    num_pages, page_bytes = actual.shape
    expected = expected_destination(spec, num_pages, page_bytes, moves)
    got_words = actual.contiguous().view(torch.int64)
    exp_words = expected.view(torch.int64)
    bad = got_words != exp_words
    received = {d for _, d in moves}
    bad_pages = bad.any(dim=1)
    skip = set(unchecked)
    for page in range(num_pages):
        if page in skip:
            continue
        if not bool(bad_pages[page]):
            if page in received:
                report.bytes_verified += page_bytes
            else:
                report.bytes_untouched_checked += page_bytes
            continue
        report.mismatch_pages += 1
        idx = int(bad[page].nonzero()[0])
        want, got = Tag.decode(int(exp_words[page, idx])), Tag.decode(int(got_words[page, idx]))
        unwritten = page in received and got.side == DECODE
        report.unwritten_pages += unwritten
        if len(report.mismatches) >= max_listed:
            continue
        expected, found = want.describe(), got.describe()
        if spec.heads is not None and spec.kind != AUX:  # name the head slice: where it is, whose it holds
            expected = f"{expected} {spec.heads.where(want.word, page_bytes)}"
            if got.side in SIDE_NAMES and got.kind in (K, V):
                found = f"{found} {spec.heads.where(got.word, page_bytes)}"
        if expected == found:  # same page, shifted or altered bytes: say which word
            expected, found = f"{expected} word {want.word}", f"{found} word {got.word} (value {int(got_words[page, idx]) & (2**64 - 1):#018x})"
        report.mismatches.append(
            Mismatch(
                buffer=spec.name(),
                page=page,
                first_bad_word=idx,
                bad_words=int(bad[page].sum()),
                expected=expected,
                found=found,
                unwritten=unwritten,
            )
        )


def verify_pools(
    buffers: Iterable[tuple[BufferSpec, torch.Tensor]],
    kv_moves: Sequence[tuple[int, int]],
    aux_moves: Sequence[tuple[int, int]],
    unchecked_kv: Sequence[int] = (),
    unchecked_aux: Sequence[int] = (),
    sent_layers: Sequence[int] | None = None,
) -> PoolReport:
    """Check every decode buffer: K/V buffers against ``kv_moves`` (page pairs,
    the same for every layer), aux buffers against ``aux_moves`` (slot pairs).
    ``unchecked_kv`` pages and ``unchecked_aux`` slots are not judged.  With
    ``sent_layers``, K/V buffers of other layers (a decode's own draft layers, a
    stage the prefill does not hold) must stay untouched."""
    report = PoolReport()
    sent = None if sent_layers is None else set(sent_layers)
    for spec, tensor in buffers:
        aux = spec.kind == AUX
        moves = aux_moves if aux else kv_moves if sent is None or spec.layer in sent else ()
        verify_buffer(spec, tensor, moves, report, unchecked=unchecked_aux if aux else unchecked_kv)
    return report
