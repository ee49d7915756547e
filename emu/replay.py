"""`dyntra-emu replay LOG`: re-run the planner on every snapshot a diagnostics log shows.

Used offline, after a run with DyntraLB diagnostics on (static mode and
``enable_diagnostics``), on a log written by the emulator or by a vllm-ascend decode
node. Rank 0 prints, for every all-gather, the gathered snapshot (spec F.7, the
``requests_by_rank`` table) and the plan it made (F.8, the ``modifications`` table).
This module rebuilds each snapshot, runs ``dyntra_lb.planner.balance_load`` on it with
the logged config, and reports which plans this checkout's planner reproduces exactly.

Log lines may carry vLLM's decorations, which are stripped before matching: ANSI
colours, a process tag such as ``(EngineCore_DP0 pid=12345)`` (lines are grouped into
streams by that tag, so ranks writing into one file are told apart), and the logger
prefix ``INFO 11-29 09:31:02 [file.py:123]`` (or the indentation vLLM puts in its place
on continuation lines of a multi-line message). Anything that is not a DyntraLB line is
ignored; a DyntraLB table that is cut off or has a row that does not parse is reported
as a warning with its line number, and that snapshot is left out of the comparison.

Reconstruction (spec F.7 against C and D.2): a row ``Run(n): [...]`` lists
``blks[:split]`` and ``Wait(m): [...]`` lists the *positive* entries of ``blks[split:]``,
so the snapshot is rebuilt as ``(run + wait, n)``. The trailing zero padding is dropped,
which does not change the plan. What cannot be rebuilt is a zero block count inside the
waiting part: the planner stops at the first 0 (D.2) while the table hides zeros and
still lists the values after it. A request always has at least one token, so a real
payload never holds such a zero; a log that did would replay as a mismatch.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from dyntra_lb import planners
from emu.run_status import unfinished_note

DEFAULT_THRESHOLD = 5.0  # DyntraLBConfig.bubble_threshold default (spec A.2)
MAX_SNAPSHOT_PLOTS = 200  # per-snapshot bar charts written besides overview.png

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


# --- the DyntraLB lines (spec F) ---------------------------------------------------

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
    after its increment, the one compared with start_step/end_step): the F.3 line printed
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


# --- replay ----------------------------------------------------------------------------


@dataclass
class Replayed:
    snapshot: Snapshot
    threshold: float | None = None
    max_num_seqs: int | None = None
    recomputed: list[dict] | None = None
    status: str = "not_compared"  # reproduced | mismatch | not_compared | error
    detail: str | None = None

    @property
    def mismatched_ranks(self) -> list[int]:
        if self.status != "mismatch":
            return []
        pairs = zip(self.snapshot.logged_plans, self.recomputed, strict=True)
        return [rank for rank, (logged, mine) in enumerate(pairs) if logged != mine]

    def to_dict(self) -> dict:
        s = self.snapshot
        return {
            "index": s.index, "line": s.line, "stream": s.stream, "wave": s.wave,
            "step": s.step,
            "requests_by_rank": (None if s.requests_by_rank is None
                                 else [[list(b), n] for b, n in s.requests_by_rank]),
            "threshold": self.threshold, "max_num_seqs": self.max_num_seqs,
            "logged_plans": s.logged_plans, "recomputed_plans": self.recomputed,
            "status": self.status, "detail": self.detail or s.problem,
            "mismatched_ranks": self.mismatched_ranks,
        }


@dataclass
class ReplayReport:
    scan: LogScan
    results: list[Replayed]
    settings: list[str]  # where threshold / max_num_seqs came from
    assumptions: list[str]  # flagged guesses that may explain mismatches
    warnings: list[LogWarning]

    def count(self, status: str) -> int:
        return sum(1 for r in self.results if r.status == status)

    def summary(self) -> dict:
        reproduced, mismatched = self.count("reproduced"), self.count("mismatch")
        return {"snapshots": len(self.results), "compared": reproduced + mismatched,
                "reproduced": reproduced, "mismatched": mismatched,
                "not_compared": len(self.results) - reproduced - mismatched}

    def to_dict(self) -> dict:
        return {
            "log": self.scan.path, "lines": self.scan.num_lines, "streams": self.scan.streams,
            "logged_config": self.scan.config, "settings": self.settings,
            "assumptions": self.assumptions, "summary": self.summary(),
            "warnings": [w.to_dict() for w in self.warnings],
            "snapshots": [r.to_dict() for r in self.results],
        }


def snapshot_bounds(snapshots: Iterable[Snapshot]) -> int:
    """Smallest max_num_seqs the logged snapshots allow: running never exceeds it and a
    payload holds at most ``2 * max_num_seqs`` entries (spec C)."""
    low = 0
    for s in snapshots:
        for blks, split in s.requests_by_rank or ():
            low = max(low, split, (len(blks) + 1) // 2)
    return low


def run_planner(requests_by_rank, *, threshold, max_num_seqs, observer=None,
                planner: str = planners.REFERENCE) -> list[dict]:
    """Planner ``planner`` of ``dyntra_lb.planners`` (default: the reference, production's)
    on a rebuilt snapshot, one plan dict per rank."""
    plans = planners.get(planner)(requests_by_rank, len(requests_by_rank),
                                  max_num_seqs=max_num_seqs, threshold=threshold,
                                  observer=observer)
    return [p.to_dict() for p in plans]


def _sources(name: str, values: list[tuple]) -> list[str]:
    """One "name=value (log line N, and K more)" entry per distinct value in the log."""
    lines: dict = {}
    for value, line in values:
        if value is not None:
            lines.setdefault(value, set()).add(line)
    out = []
    for value, where in lines.items():
        more = f" and {len(where) - 1} more" if len(where) > 1 else ""
        out.append(f"{name}={value} (log line {min(where)}{more})")
    return out


def replay(scan: LogScan, *, threshold: float | None = None,
           max_num_seqs: int | None = None, planner: str = planners.REFERENCE) -> ReplayReport:
    """Re-plan every usable snapshot with ``planner`` (``dyntra_lb.planners``; another
    than the reference shows which logged plans it would change). ``threshold`` /
    ``max_num_seqs`` override what the log says; without either, the log's values are
    used, else the defaults below (and the guess is listed in ``assumptions``)."""
    snaps = scan.snapshots
    warnings = list(scan.warnings)
    settings, assumptions = [], []
    if planner != planners.REFERENCE:
        settings.append(f"planner={planner} (--planner)")
    usable = [s for s in snaps if s.requests_by_rank is not None]

    if threshold is not None:
        settings.append(f"bubble_threshold={threshold} (--threshold)")
    else:
        settings += _sources("bubble_threshold", [(s.threshold, s.threshold_line)
                                                  for s in usable])
        if any(s.threshold is None for s in usable):
            assumptions.append(
                f"no dyntra_lb_config.bubble_threshold line precedes "
                f"{sum(s.threshold is None for s in usable)} snapshot(s): replayed them "
                f"with the default {DEFAULT_THRESHOLD}; pass --threshold if that is wrong")

    if max_num_seqs is not None:
        settings.append(f"max_num_seqs={max_num_seqs} (--max-num-seqs)")
    else:
        settings += _sources("max_num_seqs", [(s.max_num_seqs, s.max_num_seqs_line)
                                              for s in usable])
        missing = [s for s in usable if s.max_num_seqs is None]
        if missing:
            assumptions.append(
                f"max_num_seqs is not in the log (DyntraLB does not print it) for "
                f"{len(missing)} snapshot(s): replayed them with max_num_seqs=None, which "
                f"skips the planner's fill step (spec D.4), so plans that admit waiting "
                f"requests into free running slots will not reproduce. The snapshots need "
                f"max_num_seqs >= {snapshot_bounds(missing)}; pass --max-num-seqs")

    results = []
    for s in snaps:
        r = Replayed(s)
        results.append(r)
        if s.requests_by_rank is None:
            r.detail = s.problem
            continue
        r.threshold = threshold if threshold is not None else (
            s.threshold if s.threshold is not None else DEFAULT_THRESHOLD)
        r.max_num_seqs = max_num_seqs if max_num_seqs is not None else s.max_num_seqs
        if r.max_num_seqs is not None:
            for rank, (blks, split) in enumerate(s.requests_by_rank):
                if split > r.max_num_seqs or len(blks) > 2 * r.max_num_seqs:
                    warnings.append(LogWarning(
                        s.line, f"snapshot {s.index} DP{rank} has {split} running and "
                                f"{len(blks) - split} waiting entries, more than "
                                f"max_num_seqs={r.max_num_seqs} allows"))
        try:
            r.recomputed = run_planner(s.requests_by_rank, threshold=r.threshold,
                                       max_num_seqs=r.max_num_seqs, planner=planner)
        except Exception as exc:  # a garbled snapshot must not end the whole replay
            r.status, r.detail = "error", f"planner failed: {exc!r}"
            continue
        if s.logged_plans is None:
            r.detail = s.problem
        elif s.logged_plans == r.recomputed:
            r.status = "reproduced"
        else:
            r.status = "mismatch"
    warnings.sort(key=lambda w: w.line)
    return ReplayReport(scan, results, settings, assumptions, warnings)


# --- output ----------------------------------------------------------------------------


def format_plan(plan: dict | None) -> str:
    if plan is None:
        return "-"
    return (f"out={list(plan['out_blk'])} in={list(plan['in_blk'])} "
            f"freeze={plan['freeze']}")


def loads(requests_by_rank) -> list[int]:
    """Running blocks per rank (what the planner balances, before the plan)."""
    return [sum(blks[:split]) for blks, split in requests_by_rank]


def loads_after(requests_by_rank, plans) -> list[int]:
    """Running blocks per rank once the plan is applied: minus outs, plus ins."""
    return [load - sum(p["out_blk"]) + sum(p["in_blk"])
            for load, p in zip(loads(requests_by_rank), plans, strict=True)]


def _fmt(v) -> str:
    return "-" if v is None else str(v)


def format_report(report: ReplayReport) -> str:
    scan, out = report.scan, []
    streams = f", streams: {', '.join(scan.streams)}" if scan.streams else ""
    out.append(f"replay of {scan.path}: {scan.num_lines} lines{streams}")
    if report.settings:
        out.append("settings: " + "; ".join(report.settings))
    for a in report.assumptions:
        out.append(f"ASSUMPTION: {a}")
    s = report.summary()
    pct = f" ({100.0 * s['reproduced'] / s['compared']:.1f}%)" if s["compared"] else ""
    out.append(f"snapshots: {s['snapshots']}  compared: {s['compared']}  "
               f"reproduced: {s['reproduced']}{pct}  mismatched: {s['mismatched']}  "
               f"not compared: {s['not_compared']}")
    if report.results:
        rows = [("#", "line", "stream", "wave", "step", "load before", "load after (logged)",
                 "result")]
        for r in report.results:
            snap = r.snapshot
            before = after = "-"
            if snap.requests_by_rank is not None:
                before = "/".join(map(str, loads(snap.requests_by_rank)))
                if snap.logged_plans is not None:
                    after = "/".join(map(str, loads_after(snap.requests_by_rank,
                                                          snap.logged_plans)))
            result = r.status.replace("_", " ")
            if r.detail:
                result += f": {r.detail}"
            rows.append((str(snap.index), str(snap.line), snap.stream or "-", _fmt(snap.wave),
                         _fmt(snap.step), before, after, result))
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
        out.append("")
        for row in rows:
            cells = [c.ljust(w) for c, w in zip(row[:-1], widths, strict=True)]
            out.append("  ".join([*cells, row[-1]]))
    for r in report.results:
        if r.status != "mismatch":
            continue
        snap = r.snapshot
        out.append("")
        out.append(f"MISMATCH snapshot {snap.index} at line {snap.line}: wave {_fmt(snap.wave)}, "
                   f"step {_fmt(snap.step)}, threshold {r.threshold}, "
                   f"max_num_seqs {r.max_num_seqs}")
        for rank, (blks, split) in enumerate(snap.requests_by_rank):
            mark = "  <-- differs" if rank in r.mismatched_ranks else ""
            out.append(f"  DP{rank} run={blks[:split]} wait={blks[split:]}")
            out.append(f"      logged     {format_plan(snap.logged_plans[rank])}{mark}")
            out.append(f"      recomputed {format_plan(r.recomputed[rank])}")
    if report.warnings:
        out.append("")
        out.append(f"warnings ({len(report.warnings)}):")
        out.extend(f"  line {w.line}: {w.message}" for w in report.warnings)
    return "\n".join(out)


def write_plots(report: ReplayReport, directory: str | Path) -> list[Path]:
    """PNG plots of per-rank load before and after each plan: ``overview.png`` (all
    snapshots) and one bar chart per snapshot (the first ``MAX_SNAPSHOT_PLOTS`` plus
    every mismatch). Returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    done = [r for r in report.results
            if r.snapshot.requests_by_rank is not None and r.recomputed is not None]
    written = []
    if not done:
        return written

    dp = max(len(r.snapshot.requests_by_rank) for r in done)
    xs = [r.snapshot.index for r in done]
    fig, (ax_before, ax_after) = plt.subplots(2, 1, sharex=True, figsize=(10, 7))
    marker = "o" if len(done) <= 50 else None
    for rank in range(dp):
        before, after = [], []
        for r in done:
            snap = r.snapshot
            plans = snap.logged_plans if snap.logged_plans is not None else r.recomputed
            b = loads(snap.requests_by_rank)
            a = loads_after(snap.requests_by_rank, plans)
            before.append(b[rank] if rank < len(b) else math.nan)
            after.append(a[rank] if rank < len(a) else math.nan)
        ax_before.plot(xs, before, marker=marker, label=f"DP{rank}")
        ax_after.plot(xs, after, marker=marker, label=f"DP{rank}")
    for r in done:
        if r.status == "mismatch":
            for ax in (ax_before, ax_after):
                ax.axvline(r.snapshot.index, color="red", alpha=0.3, linewidth=1)
    ax_before.set_title("before the plan (running totals in the snapshot)")
    ax_after.set_title("after the plan (running - out + in; logged plan, red lines = mismatch)")
    for ax in (ax_before, ax_after):
        ax.set_ylabel("running KV blocks")
        ax.legend(loc="upper right", fontsize="small", ncol=min(dp, 4))
        ax.grid(alpha=0.3)
    ax_after.set_xlabel("snapshot index")
    fig.suptitle(f"DyntraLB replay of {Path(report.scan.path).name}: per-rank load")
    fig.tight_layout()
    path = directory / "overview.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    written.append(path)

    chosen = [r for r in done if r.snapshot.index < MAX_SNAPSHOT_PLOTS or r.status == "mismatch"]
    fig, ax = plt.subplots(figsize=(max(5, 1.2 * dp + 3), 4))
    fig.subplots_adjust(left=0.14, right=0.97, bottom=0.14, top=0.9)
    for r in chosen:
        snap = r.snapshot
        ranks = list(range(len(snap.requests_by_rank)))
        series = [("before", loads(snap.requests_by_rank))]
        if snap.logged_plans is not None:
            series.append(("after (logged plan)",
                           loads_after(snap.requests_by_rank, snap.logged_plans)))
        if snap.logged_plans is None or r.status == "mismatch":
            series.append(("after (recomputed plan)",
                           loads_after(snap.requests_by_rank, r.recomputed)))
        width = 0.8 / len(series)
        ax.clear()
        for i, (label, values) in enumerate(series):
            ax.bar([x + (i - (len(series) - 1) / 2) * width for x in ranks], values, width,
                   label=label)
        ax.set_xticks(ranks, [f"DP{x}" for x in ranks])
        ax.set_xlabel("DP rank")
        ax.set_ylabel("running KV blocks")
        ax.set_title(f"snapshot {snap.index} (line {snap.line}, wave {_fmt(snap.wave)}, "
                     f"step {_fmt(snap.step)}): {r.status.replace('_', ' ')}")
        ax.legend(fontsize="small")
        ax.grid(axis="y", alpha=0.3)
        path = directory / f"snapshot_{snap.index:05d}.png"
        fig.savefig(path, dpi=80)
        written.append(path)
    plt.close(fig)
    return written


# --- command line ------------------------------------------------------------------------


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def threshold_value(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def add_planner_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--planner", choices=planners.NAMES, default=planners.REFERENCE,
                        help="which of our planners to run (dyntra_lb/planners.py; "
                             "default: reference, production's algorithm)")
    parser.add_argument("--threshold", type=threshold_value, default=None,
                        help="bubble_threshold for the planner (default: the log's "
                             "dyntra_lb_config.bubble_threshold line, else 5.0)")
    parser.add_argument("--max-num-seqs", type=positive_int, default=None,
                        help="vLLM max_num_seqs (drives the planner's fill step; default: "
                             "taken from a vLLM line in the log such as 'non-default "
                             "args: {...}', else unset)")


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("log", help="log file with DyntraLB diagnostics lines")
    add_planner_options(parser)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--plot", metavar="DIR", default=None,
                        help="write PNG plots of per-rank load before/after each plan to DIR")


