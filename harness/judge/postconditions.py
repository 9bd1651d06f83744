"""Generic post-conditions: checks the judge adds to every scenario's own.

Some requirements hold in every cell, whatever the scenario sets out to show, so no scenario
has to remember them (one that forgets lets a broken backend pass):

* ``every-trail-terminal`` (R-TERM-1): over every recorded poll of every room on every
  role (each wait's whole trail of statuses, not only the status it ended on), once a room
  was seen Success or Failed every later read in that lifecycle says the same, the fresh
  reads of poll() and of the manager's own status table just before ``clear`` and at the
  end of the cell included (1c of issue 36: sglang's poll() caches its first terminal
  answer, so its table is read too); a lifecycle ends at ``clear`` of the room on that
  role, or when the role was started again;
* ``every-failure-has-reason`` (R-REASON-1): every Failed read, on any role and rank, has a reason;
* ``no-dead-thread`` (R-LIVE-2): no thread of any role died (unless the scenario judges it);
* ``no-residue-after-clear`` (R-RESIDUE-1): every room whose lifecycle ended with a
  ``clear`` on every role that named it (harness.spec.history.rooms_cleared_everywhere)
  has no per-room state left in any role at the end of the cell.  Quiescence: the cell
  observes such a role again, every RESIDUE_POLL_S for ``harness.drive.cell.RESIDUE_SETTLE_S``
  (plus the last observation call, itself bounded), while it still holds state of such a
  room (work in flight may still be draining); a role whose last observation failed is
  not judged on an older one; and the memory of ended generations that R-REUSE-1 allows
  (an adapter's ``remembered``) is not residue until the bootstrap timeout has passed,
  which the no-residue scenario waits out and judges itself;
* ``failure-reason-names-cause`` (R-REASON-1, SHOULD): every Failed read whose cause the
  history shows names it: a decode room whose prefill (the bootstrap address it was opened
  with) was killed before the read names that address; otherwise a room aborted (by either
  side) in the same lifecycle before the read, with no other fault in the cell before it
  (an engine fault plan, a kill, a freeze, a network fault, an injected frame), says "abort".  A failure with no cause the
  history can tell (a timer, an engine error) is left to its scenario; one without any
  reason is every-failure-has-reason's;
* ``bytes-in-place-at-success`` (R-XFER-2): each decode copies a room's destination rows
  when it first reads the room Success (harness.role.at_success); every pool verification
  judges those copies too, so a Success reported before its last byte landed fails even
  when the byte lands a moment later;
* ``ack-names-abort-generation`` (R-ABORT-2): every ABORT_ACK a decode received echoes the
  generation of an ABORT that decode sent for the room, at most once per sender;
* ``every-abort-answered`` (R-ABORT-2): with deferred KV release on, every ABORT generation a
  decode (each decode rank on its own) sent got at least one ABORT_ACK naming it back at that
  decode, once the ACK was due (see :func:`every_abort_answered`);
* ``every-abort-sent`` (R-ABORT-1): with deferred KV release on, each decode ``abort()`` of a
  room whose registration it sent and that never read Success sent an ABORT, whatever the
  room's status;
* ``unscheduled-registration-dropped`` (R-RESIDUE-2): harness.judge.unscheduled; the rooms it
  judges (no prefill opened a sender) are left out of ``no-residue-after-clear`` on prefills;
* ``every-message-whole`` (R-LOAD-1, in each role the cell pushed no frames into), ``decode-abort-fails-room`` (R-ABORT-1).

A scenario opts out of one only with a reason (Scenario ``opt_out``; ``pdconform list`` shows them).
"""

from __future__ import annotations

from harness.judge import checks as c
from harness.judge import fault_checks as fc
from harness.judge.decode_abort import decode_abort_fails_room
from harness.judge.unscheduled import registration_dropped, unscheduled_rooms
from harness.spec.history import (Event, Op, fact, held_rooms, is_prefill, last_observations, lost_message_rooms,
                                  rank_reads, rooms_cleared_everywhere)
from harness.spec.protocol import KVPoll, kvpoll_name

