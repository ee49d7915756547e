"""Diagnostics logs read back: every DyntraLB table and line of a log, grouped per rank.

Used by ``dyntra-emu replay`` / ``explain`` (which re-run the planner on the
snapshots found here) and ``diff`` (which compares two runs' lines after
``clean_line``).

Log lines may carry vLLM's decorations, which are stripped before matching: ANSI
colours, a process tag such as ``(EngineCore_DP0 pid=12345)`` (lines are grouped into
streams by that tag, so ranks writing into one file are told apart), and the logger
prefix ``INFO 11-29 09:31:02 [file.py:123]`` (or the indentation vLLM puts in its place
on continuation lines of a multi-line message). Anything that is not a DyntraLB line is
ignored; a DyntraLB table that is cut off or has a row that does not parse is reported
as a warning with its line number, and that snapshot is left out of the comparison.

Reconstruction (docs/diagnostics.md's requests table against docs/protocol.md's payload
and docs/planner.md's parser): a row ``Run(n): [...]`` lists
``blks[:split]`` and ``Wait(m): [...]`` lists the *positive* entries of ``blks[split:]``,
so the snapshot is rebuilt as ``(run + wait, n)``. The trailing zero padding is dropped,
which does not change the plan. What cannot be rebuilt is a zero block count inside the
waiting part: the planner stops at the first 0 (docs/planner.md, "Input and parsing")
while the table hides zeros and
still lists the values after it. A request always has at least one token, so a real
payload never holds such a zero; a log that did would replay as a mismatch.

"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

# --- line cleaning -----------------------------------------------------------------

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# An optional container timestamp, then vLLM's process tag: "(EngineCore_DP0 pid=12345) ",
# "(APIServer pid=1) ", "(Engine (DP0)) ", Ray's "(EngineCore_DP0 pid=1, ip=10.0.0.1) ".
_TAG = re.compile(r"^\s*(?:\S*\d\d:\d\d:\d\d\S*\s+)?\((\w[^()]*(?:\([^()]*\)[^()]*)*)\)\s")
# vLLM's logger prefix: level, "%m-%d %H:%M:%S" (newer releases add milliseconds), and
# "[file.py:123]" (older releases: "file.py:123]"). The emulator's vllm-ascend ranks
# write it without the time (their logs are deterministic).
_VLLM_PREFIX = re.compile(
    r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+(?:\d\d-\d\d\s+\d\d:\d\d:\d\d(?:[.,]\d+)?\s+)?"
    r"\[?[^\s\]]+\.py:\d+\]\s?"
)
# A bare level word, as in the emulator's per-rank logs ("(EngineCore_DP0) INFO <message>").
_LEVEL = re.compile(r"^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) ")


def clean_line(raw: str) -> tuple[str, str]:
    """Split one physical log line into ``(stream, message)``: the process tag ("" when
    there is none) and the text the program logged, with colours and prefixes removed."""
    line = _ANSI.sub("", raw).rstrip("\r\n")
    stream = ""
    tag = _TAG.match(line)
    if tag:
        stream = tag.group(1).strip()
        line = line[tag.end():]
    prefix = _VLLM_PREFIX.search(line) or _LEVEL.match(line)
    if prefix:
        line = line[prefix.end():]
    return stream, line


# --- the DyntraLB lines (docs/diagnostics.md) --------------------------------------

_REQ_HEADER = re.compile(r"\[dyntra_lb\] requests_by_rank \(DP Workload Status\):")
_MOD_HEADER = re.compile(r"\[dyntra_lb\] modifications:")
_SEPARATOR = re.compile(r"^\s*={20,}\s*$")
_ROWISH = re.compile(r"^\s*DP\d+\s*\|")
_TABLE_LINE = re.compile(r"^\s*(?:={20,}\s*$|DP\d+\s*\||\[dyntra_lb\] (?:requests_by_rank|modif))")
_REQ_ROW = re.compile(
    r"^\s*DP(\d+) \| Run\((\d+)\): \[([^\]]*)\]\s* \| Wait\((\d+)\): \[([^\]]*)\]\s*$"
)
_MOD_ROW = re.compile(
    r"^\s*DP(\d+) \| Out: \[([^\]]*)\]\s* \| In: \[([^\]]*)\]\s* \| Freeze: (True|False)\s*$"
)
_STEP = re.compile(r"_has_global_unfinished_reqs \| step_counter: (-?\d+)")
_WAVE = re.compile(r"\[dyntra_lb\] run_busy_loop\(\) \| .*current_wave incremented to (\d+)")
_ACTIVATION = re.compile(
    r"\[dyntra_lb\] Dynamic LB (?:enabled by long request: .*|disabled after .*: )"
    r"current_wave=(\d+), step_counter=(\d+)"
)
_CONFIG = re.compile(r"\[dyntra_lb\] dyntra_lb_config\.(\w+) = (.*?)\s*$")
# vLLM does not print max_num_seqs in its "Initializing a V1 LLM engine ... with config:"
# line; it shows up in `vllm serve`'s "non-default args: {..., 'max_num_seqs': 16, ...}",
# in a command line echoed into the log, or in JSON dumps of the config.
_MAX_NUM_SEQS = re.compile(
    r"""(?:['"]?max_num_seqs['"]?\s*[=:]\s*|--max-num-seqs[= ])(\d+)"""
)


def _parse_items(text: str) -> list[int]:
    text = text.strip()
    return [int(v) for v in text.split(",")] if text else []


# --- scanning ------------------------------------------------------------------------


@dataclass
class LogWarning:
    line: int
    message: str

    def to_dict(self) -> dict:
        return {"line": self.line, "message": self.message}


@dataclass
class Snapshot:
    """One logged all-gather: the rebuilt ``requests_by_rank`` and the logged plans.

    ``step`` is the ``step_counter`` the planner ran at (the value vLLM's step counter had
    after its increment, the one compared with start_step/end_step): the step-counter line printed
    just before the table shows one less, because it is logged before the increment.
    ``problem`` says why the snapshot cannot be compared (None when it can)."""

    index: int
    line: int
    stream: str
    wave: int | None
    step: int | None
    requests_by_rank: list[tuple[list[int], int]] | None
    logged_plans: list[dict] | None = None
    threshold: float | None = None
    threshold_line: int | None = None
    max_num_seqs: int | None = None
    max_num_seqs_line: int | None = None
    problem: str | None = None


@dataclass
class _Table:
    kind: str  # "requests" | "modifications"
    line: int
    rows: list = field(default_factory=list)
    broken: str | None = None


@dataclass
class _Stream:
    step: int | None = None
    wave: int | None = None
    config: dict = field(default_factory=dict)  # key -> (value text, line)
    table: _Table | None = None
    awaiting_plans: Snapshot | None = None
    dropped_requests: bool = False  # the last requests table was unusable (already warned)


@dataclass
class LogScan:
    path: str
    num_lines: int
    snapshots: list[Snapshot]
    warnings: list[LogWarning]
    streams: list[str]
    config: dict  # the last DyntraLB config seen in the log: key -> value text


class _Scanner:
    """Feeds cleaned lines through one small state machine per stream."""

    def __init__(self) -> None:
        self.streams: dict[str, _Stream] = {}
        self.snapshots: list[Snapshot] = []
        self.warnings: list[LogWarning] = []
        self.last_config: dict = {}
        self.max_num_seqs: tuple[int, int] | None = None  # (value, line)
        self.any_stream = _Stream()  # context from every stream, for streams with none
        self.previous_stream = ""
        self.lineno = 0

    def warn(self, message: str, line: int | None = None) -> None:
        self.warnings.append(LogWarning(self.lineno if line is None else line, message))

    def feed(self, raw: str) -> None:
        self.lineno += 1
        stream_name, msg = clean_line(raw)
        if not stream_name and _TABLE_LINE.match(msg):
            # An untagged table line right after a tagged line continues that process's
            # multi-line message (a table logged with one call through a formatter that
            # prefixes only the first line, as the emulator's per-rank logs do).
            stream_name = self.previous_stream
        self.previous_stream = stream_name
        st = self.streams.setdefault(stream_name, _Stream())
        if _SEPARATOR.match(msg):
            self._separator(st)
        elif _ROWISH.match(msg):
            self._row(st, msg)
        elif _REQ_HEADER.search(msg):
            self._requests_header(st, stream_name)
        elif _MOD_HEADER.search(msg):
            self._modifications_header(st)
        else:
            self._context(st, msg)

    # tables

    def _close_table(self, st: _Stream, reason: str | None) -> None:
        """Finish the open table; ``reason`` (when not None) says why it is incomplete."""
        table, st.table = st.table, None
        if table is None:
            return
        if reason is not None and table.broken is None:
            table.broken = reason
            self.warn(f"{table.kind} table starting at line {table.line}: {reason}", table.line)
        if table.kind == "requests":
            snap = st.awaiting_plans
            if table.broken is None and not table.rows:
                table.broken = "the table has no rows"
                self.warn(f"requests table starting at line {table.line} has no rows",
                          table.line)
            if table.broken is None:
                snap.requests_by_rank = list(table.rows)
            else:
                snap.problem = f"requests table unusable: {table.broken}"
                st.awaiting_plans = None
                st.dropped_requests = True
            return
        snap, st.awaiting_plans = st.awaiting_plans, None
        if snap is None:
            return
        if table.broken is not None:
            snap.problem = f"modifications table unusable: {table.broken}"
        elif len(table.rows) != len(snap.requests_by_rank):
            snap.problem = (f"modifications table at line {table.line} has "
                            f"{len(table.rows)} row(s), the requests table "
                            f"{len(snap.requests_by_rank)}")
            self.warn(snap.problem, table.line)
        else:
            snap.logged_plans = list(table.rows)

    def _drop_waiting_snapshot(self, st: _Stream) -> None:
        snap, st.awaiting_plans = st.awaiting_plans, None
        if snap is not None and snap.problem is None:
            snap.problem = "no modifications table follows the requests table"
            self.warn(f"requests table at line {snap.line} is not followed by a "
                      f"modifications table", snap.line)

    def _requests_header(self, st: _Stream, stream_name: str) -> None:
        st.dropped_requests = False
        if st.table is not None:
            self._close_table(st, f"cut off by a new requests table at line {self.lineno}")
        self._drop_waiting_snapshot(st)
        threshold, threshold_line = self._config_value(st, "bubble_threshold")
        # A stream's own step/wave lines win; a table in a stream without any (say, step
        # lines untagged and tables tagged) takes the latest from the whole log.
        ctx = st if st.step is not None or st.wave is not None else self.any_stream
        snap = Snapshot(
            index=len(self.snapshots), line=self.lineno, stream=stream_name, wave=ctx.wave,
            step=ctx.step, requests_by_rank=None, threshold=threshold,
            threshold_line=threshold_line,
        )
        if self.max_num_seqs is not None:
            snap.max_num_seqs, snap.max_num_seqs_line = self.max_num_seqs
        self.snapshots.append(snap)
        st.awaiting_plans = snap
        st.table = _Table("requests", self.lineno)

    def _modifications_header(self, st: _Stream) -> None:
        if st.table is not None:
            if st.table.kind == "requests" and st.table.rows and st.table.broken is None:
                self.warn(f"requests table starting at line {st.table.line} has no closing "
                          f"line; taking its {len(st.table.rows)} rows")
                self._close_table(st, None)
            else:
                self._close_table(st, f"cut off by a modifications table at line "
                                      f"{self.lineno}")
        dropped, st.dropped_requests = st.dropped_requests, False
        if st.awaiting_plans is None:
            if not dropped:
                self.warn("modifications table without a requests table before it; ignored")
            st.table = _Table("modifications", self.lineno, broken="no usable requests table")
            return
        st.table = _Table("modifications", self.lineno)

    def _separator(self, st: _Stream) -> None:
        if st.table is None:
            return  # the opening line of a table
        if not st.table.rows and st.table.broken is None:
            self._close_table(st, f"separator at line {self.lineno} before any row")
        else:
            self._close_table(st, None)

    def _row(self, st: _Stream, msg: str) -> None:
        table = st.table
        if table is None:
            self.warn(f"table row outside a table: {msg.strip()!r}")
            return
        if table.broken is not None:
            return
        pattern = _REQ_ROW if table.kind == "requests" else _MOD_ROW
        m = pattern.match(msg)
        row = None
        if m:
            try:
                row = self._row_value(table.kind, m)
            except ValueError:
                row = None
        if row is None:
            table.broken = f"unreadable row at line {self.lineno}"
            self.warn(f"unreadable {table.kind} row: {msg.strip()!r}")
            return
        rank, value = row
        if rank != len(table.rows):
            table.broken = f"row DP{rank} at line {self.lineno}, expected DP{len(table.rows)}"
            self.warn(f"{table.kind} table starting at line {table.line}: {table.broken}")
            return
        table.rows.append(value)

    @staticmethod
    def _row_value(kind: str, m: re.Match) -> tuple[int, object]:
        if kind == "requests":
            run, wait = _parse_items(m.group(3)), _parse_items(m.group(5))
            if len(run) != int(m.group(2)) or len(wait) != int(m.group(4)):
                raise ValueError("count does not match the items")
            return int(m.group(1)), (run + wait, len(run))
        plan = {"out_blk": _parse_items(m.group(2)), "in_blk": _parse_items(m.group(3)),
                "freeze": m.group(4) == "True"}
        return int(m.group(1)), plan

    # context lines

    def _config_value(self, st: _Stream, key: str) -> tuple[float | None, int | None]:
        entry = st.config.get(key) or self.last_config.get(key)
        if entry is None:
            return None, None
        text, line = entry
        try:
            return float(text), line
        except ValueError:
            return None, None

    def _context(self, st: _Stream, msg: str) -> None:
        if m := _STEP.search(msg):
            st.step = self.any_stream.step = int(m.group(1)) + 1
        elif m := _WAVE.search(msg):
            st.wave, st.step = int(m.group(1)), 0
            self.any_stream.wave, self.any_stream.step = st.wave, 0
        elif m := _ACTIVATION.search(msg):
            st.wave, st.step = int(m.group(1)), int(m.group(2))
            self.any_stream.wave, self.any_stream.step = st.wave, st.step
        elif m := _CONFIG.search(msg):
            key, text = m.group(1), m.group(2)
            if key == "enabled":
                # printed once at DP init: the engine starts in wave 0 (vLLM's current_wave)
                st.wave = self.any_stream.wave = 0
            st.config[key] = (text, self.lineno)
            self.last_config[key] = (text, self.lineno)
            if key == "bubble_threshold":
                try:
                    float(text)
                except ValueError:
                    self.warn(f"unreadable bubble_threshold {text!r}")
        elif m := _MAX_NUM_SEQS.search(msg):
            value = int(m.group(1))
            if self.max_num_seqs is not None and self.max_num_seqs[0] != value:
                self.warn(f"max_num_seqs={value} differs from {self.max_num_seqs[0]} "
                          f"(line {self.max_num_seqs[1]}); using {value} from here on")
            self.max_num_seqs = (value, self.lineno)

    def finish(self) -> None:
        for st in self.streams.values():
            if st.table is not None:
                if st.table.broken is not None:
                    self.warn(f"the log ends inside the {st.table.kind} table starting at "
                              f"line {st.table.line}", self.lineno)
                self._close_table(st, "the log ends inside the table")
            self._drop_waiting_snapshot(st)


def scan_lines(lines: Iterable[str], path: str = "<log>") -> LogScan:
    """Scan log lines (str, newline optional) into snapshots and warnings."""
    scanner = _Scanner()
    for raw in lines:
        scanner.feed(raw)
    scanner.finish()
    return LogScan(
        path=path, num_lines=scanner.lineno, snapshots=scanner.snapshots,
        warnings=sorted(scanner.warnings, key=lambda w: w.line),
        streams=[s for s in scanner.streams if s],
        config={k: v for k, (v, _) in scanner.last_config.items()},
    )


def read_log(path: str | Path) -> LogScan:
    """Scan a log file. Lines are split on ``\\n`` only (so line numbers match an
    editor's) and decoded as UTF-8 with undecodable bytes replaced. Raises OSError."""
    with open(path, "rb") as f:
        return scan_lines((raw.decode("utf-8", errors="replace") for raw in f), str(path))
