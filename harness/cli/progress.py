"""What ``pdconform run`` shows while its cells run (on stderr; stdout stays the matrix).

On a terminal: a live view (rich) of the cells running now and the last one started,
done of total, how many are not as expected so far, elapsed time and the time left.
Off a terminal (CI logs): one line per finished cell, with its verdict and, for a known
non-PASS one, its bug.  Each finished cell is judged here from its history alone
(harness.judge.judge, without the reference's divergence), only to show its verdict;
the run's result tree is judged once more, in full, when every cell has ended.
"""

from __future__ import annotations

import threading
import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from harness.drive.scheduler import Callbacks
from harness.report.safe import terminal
from harness.report.terminal import known_mark


class RunProgress:
    """Callbacks for harness.session.run that keep ``console`` (stderr) informed about
    ``total`` cells of ``seed``, judged against ``expectations`` (a loaded
    harness.judge.expectations.Expectations, or None); ``scenarios``: scenario id ->
    Scenario, to judge each finished cell.  A context manager (the live view)."""

    def __init__(self, console: Console, total: int, seed: int, expectations, scenarios: dict):
        self.console, self.seed, self.expectations, self.scenarios = console, seed, expectations, scenarios
        self.live = console.is_terminal
        self.running: dict[tuple[str, str], float] = {}
        self.unexpected = 0
        self.lock = threading.Lock()
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), TextColumn("left"), TimeRemainingColumn(), console=console,
                            transient=True, disable=not self.live)
        self.task = self.bar.add_task("starting", total=total)

    def __enter__(self):
        self.bar.__enter__()
        return self

    def __exit__(self, *exc):
        return self.bar.__exit__(*exc)

    def stop(self) -> None:
        """End the live view now (an interrupted run prints its message after it)."""
        self.bar.stop()

    def callbacks(self, on_note) -> Callbacks:
        """The harness.drive.scheduler.Callbacks of the run; ``on_note(text)`` for notes."""
        return Callbacks(on_start=self._started, on_cell=self._finished, on_note=on_note)

    def _describe(self, last: str) -> str:
        return f"{len(self.running)} running, {self.unexpected} not as expected | {last}"

    def _started(self, i: int, n: int, impl: str, scenario) -> None:
        with self.lock:
            self.running[(scenario.id, impl)] = time.monotonic()
            self.bar.update(self.task, description=terminal(self._describe(f"{scenario.id} x {impl}")))

    def _finished(self, done: int, total: int, cell_run) -> None:
        cell = self._judged(cell_run)
        with self.lock:
            started = self.running.pop((cell_run.scenario, cell_run.impl), None)
            if cell is not None and not cell.as_expected:
                self.unexpected += 1
            self.bar.update(self.task, advance=1, description=terminal(self._describe(
                f"{cell_run.scenario} x {cell_run.impl} {cell.verdict if cell else 'done'}")))
            if not self.live:
                took = f", {time.monotonic() - started:.1f} s" if started is not None else ""
                verdict = (f"{known_mark(cell)}{cell.verdict}" + ("" if cell.as_expected else
                                                                 f" (expected {cell.expected})")) if cell else "ended"
                self.console.print(terminal(f"[{done}/{total}] {cell_run.scenario} x {cell_run.impl}: {verdict}{took}"),
                                   markup=False, highlight=False)

    def _judged(self, cell_run):
        """The cell's verdict from its history (None when it cannot be read: the run's own
        judgement later says why)."""
        from harness.judge.judge import judge_cell
        from harness.spec.history import load

        scenario = self.scenarios.get(cell_run.scenario)
        if scenario is None:
            return None
        try:
            return judge_cell(scenario, self.seed, load(cell_run.workdir / "history.jsonl"), cell_run.impl,
                              self.expectations)
        except Exception:  # noqa: BLE001 - a preview only; the run's judgement reports any problem
            return None
