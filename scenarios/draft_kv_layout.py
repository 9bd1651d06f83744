"""draft-kv-layout: the backend's own KV layout planning, pair by pair, against the
layout planning rules (harness.spec.layout_plan), over generated layouts (R-LAYOUT-2).

Layouts (harness.spec.layouts): MHA and MLA; 1-8 layers split into 1-4 prefill
pipeline stages; the decode with one stage or the same stages; draft KV on the
decode only, on both, or on neither.  The adapter runs the implementation's
planning function on each; every layout planned differently is shrunk to a
smallest layout with the same kind of difference and printed.  Then real
transfers, each between its own prefill and decode roles, verified byte by byte
per layer (the decode's own draft layers must stay untouched): a plain one (three
layers, no draft), two layouts drawn from the single-stage layouts with draft KV,
every shrunk layout that has a single prefill stage; and two layouts whose prefill
has several pipeline stages, plus up to two such shrunk layouts, each stage its own
role process (one gloo PP group, one bootstrap server on stage 0, each stage sending
its own layers, the last its draft layers) into a decode that holds the whole model.

A layout the machine cannot serve (the adapter's ``unsupported_layout``) is skipped, and
the transfer check is then UNSUPPORTED with the reason (never PASS), unless a MUST check
fails or a check cannot tell.  Not covered: a decode with pipeline stages of its own
(its layouts are judged at the planning function only).
"""

from __future__ import annotations

from harness.judge import checks as c
from harness.judge import layout_check
from harness.spec.history import completions
from harness.spec.scenario import Scenario, register
from harness.spec.steps import PlanLayouts, StartRoles, TransferLayouts
from scenarios._flows import LAYOUT, RoomAllocator, full_room, room_succeeds, verify

COUNT = 200


def steps(seed: int):
    room = RoomAllocator(seed).room()
    return [StartRoles(layout=LAYOUT), PlanLayouts("prefill", count=COUNT, seed=seed), *full_room(room), verify([room]),
            TransferLayouts(count=2, seed=seed)]


def _planned_like_reference(events):
    runs = [e for e in events if e["op"] == "layout-shrink"]
    if not runs:
        calls = [e for e in events if e["op"] == "plan_layouts" and e["type"] == "fail"]
        return None, (calls[0].get("error") if calls else "no layouts were planned")
    value = runs[-1]["value"]
    wrong = [(spec, problem) for spec, result in zip(value["specs"], value["results"])
             if (problem := layout_check.plan_difference(spec, result)) is not None]
    if not wrong:
        return True, f"{len(value['specs'])} generated layouts planned exactly as the planning rules say"
    shown = "; ".join(f"[{s['layout']}] {s['problem']}" for s in value["shrunk"])
    return False, f"{len(wrong)} of {len(value['specs'])} layouts planned wrongly; shrunk: {shown}"


def _layout_transfers_exact(events):
    transfers = [e for e in events if e["op"] == "layout-transfer"]
    if not transfers:
        return False, "no layout was transferred"
    problems, bytes_ok, skipped = [], 0, []
    for t in transfers:
        if t["args"].get("skipped"):
            skipped.append(f"[{t['args']['layout']}] skipped: {t['args']['skipped']}")
            continue
        start_failed = [e for e in events if e["op"] == "layout-start" and e["role"] == t["role"]]
        if start_failed:
            problems.append(f"[{t['args']['layout']}] roles did not start: {start_failed[0].get('error')}")
            continue
        decode = t["args"].get("decode") or f"decode-L{t['role'].rsplit('-L', 1)[1]}"
        checks = list(completions(events, op="verify", role=decode))
        waits = [e for e in completions(events, op="await_status", role=decode) if e["type"] == "ok"]
        if not checks or checks[-1]["type"] != "ok":
            status = waits[-1]["value"]["status_name"] if waits else "never polled"
            problems.append(f"[{t['args']['layout']}] not verified (decode {status})")
            continue
        report = checks[-1]["value"]
        if not report["ok"]:
            problems.append(f"[{t['args']['layout']}] {report['mismatch_pages']} page(s) wrong: "
                            + "; ".join(report["mismatches"][:2]))
        elif waits and waits[-1]["value"]["status_name"] != "Success":
            problems.append(f"[{t['args']['layout']}] bytes right but decode {waits[-1]['value']['status_name']}")
        else:
            bytes_ok += report["bytes_verified"]
    if problems:
        return False, "; ".join(problems + skipped)
    ran = len(transfers) - len(skipped)
    if skipped:  # a layout this machine cannot serve is not judged, so the check is not a PASS
        return c.UNSUPPORTED, (f"{ran} layout(s) transferred for real, {bytes_ok} bytes exact per layer; "
                               + "; ".join(skipped))
    return True, f"{ran} layout(s) transferred for real, {bytes_ok} bytes exact per layer"


def checks(seed: int):
    room = RoomAllocator(seed).room()
    return [
        c.Check("planning-matches-reference", "R-LAYOUT-2", _planned_like_reference),
        c.Check("sampled-layouts-bytes-exact", "R-LAYOUT-2", _layout_transfers_exact),
        *room_succeeds(room, "R-XFER-1", "sample-room"),
        c.Check("bytes-exact", "R-LAYOUT-1", c.pools_exact()),
    ]


SCENARIO = register(
    Scenario(
        id="draft-kv-layout",
        title="Generated MHA/MLA x PP-stage x draft-KV layouts planned like the reference; shrunk when not",
        steps=steps,
        checks=checks,
        timeout_s=240.0,
        topologies=(("p1-d1",), "it draws its own layouts and starts its own pipeline stages for each"),
    )
)
