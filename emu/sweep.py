"""``dyntra-emu sweep``: tune DyntraLB's config on one workload over a grid of values.

    dyntra-emu sweep --workload longtail --dp 8 --grid bubble_threshold=1,2,5 \\
        --grid mode=static,dynamic --jobs 2 --out runs/lt-sweep

Every ``--grid KEY=V1,V2,...`` names a ``dyntra_lb_config`` key (``mode`` among them) and
its values; the grid is their product, each point the base ``--additional-config`` with
those keys set (and DyntraLB enabled). The baseline is the base config with DyntraLB
off. All runs share the workload, engine settings and seed, and run on the thread
transport (``emu.cluster.threads``), on an executor (``emu.executors``: ``--jobs`` job
processes on this machine, or Ray tasks with ``--executor ray``). Then ``DIR`` holds:

- ``sweep.json``, ``sweep.csv``, ``summary.md``: one row per config with throughput, DP
  bubble, balance, TPOT p50/p99, TTFT p90 and pauses, each with its change against the
  baseline, and the best config for ``--objective``;
- ``pareto.png``: throughput against TPOT p99, the Pareto front (no other config has
  higher throughput and lower TPOT p99) marked;
- ``kv_blocks.png``: the workload's per-request KV blocks (prompt, as dynamic mode
  counts them at arrival) with every ``long_req_block_threshold`` of the grid;
- ``runs/baseline``, ``runs/p01`` ...: each run's ``metrics.json`` and event logs.

The best config is printed as a ready ``--additional-config`` JSON.

This module is the sweep itself, below the CLI: the grid, each point's RunSpec (the
base spec with the point's config), the table and the plots. The command
(``emu.cli.sweep``) checks each spec once and runs the checked runs as a batch
(``emu.cli.batch``: each one ``emu.run.run_checked`` on the executor, so each run
records its config as any other run of that spec).
"""

from __future__ import annotations

import csv
import dataclasses
import itertools
import json
from pathlib import Path

from dyntra_lb.blocks import num_blocks
from dyntra_lb.config import DyntraLBConfig
from emu.metric_catalogue import better, in_order
from emu.spec import RunSpec

# More points than this need --yes: at tens of seconds per run, a few hundred take hours.
MAX_POINTS = 64
# --objective's choices: the table's column each names (its way from the catalogue).
OBJECTIVE_COLUMNS = {"throughput": "throughput_tok_s", "tpot_p99": "tpot_p99_ms",
                     "bubble": "bubble_ratio"}
OBJECTIVES = tuple(OBJECTIVE_COLUMNS)
GRID_KEYS = tuple(f.name for f in dataclasses.fields(DyntraLBConfig))

# The table's metrics (emu.metric_catalogue names, in its order): the column that
# sweep.json and sweep.csv call each, and the table's scale (the bubble in percent).
_COLUMN_OF = {"throughput_tok_s": ("throughput_tok_s", 1.0),
              "bubble_ratio": ("bubble_ratio", 100.0),
              "balance_ratio": ("balance_ratio", 1.0),
              "tpot_ms.p50": ("tpot_p50_ms", 1.0),
              "tpot_ms.p99": ("tpot_p99_ms", 1.0),
              "ttft_ms.p90": ("ttft_p90_ms", 1.0),
              "pauses.total": ("pauses", 1.0)}
# (column, metric name, scale) in the catalogue's order.
COLUMNS = tuple((_COLUMN_OF[name][0], name, _COLUMN_OF[name][1])
                for name in in_order(_COLUMN_OF))


# ----------------------------------------------------------------------- the grid


def parse_grid(values: list[str]) -> dict[str, list]:
    """``--grid`` values -> {key: [values]} in the order given. A value is read as JSON
    (``5``, ``1.5``, ``true``) or else taken as a string (``static``). Raises
    ValueError naming the ``--grid`` value."""
    grid: dict[str, list] = {}
    for text in values:
        key, sep, rest = text.partition("=")
        key = key.strip()
        if not sep or not key or not rest.strip():
            raise ValueError(f"--grid {text}: expected KEY=V1,V2,... "
                             "(e.g. bubble_threshold=1,2,5)")
        if key not in GRID_KEYS:
            raise ValueError(f"--grid {text}: unknown key {key!r}; expected a "
                             f"dyntra_lb_config key: {', '.join(GRID_KEYS)}")
        if key in grid:
            raise ValueError(f"--grid {text}: {key} is already given by another --grid")
        parsed = []
        for raw in rest.split(","):
            raw = raw.strip()
            if not raw:
                raise ValueError(f"--grid {text}: empty value")
            try:
                value = json.loads(raw)
            except ValueError:
                value = raw
            if value in parsed:
                raise ValueError(f"--grid {text}: {raw} is listed twice")
            parsed.append(value)
        grid[key] = parsed
    return grid


def with_lb(base: dict, **keys) -> dict:
    """The additional config ``base`` with ``keys`` set in its dyntra_lb_config."""
    config = json.loads(json.dumps(base))
    scheduler = config.setdefault("scheduler_config", {})
    if not isinstance(scheduler, dict):
        raise ValueError("--additional-config: scheduler_config must be an object")
    lb = scheduler.setdefault("dyntra_lb_config", {})
    if not isinstance(lb, dict):
        raise ValueError("--additional-config: scheduler_config.dyntra_lb_config must "
                         "be an object")
    lb.update(keys)
    return config


