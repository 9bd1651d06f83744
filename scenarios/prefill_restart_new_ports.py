"""prefill-restart-new-ports: a prefill restarts behind the same bootstrap address
with new control ports; a new room to it must succeed.

A room completes between the decode and prefill P and is cleared, so the decode
has resolved P's control ports.  P is then replaced by a new process behind the
same bootstrap port (launched first, so the gap is only the new manager's
start-up; the new manager binds its own control ports).  The roles run with a
60 s heartbeat interval so that the decode's health checker cannot notice the
gap: what is judged is whether the decode re-resolves the ports itself, not a
race with the heartbeat.  A new room to P must succeed with exact bytes
(R-RESTART-1).
"""

from __future__ import annotations

from harness.judge import checks as c
from harness.spec.scenario import Scenario, register
from harness.spec.steps import Clear, RestartRole, StartRoles
from scenarios._flows import LAYOUT, RoomAllocator, full_room, pair_healthy, room_succeeds, verify

ENV = (("SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", "60"),)


def _plan(seed: int):
    planner = RoomAllocator(seed)
    return planner.room(), planner.room()


def steps(seed: int):
    before, after = _plan(seed)
    return [
        StartRoles(layout=LAYOUT, env=ENV),
        *full_room(before),
        Clear(before.room, "prefill"),
        Clear(before.room, "decode"),
        RestartRole("prefill"),
        *full_room(after),
        verify([before, after]),
    ]


def _ports_changed(events):
    restart = next((e for e in events if e["type"] == "nemesis" and e["op"] == "restart"), None)
    if restart is None:
        return False, "the prefill was never restarted"
    old = restart["args"].get("old_control_endpoint")
    new = next((e["value"].get("rank_port") for e in events if e["op"] == "start_prefill" and e["type"] == "ok"
                and e["seq"] > restart["seq"]), None)
    if new is None:
        return False, "the restarted prefill did not start"
    if old and old.endswith(f":{new}"):
        return None, f"the restarted prefill bound the same control port ({new}): the scenario proves nothing"
    return True, f"control endpoint moved from {old} to port {new}"


def checks(seed: int):
    before, after = _plan(seed)
    return [
        c.Check("ports-changed", "R-RESTART-1", _ports_changed),
        *room_succeeds(before, "R-XFER-1", "room-before-restart"),
        *room_succeeds(after, "R-RESTART-1", "room-after-restart"),
        *pair_healthy(),
    ]


SCENARIO = register(
    Scenario(
        id="prefill-restart-new-ports",
        title="A prefill restarted behind the same bootstrap address on new ports: the decode's next room succeeds",
        steps=steps,
        checks=checks,
        timeout_s=180.0,
        topologies=(("p1-d1", "p1-d1dp2"), "restarting a prefill of several TP ranks, PP stages or DP engines is not built (RestartRole)"),
    )
)
