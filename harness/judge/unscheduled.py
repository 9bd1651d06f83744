"""R-RESIDUE-2 in every cell: a registration the prefill never scheduled is dropped.

A decode may register a room (send its pages) that no prefill ever opens a sender for: the
request was cancelled on the prefill side, or routed elsewhere.  R-RESIDUE-2 bounds how long a
prefill may keep that registration: until the room's bootstrap timeout plus :data:`SLACK_S`
after it arrived, and no longer than the decode's ABORT of the room (plus
:data:`ABORT_ARRIVAL_S` for the ABORT to arrive and be handled).  This post-condition judges
every such room at each prefill's end-of-cell observation, once one of the two bounds has
passed by then; a room whose bounds have not passed is not judged.

Which rooms: those whose last lifecycle some decode registered (a ``request_kv`` that completed)
and no prefill role opened a sender for (:func:`unscheduled_rooms`).  Such rooms are R-RESIDUE-2's, not R-RESIDUE-1's: the
prefill never had a sender to clear (harness.judge.postconditions.no_residue_after_clear leaves
them out on the prefill side).  What may hold a prefill back is taken out of the bounds: the
ABORT route is not used when the ABORT was lost on purpose (R-LOSS-1) or the prefill was killed,
restarted, frozen or cut off from the network; the timeout bound also gets the time the prefill
stood frozen or cut off (a registration sent meanwhile arrives only at the thaw or heal); a prefill
with a point armed in it (a thread held on purpose) is not judged.
"""

from __future__ import annotations

from harness.spec.history import Event, Op, fact, held_rooms, is_prefill, last_observations, lost_message_rooms

SLACK_S = 2.0  # R-RESIDUE-2's bounded slack past the bootstrap timeout (docs/protocol.md)
ABORT_ARRIVAL_S = 1.0  # for the decode's ABORT to reach the prefill and be handled (loopback: milliseconds)
_HELD_BACK = (Op.KILL, Op.RESTART, Op.FREEZE, Op.NETWORK)  # after these the ABORT may not have arrived
_DECODE_ENDS = (Op.CLEAR, Op.RESTART, Op.START_DECODE)  # a room's lifecycle on the decode ends


def unscheduled_rooms(events: list[dict]) -> dict[int, float]:
    """Room -> ``t`` (s) of the first registration of its last lifecycle, for every room whose
    last registered lifecycle no prefill role opened a sender for, and of which no prefill
    sender is left open at the end (a state held then may be that sender's).

    A room's lifecycle on the decode ends at its ``clear`` there (or a decode start/restart);
    a sender the prefill opens after that belongs to the next one, whether it opens before or
    after that lifecycle's registration.  So a room reused after a served lifecycle is judged
    on its own last registration, not excused by the earlier sender."""
    lives: dict[int, list[dict]] = {}  # room -> its lifecycles: {"t": first registration, "opened": bool}
    open_senders: set[tuple[str, int]] = set()  # (prefill role, room): a sender opened and not cleared
    for e in events:
        role, room = str(e.get("role") or ""), (e.get("args") or {}).get("room")
        if e["type"] not in (Event.OK, Event.NEMESIS):
            continue
        if not is_prefill(role) and e["op"] in _DECODE_ENDS:
            for r, rl in lives.items():  # the room's lifecycle on the decode ended
                if (room is None or r == room) and rl[-1]["t"] is not None:
                    rl.append({"t": None, "opened": False})
        if is_prefill(role) and e["op"] in (Op.RESTART, Op.START_PREFILL):
            open_senders = {key for key in open_senders if key[0] != role.split(".")[0]}
        if not isinstance(room, int):
            continue
        life = lives.setdefault(room, [{"t": None, "opened": False}])[-1]
        if e["op"] == Op.OPEN_SENDER and is_prefill(role):
            life["opened"] = True
            open_senders.add((role.split(".")[0], room))
        elif e["op"] == Op.CLEAR and is_prefill(role):
            open_senders.discard((role.split(".")[0], room))
        elif e["op"] == Op.REQUEST_KV and not is_prefill(role) and life["t"] is None:
            life["t"] = e["t"]
    out = {}
    for room, rl in lives.items():
        last = next((life for life in reversed(rl) if life["t"] is not None), None)
        if last is not None and not last["opened"] and not any(key[1] == room for key in open_senders):
            out[room] = last["t"]
    return out


