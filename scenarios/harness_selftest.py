"""Test-only scenarios for the harness itself (hidden unless PDCONFORM_TEST_SCENARIOS=1).

``selftest-hang`` never finishes, so the runner must kill it at its deadline and
report ERROR; ``selftest-noop`` runs no step and must PASS right after it.
Neither starts a role, so they cost no sglang import.
"""

from __future__ import annotations

from harness.judge import checks as c
from harness.spec.scenario import Scenario, register
from harness.spec.steps import ArmPoint, Sleep, VerifyPools


def _selftest(id: str, title: str, steps, timeout_s: float) -> None:
    """Register a test-only scenario whose one check is that every step completed."""
    register(Scenario(id=id, title=title, steps=steps,
                      checks=lambda seed: [c.Check("steps-complete", "R-XFER-1", c.steps_completed())],
                      timeout_s=timeout_s, test_only=True))


register(
    Scenario(
        id="selftest-hang",
        title="A cell that hangs (harness self-test)",
        steps=lambda seed: [Sleep(3600.0)],
        checks=lambda seed: [],
        timeout_s=3.0,
        test_only=True,
    )
)


_selftest("selftest-noop", "A cell that does nothing (harness self-test)",
          lambda seed: [], 30.0)


def _misplaced_steps(seed: int):
    """happy-path, but the verification expects the first two destination pages
    swapped: the real transfer is right, so the check must fail and name them."""
    from scenarios import happy_path

    steps = happy_path.steps(seed)
    at = next(i for i, step in enumerate(steps) if isinstance(step, VerifyPools))
    moves = list(steps[at].kv_moves)
    (s0, d0), (s1, d1) = moves[0], moves[1]
    moves[0], moves[1] = (s0, d1), (s1, d0)
    return steps[:at] + [VerifyPools(tuple(moves), steps[at].aux_moves)] + steps[at + 1:]


register(
    Scenario(
        id="selftest-misplaced",
        title="happy-path checked against a wrong plan: the byte check must fail (harness self-test)",
        steps=_misplaced_steps,
        checks=lambda seed: [c.Check("bytes-exact", "R-LAYOUT-1", c.pools_exact())],
        timeout_s=150.0,
        test_only=True,
    )
)


def _open_room_steps(room: int):
    from harness.spec.protocol import KVPoll
    from harness.spec.steps import AwaitStatus, OpenRoom, StartRoles

    return lambda seed: [StartRoles(ready_timeout_s=30), OpenRoom(room),
                         AwaitStatus(room, "prefill", (KVPoll.Success, KVPoll.Failed), 2, must_come=False)]


_selftest("selftest-role-dies", "The prefill role process exits in the middle of a call (harness self-test, impl selftest)",
          _open_room_steps(1002), 60.0)  # backends.selftest.adapter.DIE_ROOM


def _observe_after(room: int):
    from harness.spec.steps import Observe

    return lambda seed: [*_open_room_steps(room)(seed), Observe(("prefill", "decode"))]


_selftest("selftest-leak-thread", "The prefill leaves a non-daemon thread running and module state changed (harness self-test)",
          _observe_after(1003), 30.0)  # backends.selftest.adapter.LEAK_ROOM

_selftest("selftest-native-crash", "The prefill crashes natively (SIGSEGV) inside a call (harness self-test)",
          _open_room_steps(1004), 30.0)  # backends.selftest.adapter.CRASH_ROOM

_selftest("selftest-clean", "An ordinary room, then an observation of the roles' threads and module state (harness self-test)",
          _observe_after(7), 30.0)

def _harness_bug_steps(seed: int):
    """A step that names a role the cell never started: the executor raises KeyError (a
    harness bug, not an implementation's), so the cell process crashes mid-steps."""
    from harness.spec.steps import Clear

    return [*_open_room_steps(1005)(seed), Clear(1005, "ghost")]


_selftest("selftest-harness-bug", "A step raises an unexpected exception in the cell driver (harness self-test)",
          _harness_bug_steps, 30.0)

_selftest("selftest-escapee", "The prefill starts a process in a session of its own that would outlive it "
          "(harness self-test)", _observe_after(1006), 30.0)  # backends.selftest.adapter.ESCAPE_ROOM

_selftest("selftest-hostile-text", "The prefill raises an exception whose message forges lines, markup and bidi "
          "text (harness self-test)", _open_room_steps(1007), 30.0)  # backends.selftest.adapter.HOSTILE_ROOM

