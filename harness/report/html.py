"""``index.html``: the matrix at a glance, as a pure function of the result tree.

One self-contained page (inline CSS and a few lines of inline JS, no network
assets, works from ``file://``): scenarios as rows, implementations as columns,
each cell coloured by verdict and marked when the verdict is not the expected
one.  Clicking a cell opens its details: verdict and reason, failing checks,
first divergence from the reference, a unified diff of the normalized histories
(:func:`harness.judge.divergence.normalize`), the history as a compact table and the
command that reproduces the cell.

Long histories are cut at ``max_events`` rows and long values at
``max_value_chars`` characters, with a note pointing at the full
``history.jsonl`` next to the page; the real 21 x 4 matrix stays around a
megabyte.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any, Mapping

import jinja2

from harness.judge.divergence import describe as describe_divergence
from harness.judge.divergence import normalize
from harness.judge.results import VERDICTS, CellResult, RunResult, cell_dir_name, write_atomic
from harness.report.terminal import engine_settings_line, reproduce_command
from harness.spec.protocol import REFERENCE

MAX_EVENTS = 400  # history rows shown per cell
MAX_VALUE_CHARS = 160  # characters of a value/error shown per history row
MAX_DIFF_LINES = 200  # lines of normalized diff shown per cell

_env = jinja2.Environment(
    loader=jinja2.FileSystemLoader(Path(__file__).resolve().parent / "templates"),
    autoescape=True,  # every template, whatever its name
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)


def _short(value: Any, limit: int) -> str:
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), default=repr)
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def _history_rows(events: list[dict], max_events: int, max_value_chars: int) -> list[dict]:
    rows = []
    for e in events[:max_events]:
        if e.get("error"):
            shown = e["error"]
        elif e.get("op") == "step":
            shown = (e.get("args") or {}).get("step", "")
        elif e.get("type") == "invoke":
            shown = e.get("args") or ""
        else:
            shown = e.get("value")
        t = e.get("t")
        rows.append({"t": f"{t:.3f}" if isinstance(t, (int, float)) else "", "step": e.get("step"),
                     "role": e.get("role") or "", "op": e.get("op", ""), "type": e.get("type", ""),
                     "value": "" if shown is None else _short(shown, max_value_chars)})
    return rows


def _normalized_lines(events: list[dict]) -> list[str]:
    return [f"step {e['step']} {e['step_name']}: {e['op']} on {e['role']}: {e['value']}" for e in normalize(events)]


def _diff(reference: list[dict], observed: list[dict], max_lines: int) -> dict:
    """Unified diff of the two normalized histories:
    ``{"lines": [(kind, text)], "cut": int, "same": bool, "count": int, "error": str | None}``,
    kind one of ``hunk``, ``add``, ``del``, ``ctx``; ``error`` when a history cannot be normalized."""
    try:
        ref, obs = _normalized_lines(reference), _normalized_lines(observed)
    except (KeyError, TypeError, AttributeError) as exc:  # an event of an unexpected shape
        return {"lines": [], "cut": 0, "same": False, "count": 0, "error": f"{type(exc).__name__}: {exc}"}
    lines = []
    for line in list(difflib.unified_diff(ref, obs, "reference", "observed", n=2, lineterm=""))[2:]:
        kind = {"@": "hunk", "+": "add", "-": "del"}.get(line[:1], "ctx")
        lines.append((kind, line))
    return {"lines": lines[:max_lines], "cut": max(0, len(lines) - max_lines), "same": not lines,
            "count": len(obs), "error": None}


def _engine_label(cells: list[CellResult]) -> str:
    engines = list(dict.fromkeys(c.engine for c in cells if c.engine))
    return " / ".join(engines) if engines else "no role started"


def _safe_link(link: str) -> str | None:
    """Only http(s) links become hrefs (no ``javascript:`` from an expectations file)."""
    return link if link.startswith(("https://", "http://")) else None


def _cell_view(run: RunResult, cell: CellResult, histories: Mapping[tuple[str, str], list[dict]],
               max_events: int, max_value_chars: int, max_diff_lines: int) -> dict:
    events = histories.get((cell.scenario, cell.impl))
    reference = histories.get((cell.scenario, REFERENCE))
    diff = None
    if cell.impl != REFERENCE and reference and events is not None:
        diff = _diff(reference, events, max_diff_lines)
    return {
        "cell": cell,
        "id": "cell-" + cell_dir_name(cell.scenario, cell.impl),
        "unexpected": not cell.as_expected,
        "expected_link": _safe_link(cell.expected_link),
        "failing_checks": [{key: check.get(key, "") for key in ("level", "requirement", "name", "detail")}
                           for check in cell.checks if check.get("ok") is False],
        "checks_total": len(cell.checks),
        "divergence": describe_divergence(cell.divergence),
        "diff": diff,
        "has_reference": bool(reference),
        "history": None if events is None else _history_rows(events, max_events, max_value_chars),
        "history_total": 0 if events is None else len(events),
        "history_path": f"cells/{cell_dir_name(cell.scenario, cell.impl)}/history.jsonl",
        "reproduce": reproduce_command(run, cell),
    }


def render_index_html(run: RunResult, histories: Mapping[tuple[str, str], list[dict]], *,
                      max_events: int = MAX_EVENTS, max_value_chars: int = MAX_VALUE_CHARS,
                      max_diff_lines: int = MAX_DIFF_LINES) -> str:
    """The whole ``index.html`` page for ``run``, as a string (pure: no I/O).

    ``histories`` maps ``(scenario, impl)`` to that cell's raw history events
    (:mod:`harness.spec.history`), including ``(scenario, "reference")`` for the diff
    when the reference was not a column; a missing key renders as "no history".
    Each cell's history table shows at most ``max_events`` events, each value or
    error at most ``max_value_chars`` characters, and the normalized diff at most
    ``max_diff_lines`` lines, with a note when something was cut.  Every string
    from the result tree is HTML-escaped.
    """
    impls = list(dict.fromkeys(c.impl for c in run.cells))
    scenarios = list(dict.fromkeys(c.scenario for c in run.cells))
    views = {(c.scenario, c.impl): _cell_view(run, c, histories, max_events, max_value_chars, max_diff_lines)
             for c in run.cells}
    columns = [{"impl": impl, "engine": _engine_label([c for c in run.cells if c.impl == impl])} for impl in impls]
    counts = {v: sum(1 for c in run.cells if c.verdict == v) for v in VERDICTS}
    return _env.get_template("index.html.j2").render(
        run=run, columns=columns, scenarios=scenarios, views=views, counts=counts,
        unexpected=sum(1 for c in run.cells if not c.as_expected), max_events=max_events,
        engine_settings=engine_settings_line(run),
    )


def write_index_html(run: RunResult, out_dir: str | Path, histories: Mapping[tuple[str, str], list[dict]]) -> Path:
    """Render ``OUT/index.html`` from ``run`` and its ``histories``
    (harness.judge.results.load_histories), atomically; returns its path.  OSError if it
    cannot be written."""
    path = Path(out_dir) / "index.html"
    write_atomic(path, render_index_html(run, histories).encode("utf-8"))
    return path
