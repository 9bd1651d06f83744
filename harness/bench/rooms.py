"""Each backend's control-path time per room under load: figures from the load scenarios' cells
(scenarios/load.py), for ``pdconform bench`` (docs/performance.md).

A room's time is from the prefill's last ``send_chunk`` of the room (the call's completion,
``t``) to the decode's first read of it as Success (:func:`harness.judge.checks.seen_at`).
The load scenarios poll rooms in the order their last chunk went, so a room's read waits at
most for the reads of rooms sent before it; with 64 or 256 rooms in flight that is the time a
room spends in the backend's queues and workers, its engine write and its status message.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from harness.bench.matrix import Figure
from harness.judge.checks import seen_at
from harness.spec import history as hist
from harness.spec.history import Event, Op
from harness.spec.protocol import KVPoll


def room_times(events: list[dict]) -> list[float]:
    """Seconds from each room's last chunk to its decode's first Success read, for every room
    that has both, in history order."""
    last_chunk: dict[int, float] = {}
    times: dict[int, float] = {}
    for e in events:
        room = (e.get("args") or {}).get("room")
        if e["type"] != Event.OK or not isinstance(room, int):
            continue
        if e["op"] == Op.SEND_CHUNK:
            last_chunk[room] = e["t"]
        elif (e["op"] == Op.AWAIT_STATUS and e["role"] == "decode" and room in last_chunk and room not in times
              and (e.get("value") or {}).get("status") == KVPoll.Success):
            times[room] = max(0.0, seen_at(e) - last_chunk[room])
    return list(times.values())


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``values``, by the nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def load_figures(runs: list) -> list[Figure]:
    """``load_room_s[SCENARIO, IMPL]`` for each load cell of ``runs`` (RunResults): every room's
    time, with p50, p99 and the overhead of p50 over the reference's in the note."""
    samples: dict[tuple[str, str], list[float]] = {}
    for run in runs:
        for cell in run.cells:
            if cell.scenario.startswith("load-") and cell.workdir:
                path = Path(cell.workdir) / "history.jsonl"
                if path.is_file():
                    samples.setdefault((cell.scenario, cell.impl), []).extend(room_times(hist.load(path)))
    figures = []
    for (scenario, impl), values in samples.items():
        if not values:
            continue
        p50, p99 = percentile(values, 50), percentile(values, 99)
        ref = samples.get((scenario, "reference"))
        note = f"p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms over {len(values)} rooms"
        if ref and impl != "reference":
            note += f"; p50 {1000 * (p50 - statistics.median(ref)):+.1f} ms over the reference's"
        figures.append(Figure(f"load_room_s[{scenario},{impl}]", "s", values, note=note))
    return figures
