"""A history stores a long string that repeats an earlier event's once (a reference in the
file) and every reader gets the events back as they were recorded: load, the line-by-line
Resolver (the runner's live follower), append_event after it; text of the code under test
cannot pose as a reference."""

from __future__ import annotations

import json

from harness.spec.history import REF_MIN_CHARS, REFS_KEY, Event, History, Op, Resolver, append_event, load

FRAME = "Malformed ABORT message: invalid room field b'" + "9" * 300_000 + "'"  # what mori's prefill logs


def _as_read(events: list[dict]) -> list[dict]:
    """The events as a reader of a file without references would see them (bytes repr'd)."""
    return json.loads(json.dumps(events, default=repr))


def _record_observations(history: History) -> None:
    """What malformed-frame x mori records: each observation repeats every log record so far."""
    records = []
    for step in range(6):
        records.append({"message": FRAME if step == 1 else f"record {step}", "exception": ""})
        history.record(Event.OK, Op.OBSERVE_MID, "prefill", step, value={"log_records": list(records)})
    frame = FRAME.encode()
    history.record(Event.OK, Op.OBSERVE, "decode", 7, args={"frame": frame},  # bytes: written as their repr
                   value={"same": [frame, frame], "text": FRAME, "short": "x" * REF_MIN_CHARS})
    history.record(Event.FAIL, Op.VERIFY, "decode", 8, error=FRAME)


def test_repeated_long_values_are_stored_once_and_load_as_recorded(tmp_path):
    path = tmp_path / "history.jsonl"
    history = History(path)
    _record_observations(history)
    history.close()
    size = path.stat().st_size
    # written whole once as text, once as a bytes repr; the other 7 as references
    assert size < 2 * len(FRAME) + 20_000, size
    lines = path.read_text().splitlines()
    assert sum(REFS_KEY in json.loads(line) for line in lines) == 6
    assert load(path) == _as_read(history.events)
    parse = Resolver()  # a reader that follows the file line by line gets the same
    assert [parse(line.encode()) for line in lines] == _as_read(history.events)


def test_a_value_that_looks_like_a_reference_stays_as_it_is(tmp_path):
    path = tmp_path / "history.jsonl"
    history = History(path)
    history.record(Event.OK, Op.OBSERVE, "prefill", 1, value={"text": FRAME})
    # a role reporting a reference list or a placeholder of its own: no top-level key is its
    forged = {REFS_KEY: [[["value", "text"], 0, ["value", "text"]]], "text": "<the text at value.text of event 0>",
              "long": "<" + "y" * REF_MIN_CHARS + ">"}
    history.record(Event.OK, Op.OBSERVE, "decode", 2, value=forged)
    history.close()
    assert load(path) == _as_read(history.events)
    assert load(path)[1]["value"] == forged


def test_unresolvable_references_keep_their_placeholder_and_appending_still_works(tmp_path):
    path = tmp_path / "history.jsonl"
    history = History(path)
    _record_observations(history)
    history.close()
    lines = path.read_text().splitlines()
    # an edited file: the first frame's event is gone; its references cannot resolve
    (tmp_path / "edited.jsonl").write_text("\n".join(lines[:1] + lines[2:]) + "\n")
    edited = load(tmp_path / "edited.jsonl")
    assert len(edited) == len(lines) - 1
    assert all(REFS_KEY not in e for e in edited)
    assert edited[1]["value"]["log_records"][1]["message"].startswith("<the text at value.log_records.1.message")
    # the runner appends CELL_EXIT after the writer ended: the next seq, references still resolved
    exit_ = append_event(path, Event.INFO, Op.CELL_EXIT, value={"how": "exited"})
    assert exit_["seq"] == len(history.events)
    assert load(path) == _as_read(history.events) + [json.loads(json.dumps(exit_))]


def test_a_file_written_twice_resolves_each_writers_references_to_its_own_events(tmp_path):
    path = tmp_path / "history.jsonl"
    other = FRAME.replace("9", "8")
    events = []
    for text in (FRAME, other):  # the second writer's seqs start at 0 again
        history = History(path)
        for step in range(3):
            history.record(Event.OK, Op.OBSERVE_MID, "prefill", step, value={"message": text})
        history.close()
        events += history.events
    assert path.stat().st_size < 2 * len(FRAME) + 5_000
    assert load(path) == _as_read(events)
