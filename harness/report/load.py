"""The load a run ran under, in words, for every report (pure functions of the result tree).

Each cell's entry carries the load it ran under and whether it ran starved
(harness.judge.load: the rule, and the alone run of a cell worse than expected only on
timing bounds).  The terminal, summary.md and index.html say the same from here:
:func:`load_warning` for the run, :func:`starved_line` for a cell, :func:`alone_line`
for a cell run again alone.  How a cell ran is said here too: :func:`pair_line` for a cell
that ran on a warm role pair or was confirmed in a fresh cell (harness.drive.warm),
:func:`pairs_sentence` for the run.  Strings here hold only numbers and verdicts; the
callers escape for their medium all the same.
"""

from __future__ import annotations

from harness.judge.results import CellResult, RunResult


def _peak(cell: CellResult) -> float | None:
    load = cell.load or {}
    values = [x for x in (load.get("load_peak_1m"), *(load.get("load_start") or [])[:1],
                          *(load.get("load_end") or [])[:1]) if isinstance(x, (int, float))]
    return max(values) if values else None


def run_peak(run: RunResult) -> tuple[float | None, int | None]:
    """The highest 1-minute load average any cell of ``run`` saw, and the cores it is compared
    with ((None, None) for a run that recorded none: made before load was recorded)."""
    peaks = [(p, (c.load or {}).get("cores")) for c in run.cells if (p := _peak(c)) is not None]
    if not peaks:
        return None, None
    peak, cores = max(peaks, key=lambda pc: pc[0])
    return peak, cores


def load_warning(run: RunResult) -> str:
    """One sentence when the run's load was above its core count or a cell ran starved (""
    otherwise): the peak load, the cores, how many cells ran starved, and what was done about
    cells worse than expected only on timing bounds."""
    peak, cores = run_peak(run)
    starved = [c for c in run.cells if c.starved]
    if not starved and (peak is None or not cores or peak <= cores):
        return ""
    text = (f"the machine was overloaded while this run ran (1-minute load average up to {peak:.1f} "
            f"on {cores} core{'s' * (cores != 1)}); {len(starved)} of {len(run.cells)} cells ran starved, "
            "so a timing bound may have failed for want of a core") if peak is not None and cores else \
        f"{len(starved)} of {len(run.cells)} cells ran starved, so a timing bound may have failed for want of a core"
    again = [c for c in run.cells if c.alone is not None]
    if again:
        passed = sum(c.under_load for c in again)
        text += (f"; {len(again)} cell(s) worse than expected only on timing bounds ran again alone, "
                 f"{passed} as expected there")
    return text + " (harness/judge/load.py)"


def starved_line(cell: CellResult) -> str:
    """``ran starved: load 31.0 on 2 cores`` for a starved cell whose verdict is not the
    expected one ("" otherwise: a cell as expected is as expected whatever the load, and
    results.json keeps ``starved`` for every cell)."""
    return f"ran starved: {cell.starved}" if cell.starved and not cell.as_expected else ""


def alone_line(cell: CellResult) -> str:
    """Both results of a cell run again alone: ``FAIL under load (load 31.0 on 2 cores), PASS
    alone: timing under load`` (or ``..., FAIL alone too`` when alone did not help); "" for
    a cell that was not."""
    if cell.alone is None:
        return ""
    first = f"{cell.verdict} under load ({cell.starved})" if cell.starved else str(cell.verdict)
    alone = f"{cell.alone.verdict} alone" + (f" (itself starved: {cell.alone.starved})" if cell.alone.starved else "")
    verdict = "timing under load" if cell.under_load else "not as expected alone either"
    return f"{first}, {alone}: {verdict}"


def pair_line(cell: CellResult) -> str:
    """How ``cell`` ran when not in a fresh process of its own (harness.drive.warm): ``ran on a
    warm role pair (its program 4, rooms moved 3 strides)``; for a cell whose run on a pair was
    not as expected and ran once more isolated, ``confirmed in a fresh cell: FAIL on a warm
    pair (its program 4), FAIL fresh`` (the fresh run is the one reported); "" for a cell that
    ran isolated."""
    if cell.on_pair is not None:
        first = cell.on_pair.pair or {}
        return (f"confirmed in a fresh cell: {cell.on_pair.verdict} on a warm pair (its program "
                f"{first.get('program', '?')}), {cell.verdict} fresh")
    if not cell.pair or not cell.pair.get("reused"):
        return ""  # a pair's first program runs as an isolated cell does: nothing to say
    return (f"ran on a warm role pair (its program {cell.pair.get('program', '?')}, "
            f"rooms moved {cell.pair.get('room_shift', '?')} strides)")


def pairs_sentence(run: RunResult) -> str:
    """For the run: how many cells ran on a warm role pair after another cell (the rest ran as
    isolated cells do) and how many of those were confirmed in a fresh cell; "" when none did
    (``run --isolated``, repro, or a run made before pairs)."""
    reused = [c for c in run.cells if (c.pair or {}).get("reused") or c.on_pair is not None]
    if not reused:
        return ""
    confirmed = [c for c in run.cells if c.on_pair is not None]
    same = sum(c.on_pair.verdict == c.verdict and c.on_pair.failing_checks == c.failing_checks for c in confirmed)
    text = f"{len(reused)} of {len(run.cells)} cells ran on a warm role pair after an earlier cell"
    if confirmed:
        text += (f"; {len(confirmed)} not as expected there ran again in a fresh cell (reported), "
                 f"{same} with the same verdict and failing checks")
    return text + " (harness/drive/warm.py; run --isolated runs every cell fresh)"
