"""The distribution of request block counts at a KV block size, and where DyntraLB's
thresholds fall on it: what ``dyntra-emu inspect`` prints and plots, so that a user can
set ``long_req_block_threshold`` and ``bubble_threshold`` to their own traffic, as the
DyntraLB feature guide asks.

A request's block count is ``ceil(tokens / block_size)`` (``dyntra_lb.blocks``): at
arrival its prompt's, which is what dynamic mode compares with
``long_req_block_threshold`` when the request is added (docs/protocol.md, "Dynamic
mode"); at its last token prompt plus output, the most a rank holds for it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dyntra_lb.blocks import num_blocks
from dyntra_lb.config import DyntraLBConfig
from emu.workload import TraceRequest

PERCENTILES = (50, 90, 99)
_BAR_WIDTH = 40


@dataclass(frozen=True)
class BlockCounts:
    """Each request's block count at ``block_size``: at arrival and at its last token."""

    block_size: int
    at_arrival: list[int]
    at_finish: list[int]

    @classmethod
    def of(cls, trace: Sequence[TraceRequest], block_size: int) -> BlockCounts:
        return cls(block_size,
                   [num_blocks(r.prompt_tokens, block_size) for r in trace],
                   [num_blocks(r.prompt_tokens + r.output_tokens, block_size) for r in trace])

    def arming(self, threshold: int) -> int:
        """Requests whose block count at arrival is above ``threshold``: each one, added
        on a rank, arms dynamic mode."""
        return sum(b > threshold for b in self.at_arrival)

    def at_most(self, blocks: float) -> int:
        """Requests that arrive with at most ``blocks`` blocks."""
        return sum(b <= blocks for b in self.at_arrival)


def report(counts: BlockCounts, lb: DyntraLBConfig) -> list[str]:
    """The printout: percentiles, a histogram with the thresholds marked, and what share
    of requests would arm dynamic mode."""
    n = len(counts.at_arrival)
    lines = [f"{n:,} requests, KV block size {counts.block_size} tokens",
             "",
             f"{'blocks per request':<22}" + "".join(f"{f'p{p}':>8}" for p in PERCENTILES)
             + f"{'max':>8}",
             _percentile_row("at arrival (prompt)", counts.at_arrival),
             _percentile_row("at finish (+ output)", counts.at_finish),
             "",
             "requests by block count at arrival:"]
    lines += _histogram(counts, lb)
    lines.append("")
    lines += threshold_notes(counts, lb)
    return lines


def threshold_notes(counts: BlockCounts, lb: DyntraLBConfig) -> list[str]:
    """Where long_req_block_threshold and bubble_threshold fall, in words."""
    n = len(counts.at_arrival)
    threshold = lb.long_req_block_threshold
    arming = counts.arming(threshold)
    mode = ("" if lb.mode == "dynamic" else
            f" (the config runs {lb.mode} mode, which never arms: this is what dynamic mode "
            "would see)")
    notes = [f"long_req_block_threshold = {threshold:,} blocks: {arming:,} of {n:,} requests "
             f"({_share(arming, n)}) arrive with more, and each would arm dynamic mode"
             f"{mode}; the threshold is at the {_rank(counts.at_most(threshold), n)} of "
             "the distribution"]
    bubble = lb.bubble_threshold
    if bubble >= 1:
        small = counts.at_most(bubble)
        notes.append(f"bubble_threshold = {bubble:g} blocks (absolute): the planner stops once "
                     "the fullest rank holds less than that above the ranks' mean; "
                     f"{small:,} of {n:,} requests ({_share(small, n)}) arrive with at most "
                     f"{bubble:g} blocks")
    else:
        notes.append(f"bubble_threshold = {bubble:g} (a ratio): the planner stops once "
                     "(fullest - mean) / fullest of the ranks' loads is below it; a ratio "
                     "of rank loads has no place on this per-request axis")
    return notes


