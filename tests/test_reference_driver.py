"""The reference's real driver, in one process: a room over ZMQ with byte checks,
malformed frames survived (R-LIVE-1), a rejected layout failing visibly (R-LAYOUT-2)."""

import time

import pytest
import zmq

from backends.reference.adapter import ReferenceRole
from backends.reference.wire import MalformedFrame, parse
from harness.spec.protocol import KVPoll, Layout
from harness.role.recorder import RoleRecorder
from harness.drive.runner import free_port_block

LAYOUT = Layout(num_layers=2, num_pages=8, page_bytes=64, aux_slots=2, aux_bytes=32)


@pytest.fixture
def pair():
    import logging

    # a test run earlier in this process (import-linter's CLI configures logging) may have
    # disabled the loggers that existed then; a role process starts with them enabled
    logging.getLogger("pdconform.reference").disabled = False
    recorder = RoleRecorder().install()
    prefill, decode = ReferenceRole("prefill", recorder), ReferenceRole("decode", recorder)
    port = free_port_block(1)
    addr = prefill.start_prefill(LAYOUT.to_dict(), port)["bootstrap_addr"]
    decode.start_decode(LAYOUT.to_dict(), port)
    yield prefill, decode, addr
    prefill.teardown()
    decode.teardown()


def wait(role, room, statuses, timeout=5.0):
    deadline = time.monotonic() + timeout
    while role.poll(room) not in statuses and time.monotonic() < deadline:
        time.sleep(0.01)
    return role.poll(room)


def transfer(prefill, decode, addr, room, src, dst):
    prefill.open_sender(room, addr)
    decode.open_receiver(room, addr, 5)
    decode.request_kv(room, dst, 1)
    assert wait(prefill, room, (KVPoll.WaitingForInput,)) == KVPoll.WaitingForInput  # as sglang's scheduler waits
    prefill.init_sender(room, len(src), 0)
    prefill.send_chunk(room, src[:1])
    prefill.send_chunk(room, src[1:])
    return wait(prefill, room, (KVPoll.Success, KVPoll.Failed)), wait(decode, room, (KVPoll.Success, KVPoll.Failed))


def test_room_transfers_exact_bytes(pair):
    """The first room right after start-up is served (R-LIVE-4)."""
    prefill, decode, addr = pair
    assert transfer(prefill, decode, addr, 11, [1, 4, 6], [7, 0, 2]) == (KVPoll.Success, KVPoll.Success)
    report = decode.verify([(1, 7), (4, 0), (6, 2)], [(0, 1)])
    assert report["ok"], report["mismatches"]
    assert report["bytes_verified"] == 3 * 64 * 4 + 32


def test_malformed_frames_are_dropped_and_the_loop_lives(pair):
    prefill, decode, addr = pair
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 2000)  # deliver every frame before the socket closes
    sock.connect(prefill.side.endpoint)
    for frames in ([b"BOGUS"], [b"REGISTER", b"1"], [b"ABORT", b"\xff\xfe", b"x", b"1"],
                   [b"WRITE_DONE", b"abc", b"1", b"1", b""], [b""], [b"STATUS", b"1", b"1", b"4", b""],
                   [b"WATERMARK", b"11", b"0"]):  # staging off: dropped quietly (R-LIVE-3), not malformed
        sock.send_multipart(frames)
    sock.close()
    ctx.term()
    assert transfer(prefill, decode, addr, 12, [0, 1], [3, 4]) == (KVPoll.Success, KVPoll.Success)
    observed = prefill.observe()
    assert all(observed["loops"].values()) and not observed["dead_threads"]
    assert sum("malformed control frame" in r["message"] for r in observed["log_records"]) == 6, observed


@pytest.mark.parametrize("change", [{"num_layers": 1}, {"mla": True}, {"page_bytes": 128}, {"aux_bytes": 64},
                                    {"kv_heads": 2}, {"page_size": 8}])
def test_layout_mismatch_fails_the_room_at_bootstrap(pair, change):
    """R-LAYOUT-2: rejected before any byte moves, with the reason."""
    prefill, _, addr = pair
    recorder = RoleRecorder()
    decode = ReferenceRole("decode", recorder)
    decode.start_decode({**LAYOUT.to_dict(), **change}, 0)
    try:
        prefill.open_sender(13, addr)
        decode.open_receiver(13, addr, 5)
        assert wait(decode, 13, (KVPoll.Failed,)) == KVPoll.Failed
        reason = decode.failure_reason(13)
        # a TP rank's pages hold its share of the heads: what must match is the bytes of one head
        # of one token and the model's heads, not a rank's page size or head count
        field = {"page_bytes": "head_bytes", "kv_heads": "total_kv_heads"}.get(next(iter(change)), next(iter(change)))
        assert reason.startswith("layout rejected: ") and f"prefill {field}=" in reason, reason
    finally:
        decode.teardown()


