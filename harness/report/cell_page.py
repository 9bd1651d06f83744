"""``cells/SCENARIO--IMPL/cell.html``: one cell's page, read in seconds.

From the top: the verdict and whether it was expected (with the bug entry), the failing
checks each with its requirement (linked to docs/protocol.md) and the step it was decided
on, the first divergence, the reproduce command, then the swim-lane timeline
(harness.report.timeline) with the failing checks, the first divergence and the first
dead thread pinned to their events, the dead threads and raised calls with their
tracebacks (file:line, and where the role log has them), links to every file of the
cell's folder (role logs, history.jsonl, cell.json), the normalized diff against the
reference in the conventional colours (the reference is what was *expected*, green; the
implementation what *actually* happened, red), and the raw history folded below, each row
linked from the timeline.

A pure function of the result tree (the run, the cell, its history, the reference's
history, the cell folder's file names and role logs): :func:`render_cell_page`; the writer
(:func:`write_cell_pages`) does the reading and writes each page atomically.
"""

from __future__ import annotations

import difflib
import math
import os
import re
from pathlib import Path
from urllib.parse import quote
from typing import Mapping

from harness import ROOT, nofollow
from harness.judge.divergence import describe_parts
from harness.judge.divergence import normalize
from harness.judge.results import ON_PAIR_DIR, CellResult, RunResult, cell_dir, cell_dir_name, write_atomic
from harness.report import timeline as tl
from harness.report.load import pair_line
from harness.report.templates_env import env
from harness.report.terminal import expectation_gap, known_label, reproduce_command
from harness.spec.history import Event, Op
from harness.spec.protocol import REFERENCE

CELL_PAGE = "cell.html"
MAX_EVENTS = 400  # raw history rows shown (rows a pin points at are always shown)
MAX_VALUE_CHARS = 200  # characters of a value shown per raw row
MAX_DIFF_LINES = 200  # lines of normalized diff shown
MAX_LOG_BYTES = 2 * 1024 * 1024  # of a role log read to find tracebacks (its end)
MAX_LOG_TRACEBACKS = 3  # tracebacks shown per role log when the history has none
MAX_T_S = 7 * 24 * 3600.0  # a cell's event later than this (seconds) is not a time since the cell started
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def docs_href(run: RunResult, link: str) -> str | None:
    """Where a link into the checkout's docs/ (``docs/protocol.md#r-xfer-1``) points from a
    page: under the run's ``docs_url`` when it has one, else the checkout's file (a
    ``file://`` URL, which a page opened from disk follows); http(s) links as they are;
    anything else (``javascript:``) None."""
    if link.startswith(("https://", "http://")):
        return link
    path, _, anchor = link.partition("#")
    docs = (ROOT / "docs").resolve()
    if not link.startswith("docs/") or not (ROOT / path).resolve().is_relative_to(docs):
        return None  # not into docs/ (javascript:, docs/../../etc/passwd): no link
    if run.docs_url:  # a results.json may carry anything: only a web address becomes a base
        return f"{run.docs_url.rstrip('/')}/{link}" if run.docs_url.startswith(("https://", "http://")) else None
    return (ROOT / path).resolve().as_uri() + (f"#{quote(anchor)}" if anchor else "")


def file_href(name: str) -> str:
    """A link to a file of the cell's folder: ``./`` and the name percent-encoded, so no name
    (``javascript:x.log``, ``a#b.log``) is read as a scheme, a fragment or a query."""
    return "./" + quote(name)


def requirement_link(rid: str) -> str:
    """``docs/protocol.md#r-xfer-1``: the anchor each requirement row of docs/protocol.md carries."""
    return f"docs/protocol.md#{rid.lower()}"


def _where(traceback: str) -> str:
    """The innermost ``file:line in function`` of a Python traceback, the file shortened to
    its package path (``sglang/srt/disaggregation/nixl/conn.py:3379 in bootstrap_thread``)."""
    if not isinstance(traceback, str):
        return ""
    # frames are the lines that start a traceback entry (not text inside a message)
    frames = [m for line in traceback.splitlines() if line.startswith("  File ") and (m := _FRAME.search(line))]
    if not frames:
        return ""
    path, line, func = frames[-1].groups()
    short = re.split(r"/(?:site|dist)-packages/", path)[-1]
    root = str(ROOT) + "/"
    return f"{short[len(root):] if short.startswith(root) else short}:{line} in {func}"