@dataclasses.dataclass
class Point:
    name: str  # "baseline", "p01", ...
    values: dict  # the grid's keys for this point ({} for the baseline)
    config: dict  # the whole additional config

    @property
    def label(self) -> str:
        if not self.values:
            return "baseline (DyntraLB off)"
        return " ".join(f"{k}={json.dumps(v)}" for k, v in self.values.items())

    @property
    def source(self) -> str:
        """How messages name this point's config: the --grid values that made it."""
        if not self.values:
            return "the baseline (--additional-config with DyntraLB disabled)"
        return "--grid " + " ".join(f"{k}={v}" for k, v in self.values.items())


def build_points(base: dict, grid: dict[str, list]) -> list[Point]:
    """The baseline (``base`` with DyntraLB off) and every grid point (``base`` with
    DyntraLB on and the point's values), in grid order. Unchecked: ``point_spec`` makes
    each a RunSpec, which ``emu.spec.check`` judges."""
    points = [Point("baseline", {}, with_lb(base, enabled=False))]
    combos = list(itertools.product(*grid.values()))
    width = max(2, len(str(len(combos))))
    for i, combo in enumerate(combos, 1):
        values = dict(zip(grid, combo, strict=True))
        points.append(Point(f"p{i:0{width}d}", values,
                            with_lb(base, **{"enabled": True, **values})))
    return points


def point_spec(base: RunSpec, point: Point, out_dir: Path) -> RunSpec:
    """The RunSpec of ``point``: ``base`` (the workload, engine settings, seed, the
    thread transport) with the point's config, run into ``out_dir``/runs/<name>."""
    return dataclasses.replace(base, additional_config=point.config,
                               out_dir=out_dir / "runs" / point.name)


# ----------------------------------------------------------------------- the table


def _metric(metrics: dict, path: tuple):
    value = metrics
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def make_rows(points: list[Point], results: dict[str, dict], out_dir: Path) -> list[dict]:
    """One row per config: its metrics and their change against the baseline."""
    base = results["baseline"]
    rows = []
    for p in points:
        m = results[p.name]
        row = {"name": p.name, "label": p.label, "values": p.values,
               "additional_config": p.config,
               "run_dir": str((out_dir / "runs" / p.name).relative_to(out_dir))}
        for column, name, _ in COLUMNS:
            path = tuple(name.split("."))
            value, ref = _metric(m, path), _metric(base, path)
            row[column] = value
            row[f"{column}_delta"] = (None if value is None or ref is None else value - ref)
            row[f"{column}_delta_pct"] = (None if value is None or not ref
                                          else (value - ref) / abs(ref) * 100)
        rows.append(row)
    return rows


def pareto_front(rows: list[dict]) -> list[str]:
    """Names of the rows no other row beats on both throughput (higher) and TPOT p99
    (lower), in order of throughput."""
    valid = [r for r in rows if r["throughput_tok_s"] is not None
             and r["tpot_p99_ms"] is not None]
    front = []
    for r in valid:
        dominated = any(
            o["throughput_tok_s"] >= r["throughput_tok_s"] and o["tpot_p99_ms"]
            <= r["tpot_p99_ms"] and (o["throughput_tok_s"] > r["throughput_tok_s"]
                                     or o["tpot_p99_ms"] < r["tpot_p99_ms"])
            for o in valid)
        if not dominated:
            front.append(r)
    return [r["name"] for r in sorted(front, key=lambda r: r["throughput_tok_s"])]


def best_row(rows: list[dict], objective: str, max_tpot_p99_ms: float | None):
    """The best grid point (never the baseline) for the objective; None when none
    qualifies. Ties go to the earlier point."""
    candidates = [r for r in rows if r["name"] != "baseline"]
    if max_tpot_p99_ms is not None:
        candidates = [r for r in candidates if r["tpot_p99_ms"] is not None
                      and r["tpot_p99_ms"] <= max_tpot_p99_ms]
    column = OBJECTIVE_COLUMNS[objective]
    name = next(name for c, name, _ in COLUMNS if c == column)
    sign = -1.0 if better(name) == "higher" else 1.0

    def key(r):  # a row without the figure is the worst
        return float("inf") if r[column] is None else sign * r[column]

    return min(candidates, key=key) if candidates else None


def _cell(row: dict, column: str, scale: float, baseline: bool) -> str:
    value = row[column]
    if value is None:
        return "-"
    text = f"{value * scale:.1f}" if column != "balance_ratio" else f"{value:.3f}"
    if column == "pauses":
        text = str(value)
    if baseline:
        return text
    if column in ("bubble_ratio", "balance_ratio", "pauses"):
        delta = row[f"{column}_delta"]
        if delta is None:
            return text
        d = (f"{delta * scale:+.1f} pp" if column == "bubble_ratio"
             else f"{delta:+.3f}" if column == "balance_ratio" else f"{delta:+d}")
        return f"{text} ({d})"
    pct = row[f"{column}_delta_pct"]
    return text if pct is None else f"{text} ({pct:+.1f} %)"