TERMINAL = (kvpoll_name(KVPoll.Success), kvpoll_name(KVPoll.Failed))
# a role's lifecycle starts again (its rooms are new) when it is started or restarted
_RESTARTS = (Op.START_PREFILL, Op.START_DECODE, Op.RESTART)


def trails(events: list[dict]) -> dict[tuple[str, int], list[list[str]]]:
    """Each ``(role, room)``'s lifecycles, in order, each the statuses read in it (KVPoll
    names, consecutive repeats kept once) from every AwaitStatus that completed, then the
    fresh reads of poll() and of the manager's own status table (RoleAdapter.status_map:
    sglang's poll() caches its first terminal answer, the table does not) taken just before
    each ``clear`` and, for a room still open, at the cell's final observation; a role of
    TP ranks has one per rank (``(rank role, room)``: each rank's own reads)."""
    out: dict[tuple[str, int], list[list[str]]] = {}
    for e in events:
        if e["type"] not in (Event.OK, Event.FAIL, Event.NEMESIS):  # a restart is a nemesis event
            continue
        role, room = e.get("role"), (e.get("args") or {}).get("room")
        value = e.get("value") if isinstance(e.get("value"), dict) else {}
        if e["op"] in _RESTARTS:
            for key, lives in out.items():
                if key[0] == role and lives[-1]:
                    lives.append([])
        elif e["op"] == Op.CLEAR and e["type"] == Event.OK and room is not None:
            ranks = value.get("ranks") or {}
            for name in (role, *ranks):
                lives = out.get((name, room))
                rank_value = ranks.get(name) if name in ranks else value
                _add_fresh_reads(lives, rank_value.get("before") if isinstance(rank_value, dict) else None)
                if lives and lives[-1]:
                    lives.append([])
        elif e["op"] == Op.OBSERVE and e["type"] == Event.OK and isinstance(value.get("statuses"), dict):
            for key, before in value["statuses"].items():  # the end of the cell: each open room read afresh
                _add_fresh_reads(out.get((role, int(key))), before)
        elif e["op"] == Op.AWAIT_STATUS and e["type"] == Event.OK and room is not None:
            reads = {name: r.get("trail") for name, r in rank_reads(e).items()}
            for name, trail in reads.items():
                life = out.setdefault((name, room), [[]])[-1]
                for status in trail or []:
                    if not life or life[-1] != status:
                        life.append(status)
    return out


def _add_fresh_reads(lives: list[list[str]] | None, before: dict | None) -> None:
    """Append a fresh read (RoleAdapter.status_before_clear: poll, then the manager's table) to
    the current lifecycle in ``lives``, when that lifecycle has reads; repeats kept once."""
    if not lives or not lives[-1] or not isinstance(before, dict):
        return
    for status in (before.get("poll"), before.get("map")):
        if status and lives[-1][-1] != status:
            lives[-1].append(status)


def every_trail_terminal(events: list[dict]) -> tuple[bool, str]:
    """R-TERM-1 over every read of every room: see the module docstring."""
    flips, rooms = [], trails(events)
    for (role, room), lives in rooms.items():
        for life in lives:
            first = next((i for i, s in enumerate(life) if s in TERMINAL), None)
            if first is not None and len(life) > first + 1:
                flips.append(f"{role} room {room}: {' -> '.join(life[first:])}")
    if flips:
        return False, "a terminal status changed between reads: " + "; ".join(flips[:3])
    return True, f"every terminal status held on every later read ({len(rooms)} room(s) on their roles)"


def every_failure_has_reason(events: list[dict]) -> tuple[bool, str, int | None]:
    """R-REASON-1 on every role and decode rank: each wait that ended Failed has a reason
    (decided at the first read without one)."""
    missing, failed, at = [], 0, None
    for e in events:
        if e["op"] != Op.AWAIT_STATUS or e["type"] != Event.OK:
            continue
        for name, read in rank_reads(e).items():
            if read.get("status") != KVPoll.Failed:
                continue
            failed += 1
            if read.get("failure_reason_error"):
                missing.append(f"{name} room {e['args'].get('room')} (its reason could not be read: "
                               f"{read['failure_reason_error'][:120]})")
            elif not (read.get("failure_reason") or "").strip():
                missing.append(f"{name} room {e['args'].get('room')}")
            else:
                continue
            at = e["seq"] if at is None else at
    if missing:
        return False, f"Failed without a failure reason: {', '.join(dict.fromkeys(missing))}", at
    return True, f"all {failed} Failed read(s) came with a reason", None


