"""Hypothesis strategies for control-plane frames a peer could send.

A *message* is a ZMQ multipart message: a tuple of ``bytes`` frames.  The
strategies cover what R-LIVE-1 lists (docs/protocol.md): truncated messages,
unknown tags, non-ASCII and non-numeric fields, empty and oversized frames,
extra frames, well-formed messages for rooms nobody holds, and duplicated or
reordered sequences of well-formed messages.

Well-formed messages follow the Common protocol's wire formats
(``sglang/srt/disaggregation/common/conn.py``: ``AbortNotification``,
``AbortAck``, the KV status message, ``CHUNK_READY``; ``common/staging_handler.py``:
WATERMARK, STAGING_RSP; the Mooncake/Mori ``AUX_DATA`` frame) and the
reference's own frames.  Their rooms are drawn from ``UNKNOWN_ROOMS``, a range no
scenario uses, so a conforming side must leave every room as it was.

:func:`sample` draws a deterministic list of messages for a seed, which is how
scenarios turn a strategy into steps.
"""

from __future__ import annotations

import struct
import threading
from unittest import mock

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

Message = tuple[bytes, ...]

#: rooms that no scenario opens (scenarios draw rooms below 2**62)
UNKNOWN_ROOMS = st.integers(min_value=2**62, max_value=2**63 - 1)
OVERSIZED_BYTES = 2 * 1024 * 1024
KNOWN_TAGS = (b"ABORT", b"ABORT_ACK", b"WATERMARK", b"STAGING_RSP", b"STAGING_REQ", b"CHUNK_READY", b"AUX_DATA",
              b"KV_STATUS", b"NixlMsgGuard", b"None", b"REGISTER", b"WRITE", b"WRITE_DONE", b"STATUS")

_ascii_int = st.integers(min_value=0, max_value=2**31).map(lambda n: str(n).encode("ascii"))
_room = UNKNOWN_ROOMS.map(lambda n: str(n).encode("ascii"))
_endpoint = st.tuples(st.just(b"127.0.0.1"), st.integers(1024, 65535).map(lambda p: str(p).encode()))
_non_ascii = st.binary(min_size=1, max_size=16).filter(lambda b: any(x >= 0x80 for x in b))
_non_numeric = st.sampled_from([b"", b"abc", b"1.5", b"-", b"0x10", b"1e3", b" 7", b"NaN", b"\x00"])


def well_formed_unknown_room() -> st.SearchStrategy[Message]:
    """One well-formed Common (or reference) message naming a room nobody holds."""
    abort = st.builds(lambda r, ep, g: (b"ABORT", r, *ep, g), _room, _endpoint, _ascii_int)
    abort_ack = st.builds(lambda r, rank, g: (b"ABORT_ACK", r, rank, g), _room, st.just(b"0"), _ascii_int)
    status = st.builds(lambda r, s: (r, s, b"0", b"pdconform: status for a room nobody holds"), _room,
                       st.sampled_from([b"0", b"2", b"3", b"4"]))
    tagged_status = st.builds(lambda tag, m: (tag, *m), st.sampled_from([b"KV_STATUS", b"NixlMsgGuard"]), status)
    chunk_ready = st.builds(lambda r: (b"CHUNK_READY", r, b"0", b"0", b"1", b"pdconform-writer", b"0"), _room)
    watermark = st.builds(lambda rnd, tail: (b"WATERMARK", rnd, tail, b"pdconform-session"), _ascii_int, _ascii_int)
    staging_rsp = st.builds(lambda r: (b"STAGING_RSP", r, b"0", b"0", b"0", b"0", b"pdconform-session"), _room)
    aux_data = st.builds(lambda r, slot: (b"AUX_DATA", r, b"0", str(slot).encode(), struct.pack(">I", 8), b"PDCONFRM"),
                         _room, st.integers(0, 3))
    reference = st.one_of(
        st.builds(lambda r: (b"STATUS", r, b"1", b"0", b"pdconform"), _room),
        st.builds(lambda r: (b"WRITE_DONE", r, b"1", b"0", b"pdconform"), _room),
    )
    return st.one_of(abort, abort_ack, status, tagged_status, chunk_ready, watermark, staging_rsp, aux_data, reference)


def truncated() -> st.SearchStrategy[Message]:
    """A well-formed message cut after its first k frames (k >= 1)."""
    return well_formed_unknown_room().filter(lambda m: len(m) > 1).flatmap(
        lambda m: st.integers(1, len(m) - 1).map(lambda k: m[:k]))


