"""Unit tests of harness.role.faults: points and the engine fault counter, without roles."""

import threading
import time

import pytest

from harness.role.faults import FAIL, NEVER, EngineFaultCounter, EngineFaultPlan, HeldConnection, PointError, Points


def test_pause_point_holds_the_thread_until_released():
    points = Points({"p": "test point"})
    points.arm("p", "pause", hold_s=5)
    done = threading.Event()
    worker = threading.Thread(target=lambda: (points.hit("p", room=7), done.set()))
    worker.start()
    for _ in range(200):
        if points.hits()["paused"] == ["p"]:
            break
        threading.Event().wait(0.01)
    assert points.hits()["paused"] == ["p"] and not done.is_set()
    assert points.release("p") is True
    worker.join(2)
    assert done.is_set()
    (hit,) = points.hits()["log"]
    assert hit["released"] is True and hit["facts"] == {"room": "7"}


def test_unarmed_point_costs_nothing_and_fires_once():
    points = Points({"p": "test point"})
    points.hit("p")  # not armed: returns at once
    points.arm("p", "pause", hold_s=0.05)
    points.hit("p")  # times out: released False
    points.hit("p")  # armed once only
    assert [h["released"] for h in points.hits()["log"]] == [False]


@pytest.mark.parametrize("point,action,hold", [("q", "pause", 1), ("p", "explode", 1), ("p", "pause", 0),
                                               ("p", "pause", float("inf"))])
def test_bad_arm_requests_are_refused(point, action, hold):
    with pytest.raises(PointError):
        Points({"p": "test point"}).arm(point, action, hold_s=hold)


def test_counter_fails_only_the_nth_and_logs_it():
    counter = EngineFaultCounter(EngineFaultPlan(fail_nth=3))
    assert [counter.next_transfer(f"t{i}") for i in range(5)] == [None, None, FAIL, None, None]
    (entry,) = counter.snapshot()
    assert isinstance(entry.pop("t"), float)  # wall-clock stamp of the injection
    assert entry == {"transfer": 3, "fault": "fail", "what": "t2"}


def test_counter_never_complete_and_group():
    counter = EngineFaultCounter(EngineFaultPlan(never_complete=True, fail_group=2))
    first = counter.next_transfer("a", counter.next_group())
    second = counter.next_transfer("b", counter.next_group())
    assert (first, second) == (NEVER, FAIL)


@pytest.mark.parametrize("fields", [{"fail_nth": 0}, {"fail_group": True}, {"delay_s": -1}, {"delay_s": float("nan")},
                                    {"aux_delay_s": -0.5}, {"aux_delay_s": True}])
def test_plan_rejects_bad_values(fields):
    with pytest.raises(ValueError):
        EngineFaultPlan(**fields)


class _Wire:
    """A socket stand-in that records when each message left."""

    def __init__(self):
        self.sent: list[tuple[float, list]] = []
        self.lock = threading.Lock()

    def send_multipart(self, parts):
        with self.lock:
            self.sent.append((time.monotonic(), list(parts)))


def test_a_held_message_delays_what_follows_it_on_its_connection_only():
    """The held AUX_DATA leaves after its hold, the STATUS sent behind it on the same
    connection leaves after it (in order), and another connection is not held at all."""
    held_wire, other_wire = _Wire(), _Wire()
    hold = lambda parts: 0.3 if parts[0] == b"AUX_DATA" else 0.0  # noqa: E731
    conn, other = HeldConnection(held_wire, hold), HeldConnection(other_wire, hold)
    start = time.monotonic()
    conn.send_multipart([b"AUX_DATA", b"7"])
    conn.send_multipart([b"STATUS", b"7"])
    other.send_multipart([b"STATUS", b"8"])
    assert [p for _, p in other_wire.sent] == [[b"STATUS", b"8"]] and held_wire.sent == []
    deadline = time.monotonic() + 5
    while len(held_wire.sent) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [p[0] for _, p in held_wire.sent] == [b"AUX_DATA", b"STATUS"]
    assert held_wire.sent[0][0] - start >= 0.3
    conn.send_multipart([b"STATUS", b"9"])  # the hold is over: straight through
    assert held_wire.sent[-1][1] == [b"STATUS", b"9"]


def test_an_engine_fault_plan_can_go_to_one_rank_of_a_role():
    """EngineFaults ``rank``: only that process of the role gets the plan (-1: its last PP
    stage or TP rank, so the others complete first); None: the role as a whole; a rank the
    role does not run ends the cell with a one-line reason."""
    from harness.drive.errors import CellAborted
    from harness.drive.executors import nemesis
    from harness.spec.steps import EngineFaults

    class Driver:
        def __init__(self):
            self.calls = []

        def ranks(self, role):
            return [role, f"{role}.pp1"]

        def nemesis_call(self, role, op, what, **kwargs):
            self.calls.append((role, op, kwargs["slow_nth"]))

    d = Driver()
    nemesis.engine_faults(d, EngineFaults("prefill", slow_nth=1, slow_s=1.0, rank=-1))
    nemesis.engine_faults(d, EngineFaults("prefill", slow_nth=2, slow_s=1.0))
    assert d.calls == [("prefill.pp1", "set_engine_faults", 1), ("prefill", "set_engine_faults", 2)]
    with pytest.raises(CellAborted, match="runs 2 process"):
        nemesis.engine_faults(d, EngineFaults("prefill", slow_nth=1, slow_s=1.0, rank=2))


class _Engine:
    """The one call of sglang's MooncakeTransferEngine the wrapper forwards (it counts them)."""

    def __init__(self):
        self.calls = 0

    def batch_transfer_sync(self, session_id, buffers, peer_buffer_addresses, lengths) -> int:
        self.calls += 1
        return 0


@pytest.mark.parametrize("slow_s, returns, forwarded", [(0.2, 0, 1), (5.0, -1, 0)])
def test_a_mooncake_batch_slower_than_the_engine_timeout_fails_at_the_timeout(monkeypatch, slow_s, returns, forwarded):
    """The real engine gives up on a batch after MC_TRANSFER_TIMEOUT seconds: a planned slow
    batch within it runs late; one beyond it returns -1 at the timeout and moves no bytes."""
    from backends.mooncake.adapter import FaultyMooncakeEngine

    monkeypatch.setenv("MC_TRANSFER_TIMEOUT", "0.5")
    real = _Engine()
    engine = FaultyMooncakeEngine(real, EngineFaultCounter(EngineFaultPlan(slow_nth=1, slow_s=slow_s)))
    begin = time.monotonic()
    assert engine.batch_transfer_sync("peer", [0], [0], [8]) == returns
    assert real.calls == forwarded
    faults = [entry["fault"] for entry in engine._counter.snapshot()]
    assert faults == (["slow"] if returns == 0 else ["slow", "fail"])  # a batch the engine gave up on is a failed write
    assert min(slow_s, 0.5) - 0.05 <= time.monotonic() - begin < min(slow_s, 0.5) + 2.0
    assert engine.batch_transfer_sync("peer", [0], [0], [8]) == 0  # the next batch is not slow
    assert real.calls == forwarded + 1
