"""Workload traces for the emulated cluster: the trace schema, loading with validation,
and the rules every trace's requests pass (the routing of unpinned requests to DP ranks is
``emu.routers``'; its names are kept here too).

The rules are each written once, here, and worded once: one request's arrival time
(``arrival_problem``) and token counts (``tokens_problem``); the requests of a trace
together (``UniqueIds``, ``ArrivalOrder``); a pinned rank against the DP size
(``pinned_rank_problem``). The readers of every trace format (``emu.traces``) apply them
line by line, naming ``file:line``; ``emu.spec.check`` applies them to a RunSpec's
trace, naming the request.

The engine on every rank loads the same trace, routes every request with the same
deterministic router and keeps only the requests routed to itself, so no rank needs to
talk to another about arrivals. Virtual time in the engine is integer microseconds
(`arrival_us`).

Trace format (JSON Lines, UTF-8): one JSON object per line,

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

import dataclasses
import json
import math
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from emu.knobs import is_int, is_number
from emu.limits import MAX_TRACE_BYTES, MAX_TRACE_REQUESTS, FileTooLarge, read_limited
from emu.routers import (  # noqa: F401 (the routing names this module kept)
    DEFAULT_ROUTER,
    LeastLoadedRouter,
    RoundRobinRouter,
    check_dp_size,
    make_router,
)
from emu.routers import ROUTERS as _ROUTER_TYPES

MAX_TOKENS = 10_000_000
MAX_ARRIVAL_S = 1_000_000.0
MAX_PRIORITY = 2**31 - 1

REQUIRED_FIELDS = ("request_id", "arrival_s", "prompt_tokens", "output_tokens")
OPTIONAL_FIELDS = ("rank", "priority", "prompt_text")

# How many problems a TraceError message lists before summarising the rest.
_MAX_LISTED_PROBLEMS = 20


@dataclass(frozen=True)
class TraceRequest:
    """One request of a workload trace, as the engine receives it."""

    request_id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    rank: int | None = None
    priority: int = 0
    prompt_text: str | None = field(default=None, compare=False, repr=False)


class TraceError(ValueError):
    """A trace (or its routing against a DP size) is invalid. `problems` holds every
    problem found, each naming `file:line`, the field and what was expected."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        shown = self.problems[:_MAX_LISTED_PROBLEMS]
        more = len(self.problems) - len(shown)
        if more:
            shown.append(f"... and {more} more problem(s)")
        super().__init__("\n".join(shown))


# The bundled workloads, next to the package (a source checkout or an editable install).
WORKLOADS_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "workloads"


def bundled_workloads() -> list[str]:
    """Names of the traces under fixtures/workloads/ (empty when not installed)."""
    if not WORKLOADS_DIR.is_dir():
        return []
    return sorted(p.stem for p in WORKLOADS_DIR.glob("*.jsonl"))


def resolve_workload(value: str) -> Path:
    """A workload given as FILE or NAME -> its trace file. An existing path wins; a bare
    name (no directory part, no suffix such as .jsonl or .csv) is a bundled workload.
    Raises ValueError starting with the value, e.g. ``'longtale': no such file and not a bundled
    workload; ...`` (the CLI puts ``--workload`` in front)."""
    path = Path(value)
    if path.exists():
        return path
    is_name = value and "/" not in value and os.sep not in value and not path.suffix
    if not is_name:
        raise ValueError(f"{value}: no such file")
    bundled = WORKLOADS_DIR / f"{value}.jsonl"
    if bundled.is_file():
        return bundled
    names = bundled_workloads()
    if not names:
        raise ValueError(f"{value!r}: no such file, and the bundled workloads are not "
                         f"installed (looked in {WORKLOADS_DIR}); pass a trace file")
    raise ValueError(f"{value!r}: no such file and not a bundled workload; bundled "
                     f"workloads are: {', '.join(names)}")


def workload_label(value: str, path: Path) -> str:
    """What ``RunSpec.workload`` (and so metrics.json's ``config.workload``) calls the
    workload ``value`` resolved to ``path``: a bundled workload's name, else the file."""
    return value if path.parent == WORKLOADS_DIR else str(path)


def arrival_us(req: TraceRequest) -> int:
    """Arrival time in the engine's integer virtual microseconds."""
    return round(req.arrival_s * 1e6)


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
            yield lineno, None, f"{where}: expected a JSON object per line, got {_json_type(obj)}"
            continue
        yield lineno, obj, None


def on_line(line: int) -> str:
    """A file's line as the rules below name an earlier one."""
    return f"line {line}"


class ArrivalOrder:
    """The rule of a trace in arrival order: each time is no earlier than the one before
    it (equal times are fine). ``check`` each time in order, with its position (a file's
    line; a request's index), which ``place`` names when a later time breaks the rule."""

    def __init__(self, place: Callable[[int], str] = on_line):
        self._previous: tuple[float, int] | None = None  # (time, position)
        self._place = place

    def check(self, time: float, position: int) -> str | None:
        """The problem with ``time`` at ``position`` (without the place's own prefix)."""
        previous, self._previous = self._previous, (time, position)
        if previous is not None and time < previous[0]:
            return (f"arrivals must be non-decreasing, got {time} after {previous[0]} on "
                    f"{self._place(previous[1])}")
        return None