def plot(counts: BlockCounts, lb: DyntraLBConfig, path: Path) -> None:
    """block_counts.png: both distributions on log axes (the few long requests that arm
    dynamic mode stay visible next to the many short ones), the thresholds marked."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    n = len(counts.at_arrival)
    threshold = lb.long_req_block_threshold
    top = max(max(counts.at_finish), threshold, lb.bubble_threshold) * 1.3
    bins = _log_bins(top)
    fig = Figure(figsize=(10, 5.5), layout="constrained")
    ax = fig.add_subplot()
    ax.hist(counts.at_arrival, bins=bins, color="tab:gray", alpha=0.8,
            label="at arrival (prompt): what arms dynamic mode")
    ax.hist(counts.at_finish, bins=bins, histtype="step", color="black", linewidth=1.5,
            label="at finish (prompt + output): the most a rank holds for it")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(0.5, top)
    ax.set_ylim(0.7, n * 2)
    plain = FuncFormatter(lambda value, _: f"{value:,.0f}")
    ax.xaxis.set_major_formatter(plain)
    ax.yaxis.set_major_formatter(plain)
    arming = counts.arming(threshold)
    ax.axvspan(threshold, top, color="tab:red", alpha=0.08)
    ax.axvline(threshold, color="tab:red", linestyle="--", linewidth=2,
               label=f"long_req_block_threshold = {threshold:,}: the {arming:,} requests "
                     f"({_share(arming, n)}) above it arm dynamic mode")
    if lb.bubble_threshold >= 1:
        small = counts.at_most(lb.bubble_threshold)
        ax.axvline(lb.bubble_threshold, color="tab:blue", linestyle=":", linewidth=2,
                   label=f"bubble_threshold = {lb.bubble_threshold:g} blocks: {small:,} "
                         f"requests ({_share(small, n)}) at or below it")
    ax.set_xlabel(f"KV blocks per request (block size {counts.block_size} tokens)")
    ax.set_ylabel("requests")
    ax.set_title(f"Request block counts: {n:,} requests at block size {counts.block_size} "
                 "(log scales)")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(0.0, -0.12), fontsize="small", ncols=2,
              frameon=False)
    fig.savefig(path, dpi=110)


def _percentile_row(name: str, values: list[int]) -> str:
    ordered = sorted(values)
    cells = [ordered[min(len(ordered) - 1, math.ceil(p / 100 * len(ordered)) - 1)]
             for p in PERCENTILES]
    return f"  {name:<20}" + "".join(f"{c:>8,}" for c in cells) + f"{ordered[-1]:>8,}"


def _histogram(counts: BlockCounts, lb: DyntraLBConfig) -> list[str]:
    """One bar per power of two of blocks at arrival, the bars holding a threshold
    marked."""
    top = max(counts.at_arrival)
    edges = [1]
    while edges[-1] <= top:
        edges.append(edges[-1] * 2)
    rows = [(lo, hi - 1, sum(lo <= b < hi for b in counts.at_arrival))
            for lo, hi in zip(edges, edges[1:], strict=False)]
    most = max(c for _, _, c in rows)
    lines = []
    for lo, hi, count in rows:
        bar = "#" * math.ceil(_BAR_WIDTH * count / most) if count else ""
        marks = []
        if lo <= lb.long_req_block_threshold <= hi:
            marks.append(f"long_req_block_threshold {lb.long_req_block_threshold:,}")
        if lb.bubble_threshold >= 1 and lo <= lb.bubble_threshold < hi + 1:
            marks.append(f"bubble_threshold {lb.bubble_threshold:g}")
        mark = f"  <- {', '.join(marks)}" if marks else ""
        span = f"{lo:,}" if lo == hi else f"{lo:,}-{hi:,}"
        lines.append(f"  {span:>13} {count:>8,} {bar:<{_BAR_WIDTH}}{mark}".rstrip())
    if lb.long_req_block_threshold > rows[-1][1]:
        lines.append(f"  (long_req_block_threshold {lb.long_req_block_threshold:,} is above "
                     f"every request: the largest has {top:,} blocks)")
    return lines


def _log_bins(top: float) -> list[float]:
    """Bin edges about eight per factor of ten from 1 block to ``top``, each halfway
    between two whole block counts, so that no bin falls between two counts."""
    steps = max(8, math.ceil(8 * math.log10(top)))
    counts = sorted({round(top ** (i / steps)) for i in range(steps + 1)})
    return [c - 0.5 for c in counts] + [counts[-1] + 0.5]


def _share(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f} %"


def _rank(below: int, whole: int) -> str:
    return f"p{100 * below / whole:.1f}"