def unknown_tag() -> st.SearchStrategy[Message]:
    """A first frame no protocol knows, then a few arbitrary frames."""
    tag = st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZ_", min_size=1, max_size=12).map(str.encode)
    return st.tuples(tag.filter(lambda t: t not in KNOWN_TAGS),
                     st.lists(st.binary(max_size=24), max_size=6)).map(lambda t: (t[0], *t[1]))


def _replace_field(bad: st.SearchStrategy[bytes]) -> st.SearchStrategy[Message]:
    def swap(message: Message):
        return st.integers(0, len(message) - 1).flatmap(
            lambda i: bad.map(lambda b: message[:i] + (b,) + message[i + 1:]))
    return well_formed_unknown_room().flatmap(swap)


def non_ascii() -> st.SearchStrategy[Message]:
    """A well-formed message with one field (the tag included) replaced by non-ASCII bytes."""
    return _replace_field(_non_ascii)


def non_numeric() -> st.SearchStrategy[Message]:
    """A well-formed message with one field replaced by something that is not an integer."""
    return _replace_field(_non_numeric)


def empty() -> st.SearchStrategy[Message]:
    """Messages of empty frames only."""
    return st.integers(1, 4).map(lambda n: (b"",) * n)


def oversized() -> st.SearchStrategy[Message]:
    """A known tag followed by one frame of :data:`OVERSIZED_BYTES` bytes."""
    return st.sampled_from(KNOWN_TAGS).map(lambda tag: (tag, b"9" * OVERSIZED_BYTES))


def extra_frames() -> st.SearchStrategy[Message]:
    """A well-formed message with arbitrary frames appended."""
    return st.tuples(well_formed_unknown_room(), st.lists(st.binary(max_size=16), min_size=1, max_size=8)).map(
        lambda t: t[0] + tuple(t[1]))


def malformed() -> st.SearchStrategy[Message]:
    """Any single message of the kinds above."""
    return st.one_of(truncated(), unknown_tag(), non_ascii(), non_numeric(), empty(), oversized(),
                     extra_frames(), well_formed_unknown_room())


def duplicated_reordered() -> st.SearchStrategy[list[Message]]:
    """A sequence of well-formed unknown-room messages, each possibly repeated, shuffled."""
    return st.lists(well_formed_unknown_room(), min_size=2, max_size=5).flatmap(
        lambda ms: st.permutations(ms + ms[: len(ms) // 2 + 1]))


_SAMPLE_LOCK = threading.Lock()  # sample() patches a module attribute of hypothesis for its draw


def sample(strategy: st.SearchStrategy, count: int, seed: int) -> list:
    """``count`` examples of ``strategy``, the same ones for the same ``seed`` in any process.

    Uses hypothesis's own generator (``@seed``), without shrinking or the example
    database, so a cell's frames are reproducible from its seed alone.  Hypothesis also
    draws, now and then, constants it collects from the project's modules that the
    process has imported; a cell forked from a fork server, a fresh interpreter and the
    runner import different sets, so they drew different frames for one seed.  Here that
    collection is empty (and its scan, 0.5 s in a fresh cell, skipped); hypothesis's
    global constants still apply.  Thread-safe: the draw holds a lock.
    """
    drawn: list = []

    @settings(max_examples=count, database=None, phases=[Phase.generate], deadline=None,
              suppress_health_check=list(HealthCheck))
    @hypothesis_seed(seed)
    @given(strategy)
    def collect(example):
        if len(drawn) < count:
            drawn.append(example)

    with _SAMPLE_LOCK, _no_local_constants():
        collect()
    return drawn


def _no_local_constants():
    """A context in which hypothesis sees no constants of the project's own modules
    (hypothesis 6.170: ``providers._get_local_constants``; tests/test_frames.py proves the
    draw no longer depends on what was imported, and fails if a hypothesis upgrade moves it)."""
    from hypothesis.internal.conjecture import providers

    return mock.patch.object(providers, "_get_local_constants", lambda: providers.Constants())


def malformed_batch(count: int, seed: int) -> list[Message]:
    """The messages a malformed-frame scenario sends to one socket: ``count`` single
    messages plus one duplicated-and-reordered sequence, in a seed-fixed order."""
    singles = sample(malformed(), count, seed)
    sequence = sample(duplicated_reordered(), 1, seed + 1)
    return singles + [tuple(m) for m in (sequence[0] if sequence else [])]