def _failed_reads(e: dict) -> list[tuple[str, str]]:
    """``(role or rank, reason)`` of each Failed read of one completed AwaitStatus event (a
    group's value holds each rank's under ``ranks``), reasons stripped, empty ones left out."""
    return [(name, (r.get("failure_reason") or "").strip()) for name, r in rank_reads(e).items()
            if r.get("status") == KVPoll.Failed and (r.get("failure_reason") or "").strip()]


def failure_reason_names_cause(events: list[dict]) -> tuple[bool, str, int | None]:
    """R-REASON-1 (SHOULD) on every Failed read whose cause the history shows: see the module
    docstring.  The cause of a read is decided at that read, from what came before it."""
    opened: dict[int, tuple[int, str]] = {}  # room -> (seq, bootstrap address) of its last open_receiver
    killed: list[tuple[int, str]] = []  # (seq, bootstrap address) of each killed prefill
    aborted: dict[int, int] = {}  # room -> seq of its last abort
    faulted = None  # seq of the cell's first fault of another kind: after it an abort is not the sure cause
    misses, judged, at = [], 0, None
    for e in events:
        args, room = e.get("args") or {}, (e.get("args") or {}).get("room")
        if e["op"] in _OTHER_FAULTS and e["type"] in (Event.NEMESIS, Event.INVOKE, Event.OK) and faulted is None:
            faulted = e["seq"]
        if e["type"] == Event.NEMESIS and e["op"] == Op.KILL:
            addr = fact(events, e["role"], "bootstrap_addr")
            if addr:
                killed.append((e["seq"], str(addr)))
        elif e["type"] == Event.INVOKE and e["op"] == Op.OPEN_RECEIVER and room is not None:
            opened[room] = (e["seq"], str(args.get("bootstrap_addr") or ""))
        elif e["type"] == Event.INVOKE and e["op"] == Op.ABORT and room is not None:
            aborted[room] = e["seq"]
        elif e["op"] == Op.AWAIT_STATUS and e["type"] == Event.OK and room is not None:
            for name, reason in _failed_reads(e):
                since, bootstrap = opened.get(room, (-1, ""))
                dead = next((addr for seq, addr in killed if seq > since and addr == bootstrap), None)
                if dead is not None and not is_prefill(name):
                    judged += 1
                    if not fc.names(reason, dead):
                        misses.append(f"{name} room {room}: {reason[:120]!r} does not name the killed prefill {dead}")
                        at = e["seq"] if at is None else at
                elif aborted.get(room, -1) > since and (faulted is None or faulted > e["seq"]):
                    judged += 1
                    if "abort" not in reason.lower():
                        misses.append(f"{name} room {room}: {reason[:120]!r} does not say it was aborted")
                        at = e["seq"] if at is None else at
    if misses:
        return False, "a failure reason does not name its cause: " + "; ".join(dict.fromkeys(misses[:4])), at
    return True, f"all {judged} Failed read(s) with a cause in the history named it", None


#: faults that can fail a room on their own: after one, an abort is not the sure cause of a failure
_OTHER_FAULTS = (Op.ENGINE_FAULTS, Op.ENGINE_FAULT, Op.KILL, Op.FREEZE, Op.NETWORK, Op.INJECT, Op.RESTART,
                 Op.INJECT_ABORT, Op.INJECT_CAPTURED, Op.LOSE_MESSAGES)


