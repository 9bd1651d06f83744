"""early-watermark: a staging WATERMARK that arrives too early, or while staging
is switched off, is dropped and never kills the prefill's control loop.

Two prefills, so the two cases are judged apart (R-LIVE-3):
(a) ``prefill-init``: the WATERMARK is pushed into its control socket from inside
its manager's constructor, right after the control thread started
(``prefill-control-started``), while the constructor is held 0.5 s (the window in
which Mooncake's ``_staging_ctx`` is not yet assigned, PR #35281 review);
(b) ``prefill-later``: a WATERMARK after start-up.  Staging is off (sglang's
default) in both, so both also test a message for a feature that is switched off.
After each, that prefill's loops must be alive, and a new room to each must
complete (R-LIVE-3, R-LIVE-4).
"""

from __future__ import annotations

from harness.judge import checks as c
from harness.spec.scenario import Scenario, register
from harness.spec.steps import ArmPoint, InjectFrames, Observe, StartRoles
from scenarios._flows import LAYOUT, RoomAllocator, full_room, room_succeeds, verify

# staging_handler.py's WATERMARK: tag, round, tail, session
WATERMARK = (b"WATERMARK", b"1", b"4096", b"pdconform-session")
INIT, LATER = "prefill-init", "prefill-later"
INIT_LABEL, LATER_LABEL = "after the init-window WATERMARK", "after the WATERMARK sent after start-up"


def rooms(seed: int):
    """The room served by ``prefill-init`` and the one served by ``prefill-later``."""
    planner = RoomAllocator(seed)
    return planner.room(prefill=INIT), planner.room(prefill=LATER)


def watermark_steps(seed: int, init_label: str, later_label: str, env: tuple = (), before: tuple = ()) -> list:
    """The two WATERMARKs and a room to each prefill after them (the module docstring), the
    roles started with ``env`` and ``before`` run right after they start (early-watermark-staging:
    staging on, and the fact it needs)."""
    room_init, room_later = rooms(seed)
    arm = ArmPoint(INIT, "prefill-control-started", action="inject", frames=(WATERMARK,), hold_s=0.5)
    return [
        StartRoles(prefills=(INIT, LATER), layout=LAYOUT, arm=(arm,), env=env),
        *before,
        Observe((INIT,), settle_s=0.3, label=init_label),
        InjectFrames(LATER, (WATERMARK,)),
        Observe((LATER,), settle_s=0.3, label=later_label),
        *full_room(room_init),
        *full_room(room_later),
        verify([room_init, room_later]),
    ]


def steps(seed: int):
    return watermark_steps(seed, INIT_LABEL, LATER_LABEL)


def injected_in_window(events):
    """The WATERMARK armed at ``prefill-control-started`` was pushed in while the constructor held there."""
    hits = [e["value"] for e in events if e["type"] == "nemesis" and e["op"] == "point-hit"
            and e["value"]["point"] == "prefill-control-started"]
    if not hits:
        return False, "the prefill constructor never reached prefill-control-started: nothing was injected"
    return True, f"injected in the init window: {hits[0].get('delivered')}"


def checks(seed: int):
    room_init, room_later = rooms(seed)
    return [
        c.Check("init-window-reached", "R-LIVE-3", injected_in_window),
        c.Check("survives-init-window-watermark", "R-LIVE-3", c.loops_alive_at(INIT_LABEL, (INIT,))),
        c.Check("survives-watermark-staging-off", "R-LIVE-3", c.loops_alive_at(LATER_LABEL, (LATER,))),
        *room_succeeds(room_init, "R-LIVE-4", "room-after-init-window"),
        *room_succeeds(room_later, "R-LIVE-3", "room-after-later-watermark"),
        c.Check("bytes-exact", "R-LAYOUT-1", c.pools_exact()),
        c.Check("no-dead-thread", "R-LIVE-2", c.no_dead_threads()),
    ]


SCENARIO = register(
    Scenario(
        id="early-watermark",
        title="A WATERMARK in a prefill's init window, and one after start-up with staging off, is dropped",
        steps=steps,
        checks=checks,
        timeout_s=150.0,
    )
)
