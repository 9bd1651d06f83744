"""A cell's history as a swim-lane timeline: pure layout, drawn as SVG by the cell page.

Lanes, top to bottom: the harness (each step a span, ``Sleep`` steps marked as sleeps),
the prefill roles, the decode roles, any other role, and the faults (the nemesis
channel).  A role call is a span from its ``invoke`` to its completion (``ok``, or
``fail``: it raised or timed out); an ``await_status`` that ended without one of the
statuses it waited for is a *timed-out* span, never an "ok" one; an event without an
invoke (an injected frame, a kill, an observation) is a tick.  Pins are vertical
lines across every lane: each failing check at the event it was decided on
(harness.judge.checks.CheckResult ``at``), the first divergence at its observed event,
and the first observation that saw a thread dead.

Everything here is a function of the history, the checks and the divergence; the
template (templates/timeline.svg.j2) only draws what :func:`layout` returns.  Times are
the history's ``t`` (seconds since the cell started); x is in SVG pixels.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness.spec.history import Event, Op

WIDTH = 1100  # px: the whole drawing
LABEL_W = 110  # px: the lane names on the left
LANE_H = 26  # px: one lane
PIN_ROW_H = 12  # px: one row of pin labels above the lanes
MIN_SPAN_PX = 3  # px: a call shorter than this is still visible
TEXT_PX = 7.4  # px: one character of the 11 px (bold) label font at most, to decide what fits
MAX_ITEMS = 3000  # spans and ticks drawn; a longer history's later items are left out (a note says so)
MAX_TICKS = 12  # marks on the time axis
HARNESS, FAULTS = "harness", "faults"


@dataclass
class Item:
    """One drawn thing in a lane: a span (``x2`` > ``x``) or a tick (``x2`` is None)."""

    lane: int
    x: float
    x2: float | None
    kind: str  # ok | fail | timed-out | step | sleep | nemesis | info | open (never completed)
    label: str  # drawn inside a span when it fits
    title: str  # the tooltip: what happened, in full
    seq: int | None  # the event the item links to (the raw table's row)


@dataclass
class Pin:
    """A vertical line across every lane at ``x``, with its label above the lanes."""

    x: float
    kind: str  # check | divergence | dead-thread
    label: str
    title: str
    seq: int | None
    id: str
    row: int = 0  # which row of labels above the lanes
    anchor: str = "start"  # the label's SVG text-anchor: "end" near the right edge


@dataclass
class Timeline:
    """What the SVG template draws; ``height`` and ``width`` in px, ``duration_s`` the time axis."""

    lanes: list[str]
    items: list[Item]
    pins: list[Pin]
    ticks: list[tuple[float, str]]  # (x, label) of the time axis
    width: int
    height: int
    duration_s: float
    top: int  # px: where the first lane starts (the pin labels and the time axis above it)
    notes: list[str] = field(default_factory=list)


def _lane_order(roles: list[str]) -> list[str]:
    """The harness first, prefill roles, decode roles, other roles, the faults last."""
    def rank(role: str) -> tuple[int, str]:
        return (0 if role.startswith("prefill") else 1 if role.startswith("decode") else 2, role)

    return [HARNESS, *sorted(roles, key=rank), FAULTS]


def short(value: Any, limit: int = 140) -> str:
    """``value`` as text (JSON when it is not a string), cut to ``limit`` characters with an ellipsis."""
    import json

    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), default=repr)
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def decode_frames(sample: list[list[str]]) -> list[list[str]]:
    """Injected frames as a person reads them: each hex frame of an ``inject`` event's
    ``sample`` (at most 40 bytes each, harness.drive.executors.nemesis) as quoted text when
    it is printable ASCII, else as ``0x`` hex; an empty frame is ``b''``."""
    out = []
    for message in sample or []:
        shown = []
        for frame in message:
            raw = bytes.fromhex(frame)
            if not raw:
                shown.append("b''")
            elif all(32 <= b < 127 for b in raw):
                shown.append(repr(raw.decode("ascii")))
            else:
                shown.append("0x" + frame)
        out.append(shown)
    return out


def describe_event(event: dict) -> str:
    """One line for an event: its op, role, room and what it returned or raised (a value of
    an unexpected shape shown as it is)."""
    try:
        return _describe(event)
    except (TypeError, ValueError, AttributeError, KeyError):
        return f"{event.get('op')} on {event.get('role')}: {event.get('type')}: {short(event.get('value'))}"


def _describe(event: dict) -> str:
    args = event.get("args") if isinstance(event.get("args"), dict) else {}
    room = f" room {args['room']}" if "room" in args else ""
    head = f"{event['op']}{' on ' + event['role'] if event.get('role') else ''}{room}"
    if event.get("error"):
        return f"{head}: {event['type']}: {short(event['error'])}"
    value = event.get("value")
    if event["op"] == Op.AWAIT_STATUS and isinstance(value, dict):
        wanted = "/".join(str(x) for x in args.get("statuses") or [])
        if value.get("reached") is False:
            return (f"{head}: timed out after {args.get('timeout_s')} s waiting for {wanted}, "
                    f"saw {value.get('status_name')}")
        return f"{head}: {value.get('status_name')} after {value.get('waited_s')} s"
    if event["op"] in (Op.INJECT, Op.INJECT_ABORT, Op.INJECT_CAPTURED) and "sample" in args:
        frames = "; ".join("[" + ", ".join(m) + "]" for m in decode_frames(args["sample"]))
        return f"{head}: {args.get('messages')} message(s): {short(frames, 300)}"
    if event["op"] == Op.VERIFY and isinstance(value, dict):
        return f"{head}: " + ("bytes exact" if value.get("ok") else f"{value.get('mismatch_pages')} page(s) wrong")
    if event["op"] in (Op.OBSERVE, Op.OBSERVE_MID) and isinstance(value, dict):
        dead = value.get("dead_threads") or []
        return f"{head}: " + (f"{len(dead)} dead thread(s): {dead[0].get('exception')}" if dead else "loops alive")
    return f"{head}: {event['type']}" + (f": {short(value)}" if value not in (None, {}, []) else "")


def _kind(invoke: dict | None, done: dict) -> str:
    if done["type"] == Event.FAIL:
        return "fail"
    if done["op"] == Op.AWAIT_STATUS and isinstance(done.get("value"), dict) and done["value"].get("reached") is False:
        return "timed-out"
    return "ok"


def layout(events: list[dict], checks: list[dict], divergence: dict | None, width: int = WIDTH) -> Timeline:
    """The timeline of one cell: ``events`` its raw history, ``checks`` its check results
    (dicts with ``ok``, ``name``, ``requirement``, ``at``), ``divergence`` its first
    divergence (with ``seq``) or None.  Pure."""
    timed = [e for e in events if isinstance(e.get("t"), (int, float)) and not isinstance(e.get("t"), bool)]
    duration = max((e["t"] for e in timed), default=0.0) or 1.0
    roles = list(dict.fromkeys(e["role"] for e in timed if e.get("role") and e["type"] != Event.NEMESIS))
    roles += [r for r in dict.fromkeys(e["role"] for e in timed if e.get("role")) if r not in roles]
    lanes = _lane_order(roles)
    index = {name: i for i, name in enumerate(lanes)}
    plot = width - LABEL_W - 10

    def x(t: float) -> float:
        return round(LABEL_W + plot * t / duration, 1)

    items = _step_spans(timed, index[HARNESS], duration, x) + _call_spans(timed, index, duration, x)
    notes = []
    if len(items) > MAX_ITEMS:
        notes.append(f"{len(items) - MAX_ITEMS} of {len(items)} timeline items not drawn (the history is long); "
                     "the raw history and history.jsonl hold every event")
        items = items[:MAX_ITEMS]
    pins = _place(_pins(timed, checks, divergence, x), width)
    rows = max((p.row for p in pins), default=-1) + 1
    top = PIN_ROW_H * rows + 20
    ticks = [(x(t), f"{t:g} s") for t in _axis(duration)]
    seqs = {e["seq"] for e in timed}
    notes += [f"{c.get('name')} was judged over the whole history (no single event)" if c.get("at") is None else
              f"{c.get('name')} was decided on event {c.get('at')}, which is not on the timeline"
              for c in checks if c.get("ok") is False and c.get("at") not in seqs]
    return Timeline(lanes, items, pins, ticks, width, top + LANE_H * len(lanes) + 8, duration, top, notes)


def _step_spans(timed: list[dict], lane: int, duration: float, x) -> list[Item]:
    """The harness lane: each step from its start to the next step's (a Sleep step marked)."""
    items = []
    steps = [e for e in timed if e["op"] == Op.STEP]
    for i, step in enumerate(steps):
        end = steps[i + 1]["t"] if i + 1 < len(steps) else duration
        name = (step.get("args") or {}).get("step", "")
        items.append(Item(lane, x(step["t"]), max(x(end), x(step["t"]) + MIN_SPAN_PX),
                          "sleep" if name == "Sleep" else "step", f"{step['step']} {name}",
                          f"step {step['step']} {name}: {end - step['t']:.3f} s", step["seq"]))
    return items