def test_abort_with_a_bad_endpoint_cannot_kill_the_loop(pair):
    prefill, decode, addr = pair
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 2000)
    sock.connect(prefill.side.endpoint)
    sock.send_multipart([b"ABORT", b"5", b"not-an-endpoint", b"1"])
    sock.send_multipart([b"REGISTER", b"5", b"tcp://[::1", b"1", b"1", b"0"])
    sock.close()
    ctx.term()
    assert transfer(prefill, decode, addr, 14, [0], [1]) == (KVPoll.Success, KVPoll.Success)
    observed = prefill.observe()
    assert all(observed["loops"].values()) and not observed["dead_threads"]


def test_parse_refuses_wrong_arity_and_unknown_tags():
    with pytest.raises(MalformedFrame, match="REGISTER with 1 fields"):
        parse([b"REGISTER", b"1"])
    with pytest.raises(MalformedFrame, match="empty message"):
        parse([])


@pytest.mark.parametrize("fail_second_write", [False, True])
def test_a_killed_decode_fails_the_writes_to_it_and_leaves_no_residue(pair, fail_second_write):
    """found-reference-85608e36be (explore on the reference, issue 35) on the real driver: the
    decode dies (its sockets closed, as the kernel closes a killed process's) before the prefill
    writes to it.  Before the fix a write to it was never answered and waited out the transfer
    timeout (here the default 300 s): the room stayed Transferring (R-PEER-1), or, when the
    engine failed the next write and the room was cleared, its drain and write record stayed
    after the clear (R-RESIDUE-1).  The prefill must fail its writes to the lost decode at once,
    and hold nothing of the room within the harness's quiescence after the clear."""
    from harness.drive.cell import RESIDUE_SETTLE_S

    prefill, _, addr = pair
    decode = ReferenceRole("decode", RoleRecorder())
    decode.start_decode(LAYOUT.to_dict(), 0)
    room = 21
    prefill.open_sender(room, addr)
    decode.open_receiver(room, addr, 5)
    decode.request_kv(room, [0, 1, 2], 1)
    assert wait(prefill, room, (KVPoll.WaitingForInput,)) == KVPoll.WaitingForInput
    decode.teardown()
    if fail_second_write:
        prefill.set_engine_faults(fail_nth=2)
    prefill.init_sender(room, 3, 0)
    prefill.send_chunk(room, [0])
    prefill.send_chunk(room, [1])
    assert wait(prefill, room, (KVPoll.Success, KVPoll.Failed), timeout=10.0) == KVPoll.Failed
    reason = prefill.failure_reason(room)  # the lost decode's first write, or the engine fault, whichever came first
    assert f"decode {decode.side.endpoint} lost" in reason or (fail_second_write and "engine fault" in reason), reason
    prefill.clear(room)
    deadline = time.monotonic() + RESIDUE_SETTLE_S
    while prefill.observe([room])["rooms"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not prefill.observe([room])["rooms"], prefill.observe([room])["rooms"]
    assert all(prefill.observe()["loops"].values())


def test_an_api_call_submitted_before_a_waiting_frame_is_applied_first():
    """ControlSide: work submitted by an API call that has returned runs before a frame waiting
    at the same wake-up, so an injected frame never overtakes the open_sender that made its room
    (late-old-abort's ABORT copy met a room not yet opened, and a mutant that acts on it went
    unseen)."""
    from backends.reference.wire import ControlSide

    seen = []
    side = ControlSide("test", lambda frames: seen.append("frame"), lambda now: None)
    push = side.ctx.socket(zmq.PUSH)
    try:
        push.connect(side.endpoint)
        push.send_multipart([b"FRAME"])
        assert side.pull.poll(5000), "the frame never reached the socket"
        side.submit(lambda: seen.append("call"))
        side.thread.start()
        deadline = time.monotonic() + 5
        while len(seen) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert seen == ["call", "frame"]
    finally:
        push.close(0)
        side.close()