class UniqueIds:
    """The rule that no two requests of a trace share an id. ``check`` each id in order,
    with its position (a file's line; a request's index), which ``place`` names when the
    id comes again."""

    def __init__(self, place: Callable[[int], str] = on_line):
        self._first: dict[str, int] = {}
        self._place = place

    def check(self, request_id: str, position: int) -> str | None:
        """The problem with ``request_id`` at ``position`` (without the place's prefix)."""
        first = self._first.setdefault(request_id, position)
        if first != position:
            return f"duplicate id {request_id!r} (first used on {self._place(first)})"
        return None


def pinned_rank_problem(rank: int, dp_size: int) -> str | None:
    """Why a request pinned to ``rank`` cannot run with ``dp_size`` ranks, or None."""
    if rank >= dp_size:
        return f"expected an integer in 0..{dp_size - 1} for dp_size={dp_size}, got {rank}"
    return None


def arrival_problem(value) -> str | None:
    """Why ``value`` is not a request's arrival time (a finite number of seconds in
    0..MAX_ARRIVAL_S), or None."""
    if not is_time(value):
        return f"expected a finite number >= 0 (seconds), got {show(value)}"
    if value > MAX_ARRIVAL_S:
        return (f"expected at most {MAX_ARRIVAL_S:g} seconds, got {show(value)} (is the "
                "trace in milliseconds?)")
    return None


def tokens_problem(value, shown: str | None = None) -> str | None:
    """Why ``value`` is not a token count of a request (an integer in 1..MAX_TOKENS), or
    None. ``shown``: how the message shows the value (default: as JSON, with its type)."""
    shown = show(value) if shown is None else shown
    if not is_int(value) or value < 1:
        return f"expected an integer >= 1, got {shown}"
    if value > MAX_TOKENS:
        return f"expected at most {MAX_TOKENS:,} tokens, got {shown}"
    return None


def is_time(value) -> bool:
    """A number >= 0 that is finite as a float (ints too large for a float count as
    finite: the MAX_ARRIVAL_S check rejects them)."""
    if not is_number(value):
        return False
    if isinstance(value, int):
        return value >= 0
    return math.isfinite(value) and value >= 0


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
        _check_dp_size(dp_size)
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


def _json_type(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def show(value) -> str:
    """A JSON value as messages show it: at most 40 characters, with its type."""
    text = json.dumps(value)
    if len(text) > 40:
        text = text[:37] + "..."
    return f"{text} ({_json_type(value)})"


def _check_dp_size(dp_size) -> None:
    check_dp_size(dp_size)


# --------------------------------------------------------------------------- routing
# The routers live in emu.routers (a protocol and a registry); these names stay here for
# the code that imports them from this module.
ROUTERS = tuple(_ROUTER_TYPES)


# ----------------------------------------------------------- wave-boundary arrivals


@dataclass(frozen=True)
class WaveEnd:
    """A wave's last step (from a rank's step records): ``iter`` and ``start_us`` of
    that step, and ``end_us``, the virtual time its sync decided the wave was over —
    where the next iteration (idle, or a new wave) begins."""

    wave: int
    iter: int
    start_us: int
    end_us: int


def wave_ends(steps: Sequence[dict]) -> list[WaveEnd]:
    """Every wave end in one rank's step records (file order), the run's last step
    included (a finished run ends with its last wave)."""
    ends = []
    for i, record in enumerate(steps):
        if record.get("kind", "step") != "step":
            raise ValueError(f"wave_ends expects step records, got kind {record['kind']!r}")
        if i + 1 == len(steps) or steps[i + 1]["wave"] != record["wave"]:
            start_us = round(record["clock_s"] * 1e6)
            ends.append(WaveEnd(record["wave"], record["iter"], start_us,
                                start_us + round(record["step_time_s"] * 1e6)))
    return ends


def insert_request(trace: Sequence[TraceRequest],
                   request: TraceRequest) -> list[TraceRequest]:
    """``trace`` with ``request`` added after every request arriving no later (the
    trace stays sorted; the new id must be unused)."""
    if any(r.request_id == request.request_id for r in trace):
        raise ValueError(f"request id {request.request_id!r} is already in the trace")
    position = sum(1 for r in trace if r.arrival_s <= request.arrival_s)
    return [*trace[:position], request, *trace[position:]]


def wave_boundary_trace(trace: Sequence[TraceRequest], steps: Sequence[dict], *,
                        wave: int, request: TraceRequest,
                        offset_us: int = 0) -> list[TraceRequest]:
    """``trace`` plus ``request`` arriving exactly when ``wave`` ended in the run whose
    step records (of any rank) are ``steps`` (``offset_us`` shifts it, e.g. -1 = during
    the wave's last step). Requests before it are untouched, so a run of the new trace
    is identical to the old one up to that moment (a pinned ``request`` also leaves the
    round-robin rotation of later requests alone)."""
    ends = {end.wave: end for end in wave_ends(steps)}
    if wave not in ends:
        raise ValueError(f"wave {wave} is not in the step records (waves: {sorted(ends)})")
    arrival_us = ends[wave].end_us + offset_us
    if arrival_us < 0:
        raise ValueError(f"offset_us={offset_us} puts the arrival before time 0")
    return insert_request(trace, dataclasses.replace(request, arrival_s=arrival_us / 1e6))
