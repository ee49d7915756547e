"""`dyntra-emu replay LOG`: re-run the planner on every snapshot a diagnostics log shows.

Used offline, after a run with DyntraLB diagnostics on (static mode and
``enable_diagnostics``), on a log written by the emulator or by a vllm-ascend decode
node. Rank 0 prints, for every all-gather, the gathered snapshot (docs/diagnostics.md, the
``requests_by_rank`` table) and the plan it made (the ``modifications`` table).
This module rebuilds each snapshot, runs ``dyntra_lb.planner.front.balance_load`` on it with
the logged config, and reports which plans this checkout's planner reproduces exactly.

The log is read by ``emu.offline.logscan``; the plots of ``--plot`` are
``emu.offline.replay_plots``; the command is ``emu.cli.replay``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from dyntra_lb.config import DyntraLBConfig
from dyntra_lb.planner import registry as planners
from emu.offline.logscan import LogScan, LogWarning, Snapshot

DEFAULT_THRESHOLD = DyntraLBConfig.bubble_threshold

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
    payload holds at most ``2 * max_num_seqs`` entries (docs/protocol.md, "The payload")."""
    low = 0
    for s in snapshots:
        for blks, split in s.requests_by_rank or ():
            low = max(low, split, (len(blks) + 1) // 2)
    return low


def run_planner(requests_by_rank, *, threshold, max_num_seqs, observer=None,
                planner: str = planners.REFERENCE) -> list[dict]:
    """Planner ``planner`` of ``dyntra_lb.planner.registry`` (default: the reference, production's)
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
    """Re-plan every usable snapshot with ``planner`` (``dyntra_lb.planner.registry``; another
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
                f"skips the planner's fill step (docs/planner.md, Fill step), so plans that "
                f"admit waiting requests into free running slots will not reproduce. The "
                f"snapshots need max_num_seqs >= {snapshot_bounds(missing)}; pass "
                f"--max-num-seqs")

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


def or_dash(value) -> str:
    """A field of the report that may be missing from the log, "-" when it is."""
    return "-" if value is None else str(value)


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
            rows.append((str(snap.index), str(snap.line), snap.stream or "-", or_dash(snap.wave),
                         or_dash(snap.step), before, after, result))
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
        out.append(f"MISMATCH snapshot {snap.index} at line {snap.line}: "
                   f"wave {or_dash(snap.wave)}, step {or_dash(snap.step)}, "
                   f"threshold {r.threshold}, "
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