def _log_line(log: str, needle: str) -> int | None:
    """The 1-based line of ``log`` that holds ``needle`` (a traceback's last line), or None."""
    if not needle:
        return None
    for number, line in enumerate(log.splitlines(), 1):
        if needle in line:
            return number
    return None


def _log_tracebacks(log: str) -> list[str]:
    """The first MAX_LOG_TRACEBACKS Python tracebacks in a role log, each to its exception line."""
    found, lines = [], log.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("Traceback (most recent call last):"):
            block = [line]
            for follow in lines[i + 1:i + 80]:
                block.append(follow)
                if follow and not follow.startswith((" ", "\t")):
                    break
            found.append("\n".join(block))
            if len(found) == MAX_LOG_TRACEBACKS:
                break
    return found


def tracebacks(events: list[dict], logs: Mapping[str, str], skipped: Mapping[str, int] | None = None) -> list[dict]:
    """Every dead thread the observations saw (once each) and every call that raised with a
    traceback, as ``{"role", "what", "where" (file:line), "traceback", "log", "log_line"}``;
    when the history has none, the tracebacks written in the role logs (caught and logged
    exceptions).  ``logs``: role log texts by file name (``prefill.log``), each its last
    MAX_LOG_BYTES; ``skipped``: the lines of a log before the part read (line numbers count
    them).  Values of unexpected types are shown as text, never trusted."""
    out, seen, skipped = [], set(), skipped or {}

    def located(log: str, last: str) -> int | None:
        line = _log_line(logs.get(log, ""), last)
        return None if line is None else line + skipped.get(log, 0)

    for e in events:
        value = e.get("value") if e["op"] in (Op.OBSERVE, Op.OBSERVE_MID) and e["type"] == Event.OK else None
        dead_threads = value.get("dead_threads") if isinstance(value, dict) else None
        for dead in dead_threads if isinstance(dead_threads, list) else []:
            dead = dead if isinstance(dead, dict) else {"message": str(dead)}
            key = tuple(str(dead.get(k)) for k in ("thread", "exception", "message")) + (str(e["role"]),)
            if key in seen:
                continue
            seen.add(key)
            text = dead.get("traceback") if isinstance(dead.get("traceback"), str) else ""
            last = text.strip().splitlines()[-1] if text.strip() else ""
            log = f"{e['role']}.log"
            out.append({"role": e["role"], "what": f"thread {dead.get('thread')} died: {dead.get('exception')}: "
                                                  f"{dead.get('message', '')}",
                        "where": _where(text), "traceback": text, "seq": e.get("seq"),
                        "log": log if log in logs else None, "log_line": located(log, last)})
        if e["type"] == Event.FAIL and e.get("remote_traceback"):
            text = str(e["remote_traceback"])
            out.append({"role": e.get("role"), "what": f"{e['op']} raised: {e.get('error', '')}",
                        "where": _where(text), "traceback": text, "seq": e.get("seq"), "log": None, "log_line": None})
    if not out:
        for name, text in logs.items():
            for block in _log_tracebacks(text):
                out.append({"role": name.removesuffix(".log"), "what": f"logged in {name}: "
                            f"{block.splitlines()[-1]}", "where": _where(block), "traceback": block, "seq": None,
                            "log": name, "log_line": located(name, block.splitlines()[-1])})
    return out


def _diff(reference: list[dict], observed: list[dict], impl: str) -> dict:
    """The normalized histories as a unified diff: ``{"lines": [(kind, text)], "cut", "same",
    "count", "error"}``; kind ``expected`` (the reference's line), ``actual`` (the
    implementation's), ``hunk`` or ``ctx``."""
    def lines(events: list[dict]) -> list[str]:
        return [f"step {e['step']} {e['step_name']}: {e['op']} on {e['role']}: {e['value']}" for e in normalize(events)]

    try:
        ref, obs = lines(reference), lines(observed)
    except (KeyError, TypeError, AttributeError) as exc:  # an event of an unexpected shape
        return {"lines": [], "cut": 0, "same": False, "count": 0, "error": f"{type(exc).__name__}: {exc}"}
    out = []
    for line in list(difflib.unified_diff(ref, obs, "expected (reference)", f"actual ({impl})", n=2,
                                          lineterm=""))[2:]:
        out.append(({"@": "hunk", "+": "actual", "-": "expected"}.get(line[:1], "ctx"), line))
    return {"lines": out[:MAX_DIFF_LINES], "cut": max(0, len(out) - MAX_DIFF_LINES), "same": not out,
            "count": len(obs), "error": None}