def emit(text: str) -> None:
    """Print a report; a reader that closes the pipe early (``| head``) is not an error."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def run(args: argparse.Namespace) -> int:
    """Exit code: 0 when every compared plan is reproduced, 1 on any mismatch or planner
    error, 2 when the log cannot be read."""
    try:
        scan = read_log(args.log)
    except OSError as exc:
        print(f"dyntra-emu replay: cannot read {args.log}: {exc.strerror or exc}",
              file=sys.stderr)
        return 2
    note = unfinished_note(args.log)
    if note is not None:
        print(f"dyntra-emu replay: {note}", file=sys.stderr)
    report = replay(scan, threshold=args.threshold, max_num_seqs=args.max_num_seqs,
                    planner=args.planner)
    emit(json.dumps(report.to_dict(), indent=1) if args.json else format_report(report))
    if args.plot:
        try:
            files = write_plots(report, args.plot)
        except OSError as exc:
            print(f"dyntra-emu replay: cannot write plots to {args.plot}: {exc}",
                  file=sys.stderr)
            return 2
        print(f"wrote {len(files)} plot(s) to {args.plot}", file=sys.stderr)
    return 1 if report.count("mismatch") or report.count("error") else 0


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``replay`` on the ``dyntra-emu`` sub-command parser."""
    parser = subparsers.add_parser(
        "replay", help="re-run the planner on every snapshot in a diagnostics log",
        description=__doc__.split("\n\n")[0])
    configure_parser(parser)
    parser.set_defaults(func=run)
    return parser


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m emu.replay",
                                     description=__doc__.split("\n\n")[0])
    configure_parser(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
