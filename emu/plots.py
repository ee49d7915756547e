"""The PNG plots of a run and of an A/B: per-rank load, DP bubble, TPOT distribution.
Called by the CLI once the ranks have exited, on the loaded ``emu.metrics.Run``: the
per-step lines come downsampled from the metrics' pass over the steps
(``emu.metrics.step_series``, emu/lines.py), so a plot of hours holds no more points
than one of minutes.

Plots are drawn on bare matplotlib ``Figure`` objects (Agg rendering, no pyplot state),
so they work headless and never touch the caller's backend.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from emu.lines import BUBBLE_WINDOW
from emu.metrics import Run, bubble_ratio, step_series, tpot_values_ms

_RUN_COLOURS = ("tab:blue", "tab:orange")
# Legends of line plots sit right of the axes, where they never hide data.
_OUTSIDE = dict(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")


def write_plots(run: Run, out_dir) -> list[Path]:
    """load.png, bubble.png and tpot.png of one run into `out_dir`."""
    out_dir = Path(out_dir)
    paths = [out_dir / "load.png", out_dir / "bubble.png", out_dir / "tpot.png"]
    plot_load(run, paths[0])
    plot_bubble(run, paths[1])
    plot_tpot(run, paths[2])
    return paths


def write_ab_plots(run_a: Run, run_b: Run, labels, out_dir) -> list[Path]:
    """load_ab.png, bubble_ab.png and tpot_ab.png overlaying two runs into `out_dir`."""
    out_dir = Path(out_dir)
    paths = [out_dir / "load_ab.png", out_dir / "bubble_ab.png", out_dir / "tpot_ab.png"]
    plot_load_ab(run_a, run_b, labels, paths[0])
    plot_bubble_ab(run_a, run_b, labels, paths[1])
    plot_tpot_ab(run_a, run_b, labels, paths[2])
    return paths


def plot_load(run: Run, path) -> None:
    """Per-rank running KV blocks per step; steps where a plan was applied shaded."""
    fig = Figure(figsize=(11, 4.8), layout="constrained")
    ax = fig.add_subplot()
    _draw_rank_loads(ax, run)
    ax.set_title("Per-rank load: KV blocks of running requests, per step")
    _legend(ax, **_OUTSIDE)
    fig.savefig(path, dpi=110)


def plot_bubble(run: Run, path) -> None:
    """DP bubble per step over virtual time: raw, smoothed, and the run's ratio."""
    s = step_series(run)
    fig = Figure(figsize=(11, 4.8), layout="constrained")
    ax = fig.add_subplot()
    ax.plot(*s.bubble, color="tab:gray", lw=0.6, alpha=0.45, label="per step")
    ax.plot(*s.bubble_smooth, color="tab:red", lw=1.8, label=f"mean of {BUBBLE_WINDOW} steps")
    ratio = bubble_ratio(run)
    if ratio is not None:
        ax.axhline(ratio * 100, color="black", ls="--", lw=1,
                   label=f"whole run: {ratio * 100:.1f} %")
    _label_bubble_axes(ax, "DP bubble: share of the step time ranks spend waiting for the "
                           "slowest rank")
    fig.savefig(path, dpi=110)


def plot_tpot(run: Run, path) -> None:
    """Histogram of per-request TPOT with p50 and p99 marked."""
    values = np.asarray(tpot_values_ms(run))
    fig = Figure(figsize=(8, 4.8), layout="constrained")
    ax = fig.add_subplot()
    if values.size:
        bins, log = _bins([values])
        ax.hist(values, bins=bins, color="tab:blue", alpha=0.8, edgecolor="white",
                linewidth=0.5)
        if log:
            _log_x(ax)
        for q, ls in ((50, "-"), (99, "--")):
            v = np.percentile(values, q)
            ax.axvline(v, color="black", ls=ls, lw=1, label=f"p{q} = {v:.1f} ms")
        _legend(ax, loc="upper right", fontsize="small")
    else:
        _no_data(ax)
    _label_tpot_axes(ax, f"TPOT per request ({values.size} requests with 2+ output tokens)")
    fig.savefig(path, dpi=110)


def plot_load_ab(run_a: Run, run_b: Run, labels, path) -> None:
    """Per-rank load of each run (same scales), and both runs' spread between the most
    and the least loaded rank on one axis."""
    fig = Figure(figsize=(11, 9.5), layout="constrained")
    axes = fig.subplots(3, 1, sharex=True)
    top = max(step_series(run).max_running_blocks for run in (run_a, run_b))
    for ax, run, label in zip(axes[:2], (run_a, run_b), labels, strict=True):
        _draw_rank_loads(ax, run)
        ax.set_title(f"{label}: KV blocks of running requests per rank")
        ax.set_ylim(0, top * 1.05 + 1)
        ax.set_xlabel("")
        _legend(ax, **_OUTSIDE)
    ax = axes[2]
    for run, label, colour in zip((run_a, run_b), labels, _RUN_COLOURS, strict=True):
        imbalance = step_series(run).imbalance
        if not len(imbalance[0]):
            continue
        ax.plot(*imbalance, color=colour, lw=0.9, label=label)
    ax.set_title("Imbalance: most loaded minus least loaded rank")
    ax.set_xlabel("step (lockstep iteration)")
    ax.set_ylabel("KV blocks")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    _legend(ax, **_OUTSIDE)
    fig.savefig(path, dpi=110)


