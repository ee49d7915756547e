"""Reading trace files: the ``Row`` every format reader (``emu.traces``) hands back, a
file's bytes within the limit, its JSON Lines objects, and this project's own format
(``dyntra``) line by line, with ``load_trace`` and ``validate_trace`` on top.

The format (JSON Lines, UTF-8): one JSON object per line,

    {"request_id": "req-0001", "arrival_s": 0.0, "prompt_tokens": 512,
     "output_tokens": 128, "rank": 2, "priority": 0, "prompt_text": "..."}

- `request_id` (required): non-empty string, unique in the file.
- `arrival_s` (required): finite number >= 0, at most `MAX_ARRIVAL_S`; non-decreasing
  from line to line (equal times are fine).
- `prompt_tokens`, `output_tokens` (required): integers in 1..`MAX_TOKENS`. `3.0` and
  `true` are not integers.
- `rank` (optional): integer >= 0; pins the request to that DP rank (must be < dp size).
- `priority` (optional, default 0): integer, vLLM's meaning (lower is served first under
  the "priority" scheduling policy).
- `prompt_text` (optional): a string for human readers of the trace; the engine ignores
  it (token counts come from `prompt_tokens`).

Blank (whitespace-only) lines are skipped; line numbers in errors are physical line
numbers. Any other key is an error. A trace holds at most `MAX_TRACE_REQUESTS` requests
in at most `MAX_TRACE_BYTES` (emu.limits).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from emu.knobs import is_int
from emu.limits import MAX_TRACE_BYTES, MAX_TRACE_REQUESTS, FileTooLarge, read_limited
from emu.routers import check_dp_size
from emu.workload.request import (
    MAX_PRIORITY,
    OPTIONAL_FIELDS,
    REQUIRED_FIELDS,
    TraceError,
    TraceRequest,
)
from emu.workload.rules import (
    ArrivalOrder,
    UniqueIds,
    arrival_problem,
    json_type,
    pinned_rank_problem,
    show,
    tokens_problem,
)


def validate_trace(path, dp_size: int | None = None) -> list[str]:
    """Every problem of the trace at `path` (empty list when it is valid), for a tool
    that lists them all (fixtures/README.md). With `dp_size`, pinned ranks are checked
    against it too. `load_trace` raises the same problems as a TraceError."""
    _, problems = _parse(Path(path), dp_size)
    return problems


def load_trace(path, dp_size: int | None = None) -> list[TraceRequest]:
    """Load and validate a trace before anything starts; raises TraceError listing the
    problems when any line is bad (nothing is returned for a partly valid file)."""
    requests, problems = _parse(Path(path), dp_size)
    if problems:
        raise TraceError(problems)
    return requests


@dataclass(frozen=True)
class Row:
    """One line (or CSV row) of a trace file as a reader of its format understood it
    (``emu.traces``): the request it holds, with ``arrival_s`` on the format's own
    clock in seconds; or the problems that make it none, each naming ``file:line`` and
    the field; or, for a well-formed row that is no request by the format's own rules
    (a BurstGPT failed request), why it is ``skipped``."""

    line: int
    request: TraceRequest | None = None
    problems: tuple[str, ...] = ()
    skipped: str | None = None


def read_trace_bytes(path: Path) -> tuple[bytes | None, list[str]]:
    """The bytes of a trace file, at most MAX_TRACE_BYTES, or the problem reading it."""
    try:
        return read_limited(path, MAX_TRACE_BYTES), []
    except FileTooLarge as exc:
        return None, [f"{path}: cannot read trace: {exc}"]
    except OSError as exc:
        return None, [f"{path}: cannot read trace: {exc.strerror or exc}"]


def is_blank(raw: bytes) -> bool:
    """No request could be in ``raw``: it holds nothing but whitespace."""
    return not raw.strip()


def empty_trace_problem(path: Path) -> str:
    return f"{path}: trace is empty (expected at least one request line)"


def json_objects(path: Path, raw: bytes) -> Iterator[tuple[int, dict | None, str | None]]:
    """Each non-blank line of a JSON Lines file: its line number and its object, or None
    and the problem (``file:line: ...``) when the line is not a JSON object."""
    for lineno, raw_line in enumerate(raw.split(b"\n"), start=1):
        where = f"{path}:{lineno}"
        try:
            line = raw_line.decode("utf-8")
        except UnicodeDecodeError as exc:
            yield lineno, None, f"{where}: not valid UTF-8 ({exc.reason} at byte {exc.start})"
            continue
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            yield lineno, None, f"{where}: invalid JSON: {exc.msg} (column {exc.colno})"
            continue
        except ValueError:  # an integer literal over Python's 4300-digit limit
            yield lineno, None, f"{where}: invalid JSON: a number has too many digits"
            continue
        except RecursionError:
            yield lineno, None, f"{where}: invalid JSON: nested too deeply"
            continue
        if not isinstance(obj, dict):
            yield lineno, None, f"{where}: expected a JSON object per line, got {json_type(obj)}"
            continue
        yield lineno, obj, None


def _parse(path: Path, dp_size: int | None) -> tuple[list[TraceRequest], list[str]]:
    raw, problems = read_trace_bytes(path)
    if raw is None:
        return [], problems
    requests: list[TraceRequest] = []
    for row in dyntra_rows(path, raw, dp_size):
        problems.extend(row.problems)
        if row.request is not None:
            requests.append(row.request)
    return requests, problems


def dyntra_rows(path: Path, raw: bytes, dp_size: int | None = None) -> Iterator[Row]:
    """The requests of a trace in this module's format, line by line (the reader of the
    format ``dyntra`` in ``emu.traces``); a last row holds the file's own problem, if
    any (an empty trace, too many requests)."""
    if dp_size is not None:
        check_dp_size(dp_size)
    ids = UniqueIds()
    count = 0  # request lines so far
    order = ArrivalOrder()
    for lineno, obj, problem in json_objects(path, raw):
        where = f"{path}:{lineno}"
        count += 1
        if count > MAX_TRACE_REQUESTS:
            yield Row(lineno, problems=(f"{where}: more than {MAX_TRACE_REQUESTS:,} requests, "
                                        "the limit for a trace",))
            return
        if obj is None:
            yield Row(lineno, problems=(problem,))
            continue
        line_problems: list[str] = []
        req = _check_object(obj, dp_size, line_problems)
        problems = [f"{where}: {p}" for p in line_problems]
        rid = obj.get("request_id")
        if isinstance(rid, str) and rid.strip():
            duplicate = ids.check(rid, lineno)
            if duplicate is not None:
                problems.append(f"{where}: field 'request_id': {duplicate}")
        arrival = obj.get("arrival_s")
        if arrival_problem(arrival) is None:
            out_of_order = order.check(arrival, lineno)
            if out_of_order is not None:
                problems.append(f"{where}: field 'arrival_s': {out_of_order}")
        yield Row(lineno, None if problems else req, tuple(problems))
    if count == 0:
        yield Row(0, problems=(empty_trace_problem(path),))


def _check_object(obj: dict, dp_size: int | None, problems: list[str]) -> TraceRequest | None:
    """Validate one line's object; append problems (without the file:line prefix) and
    return the request when the line is valid."""
    unknown = sorted(set(obj) - set(REQUIRED_FIELDS) - set(OPTIONAL_FIELDS))
    if unknown:
        allowed = ", ".join(REQUIRED_FIELDS + OPTIONAL_FIELDS)
        problems.append(f"unknown field(s) {unknown}; allowed fields are: {allowed}")
    for name in REQUIRED_FIELDS:
        if name not in obj:
            problems.append(f"field {name!r}: missing (required)")

    rid = obj.get("request_id")
    if "request_id" in obj and not (isinstance(rid, str) and rid.strip()):
        problems.append(f"field 'request_id': expected a non-empty string, got {show(rid)}")

    arrival = obj.get("arrival_s")
    if "arrival_s" in obj:
        problem = arrival_problem(arrival)
        if problem is not None:
            problems.append(f"field 'arrival_s': {problem}")

    for name in ("prompt_tokens", "output_tokens"):
        if name in obj:
            problem = tokens_problem(obj[name])
            if problem is not None:
                problems.append(f"field {name!r}: {problem}")

    rank = obj.get("rank")
    if "rank" in obj:
        if not is_int(rank) or rank < 0:
            problems.append(f"field 'rank': expected an integer >= 0, got {show(rank)}")
        elif dp_size is not None and (beyond := pinned_rank_problem(rank, dp_size)):
            problems.append(f"field 'rank': {beyond}")

    priority = obj.get("priority", 0)
    if not is_int(priority) or abs(priority) > MAX_PRIORITY:
        problems.append(
            f"field 'priority': expected an integer in -{MAX_PRIORITY}..{MAX_PRIORITY}, "
            f"got {show(priority)}"
        )

    text = obj.get("prompt_text")
    if "prompt_text" in obj and not isinstance(text, str):
        problems.append(f"field 'prompt_text': expected a string, got {show(text)}")

    if problems:
        return None
    return TraceRequest(
        request_id=rid,
        arrival_s=float(arrival),
        prompt_tokens=obj["prompt_tokens"],
        output_tokens=obj["output_tokens"],
        rank=rank,
        priority=priority,
        prompt_text=text,
    )

