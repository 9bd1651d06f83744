"""malformed-frame: generated bad frames at the prefill's and the decode's control
sockets; the loops survive, no room changes, new rooms complete.

A room H is held at WaitingForInput on both sides.  Then, one kind at a time
(harness.spec.frames: truncated, unknown tag, non-ASCII, non-numeric, empty, oversized,
extra frames, well-formed for rooms nobody holds, duplicated and reordered), a
seed-fixed batch of messages goes to the prefill's and the decode's control
sockets one message at a time, and both roles are observed after each message, so a
dead loop is pinned to the exact message that killed it (R-LIVE-1): the batch is
narrowed to single messages up front, since a loop that died stays dead.  H must still be
WaitingForInput on both sides, then complete; a new room N must complete; and
every byte of the decode's pools must be H's, N's or untouched (a frame that
writes into the pools breaks R-LIVE-1's "no room changes").
"""

from __future__ import annotations

from harness.judge import checks as c
from harness.spec.history import Op
from harness.spec.protocol import KVPoll
from harness.spec.scenario import Scenario, register
from harness.spec.steps import AwaitStatus, InjectFrames, Observe, StartRoles
from scenarios._flows import (
    LAYOUT,
    RoomAllocator,
    await_done,
    full_room,
    open_and_request,
    room_succeeds,
    send_all,
    verify,
)

PER_KIND = 6
#: each kind and its strategy in harness.spec.frames (imported as the frames are drawn: hypothesis
#: costs every ``pdconform`` process about 0.2 s, and the registry reads every scenario)
KINDS = {
    "truncated": "truncated", "unknown-tag": "unknown_tag", "non-ascii": "non_ascii",
    "non-numeric": "non_numeric", "empty": "empty", "oversized": "oversized", "extra-frames": "extra_frames",
    "well-formed-unknown-room": "well_formed_unknown_room",
}
ROLES = ("prefill", "decode")


def batches(seed: int) -> dict[str, list[tuple[bytes, ...]]]:
    """Kind -> the messages sent for it (the same for a seed)."""
    from harness.spec import frames as f

    out = {kind: f.sample(getattr(f, strategy)(), 1 if kind == "oversized" else PER_KIND, seed * 101 + i)
           for i, (kind, strategy) in enumerate(KINDS.items())}
    sequence = f.sample(f.duplicated_reordered(), 1, seed * 101 + len(KINDS))
    out["duplicated-reordered"] = [tuple(m) for m in sequence[0]] if sequence else []
    return out


def _plan(seed: int):
    planner = RoomAllocator(seed)
    return planner.room(), planner.room()


def steps(seed: int):
    held, new = _plan(seed)
    out = [StartRoles(layout=LAYOUT), *open_and_request(held),
           AwaitStatus(held.room, "decode", (KVPoll.WaitingForInput,), timeout_s=5.0, must_come=False)]
    for kind, index, messages in _sends(seed):
        out += [*(InjectFrames(role, tuple(messages)) for role in ROLES),
                Observe(ROLES, settle_s=0.2, label=_label(kind, index))]
    out += [AwaitStatus(held.room, "prefill", (KVPoll.WaitingForInput,), timeout_s=0.0, label="prefill-after-frames",
                        must_come=False),
            AwaitStatus(held.room, "decode", (KVPoll.WaitingForInput,), timeout_s=0.0, label="decode-after-frames",
                        must_come=False),
            *send_all(held), *await_done(held), *full_room(new), verify([held, new])]
    return out


def _sends(seed: int) -> list[tuple[str, int | None, list[tuple[bytes, ...]]]]:
    """What goes to both control sockets, in order: ``(kind, index, messages)``, one message
    at a time (``index`` its place in its kind's batch), except the duplicated-reordered
    sequence, whose order is the point, so it goes as one batch (``index`` None)."""
    out: list[tuple[str, int | None, list[tuple[bytes, ...]]]] = []
    for kind, messages in batches(seed).items():
        if kind == "duplicated-reordered":
            out.append((kind, None, list(messages)))
        else:
            out += [(kind, index, [message]) for index, message in enumerate(messages)]
    return out


def _label(kind: str, index: int | None) -> str:
    return f"after {kind}" if index is None else f"after {kind} #{index + 1}"


def _loops_survived():
    """R-LIVE-1 at every observation after a message: the first message after which a role's
    loops were dead, quoted from the history (the inject event before that observation), so
    the verdict reads only what the cell sent."""

    def fn(events):
        sent = sum(e["args"]["messages"] for e in events if e["type"] == "nemesis" and e["op"] == "inject")
        kinds = {e["args"]["label"].split(" #")[0] for e in events if e["op"] == Op.OBSERVE_MID
                 and str((e.get("args") or {}).get("label", "")).startswith("after ")}
        killers, at = [], None
        for role in ROLES:
            last_inject = None
            for event in events:
                if event["role"] != role:
                    continue
                if event["type"] == "nemesis" and event["op"] == "inject":
                    last_inject = event
                    continue
                label = (event.get("args") or {}).get("label")
                if event["op"] != Op.OBSERVE_MID or not str(label).startswith("after "):
                    continue
                ok, detail, where = c.loops_alive_at(label, (role,))(events)
                if not ok:
                    at = where if at is None else min(at, where if where is not None else at)
                    killers.append(f"{detail} -- killed by {_what(label, last_inject)}")
                    break
        if killers:
            return False, "; ".join(killers), at
        return True, (f"prefill and decode loops survived {sent} injected message(s) of "
                      f"{len(kinds)} kinds, observed after each")

    return fn


def _what(label: str, inject: dict | None) -> str:
    """The message(s) an observation ``label`` ("after KIND #N" or "after KIND") followed."""
    kind, _, number = label[len("after "):].partition(" #")
    shown = (inject or {}).get("args", {}).get("sample") or []
    if not number:
        return f"the {kind!r} sequence of {(inject or {}).get('args', {}).get('messages', '?')} message(s)"
    first = _show(tuple(bytes.fromhex(part) for part in shown[0])) if shown else "(not recorded)"
    return f"the {kind!r} message #{number}: {first}"


def _show(message: tuple[bytes, ...]) -> str:
    return "[" + ", ".join(repr(part[:24]) + ("..." if len(part) > 24 else "") for part in message[:6]) + "]"


def checks(seed: int):
    held, new = _plan(seed)
    return [
        c.Check("loops-survive", "R-LIVE-1", _loops_survived()),
        c.Check("held-room-unchanged-prefill", "R-LIVE-1",
                c.status_at("prefill-after-frames", (KVPoll.WaitingForInput,))),
        c.Check("held-room-unchanged-decode", "R-LIVE-1",
                c.status_at("decode-after-frames", (KVPoll.WaitingForInput,))),
        c.Check("no-pool-change", "R-LIVE-1", c.pools_exact()),
        *room_succeeds(held, "R-LIVE-1", "held-room"),
        *room_succeeds(new, "R-LIVE-1", "new-room"),
        c.Check("no-dead-thread", "R-LIVE-2", c.no_dead_threads()),
    ]


SCENARIO = register(
    Scenario(
        id="malformed-frame",
        title="Generated malformed frames at both control sockets: loops survive, no room changes, rooms complete",
        steps=steps,
        checks=checks,
        timeout_s=150.0,
    )
)