def _rows(events: list[dict], keep: set[int]) -> tuple[list[dict], int]:
    """The raw table: the first MAX_EVENTS events and every event in ``keep`` (pinned), each
    row ``{"seq", "t", "step", "role", "op", "type", "shown", "cls", "gap"}``; and how many
    were left out."""
    rows, left_out, last = [], 0, -1
    for i, e in enumerate(events):
        if i >= MAX_EVENTS and e.get("seq") not in keep:
            left_out += 1
            continue
        cls = [e.get("type", "")] + (["step"] if e.get("op") == Op.STEP else [])
        if e.get("op") == Op.AWAIT_STATUS and isinstance(e.get("value"), dict) and e["value"].get("reached") is False:
            cls.append("timed-out")
        if e.get("seq") in keep:
            cls.append("pinned")
        if e.get("op") == Op.STEP:
            shown = (e.get("args") or {}).get("step", "")
        elif e.get("type") == Event.INVOKE:
            shown = tl.short(e.get("args") or "", MAX_VALUE_CHARS)
        else:
            shown = tl.short(tl.describe_event(e), MAX_VALUE_CHARS * 2)
        t = e.get("t")
        rows.append({"seq": e.get("seq"), "t": f"{t:.3f}" if isinstance(t, (int, float)) else "",
                     "step": "" if e.get("step") is None else e["step"], "role": e.get("role") or "",
                     "op": e.get("op", ""), "type": "timed out" if "timed-out" in cls else e.get("type", ""),
                     "shown": shown, "cls": " ".join(cls), "gap": i != last + 1})
        last = i
    return rows, left_out


def clean(events: list) -> list[dict]:
    """A history as the page can draw it: events that are dicts with a string ``op`` and
    ``type``; ``t`` a finite number of seconds (else None: not on the timeline), ``seq`` an
    int, unique (else None: no row id), ``step`` an int or None.  The judge reads the raw
    history; this only keeps one odd event from breaking the page."""
    out, seen = [], set()
    for e in events or []:
        if not isinstance(e, dict) or not isinstance(e.get("op"), str) or not isinstance(e.get("type"), str):
            continue
        t, seq, step = e.get("t"), e.get("seq"), e.get("step")
        ok_t = isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and 0 <= t <= MAX_T_S
        ok_seq = isinstance(seq, int) and not isinstance(seq, bool) and seq not in seen
        if ok_seq:
            seen.add(seq)
        out.append({**e, "t": t if ok_t else None, "seq": seq if ok_seq else None,
                    "step": step if isinstance(step, int) and not isinstance(step, bool) else None,
                    "args": e.get("args") if isinstance(e.get("args"), dict) else {}})
    return out


def cell_view(run: RunResult, cell: CellResult, events: list[dict] | None, reference: list[dict] | None,
              files: list[str], logs: Mapping[str, str], skipped: Mapping[str, int] | None = None) -> dict:
    """Everything the cell page shows (pure).  ``events``: the cell's history (None: none
    recorded); ``reference``: the reference's history for the scenario (None: no diff);
    ``files``: the names of the files in the cell's folder; ``logs``: role log texts by name,
    ``skipped`` the lines of each before the part read."""
    events = clean(events)
    timed = tl.layout(events, cell.checks, cell.divergence) if events else None
    by_seq = {e["seq"]: e for e in events if e["seq"] is not None}
    failing = []
    for check in (c for c in cell.checks if c.get("ok") is False):
        at, event = check.get("at"), by_seq.get(check.get("at"))
        where = ("over the whole history" if at is None else f"event {at}, which the history does not hold"
                 if event is None else f"event {at}, which has no time" if event["t"] is None else
                 f"step {event['step']}, t={event['t']:.3f} s" if event["step"] is not None
                 else f"the end of the cell, t={event['t']:.3f} s")
        failing.append({**check, "href": docs_href(run, requirement_link(str(check.get("requirement")))),
                        "where": where, "row": at if event is not None else None})
    found = tracebacks(events, logs, skipped)
    keep = ({p.seq for p in timed.pins} if timed else set()) | {c["row"] for c in failing} | \
        {t["seq"] for t in found} | {(cell.divergence or {}).get("seq")}
    rows, left_out = _rows(events, keep)
    shown = {r["seq"] for r in rows}
    if timed:
        tl.link_rows(timed, shown)
    diff = None
    if cell.impl != REFERENCE and reference and events:
        diff = _diff(reference, events, cell.impl)
    divergence_row = (cell.divergence or {}).get("seq")
    divergence_line, divergence_cases = describe_parts(cell.divergence)
    return {
        "cell": cell, "run": run,
        "unexpected": not cell.as_expected,
        "bug": known_label(cell),
        "gap": expectation_gap(cell),  # how it differs from its expectation ("" when as expected)
        "bug_href": docs_href(run, cell.expected_link) if cell.expected_link else None,
        "failing": failing,
        "checks_total": len(cell.checks),
        "divergence": divergence_line,
        "divergence_cases": divergence_cases,
        "divergence_row": divergence_row if divergence_row in shown else None,
        "timeline": timed,
        "tracebacks": [{**t, "seq": t["seq"] if t["seq"] in shown else None,
                        "log": file_href(t["log"]) if t["log"] else None, "log_name": t["log"]} for t in found],
        "files": [(name, file_href(name)) for name in files],
        "diff": diff,
        "has_reference": bool(reference),
        "rows": rows, "left_out": left_out, "history_total": len(events),
        "reproduce": reproduce_command(run, cell),
        "pair": pair_line(cell),  # a warm role pair's cell, or one confirmed in a fresh cell (harness.drive.warm)
        "pair_href": f"../../{ON_PAIR_DIR}/{cell_dir_name(cell.scenario, cell.impl)}/history.jsonl",
        "baseline": (run.baseline or {}).get("marks", {}).get(f"{cell.scenario} x {cell.impl}"),
    }


