"""Did every injected fault fire?  A pure function of a cell's history.

A fault that is declared but never takes effect makes a cell test nothing: sglang's own
failure injection was silently inert once, and two of its tests passed without testing
anything (sglang #35890).  So every fault a cell injects is listed with the evidence that
it fired (issue 38, item 6):

* an engine fault plan (:class:`harness.spec.steps.EngineFaults`): each part of the plan
  (``fail_nth``, ``fail_group``, ``never_complete``, ``delay_s``, ``aux_delay_s``,
  ``slow_nth``) is a fault of its own, and it fired when the role (any of its rank processes)
  logged an entry of that kind (harness.role.faults.EngineFaultCounter) while the plan was in
  force, i.e. before the next plan for the same process;
* a message loss plan (:class:`harness.spec.steps.LoseMessages`): it fired when the role
  logged a dropped message of its kind while the plan was in force;
* an interleaving point (:class:`harness.spec.steps.ArmPoint`): it fired when a thread of the
  role reached it (a point hit, or an ``AwaitPoint`` that saw a thread there);
* the driver's own faults (a kill, freeze, thaw, restart, injected frames or ABORT): the
  driver performs them itself, so the nemesis event is the evidence;
* a network fault: it fired when its heal counted packets it applied to (the NFQUEUE
  reader's verdicts, the nftables rules' counters or netem's; harness.hosts.linkfault), or,
  where nothing counts them or the cell never heals it, when it was applied; a heal is no fault.

The judge (harness.judge.judge) makes a cell whose fault never fired ERROR, never PASS.
"""

from __future__ import annotations

from typing import Any

from harness.spec.history import Event, Op

#: the parts of an engine fault plan and the fault-log kind each one's firing is logged as
PLAN_PARTS = (("fail_nth", "fail"), ("fail_group", "fail"), ("never_complete", "never-complete"),
              ("delay_s", "delay"), ("aux_delay_s", "aux-delay"), ("slow_nth", "slow"))

#: faults the driver performs itself: its nemesis event is the evidence
DRIVER_FAULTS = (Op.KILL, Op.FREEZE, Op.THAW, Op.RESTART, Op.INJECT, Op.INJECT_ABORT, Op.INJECT_CAPTURED,
                 Op.NETWORK)


def _of(role: str | None, target: str | None) -> bool:
    """Whether process ``role`` belongs to ``target`` (the target itself or one of its
    rank processes, named ``TARGET.tp1``, ``TARGET.dp2`` ...)."""
    return bool(role and target) and (role == target or role.startswith(target + "."))


def _plan_parts(args: dict) -> list[tuple[str, str]]:
    """The parts of an engine fault plan that inject something: (description, log kind)."""
    parts = []
    for name, kind in PLAN_PARTS:
        value = args.get(name)
        if name == "slow_nth" and not args.get("slow_s"):
            continue  # a slow transfer of 0 s changes nothing
        if value not in (None, 0, 0.0, False):
            parts.append((f"{name}={value}", kind))
    return parts


def _window_end(events: list[dict], index: int, op: Op) -> float:
    """The wall time of the next ``op`` plan for the same process as ``events[index]`` (inf when none)."""
    plan = events[index]
    later = (e for e in events[index + 1:] if e["op"] == op and e["type"] == Event.NEMESIS
             and (_of(e.get("role"), plan.get("role")) or _of(plan.get("role"), e.get("role"))))
    return next((e.get("wall", float("inf")) for e in later), float("inf"))


def _logged(events: list[dict], op: Op, target: str, kind: str, start: float, end: float) -> list[dict]:
    """Fault-log entries of ``kind`` (recorded as ``op`` events) of ``target``'s processes, logged
    in the wall-time window [start, end) (an entry without a time counts)."""
    found = []
    for e in events:
        value = e.get("value")
        if e["op"] != op or not _of(e.get("role"), target) or not isinstance(value, dict):
            continue
        if value.get("fault") == kind and start - 0.5 <= value.get("t", start) < end:
            found.append(value)
    return found


def _plan_faults(events: list[dict], op: Op, fired_op: Op, parts_of) -> list[dict]:
    """One fault per part of every ``op`` plan event (``parts_of(args)``), fired when ``fired_op``
    entries of its kind were logged while the plan was in force."""
    faults = []
    for i, e in enumerate(events):
        if e["op"] != op or e["type"] != Event.NEMESIS:
            continue
        target, end = e.get("role") or "?", _window_end(events, i, op)
        for what, kind in parts_of(e.get("args") or {}):
            hits = _logged(events, fired_op, target, kind, e.get("wall", 0.0), end)
            faults.append({"fault": f"{op} {target} {what}", "role": target, "step": e.get("step"),
                           "fired": bool(hits),
                           "evidence": f"{len(hits)} {kind} entr{'y' if len(hits) == 1 else 'ies'} logged"
                           if hits else f"no {kind} entry in {target}'s fault log while the plan was in force"})
    return faults