_selftest("selftest-role-hangs", "The prefill role blocks forever inside a call (harness self-test, impl selftest)",
          _open_room_steps(1001), 6.0)  # backends.selftest.adapter.HANG_ROOM


# ---- fault mechanisms, exercised on the reference (tests/test_faults.py) --------------

KILL_ROOM, INJECT_ROOM = 4242, 4343


def _kill_steps(seed: int):
    from harness.spec.protocol import KVPoll
    from harness.spec.steps import AwaitStatus, KillRole, OpenRoom, RequestKV, StartRoles

    return [StartRoles(ready_timeout_s=60), OpenRoom(KILL_ROOM), RequestKV(KILL_ROOM, (1, 2), 0),
            AwaitStatus(KILL_ROOM, "prefill", (KVPoll.WaitingForInput,)), KillRole("prefill"),
            AwaitStatus(KILL_ROOM, "decode", (KVPoll.Failed, KVPoll.Success), timeout_s=20)]


def _reason_names_the_dead_prefill(events):
    addr = next(e["args"]["bootstrap_addr"] for e in events if e["op"] == "open_sender")
    waits = [e for e in events if e["op"] == "await_status" and e["role"] == "decode" and e["type"] == "ok"]
    reason = (waits[-1]["value"] or {}).get("failure_reason") or "" if waits else ""
    return addr in reason, f"decode failure reason: {reason!r} (dead prefill {addr})"


register(
    Scenario(
        id="selftest-kill-detected",
        title="The prefill process is killed: the decode room fails naming it (fault self-test)",
        steps=_kill_steps,
        checks=lambda seed: [
            c.Check("decode-failed", "R-HB-1", c.reached_status(KILL_ROOM, "decode", 0)),
            c.Check("reason-names-prefill", "R-HB-1", _reason_names_the_dead_prefill),
        ],
        timeout_s=90.0,
        test_only=True,
    )
)


INJECTED = ((b"BOGUS",), (b"REGISTER", b"1"), (b"ABORT", b"\xff", b"x", b"1"), (b"",))


def _inject_steps(seed: int):
    from harness.spec.steps import InjectFrames
    from scenarios import happy_path

    steps = happy_path.steps(seed)
    return [steps[0], InjectFrames("prefill", INJECTED)] + steps[1:]


def _injected_frames_were_delivered(events):
    obs = [e for e in events if e["op"] == "observe" and e["role"] == "prefill" and e["type"] == "ok"]
    logged = sum("malformed" in r["message"] for r in obs[-1]["value"]["log_records"]) if obs else 0
    return logged == len(INJECTED), f"{logged} of {len(INJECTED)} injected frames logged as malformed"


register(
    Scenario(
        id="selftest-inject-frames",
        title="Malformed frames are injected into the prefill's control socket before a room (fault self-test)",
        steps=_inject_steps,
        checks=lambda seed: [
            c.Check("delivered", "R-LIVE-1", _injected_frames_were_delivered),
            c.Check("loops-alive", "R-LIVE-2", c.loops_alive()),
            c.Check("bytes-exact", "R-LAYOUT-1", c.pools_exact()),
        ],
        timeout_s=90.0,
        test_only=True,
    )
)


def _happy_parts(seed: int):
    from scenarios import happy_path

    return happy_path, happy_path._plan(seed)


def _point_steps(seed: int):
    """happy-path with the prefill's transfer worker paused on the first chunk: the
    room cannot finish while it waits, and finishes once it is released."""
    from harness.spec.protocol import KVPoll
    from harness.spec.steps import (
        AwaitPoint,
        AwaitStatus,
        InitSender,
        OpenRoom,
        ReleasePoint,
        RequestKV,
        SendChunk,
        StartRoles,
        VerifyPools,
    )

    hp, (room, src, dst, aux_src, aux_dst, chunks) = _happy_parts(seed)
    arm = ArmPoint("prefill", "worker-take-chunk", action="pause", hold_s=30.0)
    return [
        StartRoles(layout=hp.LAYOUT, arm=(arm,)),
        OpenRoom(room), RequestKV(room, tuple(dst), aux_dst),
        AwaitStatus(room, "prefill", (KVPoll.WaitingForInput, KVPoll.Failed)),
        InitSender(room, hp.NUM_PAGES, aux_src),
        *[SendChunk(room, tuple(chunk)) for chunk in chunks],
        AwaitPoint("prefill", "worker-take-chunk"),
        AwaitStatus(room, "decode", (KVPoll.Success, KVPoll.Failed),
                    timeout_s=1.0, must_come=False),  # paused: must not come
        ReleasePoint("prefill", "worker-take-chunk"),
        AwaitStatus(room, "prefill", (KVPoll.Success, KVPoll.Failed)),
        AwaitStatus(room, "decode", (KVPoll.Success, KVPoll.Failed)),
        VerifyPools(tuple(zip(src, dst)), ((aux_src, aux_dst),)),
    ]