def _call_spans(timed: list[dict], index: dict[str, int], duration: float, x) -> list[Item]:
    """Each role call from its invoke to its completion, in its role's lane; a nemesis event a
    tick in the faults lane; an invoke that never completed a span to the end."""
    items: list[Item] = []
    open_calls: dict[tuple, list[dict]] = {}
    for e in timed:
        role = e.get("role")
        if e["type"] == Event.NEMESIS:
            items.append(Item(index[FAULTS], x(e["t"]), None, "nemesis", e["op"],
                              f"t={e['t']:.3f} s, step {e['step']}: {describe_event(e)}", e["seq"]))
            continue
        if e["op"] == Op.STEP or role not in index:
            continue
        key = (role, e["op"], e["step"])
        if e["type"] == Event.INVOKE:
            open_calls.setdefault(key, []).append(e)
        elif e["type"] in (Event.OK, Event.FAIL):
            started = open_calls.get(key, [])
            invoke = started.pop() if started else None
            t0 = invoke["t"] if invoke else e["t"]
            kind = _kind(invoke, e)
            span = x(e["t"]) - x(t0) >= 1
            label = e["op"] + ("" if kind == "ok" else f" ({kind})")
            items.append(Item(index[role], x(t0), max(x(e["t"]), x(t0) + MIN_SPAN_PX) if span else None, kind,
                              label, f"t={t0:.3f}-{e['t']:.3f} s, step {e['step']}: {describe_event(e)}", e["seq"]))
    for calls in open_calls.values():  # an invoke that never completed: the cell ended (or was killed) first
        for invoke in calls:
            items.append(Item(index[invoke["role"]], x(invoke["t"]), x(duration), "open",
                              f"{invoke['op']} (never completed)",
                              f"t={invoke['t']:.3f} s, step {invoke['step']}: {invoke['op']} never completed",
                              invoke["seq"]))
    return items