def render_cell_page(run: RunResult, cell: CellResult, events: list[dict] | None, reference: list[dict] | None,
                     files: list[str], logs: Mapping[str, str], skipped: Mapping[str, int] | None = None) -> str:
    """The cell's page as a string (pure; see :func:`cell_view`).  Every string from the
    result tree, the history and the logs is HTML-escaped.  A history the page cannot draw
    gives a page that says so, with the cell's verdict, files and reproduce command."""
    try:
        view = cell_view(run, cell, events, reference, files, logs, skipped)
        return env.get_template("cell_page.html.j2").render(
            v=view, lane_h=tl.LANE_H, pin_row_h=tl.PIN_ROW_H, fits=tl.fits)
    except Exception as exc:  # noqa: BLE001 - one odd cell must not cost the run its reports
        return env.get_template("cell_page_unreadable.html.j2").render(
            cell=cell, error=f"{type(exc).__name__}: {exc}", files=[(n, file_href(n)) for n in files],
            reproduce=reproduce_command(run, cell))


def _read_logs(folder: Path) -> tuple[dict[str, str], dict[str, int]]:
    """The role logs of a cell folder (regular files, not links): each one's last
    MAX_LOG_BYTES as text, and the lines before that part."""
    logs, skipped = {}, {}
    for path in sorted(folder.glob("*.log")):
        if path.name == "cell.log" or path.is_symlink() or not path.is_file():
            continue
        try:
            with open(path, "rb") as f:
                size = f.seek(0, 2)
                start = max(0, size - MAX_LOG_BYTES)
                f.seek(0)
                lines = 0
                while f.tell() < start:  # count the lines of the part not read
                    lines += f.read(min(1 << 20, start - f.tell())).count(b"\n")
                logs[path.name] = f.read().decode("utf-8", errors="replace")
                skipped[path.name] = lines
        except OSError:
            continue
    return logs, skipped


def write_cell_pages(run: RunResult, out_dir: str | Path, histories: Mapping[tuple[str, str], list[dict]]) -> list[Path]:
    """Write ``cells/SCENARIO--IMPL/cell.html`` for every cell of ``run`` (the folder made for
    a cell that never got one, so every link of the index leads somewhere), each atomically;
    their paths.  A cell folder that is a symbolic link is left alone (pdconform writes no
    page through it); files that are links are not listed.  OSError when one cannot be written."""
    written = []
    for cell in run.cells:
        folder = cell_dir(out_dir, cell.scenario, cell.impl)
        if folder.is_symlink():
            continue
        os.close(nofollow.open_dir(folder, create=True))  # no link followed on the way (harness.nofollow)
        files = sorted(p.name for p in folder.iterdir() if not p.is_symlink() and p.is_file()
                       and not p.name.startswith(".") and p.name != CELL_PAGE and p.suffix in (".log", ".jsonl", ".json"))
        logs, skipped = _read_logs(folder)
        page = render_cell_page(run, cell, histories.get((cell.scenario, cell.impl)),
                                histories.get((cell.scenario, REFERENCE)), files, logs, skipped)
        write_atomic(folder / CELL_PAGE, page.encode("utf-8"))
        written.append(folder / CELL_PAGE)
    return written