def no_residue_after_clear(events: list[dict]) -> tuple[bool | None, str, int | None]:
    """R-RESIDUE-1 for every room cleared on every role that named it: see the module docstring."""
    rooms = rooms_cleared_everywhere(events)
    if not rooms:
        return True, "no room was cleared on every role that used it, so no residue to judge", None
    observed, _ = c.observations(events)  # a role that could not be observed fails no-dead-thread
    stale = {role for role, e in last_observations(events).items() if e["type"] == Event.FAIL}  # no older view
    left, partial, at, prefills_judge = [], [], None, rooms - set(unscheduled_rooms(events))  # R-RESIDUE-2's are not
    for role, value in sorted(observed.items()):
        if role in stale:
            continue
        for room, paths in sorted(held_rooms(value, prefills_judge if is_prefill(role) else rooms).items()):
            left.append(f"{role} room {room}: {', '.join(sorted(set(paths))[:4])}")
            at = c.observed_at(events, role) if at is None else at
        if value.get("residue_incomplete"):
            partial.append(f"{role}: {value['residue_incomplete']}")
    if left:
        return False, f"state left after clear on every side: {'; '.join(left[:6])}", at
    if partial:
        return None, ("the residue walk did not see everything, so no residue cannot be told: "
                      + "; ".join(partial)), None
    return True, f"no state left of the {len(rooms)} room(s) cleared on every side, in {len(observed)} role(s)", None


def bytes_in_place_at_success(events: list[dict]) -> tuple[bool | None, str, int | None]:
    """R-XFER-2 at the moment of Success: every pool verification of every decode, judged
    again on the rows each room held when its Success was first read (the role's copies,
    harness.role.at_success), finds them as the moves say.  A byte wrong then but right at
    the end means Success was reported before that byte was in place, and so does a row the
    moves name that still held the decode's own bytes then, whenever (if ever) it landed
    later; a byte from the wrong place at both moments is bytes-exact's (R-LAYOUT-1: where the
    bytes go, not when)."""
    early, rooms, at = [], 0, None
    for e in events:
        if e["op"] != Op.VERIFY or e["type"] != Event.OK:
            continue
        value = e.get("value") or {}
        then = value.get("at_success")
        if not isinstance(then, dict):
            continue
        rooms += then.get("rooms") or 0
        wrong_at_end = set(value.get("mismatches") or ())
        new = [m for m in then.get("mismatches") or () if m not in wrong_at_end]
        new += [m for m in then.get("unwritten") or () if m not in new]
        if not then.get("ok") and (new or then.get("unwritten_pages")):
            early.append(f"{e.get('role')}: {then.get('mismatch_pages')} page(s) not in place at Success: "
                         + "; ".join(new[:3]))
            at = e["seq"] if at is None else at
    if early:
        return False, "Success was read before its bytes were in place: " + " | ".join(early[:3]), at
    if not rooms:
        return True, "no Success read was copied, so none can have come early", None
    return True, f"the bytes of all {rooms} room(s) read Success were in place when it was read", None


_INJECTED_ABORTS = (Op.INJECT_ABORT, Op.INJECT_CAPTURED, Op.CAPTURE, Op.INJECT)  # ABORTs the decode never sent


def _injected_abort_rooms(events: list[dict]) -> set:
    """The rooms whose ABORT frames a scenario injected (:data:`_INJECTED_ABORTS`), or whose ABORT
    or ABORT_ACK a role lost on purpose (R-LOSS-1: no ACK can come back)."""
    return {(e.get("args") or {}).get("room") for e in events if e["op"] in _INJECTED_ABORTS} \
        | lost_message_rooms(events, ("abort", "abort_ack"))


def ack_names_abort_generation(events: list[dict]) -> tuple[bool | None, str, int | None]:
    """R-ABORT-2 on every ABORT_ACK every decode (and decode rank) received: it names the
    generation of an ABORT that decode sent for that room (its ``aborts_sent``, recorded at
    the end of the cell, harness.role.adapter.RoleAdapter.aborts_sent), and no sender
    answers one room generation twice.  ACKs that name no generation, rooms of a decode that
    recorded no generation for them, and rooms whose ABORT frames a scenario injected are
    not judged."""
    injected = _injected_abort_rooms(events)
    sent: dict[tuple[str, int], set] = {}
    for e in events:
        if e["op"] == Op.ABORTS_SENT:
            for a in e.get("value") or ():
                sent.setdefault((e["role"], a.get("room")), set()).add(a.get("generation"))
    wrong, judged, at = [], 0, None
    for e in events:
        if e["op"] != Op.ABORT_ACKS:
            continue
        seen: set = set()
        for a in e.get("value") or ():
            room, generation, sender = a.get("room"), a.get("generation"), a.get("sender")
            armed = {g for g in sent.get((e["role"], room), ()) if g is not None}
            if generation is None or not armed or room in injected:
                continue
            judged += 1
            if generation not in armed:
                wrong.append(f"{e['role']} room {room}: an ABORT_ACK names generation {generation}, "
                             f"its ABORTs named {sorted(armed)}")
            elif sender is not None and (room, generation, sender) in seen:
                wrong.append(f"{e['role']} room {room}: a second ABORT_ACK of generation {generation} from {sender}")
            seen.add((room, generation, sender))
            at = e["seq"] if wrong and at is None else at
    if wrong:
        return False, "; ".join(wrong[:4]), at
    if not judged:
        return True, "no ABORT_ACK of a generation its decode recorded sending, so none to compare", None
    return True, f"each of {judged} ABORT_ACK(s) echoes a generation its decode's ABORT named, once", None


