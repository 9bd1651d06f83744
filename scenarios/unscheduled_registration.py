"""unscheduled-registration(-aborted): a decode registers a room the prefill never opens a
sender for; the prefill must not keep that registration (R-RESIDUE-2).

A prefill's scheduler may never take a request the decode already registered (it was
cancelled on the prefill, or routed elsewhere).  The registration then sits in the
prefill's manager with no sender to clear it.  R-RESIDUE-2: the prefill drops it once the
room's bootstrap timeout has passed (plus slack), and at once when the decode's ABORT of
the room arrives.

* ``unscheduled-registration``: a bootstrap timeout of 3 s, the default waiting timeout (far
  away).  The decode registers room ``never`` and keeps its receiver: no ABORT, no timeout of
  its own may drop the registration, only the prefill's bound.  The cell waits until the
  bootstrap timeout plus :data:`SLACK_S` has passed since the registration while the decode goes
  on registering and serving rooms (one a second, as a served decode does: the bound is the
  registration's own, whatever comes after it), then judges the prefill's state of ``never``.
* ``unscheduled-registration-aborted``: default timeouts (the bootstrap timeout is far
  away).  The decode registers room ``never``, aborts and clears it; a full room is served;
  the prefill is judged a second after the ABORT: only the ABORT can have dropped it.

Both are judged by the rule of the generic post-condition ``unscheduled-registration-dropped``
(harness.judge.unscheduled), which judges every unscheduled room of every cell once its bound
has passed; these scenarios wait out the bound and require the room to be judged.
"""

from __future__ import annotations

from dataclasses import replace

from harness.judge import checks as c
from harness.judge.unscheduled import ABORT_ARRIVAL_S, SLACK_S, registration_dropped
from harness.spec.scenario import Scenario, register
from harness.spec.steps import Abort, Clear, OpenRoom, RequestKV, Sleep, StartRoles
from scenarios._flows import LAYOUT, RoomAllocator, full_room, pair_healthy, room_succeeds, verify

TIMEOUT_S = 3
REGISTERED_S = 0.5  # for the decode's registration to reach the prefill (its handling takes milliseconds)
TRAFFIC = 5  # rooms the decode goes on registering and serving while the bound passes, one a second
#: the scenarios' pools: the unscheduled room, the later room and the traffic each need an aux slot
POOLS = replace(LAYOUT, aux_slots=2 + TRAFFIC)


def _plan(seed: int):
    planner = RoomAllocator(seed, POOLS)
    return planner.room(), planner.room(), [planner.room(num_pages=1, chunks=1) for _ in range(TRAFFIC)]


def steps(seed: int, aborted: bool):
    never, later, traffic = _plan(seed)
    # the decode's waiting timeout stays far away: nothing the decode does (a timeout, an ABORT) may drop it
    env = () if aborted else (("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", str(TIMEOUT_S)),)
    if aborted:
        end = [Abort(never.room, "decode"), Clear(never.room, "decode"), *full_room(later), Sleep(ABORT_ARRIVAL_S)]
    else:  # the prefill's bound passes while other rooms come and go
        end = [*full_room(later)]
        for room in traffic:  # a served decode keeps registering: the bound is the registration's own
            end += [Sleep((TIMEOUT_S + SLACK_S) / TRAFFIC), *full_room(room)]
    return [
        StartRoles(layout=POOLS, env=env),
        OpenRoom(never.room, open_sender=False),
        RequestKV(never.room, never.dst, never.aux_dst),
        Sleep(REGISTERED_S),
        *end,
        verify([later, *([] if aborted else traffic)]),  # the unscheduled room's pages were never written
    ]


def checks(seed: int, aborted: bool):
    _, later, _ = _plan(seed)
    return [  # the generic post-condition's rule, here required to judge the room
        c.Check("unscheduled-registration-dropped", "R-RESIDUE-2", registration_dropped(required=True)),
        *room_succeeds(later, "R-XFER-1", "later-room"),
        *pair_healthy(),
    ]


def _scenario(sid: str, aborted: bool) -> Scenario:
    return register(Scenario(
        id=sid,
        title="A registration the prefill never schedules is dropped "
              + ("when the decode aborts it" if aborted else "after its bootstrap timeout"),
        steps=lambda seed: steps(seed, aborted),
        checks=lambda seed: checks(seed, aborted),
        timeout_s=120.0,
        timeout_wait_s=0.0 if aborted else TIMEOUT_S,
        topologies=(("p1-d1",), "one prefill and one decode hold the registration; its state is the same on every shape"),
    ))


EXPIRES = _scenario("unscheduled-registration", aborted=False)
ABORTED = _scenario("unscheduled-registration-aborted", aborted=True)