def _loss_parts(args: dict) -> list[tuple[str, str]]:
    kind = args.get("kind")
    return [(f"kind={kind} nth={args.get('nth')}", "message-lost")] if kind else []


def _point_faults(events: list[dict]) -> list[dict]:
    """One fault per armed interleaving point: fired when a thread of the role reached it."""
    faults = []
    for e in events:
        if e["op"] != Op.ARM_POINT or e["type"] != Event.NEMESIS:
            continue
        target, point = e.get("role") or "?", (e.get("args") or {}).get("point")
        hits = [h for h in events if h["op"] == Op.POINT_HIT and _of(h.get("role"), target)
                and (h.get("value") or {}).get("point") == point]
        awaited = [a for a in events if a["op"] == Op.AWAIT_POINT and a["type"] == Event.OK
                   and _of(a.get("role"), target) and (a.get("args") or {}).get("point") == point]
        fired = bool(hits or awaited)
        faults.append({"fault": f"arm-point {target} {point}", "role": target, "step": e.get("step"), "fired": fired,
                       "evidence": f"{len(hits)} hit(s), {len(awaited)} await(s) saw a thread there" if fired
                       else f"no thread of {target} reached {point}"})
    return faults


def _network_evidence(events: list[dict], index: int) -> tuple[bool, str]:
    """Whether the network fault ``events[index]`` applied to a packet: the packets its heal
    (the next heal of the same link) counted (harness.hosts.linkfault.LinkFaults.packets); a
    fault never healed in the cell, or whose tool counts nothing, fired when it was applied."""
    fault = events[index].get("args") or {}
    link = {fault.get("a"), fault.get("b")}
    after = next((e for e in events[index + 1:] if e["op"] == Op.NETWORK and e["type"] == Event.NEMESIS
                  and {(e.get("args") or {}).get(k) for k in "ab"} == link), None)  # its heal, or its replacement
    heal = after if after is not None and (after.get("args") or {}).get("heal") else None
    ways = {f"{fault.get('a')}->{fault.get('b')}"} | ({f"{fault.get('b')}->{fault.get('a')}"} if fault.get("both_ways")
                                                       else set())
    counted = {way: n for way, n in ((heal or {}).get("args") or {}).get("packets", {}).items() if way in ways}
    counts = {way: n for way, n in counted.items() if n is not None}
    if not counts or len(counts) < len(counted):  # a direction it faulted whose tool counts nothing
        return True, "applied by the driver (its packets were not counted: " + \
            ("no heal in the cell)" if after is None else "replaced before a heal)" if heal is None
             else "the host's tool counts none)")
    said = ", ".join(f"{way}: {n}" for way, n in sorted(counts.items()))
    return any(counts.values()), f"packets it applied to until its heal: {said}"


def _driver_faults(events: list[dict]) -> list[dict]:
    """The driver's own faults, each fired by its nemesis event (a heal is none); a network
    fault by the packets it applied to (:func:`_network_evidence`)."""
    faults = []
    for i, e in enumerate(events):
        args = e.get("args") or {}
        if e["op"] not in DRIVER_FAULTS or e["type"] != Event.NEMESIS or args.get("heal"):
            continue
        fired, evidence = _network_evidence(events, i) if e["op"] == Op.NETWORK else (True, "performed by the driver")
        faults.append({"fault": f"{e['op']} {e.get('role') or ''}".strip(), "role": e.get("role"),
                       "step": e.get("step"), "fired": fired, "evidence": evidence})
    return faults


def faults_of(events: list[dict]) -> list[dict[str, Any]]:
    """Every fault the cell injected, in history order, as ``{"fault": description, "role",
    "step", "fired": bool, "evidence": str}`` (see the module docstring)."""
    faults = (_plan_faults(events, Op.ENGINE_FAULTS, Op.ENGINE_FAULT, _plan_parts)
              + _plan_faults(events, Op.LOSE_MESSAGES, Op.MESSAGE_LOST, _loss_parts)
              + _point_faults(events) + _driver_faults(events))
    return sorted(faults, key=lambda f: (f["step"] is None, f["step"] or 0))


def never_fired(faults: list[dict]) -> str:
    """The ERROR reason for ``faults`` of which some never fired ("" when every one fired)."""
    silent = [f for f in faults if not f["fired"]]
    if not silent:
        return ""
    more = f" (and {len(silent) - 1} more)" if len(silent) > 1 else ""
    return f"fault never fired: {silent[0]['fault']}: {silent[0]['evidence']}{more}"