#: seconds an ABORT_ACK may take after its ABORT when no engine fault delays the drain:
#: R-ABORT-1's 2 s for the prefill to act on the ABORT, plus its answer's way back
ACK_DUE_S = 5.0
#: after the transfer timeout declared a stuck write lost (R-TIMEOUT-3), the drain is over
LOST_WRITE_SLACK_S = 5.0
#: nemesis steps after which a prefill may be unable to answer (dead, frozen, cut off, restarted)
_PREFILL_SILENCED = (Op.KILL, Op.FREEZE, Op.RESTART, Op.NETWORK)


def _ack_due_s(events: list[dict]) -> float:
    """Seconds after an ABORT by which its ABORT_ACK is due in this cell: ACK_DUE_S, plus every
    delay an engine fault plan adds to a write (the drain waits for it); with writes that never
    complete, the prefill's waiting timeout (R-TIMEOUT-3 declares them lost) plus
    LOST_WRITE_SLACK_S."""
    due = ACK_DUE_S
    for e in events:
        if e["op"] != Op.ENGINE_FAULTS:
            continue
        plan = e.get("args") or {}  # the EngineFaultPlan's fields (harness.drive.executors.nemesis)
        if plan.get("never_complete"):
            waits = [fact(events, r, "waiting_timeout_s") for r in {x["role"] for x in events if is_prefill(x["role"])}]
            waits = [w for w in waits if isinstance(w, (int, float)) and not isinstance(w, bool)]
            due = max(due, (max(waits) if waits else float("inf")) + LOST_WRITE_SLACK_S + ACK_DUE_S)
        due = max(due, ACK_DUE_S + sum(float(plan.get(k) or 0.0) for k in ("delay_s", "slow_s", "aux_delay_s")))
    return due


def answered(acks) -> set[tuple]:
    """The ``(room, generation)`` pairs a decode's ``abort_acks`` (list of dicts) answer."""
    return {(a.get("room"), a.get("generation")) for a in acks or ()}


def prefill_silenced(events: list[dict]) -> bool:
    """Whether a prefill was killed, frozen, restarted or cut off (any network fault) in this cell."""
    return any(e["type"] == Event.NEMESIS and e["op"] in _PREFILL_SILENCED and (is_prefill(e["role"]) or e["op"] == Op.NETWORK)
               for e in events)


