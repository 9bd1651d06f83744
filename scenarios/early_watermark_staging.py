"""early-watermark-staging: with staging on, a WATERMARK inside the prefill's constructor
window is dropped or deferred, never fatal (R-LIVE-3), and the first room is served (R-LIVE-4).

Staging on (``SGLANG_DISAGG_STAGING_BUFFER=1``) on both roles.  The WATERMARK is pushed
into the prefill's control socket from inside its manager's constructor, right after the
control thread started (``prefill-control-started``), while the constructor is held
0.5 s: the window in which Mooncake's ``_staging_ctx`` is not yet assigned (PR #35281
review); and, on a second prefill, a WATERMARK after start-up and before its first
registration, when a staging context made lazily at the first room does not exist yet
(R-LIVE-3: a message before the part it targets exists).  `early-watermark` judges the same
two with staging off, through the same steps (scenarios.early_watermark.watermark_steps); this one
isolates staging on.  An implementation that has no staging is UNSUPPORTED (the window does not
exist), and so is one whose staging buffers this machine cannot hold (sglang supports them on
cuda and xpu devices only; pdconform's roles keep their pools on the CPU).
"""

from __future__ import annotations

from harness.judge import checks as c
from harness.spec.scenario import Scenario, register
from harness.spec.steps import RequireFact
from scenarios._flows import room_succeeds
from scenarios.early_watermark import INIT, LATER, injected_in_window, rooms, watermark_steps

STAGING_ON = (("SGLANG_DISAGG_STAGING_BUFFER", "1"),)
LABEL = "after the init-window WATERMARK with staging on"
LATER_LABEL = "after a WATERMARK before the first registration, staging on"
NO_STAGING = "the implementation has no staging buffers, so the staging-on init window does not exist"


def steps(seed: int):
    return watermark_steps(seed, LABEL, LATER_LABEL, env=STAGING_ON, before=(RequireFact(INIT, "staging", NO_STAGING),))


def checks(seed: int):
    room_init, room_later = rooms(seed)
    return [
        c.Check("init-window-reached", "R-LIVE-3", injected_in_window),
        c.Check("survives-init-window-watermark", "R-LIVE-3", c.loops_alive_at(LABEL, (INIT,))),
        c.Check("survives-watermark-before-first-room", "R-LIVE-3", c.loops_alive_at(LATER_LABEL, (LATER,))),
        *room_succeeds(room_init, "R-LIVE-4", "room-after-init-window"),
        *room_succeeds(room_later, "R-LIVE-3", "room-after-early-watermark"),
        c.Check("bytes-exact", "R-LAYOUT-1", c.pools_exact()),
    ]


SCENARIO = register(
    Scenario(
        id="early-watermark-staging",
        title="With staging on, a WATERMARK in the prefill's init window is dropped; the first room is served",
        steps=steps,
        checks=checks,
        timeout_s=120.0,
    )
)
