"""What a user reads after a run: the terminal summary table, the A/B comparison table
and summary.md. Called by the CLI once the ranks have exited, on the metrics dictionary
from emu/metrics.py; the PNG plots that summary.md shows are emu/plots.py's.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from emu.knobs import is_int, is_number
from emu.metric_catalogue import NOT_METRICS, SECTIONS
from emu.no_effect import no_effect_notes
from emu.recipes import mean_ci

# Latency distributions in display order: (metrics key, label).
LATENCIES = (
    ("ttft_ms", "TTFT"),
    ("tpot_ms", "TPOT"),
    ("itl_ms", "ITL"),
    ("e2e_ms", "end-to-end"),
    ("queue_ms", "queue"),
)
_STATS = ("p50", "p90", "p99", "mean")

# The wall-clock figures `ab_wall_table` shows.
_WALL_ROWS = ("step_wall_ms.p50", "step_wall_ms.p99", "planner_ms.p50", "planner_ms.p99",
              "lb_comm_ms.p50", "lb_comm_ms.p99", "step_wall_total_s", "planner_total_s",
              "lb_comm_total_s")

# ------------------------------------------------------------------------ tables


def summary_table(metrics: dict) -> str:
    """The plain-text summary printed at the end of `dyntra-emu run`."""
    parts = [
        _text_table(["run", ""], _headline_rows(metrics)),
        _text_table(["latency (ms)", *_STATS], _latency_rows(metrics)),
        _text_table(["DyntraLB", ""], _lb_rows(metrics)),
        _text_table(_RANK_HEADER, _rank_rows(metrics)),
    ]
    notes = no_effect_notes(metrics)
    if notes:
        parts.append("\n".join(f"note: {n}" for n in notes))
    return "\n\n".join(parts)


def ab_table(metrics_a: dict, metrics_b: dict, labels=("A", "B")) -> str:
    """Every metric of two runs side by side with the absolute and relative change
    from A to B (printed by `dyntra-emu ab`). Wall-clock figures are not among them:
    see `ab_wall_table`."""
    return _text_table(["metric", *labels, "delta", "delta %"], _ab_rows(metrics_a, metrics_b))


def ab_wall_table(metrics_a: dict, metrics_b: dict, labels=("A", "B")) -> str | None:
    """The measured wall-clock times of both runs side by side, with no change column:
    they vary from run to run of the same work, so an A/B delta of them means nothing.
    None when neither run has wall-clock logs."""
    rows = _wall_rows(metrics_a, metrics_b, _WALL_ROWS)
    if rows is None:
        return None
    return ("Wall-clock time of the emulator itself (measured, varies between runs; not "
            "compared):\n" + _text_table(["wall-clock", *labels], rows))


def _wall_rows(a: dict, b: dict, names=None) -> list[tuple] | None:
    flat = [flat_metrics(m, ["wall"]) if "wall" in m else {} for m in (a, b)]
    if all(v is None for f in flat for v in f.values()):
        return None
    keys = list(flat[0]) + [k for k in flat[1] if k not in flat[0]]
    keys = [k[len("wall."):] for k in keys if k.startswith("wall.")]
    if names is not None:
        keys = [k for k in names if k in keys]
    return [(k, _num(flat[0].get(f"wall.{k}"), 3), _num(flat[1].get(f"wall.{k}"), 3))
            for k in keys]


def write_summary_md(path, metrics: dict, *, title: str = "dyntra-emu run",
                     plots=(), about=()) -> None:
    """summary.md of one run: ``about`` (lines on what the run is, e.g. that it is
    stitched from windows), the summary tables, the config and seed, and the plots
    (linked relative to the summary's directory)."""
    m = metrics
    lines = [f"# {title}", "", *_md_about(about)]
    lines += ["## Run", "", _md_table(["metric", "value"], _headline_rows(m))]
    lines += ["", "## Latency (ms)", "", _md_table(["", *_STATS], _latency_rows(m))]
    lines += ["", "## DyntraLB", "", _md_table(["metric", "value"], _lb_rows(m))]
    lines += _md_notes(no_effect_notes(m))
    lines += ["", "## Ranks", "", _md_table(_RANK_HEADER, _rank_rows(m))]
    lines += _md_config(m)
    lines += _md_plots(path, plots)
    Path(path).write_text("\n".join(lines) + "\n")


def write_ab_summary_md(path, metrics_a: dict, metrics_b: dict, labels=("A", "B"), *,
                        title: str = "dyntra-emu ab", plots=(), about=()) -> None:
    """summary.md of an A/B comparison: ``about`` (lines saying what A and B are, e.g.
    their trees), every metric with its deltas, both configs, and the overlay plots."""
    lines = [f"# {title}", "", *_md_about(about), f"A = `{labels[0]}`, B = `{labels[1]}`", "",
             scheduling_line(metrics_a, metrics_b, labels), ""]
    lines += headroom_summary(metrics_a, metrics_b, labels)
    for label, m in zip(labels, (metrics_a, metrics_b), strict=True):
        lines += _md_notes([f"({label}) {n}" for n in no_effect_notes(m)])
    lines += ["", _md_table(["metric", *labels, "delta", "delta %"],
                            _ab_rows(metrics_a, metrics_b))]
    wall = _wall_rows(metrics_a, metrics_b)
    if wall is not None:
        lines += ["", "## Wall-clock time (measured, not compared)", "",
                  "The emulator's own wall-clock time per step; it varies between runs of "
                  "the same work, so the two columns are not compared.", "",
                  _md_table(["wall-clock", *labels], wall)]
    for label, m in zip(labels, (metrics_a, metrics_b), strict=True):
        lines += _md_config(m, heading=f"Config of {label}")
    lines += _md_plots(path, plots)
    Path(path).write_text("\n".join(lines) + "\n")


def seed_metric_stats(pairs: list[tuple[int, dict, dict]]) -> list[dict]:
    """Every metric the A/B table compares (``flat_metrics``), over the seeds of ``ab
    --seeds``: ``pairs`` is (seed, metrics of A, metrics of B) per seed. Per metric its
    mean on each side and the change of B against A per seed as a mean with the half
    width of its 95 % confidence interval (Student's t), absolute and in percent of A
    (None where a seed lacks the metric, or A is 0 in a seed for the percentage)."""
    flats = [(flat_metrics(a), flat_metrics(b)) for _, a, b in pairs]
    names: list[str] = []
    for flat_a, flat_b in flats:
        names += [n for n in _ab_names(flat_a, flat_b) if n not in names]
    stats = []
    for name in names:
        va = [flat_a.get(name) for flat_a, _ in flats]
        vb = [flat_b.get(name) for _, flat_b in flats]
        row = {"metric": name, "integer": all(is_int(v) for v in va + vb), "a_mean": None,
               "b_mean": None, "delta": None, "delta_ci95": None, "delta_pct": None,
               "delta_pct_ci95": None}
        if None not in va and None not in vb:
            row["a_mean"], row["b_mean"] = statistics.fmean(va), statistics.fmean(vb)
            row["delta"], row["delta_ci95"] = mean_ci([y - x for x, y in zip(va, vb,
                                                                              strict=True)])
            if all(va):
                row["delta_pct"], row["delta_pct_ci95"] = mean_ci(
                    [(y - x) / abs(x) * 100 for x, y in zip(va, vb, strict=True)])
        stats.append(row)
    return stats


def seeds_ab_table(stats: list[dict], labels=("A", "B"), markdown: bool = False) -> str:
    """``seed_metric_stats`` as the table ``ab --seeds`` prints: each metric's mean on
    both sides and the change of B, mean ± 95 % CI over the seeds."""
    header = ["metric", f"{labels[0]} (mean)", f"{labels[1]} (mean)", "delta ± 95 % CI",
              "delta % ± 95 % CI"]
    rows = []
    for row in stats:
        digits = 1 if row["integer"] else 4  # a mean of counts: one decimal
        delta = ("-" if row["delta"] is None
                 else f"{_signed(row['delta'], digits)} ± {row['delta_ci95']:.{digits}f}")
        pct = ("-" if row["delta_pct"] is None
               else f"{_signed(row['delta_pct'], 2)} ± {row['delta_pct_ci95']:.2f} %")
        rows.append((row["metric"], _num(row["a_mean"], digits), _num(row["b_mean"], digits),
                     delta, pct))
    return (_md_table if markdown else _text_table)(header, rows)


def seeds_headroom(pairs: list[tuple[int, dict, dict]], labels=("A", "B")) -> list[str]:
    """``headroom_summary`` over the seeds of ``ab --seeds``: how much B could gain over
    A at most and how much it got, each in percent of A's throughput as a mean ± 95 % CI
    over the seeds. [] when a run lacks the numbers."""
    possible, got = [], []
    for _, a, b in pairs:
        ha, ta, tb = a.get("headroom"), a.get("throughput_tok_s"), b.get("throughput_tok_s")
        if not ha or not ta or tb is None or ha.get("sol_throughput_tok_s") is None:
            return []
        possible.append((ha["sol_throughput_tok_s"] - ta) / ta * 100)
        got.append((tb - ta) / ta * 100)
    (pm, ph), (gm, gh) = mean_ci(possible), mean_ci(got)
    line = (f"Headroom over {len(pairs)} seeds: perfectly balanced, the steps of {labels[0]} "
            f"would give {pm:+.1f} ± {ph:.1f} % over its throughput; {labels[1]} reached "
            f"{gm:+.1f} ± {gh:.1f} %")
    if pm > 0:
        line += f", {gm / pm * 100:.0f} % of that headroom (of the means)"
    return [line]


def write_ab_seeds_summary_md(path, *, title: str, labels, about=(), key_table: str,
                              stats: list[dict], headroom=(), notes=(), plots=()) -> None:
    """summary.md of ``ab --seeds``: what A and B are, the key deltas per seed with their
    mean and CI, the headroom, every metric over the seeds, notes, each seed's plots."""
    lines = [f"# {title}", "", *_md_about(about),
             f"A = `{labels[0]}`, B = `{labels[1]}`; deltas of B against A, per seed and as "
             "the mean with its 95 % confidence interval (Student's t)", "",
             "```", key_table, "```", "", *headroom, "",
             "## Every metric, mean over the seeds", "",
             seeds_ab_table(stats, labels, markdown=True)]
    lines += _md_notes(list(notes))
    lines += _md_plots(path, plots)
    Path(path).write_text("\n".join(lines) + "\n")


def _md_about(about) -> list[str]:
    return [*(f"- {line}" for line in about), ""] if about else []


_RANK_HEADER = ["rank", "utilisation", "mean blocks", "max blocks", "tokens", "finished"]


def _headline_rows(m: dict) -> list[tuple]:
    return [
        ("DP ranks", str(m["dp_size"])),
        ("steps", str(m["steps"])),
        ("virtual time", f"{_num(m['virtual_time_s'], 3)} s"),
        ("requests finished", f"{m['requests_finished']} / {m['requests_total']}"),
        ("output tokens", str(m["output_tokens"])),
        ("throughput", f"{_num(m['throughput_tok_s'], 1)} tok/s"),
        ("DP bubble ratio", _pct(m["bubble_ratio"])),
        ("balance ratio (mean/max blocks)", _num(m["balance_ratio"], 3)),
        *_headroom_rows(m),
        ("preemptions", str(m["preemptions"])),
        ("cost model", _cost_model_name(m)),
        ("scheduling", scheduling_name(m)),
        *_dp_sync_rows(m),
    ]


def _dp_sync_rows(m: dict) -> list[tuple]:
    """The run's DP sync cadence (absent in metrics recorded without it)."""
    cadence = (m.get("config") or {}).get("dp_sync")
    if cadence is None:
        return []
    first = "step 1 and " if cadence["first_step"] else ""
    return [("DP sync", f"{first}every {cadence['interval']} steps")]


def _headroom_rows(m: dict) -> list[tuple]:
    """The bubble-free bound next to the bubble (absent in metrics without it)."""
    h = m.get("headroom")
    if h is None:
        return []
    gain = "" if h["max_gain"] is None else f" ({h['max_gain'] * 100:+.1f} %)"
    return [("balance ratio (mean/max step cost)", _num(h["cost_balance_ratio"], 3)),
            ("bubble-free throughput bound", f"{_num(h['sol_throughput_tok_s'], 1)} tok/s"
                                             f"{gain}")]


def headroom_summary(a: dict, b: dict, labels=("A", "B")) -> list[str]:
    """How much B could gain over A at most (A's bubble-free bound) and how much it got:
    the lines under the A/B key metrics. [] when a run lacks the numbers."""
    ha, hb = a.get("headroom"), b.get("headroom")
    ta, tb = a.get("throughput_tok_s"), b.get("throughput_tok_s")
    if not ha or not hb or not ta or tb is None or ha["sol_throughput_tok_s"] is None:
        return []
    bound = ha["sol_throughput_tok_s"]
    possible = bound - ta
    got = tb - ta
    lines = [f"Headroom: perfectly balanced, the steps of {labels[0]} would give {bound:.1f} "
             f"tok/s ({possible / ta * 100:+.1f} % over its {ta:.1f}); {labels[1]} reached "
             f"{tb:.1f} tok/s ({got / ta * 100:+.1f} %)"]
    if possible > 0:
        lines[0] += f", {got / possible * 100:.0f} % of that headroom"
    control = b.get("control_plane")
    if control and control["total_s"] and b.get("output_tokens"):
        gross = b["output_tokens"] / (b["virtual_time_s"] - control["total_s"])
        lines.append(f"  {labels[1]}'s figure is net of DyntraLB's control plane, "
                     f"{_control_text(control)}; the same steps without that charge: "
                     f"{gross:.1f} tok/s ({(gross - ta) / ta * 100:+.1f} %; a run without "
                     f"it may take other steps)")
    return lines


def _control_text(control: dict) -> str:
    """DyntraLB's control plane of a run in one phrase (metrics' ``control_plane``)."""
    per_step = control["per_active_step_ms"]
    text = (f"{control['total_s']:.3f} s of virtual time ("
            + ("" if per_step is None else f"{per_step:.3f} ms per planning step, ")
            + f"{_pct(control['busy_share'])} of busy time)")
    if not control["deterministic"]:
        text += ", the planner at its measured wall time (not deterministic)"
    return text


def scheduling_name(m: dict) -> str:
    """Which of vLLM's scheduling modes the run ran, from the metrics' config: "async"
    (two steps in flight) or "synchronous" ('-' when not recorded)."""
    mode = (m.get("config") or {}).get("async_scheduling")
    return "-" if mode is None else "async" if mode else "synchronous"


def scheduling_line(a: dict, b: dict, labels=("A", "B")) -> str:
    """The header line of an A/B saying which scheduling mode each run ran."""
    mode_a, mode_b = scheduling_name(a), scheduling_name(b)
    if mode_a == mode_b:
        return f"Scheduling: {mode_a} in both runs"
    return f"Scheduling: {mode_a} in {labels[0]}, {mode_b} in {labels[1]}"


def _cost_model_name(m: dict) -> str:
    """The step-cost profile recorded in the metrics' config ('-' when not recorded)."""
    profile = (m.get("config") or {}).get("cost_model")
    return profile.get("name", "-") if isinstance(profile, dict) else "-"


def _lb_rows(m: dict) -> list[tuple]:
    churn = m["plan_churn"]
    pauses = m["pauses"]
    rows = [
        ("steps with a plan applied", str(churn["active_steps"])),
        ("plan churn (outs+ins per active step)", _num(churn["per_active_step"], 2)),
        ("pauses (requests paused)", f"{pauses['total']} ({pauses['requests_paused']})"),
        ("requests paused at least once", _paused_share(m)),
        ("pause duration p50 / p99 / max", f"{_num(pauses['duration_ms']['p50'], 1)} / "
                                           f"{_num(pauses['duration_ms']['p99'], 1)} / "
                                           f"{_num(pauses['duration_ms']['max'], 1)} ms"),
        ("longest time one request spent paused", _longest_paused(pauses)),
    ]
    control = m.get("control_plane")
    if control is not None:
        rows.append(("control plane (virtual time)", _control_text(control)))
    wall = m.get("wall") or {}
    for key, label in (("planner_ms", "planner wall time per step"),
                       ("lb_comm_ms", "DyntraLB collectives per step")):
        if wall.get(key, {}).get("count"):
            rows.append((label, f"{_num(wall[key]['mean'], 3)} ms mean, "
                                f"{_num(wall[key]['p99'], 3)} ms p99"))
    return rows


def _paused_share(m: dict) -> str:
    """Requests paused at least once, as a count and a percentage of the run's requests
    (metrics written before ``requests_paused_pct`` existed show the count alone)."""
    pauses = m["pauses"]
    pct = pauses.get("requests_paused_pct")
    share = "" if pct is None else f" ({pct:.1f} %)"
    return f"{pauses['requests_paused']} of {m['requests_total']}{share}"


def _longest_paused(pauses: dict) -> str:
    longest = pauses.get("longest_paused_ms")
    return "-" if longest is None else f"{_num(longest, 1)} ms"


def _md_notes(notes: list[str]) -> list[str]:
    if not notes:
        return []
    return ["", "### Why nothing happened", "", *(f"- {n}" for n in notes)]


def _md_config(m: dict, heading: str = "Config") -> list[str]:
    lines = ["", f"## {heading}", "", f"Seed: `{m.get('seed')}`", ""]
    if m.get("config") is not None:
        lines += ["```json", json.dumps(m["config"], indent=2, sort_keys=True), "```"]
    return lines


def _latency_rows(m: dict) -> list[tuple]:
    rows = [(label, *(_num(m[key][s], 2) for s in _STATS))
            for key, label in LATENCIES if key in m]
    rows.append(("pause duration", *(_num(m["pauses"]["duration_ms"][s], 2) for s in _STATS)))
    return rows


def _rank_rows(m: dict) -> list[tuple]:
    return [(str(r["rank"]), _pct(r["utilisation"]), _num(r["mean_running_blocks"], 1),
             str(r["max_running_blocks"]), str(r["output_tokens"]),
             str(r["requests_finished"])) for r in m["per_rank"]]


def _ab_rows(a: dict, b: dict) -> list[tuple]:
    flat_a, flat_b = flat_metrics(a), flat_metrics(b)
    rows = []
    for name in _ab_names(flat_a, flat_b):
        va, vb = flat_a.get(name), flat_b.get(name)
        digits = 0 if isinstance(va, int) and isinstance(vb, int) else 4
        if va is None or vb is None:
            delta = rel = "-"
        else:
            delta = _signed(vb - va, digits)
            rel = f"{round((vb - va) / abs(va) * 100, 1) + 0.0:+.1f}%" if va else "-"
        rows.append((name, _num(va, digits), _num(vb, digits), delta, rel))
    return rows


def flat_metrics(metrics: dict, keys: list[str] | None = None) -> dict:
    """Numeric leaves as dotted names ('ttft_ms.p50', 'per_rank.2.utilisation') of the
    top-level `keys` (default: every metric the A/B table compares, in its display
    order); None leaves are kept (shown as '-'). These names are also the metrics
    `dyntra-emu gate` checks (emu/gate.py)."""
    out: dict = {}

    def walk(prefix, value):
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}", v)
        elif isinstance(value, list):
            for i, v in enumerate(value):
                if isinstance(v, dict) and "rank" in v:
                    v = {k: x for k, x in v.items() if k != "rank"}
                walk(f"{prefix}.{i}", v)
        elif value is None or is_number(value):
            out[prefix] = value

    if keys is None:
        keys = [k for k in SECTIONS if k in metrics]
        keys += sorted(k for k in metrics if k not in SECTIONS and k not in NOT_METRICS)
    for key in keys:
        walk(key, metrics[key])
    return out


