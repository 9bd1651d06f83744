"""Checks of the deployment shapes (harness.spec.topology): where a room is served when a
side runs several DP engines (R-DP-1).

Pure functions over a cell's history, like harness.judge.checks; each returns
``(ok, detail, seq)`` with the event the outcome was decided on.
"""

from __future__ import annotations

from harness.spec.history import START_OPS, Event, Op, completions
from harness.spec.protocol import KVPoll, kvpoll_name
from harness.spec.topology import rank_name


def dp_engines(events: list[dict], role: str) -> int:
    """How many DP engines ``role`` was started as (the ``dp`` its start calls were given; 1 when none)."""
    for e in events:
        if e["op"] in START_OPS and e["type"] == Event.OK and (e["role"] or "").split(".")[0] == role:
            dp = (e.get("args") or {}).get("dp")
            if dp:
                return int(dp[0])
    return 1


def served_on_room_engine(room: int, role: str):
    """R-DP-1: ``room`` reached Success on ``role``'s DP engine ``room mod DP``, the engine its
    bootstrap room selects (the last AwaitStatus of the room: the cell asks that engine, so
    what is checked is the status, not where it was asked); with one engine, on the role
    itself.  A decode that takes the room's KV from another prefill engine, or a prefill
    engine that refuses the room, fails it; bytes that land on another engine fail the
    byte check of the scenario (its VerifyPools is split by engine)."""

    def fn(events: list[dict]):
        dp = dp_engines(events, role)
        expected = rank_name(role, room % dp, "dp")
        waits = list(completions(events, op=Op.AWAIT_STATUS, role=role, room=room))
        if not waits:
            return False, f"{role} room {room} was never polled"
        last = waits[-1]
        value = last.get("value") or {}
        where = f"{expected} (engine {room % dp} of {dp})" if dp > 1 else role
        if last["type"] != Event.OK:
            return False, f"{role} room {room}: polling {where} failed: {last.get('error')}", last["seq"]
        if value.get("status") != KVPoll.Success:
            reason = f" (failure reason: {value['failure_reason']})" if value.get("failure_reason") else ""
            return (False, f"{role} room {room} was not served on {where}: it ended at "
                           f"{kvpoll_name(value.get('status'))}{reason}", last["seq"])
        return True, f"{role} room {room} served on {where}", last["seq"]

    return fn