def every_abort_answered(events: list[dict]) -> tuple[bool | None, str, int | None]:
    """R-ABORT-2 on every ABORT every decode (and decode rank) sent: with deferred KV release on
    (the decode's start fact ``deferred_release``), the prefill answers each ABORT generation
    with an ABORT_ACK, once its writes for the room drained, and at once for a generation it
    never served; so each (room, generation) in a decode's ``aborts_sent`` has an ABORT_ACK
    naming it among that decode's ``abort_acks``, unless the ABORT was sent less than the ACK's
    due time (:func:`_ack_due_s`, seconds) before the cell's end.  Not judged: ABORTs that name
    no generation, rooms whose ABORT frames a scenario injected, cells in which a prefill
    was killed, frozen, restarted or cut off by a network fault (it may be unable to answer),
    and cells in which the engine failed a write (whether a failed write counts as drained is
    R-ABORT-3's, a SHOULD, judged by the scenarios that fail one)."""
    if prefill_silenced(events):
        return True, "not judged: a prefill was killed, frozen, restarted or cut off in this cell, so no ABORT_ACK " \
            "is owed", None
    if any(e["op"] == Op.ENGINE_FAULT and (e.get("value") or {}).get("fault") == "fail" for e in events):
        return True, "not judged: the engine failed a write in this cell (R-ABORT-3 judges its ACK)", None
    injected = _injected_abort_rooms(events)
    due = _ack_due_s(events)
    acked: dict[str, set] = {}
    for e in events:
        if e["op"] == Op.ABORT_ACKS:
            acked.setdefault(e["role"], set()).update(answered(e.get("value")))
    missing, judged, at = [], 0, None
    for e in events:
        if e["op"] != Op.ABORTS_SENT or fact(events, e["role"], "deferred_release") is not True:
            continue
        for a in e.get("value") or ():
            room, generation, sent = a.get("room"), a.get("generation"), a.get("t")
            if generation is None or room in injected or not isinstance(sent, (int, float)) \
                    or e.get("wall", 0.0) - sent < due:
                continue
            judged += 1
            if (room, generation) not in acked.get(e["role"], set()):
                missing.append(f"{e['role']} room {room}: no ABORT_ACK for the ABORT of generation {generation} "
                               f"{e.get('wall', 0.0) - sent:.1f} s before the end of the cell (due within {due:g} s)")
                at = e["seq"] if at is None else at
    if missing:
        return False, "; ".join(missing[:4]), at
    if not judged:
        return True, "no ABORT a decode sent with deferred release on was due an ABORT_ACK by the end of the cell", None
    return True, f"each of {judged} ABORT(s) got an ABORT_ACK naming its generation back at the decode that sent it", None


def _aborts_of_registered_rooms(events: list[dict]) -> list[tuple[str, int, float, int]]:
    """``(decode role, room, wall clock its lifecycle began, seq)`` of each decode ``abort()`` of
    a room whose registration had been sent (read WaitingForInput or Transferring in this
    lifecycle on the decode, or on a prefill after the decode's RequestKV of it, which the
    prefill then has) and that the decode never read Success, before the abort or after it (a
    room that had concluded Success unread stays Success, R-TERM-1: its abort has nothing to
    stop); a decode lifecycle ends at its ``clear`` of the room or its restart."""
    began: dict[tuple[str, int], float] = {}
    seen: dict[tuple[str, int], set] = {}
    requested: set[tuple[str, int]] = set()  # the decode's RequestKV in its current lifecycle
    since: dict[tuple[str, int], int] = {}  # seq of the decode's last clear of the room
    registered: set[int] = set()  # of those, rooms a prefill read WaitingForInput or Transferring since
    owed = []

    def concluded(role: str, room: int) -> list:  # read Success: this lifecycle's aborts owe nothing
        return [o for o in owed if (o[0], o[1]) != (role, room) or o[3] < since.get((role, room), -1)]

    for e in events:
        role, room = e.get("role"), (e.get("args") or {}).get("room")
        if e["op"] in _RESTARTS and e["type"] in (Event.OK, Event.NEMESIS):
            seen = {k: v for k, v in seen.items() if k[0] != role}
            requested = {k for k in requested if k[0] != role}
            continue
        if role is None or room is None or e["type"] != Event.OK:
            continue
        value = e.get("value") if isinstance(e.get("value"), dict) else {}
        if e["op"] == Op.AWAIT_STATUS:
            reads = set(value.get("trail") or ()).union(*[r.get("trail") or () for r in rank_reads(e).values()])
            if is_prefill(role):
                asked = any(k[1] == room for k in requested)
                registered |= {room} if asked and reads & {"WaitingForInput", "Transferring"} else set()
            else:
                seen.setdefault((role, room), set()).update(reads)
                if "Success" in reads:
                    owed = concluded(role, room)
        elif e["op"] == Op.REQUEST_KV and not is_prefill(role):
            requested.add((role, room))
        elif e["op"] == Op.CLEAR and not is_prefill(role):
            before = value.get("before") if isinstance(value.get("before"), dict) else {}
            if "Success" in (before.get("poll"), before.get("map")):  # read afresh just before the clear
                owed = concluded(role, room)
            since[(role, room)] = e["seq"]
            registered.discard(room)
            requested.discard((role, room))
            seen.pop((role, room), None)
            began[(role, room)] = e.get("wall", 0.0)
        elif e["op"] == Op.ABORT and not is_prefill(role):
            reads = seen.get((role, room), set()) | ({"WaitingForInput"} if room in registered else set())
            if reads & {"WaitingForInput", "Transferring"} and "Success" not in reads:
                owed.append((role, room, began.get((role, room), 0.0), e["seq"]))
    return owed