def _paused_then_released(seed: int):
    room = _happy_parts(seed)[1][0]

    def fn(events):
        waits = [e for e in events if e["op"] == "await_status" and e["role"] == "decode" and e["type"] == "ok"
                 and e["args"]["room"] == room]
        hits = [e["value"] for e in events if e["type"] == "nemesis" and e["op"] == "point-hit"]
        if len(waits) < 2 or not hits:
            return False, f"{len(waits)} decode polls, {len(hits)} point hits recorded"
        held, done = waits[0]["value"]["status_name"], waits[-1]["value"]["status_name"]
        ok = held != "Success" and done == "Success" and hits[0]["released"] is True
        return ok, f"while paused the decode saw {held}; after release {done}; hit {hits[0]}"

    return fn


register(
    Scenario(
        id="selftest-point-pause",
        title="The prefill transfer worker pauses at worker-take-chunk and resumes (fault self-test)",
        steps=_point_steps,
        checks=lambda seed: [
            c.Check("paused-then-released", "R-XFER-1", _paused_then_released(seed)),
            c.Check("bytes-exact", "R-LAYOUT-1", c.pools_exact()),
        ],
        timeout_s=90.0,
        test_only=True,
    )
)

FAIL_NTH = 2


def _engine_fault_steps(seed: int):
    """happy-path whose second transfer (the second chunk's KV write) fails in the engine."""
    from harness.spec.protocol import KVPoll
    from harness.spec.steps import AwaitStatus, EngineFaults, InitSender, OpenRoom, RequestKV, SendChunk, StartRoles

    hp, (room, src, dst, aux_src, aux_dst, chunks) = _happy_parts(seed)
    first = len(chunks[0])
    return [
        StartRoles(layout=hp.LAYOUT),
        OpenRoom(room), RequestKV(room, tuple(dst), aux_dst),
        AwaitStatus(room, "prefill", (KVPoll.WaitingForInput, KVPoll.Failed)),
        EngineFaults("prefill", fail_nth=FAIL_NTH),
        InitSender(room, hp.NUM_PAGES, aux_src),
        SendChunk(room, tuple(chunks[0])),
        Sleep(0.5),  # the first chunk's write is the first transfer
        SendChunk(room, tuple(chunks[1])),
        AwaitStatus(room, "prefill", (KVPoll.Success, KVPoll.Failed)),
        Sleep(0.5),
        VerifyPools(tuple(zip(src[:first], dst[:first])), ((aux_src, aux_dst),)),
    ]


def _exactly_the_nth_failed(events):
    faults = [e["value"] for e in events if e["type"] == "nemesis" and e["op"] == "engine-fault"]
    failed = [f["transfer"] for f in faults if f["fault"] == "fail"]
    return failed == [FAIL_NTH], f"injected engine faults: {faults}"


register(
    Scenario(
        id="selftest-engine-fault",
        title="The engine fails exactly the 2nd transfer: the room fails, the 1st chunk and aux landed (fault self-test)",
        steps=_engine_fault_steps,
        checks=lambda seed: [
            c.Check("only-nth-failed", "R-XFER-1", _exactly_the_nth_failed),
            c.Check("prefill-failed", "R-XFER-1", c.reached_status(_happy_parts(seed)[1][0], "prefill", 0)),
            c.Check("other-transfers-landed", "R-LAYOUT-1", c.pools_exact()),
        ],
        timeout_s=90.0,
        test_only=True,
    )
)


def _slow_write_steps(nth: int):
    """happy-path with a plan that makes the ``nth`` write 0.3 s slow: 1 fires (the room's first
    write), 50 can never fire (the room makes a handful), a planted inert fault (sglang #35890)."""
    from harness.spec.steps import EngineFaults
    from scenarios import happy_path

    def steps(seed: int):
        out = happy_path.steps(seed)
        return out[:1] + [EngineFaults("prefill", slow_nth=nth, slow_s=0.3)] + out[1:]
    return steps


for _nth, _what in ((1, "fires"), (50, "never fires")):
    _selftest(f"selftest-fault-{_what.replace(' ', '-')}",
              f"happy-path with a slow write that {_what}: a cell whose fault never fired is ERROR (fault self-test)",
              _slow_write_steps(_nth), 90.0)