_HEADERS = ("throughput tok/s", "DP bubble %", "balance", "TPOT p50 ms", "TPOT p99 ms",
            "TTFT p90 ms", "pauses")


def markdown_table(rows: list[dict], front: list[str]) -> str:
    lines = ["| run | config | " + " | ".join(_HEADERS) + " |",
             "|---|---|" + "---:|" * len(_HEADERS)]
    for row in rows:
        cells = [_cell(row, c, s, row["name"] == "baseline") for c, _, s in COLUMNS]
        mark = " *" if row["name"] in front else ""
        lines.append(f"| {row['name']}{mark} | {row['label']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_csv(rows: list[dict], grid: dict, path: Path) -> None:
    fields = ["name", *grid] + [f"{c}{s}" for c, *_ in COLUMNS
                                for s in ("", "_delta", "_delta_pct")] + ["run_dir"]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: (row["values"].get(k, "") if k in grid else row[k])
                             for k in fields})


# ----------------------------------------------------------------------- plots


def plot_pareto(rows: list[dict], front: list[str], best: str | None, path: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 6), layout="constrained")
    ax = fig.add_subplot()
    by_name = {r["name"]: r for r in rows}
    points = [r for r in rows if r["throughput_tok_s"] is not None
              and r["tpot_p99_ms"] is not None]
    grid = [r for r in points if r["name"] != "baseline"]
    ax.scatter([r["tpot_p99_ms"] for r in grid], [r["throughput_tok_s"] for r in grid],
               color="tab:blue", label="grid point", zorder=2)
    if "baseline" in by_name and by_name["baseline"] in points:
        b = by_name["baseline"]
        ax.scatter([b["tpot_p99_ms"]], [b["throughput_tok_s"]], color="black", marker="s",
                   label="baseline (DyntraLB off)", zorder=3)
    line = sorted((by_name[n] for n in front), key=lambda r: r["tpot_p99_ms"])
    ax.plot([r["tpot_p99_ms"] for r in line], [r["throughput_tok_s"] for r in line],
            color="tab:red", marker="o", markerfacecolor="none", markersize=12,
            label="Pareto front", zorder=4)
    if best is not None:
        r = by_name[best]
        ax.scatter([r["tpot_p99_ms"]], [r["throughput_tok_s"]], color="gold",
                   edgecolor="black", marker="*", s=260, label=f"best ({best})", zorder=5)
    for xy, names in _label_groups(points):
        text = ",".join(names) if len(names) <= 3 else \
            f"{names[0]},{names[1]} +{len(names) - 2} here"
        ax.annotate(text, xy, textcoords="offset points", xytext=(5, 4), fontsize="x-small")
    ax.set_xlabel("TPOT p99 (ms)  - lower is better")
    ax.set_ylabel("throughput (output tok/s)  - higher is better")
    ax.set_title("Sweep: throughput against TPOT p99")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.savefig(path, dpi=110)


def _label_groups(points: list[dict]) -> list[tuple[tuple, list[str]]]:
    """The Pareto plot's labels: runs whose points lie within 2 % of the axes' spans of
    a group's first point share its label, which would otherwise print over another
    (runs with identical results, or results that differ in the fourth digit)."""
    xs = [r["tpot_p99_ms"] for r in points]
    ys = [r["throughput_tok_s"] for r in points]
    dx = 0.02 * (max(xs) - min(xs)) if points else 0.0
    dy = 0.02 * (max(ys) - min(ys)) if points else 0.0
    groups: list[tuple[tuple, list[str]]] = []
    for r in points:
        x, y = r["tpot_p99_ms"], r["throughput_tok_s"]
        for (gx, gy), names in groups:
            if abs(x - gx) <= dx and abs(y - gy) <= dy:
                names.append(r["name"])
                break
        else:
            groups.append(((x, y), [r["name"]]))
    return groups


def plot_kv_blocks(trace, block_size: int, thresholds: list, path: Path) -> None:
    from matplotlib.figure import Figure

    blocks = [num_blocks(r.prompt_tokens, block_size) for r in trace]
    fig = Figure(figsize=(9, 5), layout="constrained")
    ax = fig.add_subplot()
    ax.hist(blocks, bins=min(60, max(10, len(set(blocks)))), color="tab:gray")
    colours = ("tab:red", "tab:blue", "tab:green", "tab:orange", "tab:purple", "tab:brown")
    for i, t in enumerate(sorted(thresholds)):
        above = sum(b > t for b in blocks)
        ax.axvline(t, color=colours[i % len(colours)], linestyle="--",
                   label=f"long_req_block_threshold={t} ({above} requests above)")
    ax.set_xlabel(f"KV blocks per request at arrival (prompt tokens / block_size {block_size})")
    ax.set_ylabel("requests")
    ax.set_title(f"Workload: per-request KV blocks ({len(trace)} requests)")
    if thresholds:
        ax.legend(fontsize="small")
    fig.savefig(path, dpi=110)