def every_abort_sent(events: list[dict]) -> tuple[bool | None, str, int | None]:
    """R-ABORT-1 from the decode's side: with deferred KV release on, a decode's ``abort()`` of a
    room whose registration it had sent and that it never read Success
    (:func:`_aborts_of_registered_rooms`) sends an ABORT naming the lifecycle's generation,
    whatever the room's status then (Failed by its own timer, the heartbeat or a failure it
    heard of included): the prefill may still hold the room and write into its pages, and only
    the ABORT_ACK makes them reusable (R-ABORT-2).  Judged on the decode's ``aborts_sent`` (any of
    its ranks) since the lifecycle began, as the cell's end records it; not for rooms whose ABORT a
    scenario injected, nor a decode killed or restarted since (its record died with it)."""
    gone = {e["role"].split(".")[0]: e["seq"] for e in events  # decode -> seq of its last kill or restart
            if e["type"] == Event.NEMESIS and e["op"] in (Op.KILL, Op.RESTART) and not is_prefill(e["role"])}
    owed = [o for o in _aborts_of_registered_rooms(events) if gone.get(o[0].split(".")[0], -1) < o[3]]
    if not owed:
        return True, "no decode aborted a registered room that had not succeeded", None
    sent: dict[tuple[str, int], list[float]] = {}
    for e in (e for e in events if e["op"] == Op.ABORTS_SENT):
        for a in e.get("value") or ():
            sent.setdefault((e["role"].split(".")[0], a.get("room")), []).append(a.get("t") or 0.0)
    injected = _injected_abort_rooms(events)
    missing, judged = [], 0
    for role, room, since, seq in owed:
        if fact(events, role, "deferred_release") is not True or room in injected:
            continue
        judged += 1
        if not any(t >= since for t in sent.get((role.split(".")[0], room), ())):
            missing.append((f"{role} room {room}: abort() of a registered room that never read Success sent no ABORT", seq))
    if missing:
        return False, "; ".join(m for m, _ in missing[:4]), missing[0][1]
    if not judged:
        return True, "no abort() of a registered room with deferred release on, so none to judge", None
    return True, f"each of {judged} abort() call(s) of a registered, unsucceeded room sent its ABORT", None


GENERIC = (
    ("every-trail-terminal", "R-TERM-1", lambda: every_trail_terminal),
    ("every-failure-has-reason", "R-REASON-1", lambda: every_failure_has_reason),
    ("no-dead-thread", "R-LIVE-2", c.no_dead_threads),
    ("no-residue-after-clear", "R-RESIDUE-1", lambda: no_residue_after_clear),
    ("failure-reason-names-cause", "R-REASON-1", lambda: failure_reason_names_cause),
    ("bytes-in-place-at-success", "R-XFER-2", lambda: bytes_in_place_at_success),
    ("ack-names-abort-generation", "R-ABORT-2", lambda: ack_names_abort_generation),
    ("every-abort-answered", "R-ABORT-2", lambda: every_abort_answered),
    ("every-abort-sent", "R-ABORT-1", lambda: every_abort_sent),
    ("unscheduled-registration-dropped", "R-RESIDUE-2", registration_dropped),
    ("every-message-whole", "R-LOAD-1", lambda: fc.messages_whole(uninjected=True)),
    ("decode-abort-fails-room", "R-ABORT-1", lambda: decode_abort_fails_room),
)


def checks_of(scenario, seed: int) -> list[c.Check]:
    """``scenario``'s own checks for ``seed``, then each generic post-condition it neither
    declares (by name) nor opts out of."""
    own = list(scenario.checks(seed))
    names = {check.name for check in own}
    skip = dict(scenario.opt_out)
    return own + [c.Check(name, requirement, make()) for name, requirement, make in GENERIC
                  if name not in names and name not in skip]
