"""The plots of ``dyntra-emu replay --plot``: per-rank load before and after each plan
of a ``emu.offline.replay.ReplayReport``.

Drawn with pyplot on the Agg backend, chosen when the plots are written, so that
importing this module changes nothing in the caller's matplotlib.
"""

from __future__ import annotations

import math
from pathlib import Path

from emu.offline.replay import loads, loads_after, or_dash

# Per-snapshot bar charts `write_replay_plots` writes besides overview.png.
MAX_SNAPSHOT_PLOTS = 200


def write_replay_plots(report, directory: str | Path) -> list[Path]:
    """PNG plots of per-rank load before and after each plan: ``overview.png`` (all
    snapshots) and one bar chart per snapshot (the first ``MAX_SNAPSHOT_PLOTS`` plus
    every mismatch) of a ``emu.offline.replay.ReplayReport``. Returns the files written."""
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
        ax.set_title(f"snapshot {snap.index} (line {snap.line}, wave {or_dash(snap.wave)}, "
                     f"step {or_dash(snap.step)}): {r.status.replace('_', ' ')}")
        ax.legend(fontsize="small")
        ax.grid(axis="y", alpha=0.3)
        path = directory / f"snapshot_{snap.index:05d}.png"
        fig.savefig(path, dpi=80)
        written.append(path)
    plt.close(fig)
    return written

