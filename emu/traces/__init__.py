"""Workload traces in the field's formats: ours, the Mooncake trace, Azure's LLM
inference traces, BurstGPT and vLLM bench's custom dataset (docs/workloads.md).

``read_trace(path)`` is the one way in: it detects the format by content (or takes the
one named), reads every row with that format's reader (``FORMATS``, one module each),
and replays the part of the trace ``Replay`` says. A problem anywhere, in any row, is a
``TraceError`` listing every one, each naming ``file:line`` and the field; nothing is
returned for a partly read trace. The rules a request must pass are
``emu.workload``'s; the run's own checks (``emu.spec``) follow.
"""

from __future__ import annotations

import csv
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from emu.limits import MAX_TRACE_REQUESTS
from emu.traces import azure, burstgpt, dyntra, mooncake, vllm_custom
from emu.traces.base import Head, ReadOptions, TraceFormat
from emu.traces.replay import Replay, window_text
from emu.workload import (
    MAX_ARRIVAL_S,
    Row,
    TraceError,
    TraceRequest,
    empty_trace_problem,
    is_blank,
    read_trace_bytes,
)

FORMATS: dict[str, TraceFormat] = {
    f.name: f for f in (dyntra.FORMAT, mooncake.FORMAT, azure.FORMAT, burstgpt.FORMAT,
                        vllm_custom.FORMAT)}

# The whole trace as it is, read with nothing but the file.
WHOLE = Replay()
NO_OPTIONS = ReadOptions()

__all__ = ["FORMATS", "LoadedTrace", "ReadOptions", "Replay", "read_trace"]


@dataclass(frozen=True)
class LoadedTrace:
    """A trace read and replayed: its requests in arrival order, the file line of each,
    the format it was read as, and what the reader left out or changed (``notes``,
    for the user)."""

    requests: list[TraceRequest]
    lines: list[int]
    format: str
    notes: list[str]


def read_trace(path, *, format: str | None = None, replay: Replay = WHOLE,
               options: ReadOptions = NO_OPTIONS) -> LoadedTrace:
    """The requests of the trace at ``path`` in ``format`` (default: detected), as
    ``replay`` replays them. Raises TraceError listing every problem."""
    path = Path(path)
    raw, problems = read_trace_bytes(path)
    if raw is None:
        raise TraceError(problems)
    if is_blank(raw):
        raise TraceError([empty_trace_problem(path)])
    trace_format = FORMATS[format] if format is not None else detect_format(path, raw)
    rows, skipped = _kept_rows(path, raw, trace_format, replay, options)
    notes = [f"{path}: skipped {n:,} row(s): {why}" for why, n in skipped.items()]
    if not trace_format.ordered:
        in_file_order = rows
        rows = sorted(rows, key=lambda row: row.request.arrival_s)
        if rows != in_file_order:
            notes.append(f"{path}: rows out of time order were replayed in time order")
    if not rows:
        raise TraceError([_nothing_kept(path, replay, skipped)])
    rows = replay.apply(rows, trace_format.rebase)
    late = [row for row in rows if row.request.arrival_s > MAX_ARRIVAL_S]
    if late:
        raise TraceError([
            f"{path}:{late[0].line}: the request replays at {late[0].request.arrival_s:g} s "
            f"({len(late):,} request(s) after {MAX_ARRIVAL_S:g} s, the limit of a run's "
            "clock); replay a part with --window START:END or faster with --time-scale"])
    return LoadedTrace([row.request for row in rows], [row.line for row in rows],
                       trace_format.name, notes)


def _kept_rows(path: Path, raw: bytes, trace_format: TraceFormat, replay: Replay,
               options: ReadOptions) -> tuple[list[Row], Counter]:
    """Every row of the file in the replay's window, and how many were skipped, why.
    Raises TraceError listing every problem of every row."""
    rows: list[Row] = []
    problems: list[str] = []
    skipped: Counter = Counter()
    for row in trace_format.rows(path, raw, options):
        problems.extend(row.problems)
        if row.skipped is not None:
            skipped[row.skipped] += 1
        elif row.request is not None and replay.keeps(row.request.arrival_s):
            rows.append(row)
            if len(rows) > MAX_TRACE_REQUESTS:
                problems.append(f"{path}:{row.line}: more than {MAX_TRACE_REQUESTS:,} "
                                "requests to replay, the limit for a trace; replay a part "
                                "with --window START:END")
                break
    if problems:
        raise TraceError(problems)
    return rows, skipped


def _nothing_kept(path: Path, replay: Replay, skipped: Counter) -> str:
    if replay.window is not None:
        return f"{path}: no request arrives in the window {window_text(replay.window)} s"
    if skipped:
        return f"{path}: no request to replay: every row was skipped ({', '.join(skipped)})"
    return empty_trace_problem(path)


def detect_format(path: Path, raw: bytes) -> TraceFormat:
    """The one format whose ``looks_like`` accepts the file's first non-blank line.
    Raises TraceError when none or several do."""
    head, shown = _head(raw)
    matches = [f.name for f in FORMATS.values() if f.looks_like(head)]
    if len(matches) == 1:
        return FORMATS[matches[0]]
    names = ", ".join(FORMATS)
    if not matches:
        raise TraceError([f"{path}:{head.line}: cannot tell the trace format from this line "
                          f"({shown}); name it with --workload-format, one of: {names}"])
    raise TraceError([f"{path}:{head.line}: this line ({shown}) fits several formats: "
                      f"{', '.join(matches)}; name one with --workload-format"])


def _head(raw: bytes) -> tuple[Head, str]:
    """The first non-blank line as detection sees it, and how messages show it."""
    for number, raw_line in enumerate(raw.split(b"\n"), start=1):
        line = raw_line.decode("utf-8-sig" if number == 1 else "utf-8", errors="replace")
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):
            obj = None
        if isinstance(obj, dict):
            keys = frozenset(obj)
            return (Head(number, keys, frozenset()),
                    f"a JSON object with keys {', '.join(sorted(keys)) or 'none'}")
        if obj is not None or line.lstrip().startswith(("{", "[")):
            return (Head(number, frozenset(), frozenset(), broken_json=True),
                    "JSON, but not an object")
        columns = [c.strip() for c in next(csv.reader([line]), [])]
        return (Head(number, frozenset(), frozenset(columns)),
                f"read as a CSV header: {', '.join(columns)}")
    return Head(0, frozenset(), frozenset()), "no line"
