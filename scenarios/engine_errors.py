"""engine-post-error, engine-remote-disconnect: a write fails with the engine's own error kind.

Engine faults elsewhere fail a write the plain way (a failed state, a failed return code).
Real engines also fail in their own terms, and sglang's handling of each is a different code
path (sglang #40108: NIXL's remote-disconnect error surfacing from the transfer path).  Here
the prefill's first write of room ``hit`` fails as (harness.role.faults.EngineFaultPlan.error):

* ``engine-post-error``: the post call raises (NIXL: ``transfer`` raises ``nixlBackendError``);
* ``engine-remote-disconnect``: the state check raises ``nixlRemoteDisconnectError`` and the
  engine drops the decode's metadata until it is loaded again (backends/nixl/adapter.py
  ``FaultyNixlAgent``).

An engine without that kind of error makes the cell UNSUPPORTED.  With 3 s timeouts the room
must end on both sides within the waiting timeout plus 5 s of its last chunk (R-TIMEOUT-3's
bound), Failed with a reason or Success with every byte in place; no control loop or transfer
worker dies (R-LIVE-2); and once the engine is healed a new room between the same pair
succeeds with its bytes (R-NET-1: the pair serves again).
"""

from __future__ import annotations

from harness.judge import checks as c
from harness.judge import fault_checks as fc
from harness.role.faults import POST_ERROR, REMOTE_DISCONNECT
from harness.spec.scenario import Scenario, register
from harness.spec.steps import AwaitStatus, EngineFaults, StartRoles, VerifyPools
from scenarios._flows import DONE, LAYOUT, RoomAllocator, full_room, open_and_request, pair_healthy, room_succeeds, \
    send_all, verify

TIMEOUT_S = 3
BOUND_S = TIMEOUT_S + 5.0  # R-TIMEOUT-3: the waiting timeout plus 5 s of the room's last chunk
ENV = (("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", str(TIMEOUT_S)),
       ("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", str(TIMEOUT_S)))
ERRORS = {"engine-post-error": POST_ERROR, "engine-remote-disconnect": REMOTE_DISCONNECT}


def _plan(seed: int):
    planner = RoomAllocator(seed)
    return planner.room(), planner.room()


def steps(seed: int, error: str):
    hit, later = _plan(seed)
    return [
        StartRoles(layout=LAYOUT, env=ENV),
        *open_and_request(hit),
        EngineFaults("prefill", fail_nth=1, error=error),
        *send_all(hit),
        AwaitStatus(hit.room, "decode", DONE, timeout_s=BOUND_S + 2),
        AwaitStatus(hit.room, "prefill", DONE, timeout_s=BOUND_S + 2),
        VerifyPools(hit.kv_moves, ((hit.aux_src, hit.aux_dst),), settle_s=0.0, label="hit-room"),
        EngineFaults("prefill"),
        *full_room(later),
        verify([later], unchecked_kv=hit.dst, unchecked_aux=(hit.aux_dst,)),
    ]


def checks(seed: int):
    hit, later = _plan(seed)
    ends = [c.Check(f"hit-room-{side}-concludes", "R-TIMEOUT-3",
                    fc.concluded_within(hit.room, side, "send_chunk", "prefill", BOUND_S)) for side in ("decode", "prefill")]
    return [*ends, c.Check("hit-room-exact-or-failed", "R-XFER-2", fc.exact_or_failed(hit.room, "decode", 0)),
            *room_succeeds(later, "R-NET-1", "later-room"), *pair_healthy()]


def _scenario(sid: str) -> Scenario:
    error = ERRORS[sid]
    return register(Scenario(
        id=sid,
        title=f"A write fails with the engine's own {error} error: the room ends, the pair serves on",
        steps=lambda seed: steps(seed, error),
        checks=checks,
        timeout_s=120.0,
        timeout_wait_s=0.0,
        topologies=(("p1-d1",), "one prefill writing to one decode meets the error; the other shapes add no path"),
    ))


SCENARIOS = [_scenario(sid) for sid in ERRORS]
