"""The study's outcome: its finished trials as rows, their Pareto front, the
recommendation, the front's table and its plot."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from emu.tune.objectives import OBJECTIVES, dominates, interval_text
from emu.tune.space import config_label


def trial_rows(study, objectives: Sequence[str]) -> list[dict]:
    """One row per finished trial (complete or pruned), in trial order: its knobs, state,
    seeds run and the estimate of each objective."""
    import optuna

    rows = []
    for trial in study.get_trials(deepcopy=False):
        if trial.state not in (optuna.trial.TrialState.COMPLETE,
                               optuna.trial.TrialState.PRUNED):
            continue
        estimates = trial.user_attrs.get("estimates", {})
        rows.append({"number": trial.number, "state": trial.state.name.lower(),
                     "values": trial.user_attrs.get("config", {}),
                     "seeds_run": len(trial.user_attrs.get("seeds", {})),
                     "same_as": trial.user_attrs.get("same_as"),
                     "estimates": {name: list(estimates[name]) for name in objectives
                                   if name in estimates}})
    return rows


def pareto_front(rows: list[dict], objectives: Sequence[str]) -> list[int]:
    """The complete trials no other complete trial dominates (on the means), by trial
    number; a trial that repeats an earlier one's config is left to the earlier one."""
    done = [r for r in rows if r["state"] == "complete" and r["same_as"] is None]
    means = {r["number"]: [r["estimates"][n][0] for n in objectives] for r in done}
    return [n for n, v in means.items()
            if not any(dominates(o, v, objectives) for m, o in means.items() if m != n)]


def recommend(rows: list[dict], front: list[int], objectives: Sequence[str],
              limits: Mapping[str, float], min_gain: float | None = None) -> dict | None:
    """The front's trial with the highest mean throughput gain, or the best by the first
    objective when throughput is not one, among those whose mean of each objective in
    ``limits`` is at most its limit (``--max-tpot-p99-ms``, ``--max-pause-ms``) and whose
    mean gain is at least ``min_gain`` % (``--min-gain``, when throughput is an
    objective); None when no trial qualifies: keep DyntraLB off."""
    gain_floor = min_gain if min_gain is not None and "throughput" in objectives else None
    candidates = [r for r in rows if r["number"] in front and
                  all(r["estimates"][name][0] <= limit for name, limit in limits.items())
                  and (gain_floor is None or r["estimates"]["throughput"][0] >= gain_floor)]
    if not candidates:
        return None
    name = "throughput" if "throughput" in objectives else objectives[0]
    sign = 1.0 if OBJECTIVES[name].maximize else -1.0
    return max(candidates, key=lambda r: (sign * r["estimates"][name][0], -r["number"]))


def front_table(rows: list[dict], front: list[int], objectives: Sequence[str],
                recommended: int | None) -> str:
    """The front as a Markdown table, best throughput first; * marks the recommendation."""
    header = ["trial", "config", *(f"{OBJECTIVES[n].label} ({OBJECTIVES[n].unit}), "
                                   "mean ± 95 % CI" for n in objectives), "seeds"]
    lines = ["| " + " | ".join(header) + " |", "|---|---|" + "---:|" * (len(header) - 2)]
    by_number = {r["number"]: r for r in rows}
    first = objectives[0]
    sign = 1.0 if OBJECTIVES[first].maximize else -1.0
    for number in sorted(front, key=lambda n: -sign * by_number[n]["estimates"][first][0]):
        row = by_number[number]
        cells = [interval_text(*row["estimates"][n], signed=n == "throughput")
                 for n in objectives]
        mark = " *" if number == recommended else ""
        lines.append(f"| {number}{mark} | {config_label(row['values'])} | "
                     + " | ".join(cells) + f" | {row['seeds_run']} |")
    return "\n".join(lines)


def plot_front(rows: list[dict], front: list[int], recommended: int | None,
               path: Path) -> None:
    """Throughput gain against TPOT p99 of every complete trial, with their 95 %
    intervals; the front joined, the recommendation starred, the longest pause as the
    colour."""
    from matplotlib.figure import Figure

    done = [r for r in rows if r["state"] == "complete" and r["same_as"] is None
            and {"throughput", "tpot_p99"} <= set(r["estimates"])]
    fig = Figure(figsize=(9, 6), layout="constrained")
    ax = fig.add_subplot()
    if done:
        xs = [r["estimates"]["tpot_p99"][0] for r in done]
        ys = [r["estimates"]["throughput"][0] for r in done]
        ax.errorbar(xs, ys, xerr=[r["estimates"]["tpot_p99"][1] for r in done],
                    yerr=[r["estimates"]["throughput"][1] for r in done], fmt="none",
                    ecolor="lightgray", zorder=1)
        pauses = [r["estimates"].get("longest_pause", [0.0])[0] for r in done]
        dots = ax.scatter(xs, ys, c=pauses, cmap="viridis", vmin=0.0,
                          vmax=max(max(pauses), 1.0), zorder=2, label="trial")
        fig.colorbar(dots, ax=ax, label="longest pause (ms)")
        line = sorted((r for r in done if r["number"] in front),
                      key=lambda r: r["estimates"]["tpot_p99"][0])
        ax.plot([r["estimates"]["tpot_p99"][0] for r in line],
                [r["estimates"]["throughput"][0] for r in line], color="tab:red",
                marker="o", markerfacecolor="none", markersize=12, label="Pareto front",
                zorder=3)
        for r in line:
            ax.annotate(str(r["number"]), (r["estimates"]["tpot_p99"][0],
                                           r["estimates"]["throughput"][0]),
                        textcoords="offset points", xytext=(6, 4), fontsize="x-small")
        star = next((r for r in done if r["number"] == recommended), None)
        if star is not None:
            ax.scatter([star["estimates"]["tpot_p99"][0]], [star["estimates"]["throughput"][0]],
                       color="gold", edgecolor="black", marker="*", s=260,
                       label=f"recommended (trial {recommended})", zorder=4)
    ax.axhline(0.0, color="black", linewidth=0.8, linestyle="--", label="DyntraLB off")
    ax.set_xlabel("TPOT p99 (ms), mean over the seeds  - lower is better")
    ax.set_ylabel("throughput gain over DyntraLB off (%)  - higher is better")
    ax.set_title("Tune: the trials and their Pareto front")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.savefig(path, dpi=110)