def _place(pins: list[Pin], width: int) -> list[Pin]:
    """Give each pin a label row so that no two labels overlap (left to right, the lowest
    free row, a new row when none is), and anchor a label that would run past the right
    edge at its end."""
    ends: list[float] = []
    for pin in sorted(pins, key=lambda p: p.x):
        size = TEXT_PX * len(pin.label) + 8
        pin.anchor = "end" if pin.x + size > width else "start"
        left, right = (pin.x - size, pin.x) if pin.anchor == "end" else (pin.x, pin.x + size)
        pin.row = next((r for r, end in enumerate(ends) if end < left), len(ends))
        ends[pin.row:pin.row + 1] = [right]
    return pins


def _pins(timed: list[dict], checks: list[dict], divergence: dict | None, x) -> list[Pin]:
    by_seq = {e["seq"]: e for e in timed}
    pins = []
    at: dict[int, list[dict]] = {}  # the failing checks decided on each event: one pin per event
    for check in (c for c in checks if c.get("ok") is False):
        if check.get("at") in by_seq:
            at.setdefault(check["at"], []).append(check)
    for n, (seq, here) in enumerate(sorted(at.items())):
        event = by_seq[seq]
        where = f"step {event['step']}" if event.get("step") is not None else "the end of the cell"
        pins.append(Pin(x(event["t"]), "check", "\u2716 " + ", ".join(c["name"] for c in here),
                        "; ".join(f"{c.get('level', '')} {c['requirement']} {c['name']} failed here ({where}): "
                                  f"{short(c.get('detail', ''), 300)}" for c in here), seq, f"pin-check-{n}"))
    event = by_seq.get((divergence or {}).get("seq"))
    if event is not None:
        pins.append(Pin(x(event["t"]), "divergence", "first divergence",
                        f"step {divergence['step']} {divergence.get('step_name', '')}: reference "
                        f"{divergence['reference']}, observed {divergence['observed']}", event["seq"],
                        "pin-divergence"))
    dead = next((e for e in timed if e["op"] in (Op.OBSERVE_MID, Op.OBSERVE) and e["type"] == Event.OK
                 and isinstance(e.get("value"), dict) and isinstance(e["value"].get("dead_threads"), list)
                 and e["value"]["dead_threads"]), None)
    if dead is not None:
        first = dead["value"]["dead_threads"][0]
        first = first if isinstance(first, dict) else {"message": str(first)}
        pins.append(Pin(x(dead["t"]), "dead-thread", f"\u2620 {dead['role']} thread died",
                        f"first seen at step {dead['step']}: {first.get('thread')}: {first.get('exception')}: "
                        f"{short(first.get('message', ''), 200)}", dead["seq"], "pin-dead-thread"))
    return pins


def _axis(duration: float) -> list[float]:
    """At most MAX_TICKS round time marks from 0 to ``duration`` seconds (a 1, 2 or 5 step)."""
    import math

    exponent = math.floor(math.log10(max(duration, 1e-3) / (MAX_TICKS - 2)))
    step = next(m * 10.0 ** e for e in (exponent, exponent + 1) for m in (1, 2, 5)
                if duration / (m * 10.0 ** e) <= MAX_TICKS - 2)
    return [round(i * step, 3) for i in range(int(duration / step + 1e-9) + 1)][:MAX_TICKS]


def link_rows(timeline: Timeline, rows: set) -> None:
    """Keep the links of the items and pins whose event has a row on the page (``rows``:
    their seqs); the others link nowhere, so no link of the page leads to nothing."""
    for thing in [*timeline.items, *timeline.pins]:
        if thing.seq not in rows:
            thing.seq = None


def fits(item: Item) -> bool:
    """Whether a span's label fits inside it (the template draws it only then)."""
    return item.x2 is not None and (item.x2 - item.x) > TEXT_PX * len(item.label) + 6