def _ab_names(flat_a: dict, flat_b: dict) -> list[str]:
    """Names of both runs in order; a section that is null in one run and has values in
    the other (e.g. `wall`) is listed by its leaves only."""
    names = list(flat_a) + [k for k in flat_b if k not in flat_a]
    return [n for n in names if not any(other.startswith(n + ".") for other in names)]


def _text_table(header, rows) -> str:
    rows = [tuple(str(c) for c in row) for row in rows]
    widths = [max(len(str(h)), *(len(r[i]) for r in rows)) if rows else len(str(h))
              for i, h in enumerate(header)]
    def fmt(cells):
        first = f"{cells[0]:<{widths[0]}}"
        rest = [f"{c:>{w}}" for c, w in zip(cells[1:], widths[1:], strict=True)]
        return "  ".join([first, *rest]).rstrip()
    lines = [fmt([str(h) for h in header]), "  ".join("-" * w for w in widths)]
    lines += [fmt(r) for r in rows]
    return "\n".join(lines)


def _md_table(header, rows) -> str:
    lines = ["| " + " | ".join(str(h) for h in header) + " |",
             "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _md_plots(path, plots) -> list[str]:
    if not plots:
        return []
    base = Path(path).resolve().parent
    lines = ["", "## Plots", ""]
    for plot in plots:
        plot = Path(plot).resolve()
        rel = plot.relative_to(base) if plot.is_relative_to(base) else plot
        lines += [f"![{plot.stem}]({rel.as_posix()})", ""]
    return lines


def _num(value, digits: int) -> str:
    if value is None:
        return "-"
    if is_int(value):
        return str(value)
    return f"{value:.{digits}f}"


def _signed(value, digits: int) -> str:
    if isinstance(value, int):
        return f"{value:+d}"
    return f"{round(value, digits) + 0.0:+.{digits}f}"  # + 0.0 turns -0.0 into 0.0


def _pct(value) -> str:
    return "-" if value is None else f"{value * 100:.1f} %"
