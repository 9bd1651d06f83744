"""Executors of the steps a prefill or decode scheduler performs: start roles, open rooms,
send chunks, poll, verify, clear, abort (harness.spec.steps)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from harness.drive.errors import CellAborted, RoleError, RoleTimeout
from harness.drive.launcher import RoleHandle, RoleSpec
from harness.drive.role_client import RoleClient
from harness.spec import steps as s
from harness.spec.history import Event, Op
from harness.spec.protocol import KVPoll, kvpoll_name

if TYPE_CHECKING:
    from harness.drive.cell import CellDriver

CALL_TIMEOUT_S = 30.0
START_TIMEOUT_S = 60.0  # a manager and its engine start (seconds)


def start_roles(d: "CellDriver", step: s.StartRoles) -> None:
    """Launch every role process (every TP rank, PP stage or DP engine of a role), arm constructor
    points, then start every role's manager and engine at once (the decodes do not need the
    prefills yet); the history records the calls in the step's order.  CellAborted when a
    role does not come up."""
    from harness.spec.topology import rank_name

    tp_prefill, tp_decode = step.tp_ranks
    for logical, tp in [(n, tp_prefill) for n in step.prefills] + [(n, tp_decode) for n in step.decodes]:
        if tp > 1:
            d.groups[logical] = [rank_name(logical, r) for r in range(tp)]
    for logical in step.prefills if step.pp_stages > 1 else ():
        d.groups[logical] = [rank_name(logical, s, "pp") for s in range(step.pp_stages)]
    dp_prefill, dp_decode = step.dp_ranks
    for logical, dp in [(n, dp_prefill) for n in step.prefills] + [(n, dp_decode) for n in step.decodes]:
        if dp > 1:
            d.groups[logical], d.dp[logical] = [rank_name(logical, k, "dp") for k in range(dp)], dp
    names = [(n, "prefill") for p in step.prefills for n in d.ranks(p)] + \
        [(n, "decode") for dec in step.decodes for n in d.ranks(dec)]
    env = dict(step.env)
    for name, role in names:
        d.role_env[name] = env
        d.handles[name] = d.launcher.start(RoleSpec(name=name, impl=d.impl, role=role, env=env))
    for name, _ in names:
        connect(d, name, d.handles[name], step.ready_timeout_s)
    if max(step.tp_ranks) > 1 or step.pp_stages > 1 or max(step.dp_ranks) > 1:  # can this run here? asked
        mla = (step.decode_layout or step.layout).mla                            # before any manager starts
        dp = {"prefill_dp": dp_prefill, "decode_dp": dp_decode} if max(step.dp_ranks) > 1 else {}
        why = d.call(step.prefills[0], "unsupported_topology", prefill_tp=tp_prefill, decode_tp=tp_decode, mla=mla,
                     prefill_pp=step.pp_stages, **dp)
        if why:
            raise CellAborted(why, unsupported=True)
    for arm in step.arm:
        d.arm(arm)
    starts = _prefill_starts(d, step)
    decode_layouts = _rank_layouts(step, step.decode_layout or step.layout, tp_decode)
    for i, logical in enumerate(step.decodes):
        for r, name in enumerate(d.ranks(logical)):
            extra = {"attn_tp": (step.decode_attn_tp, i % step.decode_attn_tp)} if step.decode_attn_tp > 1 else \
                {"attn_tp": (tp_decode, r)} if tp_decode > 1 else {"dp": (dp_decode, r)} if dp_decode > 1 else {}
            starts.append((name, "start_decode", {"layout": decode_layouts[r if tp_decode > 1 else 0].to_dict(),
                                                  "bootstrap_port": d.base_port,
                                                  **extra}))
    if max(step.tp_ranks) > 1:
        d.destinations = _destinations(step)
    for (name, op, kwargs), facts in zip(starts, d.call_all(starts, deadline_s=START_TIMEOUT_S)):
        if facts is None:
            raise CellAborted(f"{op.split('_')[1]} {name} failed to start: {d.last_error(name)}")
        if op == "start_prefill":
            _prefill_started(d, name, kwargs["layout"], kwargs["bootstrap_port"], facts)
        else:
            _note_control_endpoint(d, name, facts)


def _next_port(d: "CellDriver") -> int:
    """The next port of the cell's own block (harness.drive.ports), one per prefill and per
    PP rendezvous; CellAborted when the block is used up (it would take a neighbour's)."""
    from harness.drive.ports import PORT_BLOCK

    if d.ports_used >= PORT_BLOCK:
        raise CellAborted(f"the cell has used all {PORT_BLOCK} ports of its block (harness.drive.ports.PORT_BLOCK)")
    port = d.base_port + d.ports_used
    d.ports_used += 1
    return port


def _prefill_starts(d: "CellDriver", step: s.StartRoles) -> list[tuple[str, str, dict]]:
    """The start_prefill calls of ``step``: each prefill its own bootstrap port, or (with
    ``prefill_stages``) every stage of the one prefill the same port and rendezvous."""
    if step.pp_stages > 1:  # each prefill: its stages on one port and one rendezvous
        from harness.spec.topology import stage_layouts

        starts = []
        for logical in step.prefills:
            # the stages meet on the first stage's host (its own address when roles run on several hosts)
            port, rendezvous = _next_port(d), f"tcp://{d.address_of(d.ranks(logical)[0])}:{_next_port(d)}"
            starts += [(name, "start_prefill", {"layout": layout.to_dict(), "bootstrap_port": port,
                                                "pp": (step.pp_stages, s, rendezvous)})
                       for s, (name, layout) in enumerate(zip(d.ranks(logical), stage_layouts(step.layout,
                                                                                                step.pp_stages)))]
        return starts
    if not step.prefill_stages:
        layouts, tp = _rank_layouts(step, step.layout, step.tp_ranks[0]), step.tp_ranks[0]
        starts = []
        dp = step.dp_ranks[0]
        for logical in step.prefills:  # a prefill's TP ranks or DP engines share its bootstrap port (rank 0 serves it)
            port = _next_port(d)
            starts += [(name, "start_prefill", {"layout": layouts[0 if dp > 1 else r].to_dict(), "bootstrap_port": port,
                                                **({"attn_tp": (tp, r)} if tp > 1 else {}),
                                                **({"dp": (dp, r)} if dp > 1 else {})})
                       for r, name in enumerate(d.ranks(logical))]
        return starts
    if len(step.prefill_stages) != len(step.prefills):
        raise CellAborted(f"StartRoles: {len(step.prefills)} prefill stage roles for {len(step.prefill_stages)} "
                          "stage layouts")
    port, rendezvous = _next_port(d), f"tcp://{d.address_of(step.prefills[0])}:{_next_port(d)}"
    return [(name, "start_prefill", {"layout": stage.to_dict(), "bootstrap_port": port,
                                     "pp": (len(step.prefills), rank, rendezvous)})
            for rank, (name, stage) in enumerate(zip(step.prefills, step.prefill_stages))]


def _rank_layouts(step: s.StartRoles, layout, tp: int) -> list:
    """Each of ``tp`` TP ranks' layout of a role whose scenario layout is ``layout``."""
    from harness.spec.topology import group_layouts

    return group_layouts(layout, tp, step.kv_heads, step.head_bytes) if tp > 1 or step.kv_heads else [layout]


def _destinations(step: s.StartRoles) -> list[int]:
    """For each prefill rank, how many decode ranks take KV from it (harness.spec.topology.sources):
    the number of registrations its sender waits for (open_sender's ``destinations``)."""
    from harness.spec.topology import sources

    prefill = _rank_layouts(step, step.layout, step.tp_ranks[0])
    counts = [0] * len(prefill)
    for decode in _rank_layouts(step, step.decode_layout or step.layout, step.tp_ranks[1]):
        for r in sources(prefill, decode):
            counts[r] += 1
    return counts


def _sender_extras(d: "CellDriver", prefill: str, destinations: int) -> dict[str, dict]:
    """Per prefill rank: the decode registrations its sender waits for, for a room the decode
    opens on every one of its ranks (the step's ``destinations`` counts decode roles)."""
    ranks = d.ranks(prefill)
    if len(ranks) == 1 and not d.destinations:
        return {}
    return {name: {"destinations": destinations * (d.destinations[r] if d.destinations else 1)}
            for r, name in enumerate(ranks)}


def connect(d: "CellDriver", name: str, handle: RoleHandle, timeout_s: float, **args: Any) -> None:
    """Wait for a launched role process to serve commands; connect a client to it.
    CellAborted when it does not come up within ``timeout_s`` seconds."""
    d.record(Event.INVOKE, Op.LAUNCH, name, args=args)
    try:
        endpoint = handle.wait_ready(timeout_s)
    except RoleError as exc:  # timed_out: a bound on its start ran out (harness.judge.load counts it as timing)
        d.record(Event.FAIL, Op.LAUNCH, name, args=args, error=str(exc), timed_out=isinstance(exc, RoleTimeout))
        raise CellAborted(f"role {name} did not start: {exc}") from exc
    # the pid ties the runner's per-process run-queue wait (cell-exit "load") to the role
    d.record(Event.OK, Op.LAUNCH, name, args=args, value={"endpoint": endpoint, "pid": handle.pid})
    d.clients[name] = RoleClient(d.ctx, name, endpoint, handle=handle)
    d.clients[name].shift = d.room_shift  # a restarted role of a cell on a pair: the cell's rooms still move


def start_prefill(d: "CellDriver", name: str, layout: dict, port: int) -> None:
    """Start prefill ``name``'s bootstrap server and manager on ``port``; CellAborted when it fails."""
    facts = d.call(name, "start_prefill", deadline_s=START_TIMEOUT_S, layout=layout, bootstrap_port=port)
    if facts is None:
        raise CellAborted(f"prefill {name} failed to start: {d.last_error(name)}")
    _prefill_started(d, name, layout, port, facts)


def _prefill_started(d: "CellDriver", name: str, layout: dict, port: int, facts: dict) -> None:
    d.prefill_setup[name] = (layout, port)
    d.bootstrap_addr[name] = facts["bootstrap_addr"]
    _note_control_endpoint(d, name, facts)


def _note_control_endpoint(d: "CellDriver", name: str, facts: dict) -> None:
    if facts.get("rank_port"):
        d.control_endpoint[name] = f"tcp://{d.address_of(name)}:{facts['rank_port']}"  # where the role listens


def open_room(d: "CellDriver", step: s.OpenRoom) -> None:
    addr = d.bootstrap_addr[step.prefill]
    if step.open_sender:
        d.call(step.prefill, "open_sender", per_rank=_sender_extras(d, step.prefill, 1), room=step.room,
               bootstrap_addr=addr)
    d.call(step.decode, "open_receiver", deadline_s=step.timeout_s + 5,
           room=step.room, bootstrap_addr=addr, timeout_s=step.timeout_s)


def open_sender(d: "CellDriver", step: s.OpenSender) -> None:
    extra = {"destinations": step.destinations} if step.destinations != 1 else {}
    d.call(step.prefill, "open_sender", per_rank=_sender_extras(d, step.prefill, step.destinations), room=step.room,
           bootstrap_addr=d.bootstrap_addr[step.prefill], **extra)


def request_kv(d: "CellDriver", step: s.RequestKV) -> None:
    if d.dp.get(step.decode, 1) > 1:  # where this room's bytes must land, and nowhere else (R-DP-1)
        engine = d.one(step.decode, {"room": step.room})
        pages, slots = d.dp_requested.setdefault(engine, (set(), set()))
        pages.update(step.pages)
        slots.add(step.aux_slot)
    d.call(step.decode, "request_kv", room=step.room, pages=list(step.pages), aux_slot=step.aux_slot)


def init_sender(d: "CellDriver", step: s.InitSender) -> None:
    d.call(step.prefill, "init_sender", room=step.room, num_pages=step.num_pages, aux_slot=step.aux_slot)


def send_chunk(d: "CellDriver", step: s.SendChunk) -> None:
    d.call(step.prefill, "send_chunk", room=step.room, pages=list(step.pages))


def await_status(d: "CellDriver", step: s.AwaitStatus) -> None:
    """Wait in the role for one of ``step.statuses`` (RoleAdapter.await_status); record what
    was seen, the failure reason of a Failed room, and whether the bound was cut (fail fast,
    harness.spec.steps.STALL_CUT_S)."""
    bound = step.timeout_s
    args: dict[str, Any] = {"room": step.room, "statuses": [kvpoll_name(x) for x in step.statuses],
                            "timeout_s": bound, "must_come": step.must_come}
    if step.label:
        args["label"] = step.label
    if d.stalled_step is not None and bound > s.STALL_CUT_S:
        bound = s.STALL_CUT_S
        args.update(timeout_s=bound, cut={"from_s": step.timeout_s, "after_step": d.stalled_step})
    d.record(Event.INVOKE, Op.AWAIT_STATUS, step.role, args=args)
    try:
        by_rank = d.rank_results(step.role, "await_status", bound + CALL_TIMEOUT_S,
                                 {"room": step.room, "statuses": [int(x) for x in step.statuses], "timeout_s": bound})
    except RoleError as exc:
        d.record(Event.FAIL, Op.AWAIT_STATUS, step.role, args=args, error=str(exc), unsupported=exc.unsupported)
        if exc.unsupported:  # the engine refused while the role polled (an adapter's Refusal): the cell's end
            raise CellAborted(f"{step.role}.await_status: {exc.remote_message or exc}", unsupported=True) from exc
        return
    # the scheduler's view of TP ranks: the lowest status of any rank (poll_and_all_reduce, MIN)
    rank, seen = min(by_rank.items(), key=lambda item: item[1]["status"])
    status = seen["status"]
    asked = time.monotonic()
    reason, reason_error = _failure_reason(d, rank, step.room) if status == KVPoll.Failed else (None, None)
    reason_call_s = round(time.monotonic() - asked, 3)
    reached = status in step.statuses
    if not reached and step.must_come and not d.full_waits and d.stalled_step is None:
        d.stalled_step = d.step_index
    value = {"status": status, "status_name": kvpoll_name(status), "reached": reached,
             "waited_s": seen["waited_s"], "trail": seen["trail"], "failure_reason": reason}
    if "seen_wall" in seen:  # when the status was read, for timing checks (harness.judge.checks.seen_at)
        value["seen_wall"] = seen["seen_wall"]
    if reason is not None or reason_error:
        value["reason_call_s"] = reason_call_s
    if reason_error:
        value["failure_reason_error"] = reason_error
    if d.dp.get(step.role, 1) > 1:  # the DP engine that was asked (R-DP-1, harness.judge.topology_checks)
        value["engine"] = rank
    if len(by_rank) > 1:  # each rank's own read, for R-TERM-1 and R-REASON-1 over every rank (harness.judge.postconditions)
        value["ranks"] = {name: _rank_read(d, name, r, step.room, (reason, reason_error) if name == rank else None)
                          for name, r in by_rank.items()}
        value["rank"] = rank
    d.record(Event.OK, Op.AWAIT_STATUS, step.role, args=args, value=value)


def _failure_reason(d: "CellDriver", client: str, room: int) -> tuple[str | None, str | None]:
    """``(reason, error)``: role client ``client``'s failure reason for ``room``, or, when it
    could not be asked, ``None`` and why (the status was read: R-REASON-1 judges the miss)."""
    try:
        return d.clients[client].call("failure_reason", CALL_TIMEOUT_S, room=room), None
    except RoleError as exc:
        return None, str(exc)


def _rank_read(d: "CellDriver", name: str, read: dict, room: int, asked: tuple | None) -> dict:
    """One rank's read of a group's wait: its status and trail and, when it is Failed, its own
    failure reason (``asked``: already asked of it), so no rank's reason hides behind another's
    (issue "Checks that generalize" 1d)."""
    out = {"status": read["status"], "trail": read["trail"]}
    if read["status"] == KVPoll.Failed:
        reason, error = asked or _failure_reason(d, name, room)
        out["failure_reason"] = reason
        if error:
            out["failure_reason_error"] = error
    return out


def verify_pools(d: "CellDriver", step: s.VerifyPools) -> None:
    """Check the decode's pools, again every VERIFY_RETRY_S while they are wrong, for at most
    ``step.settle_s`` seconds; one completion, the last report, with ``checks`` (how many were
    made), ``settled_s`` (seconds from the first to the last) and ``at_success``: the same
    moves judged on the rows each room held when its Success was first read
    (RoleAdapter.verify_at_success; ``at_success_error`` when that could not be asked)."""
    kwargs = dict(kv_moves=[list(m) for m in step.kv_moves], aux_moves=[list(m) for m in step.aux_moves],
                  unchecked_kv=list(step.unchecked_kv), unchecked_aux=list(step.unchecked_aux),
                  sent_layers=None if step.sent_layers is None else list(step.sent_layers))
    args = {**kwargs, "settle_s": step.settle_s, **({"label": step.label} if step.label else {})}
    d.record(Event.INVOKE, Op.VERIFY, step.decode, args=args)
    start = time.monotonic()
    checks = 0
    while True:
        checks += 1
        try:
            report = _merged(d.rank_results(step.decode, "verify", CALL_TIMEOUT_S, kwargs,
                                            _engine_moves(d, step.decode, kwargs)))
        except RoleError as exc:
            d.record(Event.FAIL, Op.VERIFY, step.decode, args=args, error=str(exc), unsupported=exc.unsupported,
                     remote_traceback=exc.remote_traceback)
            if exc.unsupported:
                raise CellAborted(f"{step.decode}.verify: {exc.remote_message or exc}", unsupported=True) from exc
            return
        if report.get("ok") or time.monotonic() - start + s.VERIFY_RETRY_S > step.settle_s:
            break
        time.sleep(s.VERIFY_RETRY_S)
    value = {**report, "checks": checks, "settled_s": round(time.monotonic() - start, 3)}
    try:  # the same moves on the bytes as they were at each room's first Success read (R-XFER-2)
        value["at_success"] = _merged(d.rank_results(step.decode, "verify_at_success", CALL_TIMEOUT_S, kwargs,
                                                     _engine_moves(d, step.decode, kwargs)))
    except RoleError as exc:
        value["at_success_error"] = str(exc.remote_message or exc)[:300]
    d.record(Event.OK, Op.VERIFY, step.decode, args=args, value=value)


def _engine_moves(d: "CellDriver", decode: str, kwargs: dict) -> dict[str, dict]:
    """On a decode of DP engines, each engine's share of a verification: the moves (and
    unchecked pages) into the pages and aux slots its own rooms requested; every other page
    of its pools must be untouched, so a byte written to the wrong engine is named there."""
    if d.dp.get(decode, 1) == 1:
        return {}
    out = {}
    engines = d.ranks(decode)
    asked = [d.dp_requested.get(engine, (set(), set())) for engine in engines]
    # a page or slot no room asked for on any engine is checked on engine 0: never on none
    orphans = (set(m[1] for m in kwargs["kv_moves"]).difference(*(a[0] for a in asked)),
               set(m[1] for m in kwargs["aux_moves"]).difference(*(a[1] for a in asked)))
    for k, engine in enumerate(engines):
        pages, slots = asked[k] if k else (asked[0][0] | orphans[0], asked[0][1] | orphans[1])
        out[engine] = {"kv_moves": [m for m in kwargs["kv_moves"] if m[1] in pages],
                       "aux_moves": [m for m in kwargs["aux_moves"] if m[1] in slots],
                       "unchecked_kv": [p for p in kwargs["unchecked_kv"] if p in pages],
                       "unchecked_aux": [a for a in kwargs["unchecked_aux"] if a in slots]}
    return out


def _merged(reports: dict[str, dict]) -> dict:
    """One pool report of every decode rank's (harness.role.pattern.PoolReport.to_dict): each
    rank checked the KV heads it holds; with several ranks a mismatch names its rank."""
    if len(reports) == 1:
        return next(iter(reports.values()))
    out = {"ok": all(r["ok"] for r in reports.values()), "ranks": len(reports), "mismatches": []}
    for key in ("bytes_verified", "bytes_untouched_checked", "mismatch_pages", "rooms", "rows"):
        if all(key in r for r in reports.values()):  # rooms, rows: verify_at_success's only
            out[key] = sum(r[key] for r in reports.values())
    for name, r in reports.items():
        out["mismatches"] += [f"{name}: {m}" for m in r["mismatches"]]
    return out


def clear(d: "CellDriver", step: s.Clear) -> None:
    d.call(step.role, "clear", room=step.room)


def abort(d: "CellDriver", step: s.Abort) -> None:
    d.call(step.role, "abort", room=step.room)


def require_fact(d: "CellDriver", step: s.RequireFact) -> None:
    """CellAborted (UNSUPPORTED) unless the role reported ``step.fact`` true when it started."""
    facts = d.start_facts(step.role)
    if facts is None:
        raise CellAborted(f"RequireFact: {step.role} has not started")
    if not facts.get(step.fact):
        release = f" on sglang {facts['sglang']}" if facts.get("sglang") else ""
        raise CellAborted(f"{step.reason} ({step.role} reports {step.fact}={facts.get(step.fact)!r}{release})",
                          unsupported=True)


def sleep(d: "CellDriver", step: s.Sleep) -> None:
    time.sleep(step.seconds)


def observe(d: "CellDriver", step: s.Observe) -> None:
    time.sleep(step.settle_s)
    for role in step.roles:
        for rank in d.ranks(role):
            d.observe(rank, op=Op.OBSERVE_MID, args={"label": step.label})