def _held_s(events: list[dict], role: str) -> float:
    """Seconds ``role``'s group was held back: frozen (FreezeRole to ThawRole, or to the cell's
    end), or named at either end of a network fault (the fault to the next heal of that link, or
    to the cell's end), as a registration sent meanwhile may arrive only at the thaw or heal.
    Overlapping windows are each counted (a bound that is too late is safe; too early is not)."""
    base, total, frozen, faulted = role.split(".")[0], 0.0, None, {}
    end = events[-1]["t"] if events else 0.0
    for e in events:
        if e["type"] != Event.NEMESIS:
            continue
        args = e.get("args") or {}
        if e["op"] in (Op.FREEZE, Op.THAW) and (e.get("role") or "").split(".")[0] == base:
            if e["op"] == Op.FREEZE and frozen is None:
                frozen = e["t"]
            elif e["op"] == Op.THAW and frozen is not None:
                total, frozen = total + e["t"] - frozen, None
        elif e["op"] == Op.NETWORK and base in {str(args.get(k) or "").split(".")[0] for k in "ab"}:
            link = frozenset((args.get("a"), args.get("b")))
            if link in faulted:  # a heal, or a fault that replaces the last: that window ends here
                total += e["t"] - faulted.pop(link)
            if not args.get("heal"):
                faulted[link] = e["t"]
    return total + (end - frozen if frozen is not None else 0.0) + sum(end - t for t in faulted.values())


def _observed_at(events: list[dict], observation: dict) -> float:
    """``t`` (s) of the call that made ``observation``: its invocation, since the state was read
    after it."""
    calls = [e for e in events if e["op"] == Op.OBSERVE and e["type"] == Event.INVOKE
             and e.get("role") == observation.get("role") and e["seq"] < observation["seq"]]
    return calls[-1]["t"] if calls else observation["t"]


def registration_dropped(required: bool = False):
    """The checker: :func:`unscheduled_registration_dropped`; ``required`` (a scenario that
    waits out the bound on purpose): a cell where no unscheduled room could be judged is not
    judged either (None), never a PASS."""

    def fn(events: list[dict]) -> tuple[bool | None, str, int | None]:
        ok, detail, at = unscheduled_registration_dropped(events)
        if required and ok is True and "past their bound" not in detail:
            return None, f"R-RESIDUE-2 could not be judged: {detail}", None
        return ok, detail, at

    return fn


def unscheduled_registration_dropped(events: list[dict]) -> tuple[bool | None, str, int | None]:
    """R-RESIDUE-2 (see the module docstring): no prefill's end-of-cell observation holds state
    of an unscheduled room whose bound had passed when it was made."""
    rooms = unscheduled_rooms(events)
    if not rooms:
        return True, "no registration went unscheduled", None
    aborted: dict[int, float] = {}
    for e in events:
        room = (e.get("args") or {}).get("room")
        if e["op"] == Op.ABORT and e["type"] == Event.OK and (e.get("role") or "").startswith("decode") \
                and room in rooms and e["t"] >= rooms[room]:  # an abort of this lifecycle, not an earlier one
            aborted.setdefault(room, e["t"])
    lost = lost_message_rooms(events, ("abort",))
    held_back = {str(name or "").split(".")[0] for e in events if e["type"] == Event.NEMESIS and e["op"] in _HELD_BACK
                 for name in (e.get("role"), (e.get("args") or {}).get("a"), (e.get("args") or {}).get("b"))}
    pointed = {(e.get("role") or "").split(".")[0] for e in events if e["op"] == Op.ARM_POINT}
    left, judged, at = [], 0, None
    for role, obs in sorted(last_observations(events).items()):
        base = role.split(".")[0]
        if not is_prefill(role) or obs["type"] != Event.OK or base in pointed:
            continue
        timeout, now, held = fact(events, role, "bootstrap_timeout_s"), _observed_at(events, obs), _held_s(events, role)
        due = {}
        for room, registered in rooms.items():
            bounds = [registered + timeout + SLACK_S + held] if isinstance(timeout, (int, float)) else []
            if room in aborted and room not in lost and base not in held_back:
                bounds.append(aborted[room] + ABORT_ARRIVAL_S)
            if bounds and now >= min(bounds):
                due[room] = min(bounds)
        judged += len(due)
        for room, paths in sorted(held_rooms(obs["value"], set(due)).items()):
            how = "after the decode's ABORT" if room in aborted and due[room] == aborted[room] + ABORT_ARRIVAL_S \
                else "past its bootstrap timeout"
            left.append(f"{role} room {room}, never scheduled, still held {now - due[room]:.1f} s {how} "
                        f"and its slack: {', '.join(sorted(set(paths))[:4])}")
            at = obs["seq"] if at is None else at
    if left:
        return False, "a registration the prefill never scheduled was kept: " + "; ".join(left[:6]), at
    if not judged:
        return True, f"{len(rooms)} registration(s) went unscheduled, none past its bound at the end", None
    return True, f"{judged} unscheduled registration(s) past their bound, none kept", None
