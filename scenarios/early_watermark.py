"""early-watermark: a staging WATERMARK that arrives too early, or for staging
that is switched off, is dropped and never kills the prefill's control loop.

(a) The WATERMARK is pushed into the prefill's control socket from inside its
manager's constructor, right after the control thread started
(``prefill-control-started``), while the constructor is held for 0.5 s: the
window in which Mooncake's ``_staging_ctx`` is still unset (PR #35281 review).
(b) After start-up, with staging disabled (sglang's default), another WATERMARK.
After each, the prefill's loops must be alive (R-LIVE-3), and a new room must
complete (R-LIVE-3, R-LIVE-4).
"""

from __future__ import annotations

from harness import checks as c
from harness.scenario import Scenario, register
from harness.steps import ArmPoint, InjectFrames, Observe, StartRoles
from scenarios._flows import LAYOUT, Planner, full_room, room_succeeds, verify

# staging_handler.py's WATERMARK: tag, round, tail, session
WATERMARK = (b"WATERMARK", b"1", b"4096", b"pdconform-session")
INIT, LATER = "after the init-window WATERMARK", "after the WATERMARK with staging off"


def steps(seed: int):
    room = Planner(seed).room()
    arm = ArmPoint("prefill", "prefill-control-started", action="inject", frames=(WATERMARK,), hold_s=0.5)
    return [
        StartRoles(layout=LAYOUT, arm=(arm,)),
        Observe(("prefill",), settle_s=0.3, label=INIT),
        InjectFrames("prefill", (WATERMARK,)),
        Observe(("prefill",), settle_s=0.3, label=LATER),
        *full_room(room),
        verify([room]),
    ]


def _injected_in_window(events):
    hits = [e["value"] for e in events if e["type"] == "nemesis" and e["op"] == "point-hit"
            and e["value"]["point"] == "prefill-control-started"]
    if not hits:
        return False, "the prefill constructor never reached prefill-control-started: nothing was injected"
    return True, f"injected in the init window: {hits[0].get('delivered')}"


def checks(seed: int):
    room = Planner(seed).room()
    return [
        c.Check("init-window-reached", "R-LIVE-3", "MUST", _injected_in_window),
        c.Check("survives-init-window-watermark", "R-LIVE-3", "MUST", c.loops_alive_at(INIT, ("prefill",))),
        c.Check("survives-watermark-staging-off", "R-LIVE-3", "MUST", c.loops_alive_at(LATER, ("prefill",))),
        *room_succeeds(room, "R-LIVE-4", "new-room"),
        c.Check("bytes-exact", "R-LAYOUT-1", "MUST", c.pools_exact()),
        c.Check("no-dead-thread", "R-LIVE-2", "MUST", c.no_dead_threads()),
    ]


SCENARIO = register(
    Scenario(
        id="early-watermark",
        title="A WATERMARK in the prefill's init window and with staging off is dropped; a new room completes",
        requirements=("R-LIVE-3", "R-LIVE-4", "R-LAYOUT-1", "R-LIVE-2"),
        steps=steps,
        checks=checks,
        timeout_s=120.0,
    )
)