def plot_bubble_ab(run_a: Run, run_b: Run, labels, path) -> None:
    """Smoothed DP bubble of both runs over virtual time, with each run's ratio."""
    fig = Figure(figsize=(11, 4.8), layout="constrained")
    ax = fig.add_subplot()
    for run, label, colour in zip((run_a, run_b), labels, _RUN_COLOURS, strict=True):
        ax.plot(*step_series(run).bubble_smooth, color=colour, lw=1.5,
                label=f"{label} (mean of {BUBBLE_WINDOW} steps)")
        ratio = bubble_ratio(run)
        if ratio is not None:
            ax.axhline(ratio * 100, color=colour, ls="--", lw=1,
                       label=f"{label} whole run: {ratio * 100:.1f} %")
    _label_bubble_axes(ax, "DP bubble over time")
    fig.savefig(path, dpi=110)


def plot_tpot_ab(run_a: Run, run_b: Run, labels, path) -> None:
    """Both runs' TPOT histograms on the same bins, with each run's p50 and p99."""
    values = [np.asarray(tpot_values_ms(run)) for run in (run_a, run_b)]
    fig = Figure(figsize=(8, 4.8), layout="constrained")
    ax = fig.add_subplot()
    if any(v.size for v in values):
        bins, log = _bins([v for v in values if v.size])
        if log:
            _log_x(ax)
        for v, label, colour in zip(values, labels, _RUN_COLOURS, strict=True):
            if not v.size:
                continue
            ax.hist(v, bins=bins, histtype="stepfilled", alpha=0.35, color=colour)
            ax.hist(v, bins=bins, histtype="step", lw=1.5, color=colour,
                    label=f"{label} ({v.size} requests)")
            for q, ls in ((50, "-"), (99, "--")):
                p = np.percentile(v, q)
                ax.axvline(p, color=colour, ls=ls, lw=1, label=f"{label} p{q} = {p:.1f} ms")
        _legend(ax, loc="upper right", fontsize="small")
    else:
        _no_data(ax)
    _label_tpot_axes(ax, "TPOT per request")
    fig.savefig(path, dpi=110)


def _label_bubble_axes(ax, title: str) -> None:
    """Title, labels, grid and legend of a bubble-over-virtual-time plot."""
    ax.set_title(title)
    ax.set_xlabel("virtual time (s)")
    ax.set_ylabel("bubble (% of DP step time)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    _legend(ax, **_OUTSIDE)


def _label_tpot_axes(ax, title: str) -> None:
    """Title, labels and grid of a TPOT histogram (its legend is placed by the caller)."""
    ax.set_title(title)
    ax.set_xlabel("TPOT (ms per output token after the first"
                  + (", log scale)" if ax.get_xscale() == "log" else ")"))
    ax.set_ylabel("requests")
    ax.grid(alpha=0.3)


def _draw_rank_loads(ax, run: Run) -> None:
    s = step_series(run)
    for rank, loads in enumerate(s.loads):
        ax.plot(*loads, lw=0.9, label=f"rank {rank}")
    for i, (start, stop) in enumerate(s.plan_spans):
        ax.axvspan(start - 0.5, stop + 0.5, color="tab:green", alpha=0.12, lw=0,
                   label="DyntraLB plan applied" if i == 0 else None)
    ax.set_xlabel("step (lockstep iteration)")
    ax.set_ylabel("running KV blocks")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)


def _bins(arrays) -> tuple[np.ndarray, bool]:
    """Shared histogram edges for `arrays`, and whether they are log-spaced: a tail more
    than 5x the median (paused or starved requests) would squeeze every other request
    into one bar on a linear axis."""
    joined = np.concatenate(arrays)
    lo, hi = float(joined.min()), float(joined.max())
    if lo > 0 and hi > 5 * float(np.median(joined)):
        return np.geomspace(lo, hi, 41), True
    return np.linspace(lo, hi if hi > lo else lo + 1.0, 41), False


def _log_x(ax) -> None:
    """Log x axis labelled 10, 20, 50, 100, ... in plain numbers."""
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())


def _legend(ax, **kwargs) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**kwargs)


def _no_data(ax) -> None:
    ax.text(0.5, 0.5, "no requests with two or more output tokens", ha="center",
            va="center", transform=ax.transAxes)
