"""Fast without starving: production's DyntraLB against the kit's opt-in pause limit
(``--pause-limit-ms``, docs/pause-limit.md) on four workloads, each run against DyntraLB
off on the same trace and seed.

Settings per workload and seed: DyntraLB off; production's config as the workload's
setup gives it (no limit); limits of 500, 1,000, 2,000 and 5,000 ms (victim ``next``);
at 2,000 ms the victims ``drop`` and ``least-paused``; ``least-paused`` alone (no
limit, spreading only); and a limit of 10^9 ms, out of reach: paused requests keep their
running slots and nothing else changes. For each: throughput gain over DyntraLB off (%),
TPOT p50/p99, ITL max, the longest time one request spent paused, the share of requests
paused, each a mean with its 95 % CI over the seeds (Student's t); a trace file is one
workload, exact.

Workloads:

- ``default``: the bundled default trace, dp 4, ``{"enabled": true}`` (the README's
  main job). One trace without randomness: one seed, exact.
- ``pr12292``: PR #12292's recipe as ``benchmarks/pr12292.py`` runs it (1,000 requests
  at 400 req/s, 128 closed-loop clients, dp 8, block 2048, 16 per rank, MTP 3 with
  ``kv-token-mtp3``, async, ``long_req_block_threshold`` 40).
- ``gpqa``: ``recipe:pr12292-gpqa`` with its published setup (fixtures/generate.py
  ``RECIPE_SETUPS``: 128 clients, block 128, 256 per rank, vLLM's router,
  ``ascend-qwen3-30b-a3b``, static mode, async), dp 8.
- ``mooncake``: a Mooncake-shaped trace generated here (its input and output lengths
  lognormal around the means of Mooncake's released conversation trace, 12,035 and 343
  tokens, assumed spread; Poisson arrivals), dp 16, block 128, dynamic mode from
  production's defaults. ``--mooncake-s`` sets its length (default 45 s of arrivals).

    .venv/bin/python benchmarks/starvation.py --seeds pr12292=10 gpqa=3 mooncake=2 \\
        --jobs 2 --json starvation.json --plot starvation.png
    .venv/bin/python benchmarks/starvation.py --from-json starvation.json --plot p.png

Every run goes through ``emu.run.run`` on rank threads (the same event logs as rank
processes) in a job process; ``--json`` is rewritten after every run, so an interrupted
benchmark keeps its numbers, and ``--resume`` skips the runs a JSON already holds.
"""

from __future__ import annotations

import argparse
import concurrent.futures as futures
import json
import math
import os
import pathlib
import platform
import shutil
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pr12292  # noqa: E402  (this directory's: the PR's settings)

from emu.recipes import mean_ci  # noqa: E402
from emu.workload import TraceRequest, load_trace, resolve_workload  # noqa: E402

generate = pr12292.generate
ENABLED = {"scheduler_config": {"dyntra_lb_config": {"enabled": True}}}
GPQA_SETUP = generate.RECIPE_SETUPS["pr12292-gpqa"]

# Mooncake's released conversation trace (FAST25-release): mean input 12,035 tokens,
# mean output 343 tokens; the lognormal spreads and the rate are assumed.
MOONCAKE_INPUT_MEAN, MOONCAKE_OUTPUT_MEAN = 12_035, 343
MOONCAKE_SIGMA = (0.9, 0.8)
MOONCAKE_RATE = 20.0  # requests/s over 16 ranks: about full slots (assumed)

# (label, DyntraLB on, pause_limit_ms, pause_victim)
SETTINGS = [
    ("off", False, None, "next"),
    ("production", True, None, "next"),
    ("limit 500", True, 500, "next"),
    ("limit 1000", True, 1000, "next"),
    ("limit 2000", True, 2000, "next"),
    ("limit 5000", True, 5000, "next"),
    ("limit 2000, drop", True, 2000, "drop"),
    ("limit 2000, least-paused", True, 2000, "least-paused"),
    ("least-paused, no limit", True, None, "least-paused"),
    # Paused requests keep their slots, with a limit too far to reach: what keeping the
    # slots alone costs (the obstacle the note names).
    ("slots kept, limit 10^9 ms", True, 10**9, "next"),
]
LABELS = [s[0] for s in SETTINGS]


def mooncake_trace(seed: int, seconds: float) -> list[dict]:
    """A Mooncake-shaped trace: ``seconds`` of Poisson arrivals at MOONCAKE_RATE."""
    rng = np.random.default_rng(seed)
    n = max(1, int(seconds * MOONCAKE_RATE))
    times = np.cumsum(rng.exponential(1 / MOONCAKE_RATE, size=n))
    times -= times[0]

    def lognormal(mean, sigma, lo, hi):
        mu = math.log(mean) - sigma ** 2 / 2
        return np.clip(np.rint(rng.lognormal(mu, sigma, size=n)), lo, hi).astype(int)

    prompts = lognormal(MOONCAKE_INPUT_MEAN, MOONCAKE_SIGMA[0], 16, 120_000)
    outputs = lognormal(MOONCAKE_OUTPUT_MEAN, MOONCAKE_SIGMA[1], 1, 4_000)
    return [{"request_id": f"mc-{i:05d}", "arrival_s": float(times[i]),
             "prompt_tokens": int(prompts[i]), "output_tokens": int(outputs[i])}
            for i in range(n)]


def workload(name: str, seed: int, mooncake_s: float) -> tuple[list, dict, dict]:
    """(trace, RunSpec fields, production's config) of workload ``name``, seed ``seed``."""
    if name == "default":
        return load_trace(resolve_workload("default")), {"dp_size": 4}, ENABLED
    if name == "pr12292":
        return (pr12292.trace(pr12292.N, pr12292.RATE, seed),
                {**pr12292.ENGINE_FIELDS, "cost_model": "kv-token-mtp3"}, pr12292.CONFIG_B)
    if name == "gpqa":
        fields = {k: v for k, v in GPQA_SETUP.items() if k != "additional_config"}
        return (generate.pr12292_gpqa(seed=seed), {"dp_size": 8, **fields},
                GPQA_SETUP["additional_config"])
    if name == "mooncake":
        return mooncake_trace(seed, mooncake_s), {"dp_size": 16}, ENABLED
    raise ValueError(name)


def run_job(name: str, seed: int, label: str, mooncake_s: float, tmp: str) -> dict:
    """One run in a job process: its key metrics and CPU seconds."""
    from emu.rank.costs import PROFILES
    from emu.run import run
    from emu.spec import RunSpec

    trace, fields, config = workload(name, seed, mooncake_s)
    if trace and isinstance(trace[0], dict):
        trace = [TraceRequest(r["request_id"], r["arrival_s"], r["prompt_tokens"],
                              r["output_tokens"]) for r in trace]
    fields = dict(fields)
    if "cost_model" in fields:
        fields["cost_model"] = PROFILES[fields["cost_model"]]
    _, on, limit, victim = SETTINGS[LABELS.index(label)]
    out = pathlib.Path(tmp) / f"{name}-{seed}-{LABELS.index(label)}"
    spec = RunSpec(trace=trace, out_dir=out, additional_config=config if on else {},
                   seed=seed, device="cpu", transport="thread", collective_timeout_s=600.0,
                   pause_limit_ms=limit if on else None,
                   pause_victim=victim if on else "next", **fields)
    cpu0 = time.process_time()
    m = run(spec).metrics
    cpu = time.process_time() - cpu0
    shutil.rmtree(out, ignore_errors=True)
    pauses = m["pauses"]
    return {"workload": name, "seed": seed, "setting": label, "cpu_s": round(cpu, 1),
            "throughput_tok_s": m["throughput_tok_s"], "tpot_p50_ms": m["tpot_ms"]["p50"],
            "tpot_p99_ms": m["tpot_ms"]["p99"], "itl_max_ms": m["itl_ms"]["max"],
            "longest_paused_ms": pauses["longest_paused_ms"],
            "paused_pct": pauses["requests_paused_pct"],
            "pause_p99_ms": pauses["duration_ms"].get("p99"),
            "requests_unfinished": m["requests_unfinished"]}


# ------------------------------------------------------------------------- summary

METRICS = [("gain_pct", "gain over off %"), ("tpot_p50_ms", "TPOT p50 ms"),
           ("tpot_p99_ms", "TPOT p99 ms"), ("tpot_p99_x", "TPOT p99 / off"),
           ("itl_max_ms", "ITL max ms"), ("longest_paused_ms", "longest pause ms"),
           ("paused_pct", "paused %")]


def summarise(runs: list[dict]) -> dict:
    """Per workload and setting: each metric's (mean, CI half-width or None) over the
    seeds that have both the setting and DyntraLB off."""
    off = {(r["workload"], r["seed"]): r for r in runs if r["setting"] == "off"}
    table: dict = {}
    for r in runs:
        base = off.get((r["workload"], r["seed"]))
        if base is None:
            continue
        row = dict(r, gain_pct=(r["throughput_tok_s"] / base["throughput_tok_s"] - 1) * 100,
                   tpot_p99_x=r["tpot_p99_ms"] / base["tpot_p99_ms"])
        table.setdefault(r["workload"], {}).setdefault(r["setting"], []).append(row)
    out: dict = {}
    for name, settings in table.items():
        for label in LABELS:
            rows = settings.get(label)
            if not rows:
                continue
            cell = {"seeds": len(rows)}
            for key, _ in METRICS:
                values = [row[key] for row in rows]
                cell[key] = (values[0], None) if len(values) < 2 else mean_ci(values)
            out.setdefault(name, {})[label] = cell
    return out


def goal(cells: dict) -> dict[str, bool]:
    """The issue's goal per setting: >= 75 % of production's gain, longest pause <= 2 s,
    TPOT p99 <= 1.5x DyntraLB off's (on the means)."""
    prod = cells.get("production")
    met = {}
    for label, cell in cells.items():
        if label in ("off", "production") or prod is None:
            continue
        kept = prod["gain_pct"][0] > 0 and cell["gain_pct"][0] >= 0.75 * prod["gain_pct"][0]
        met[label] = (kept and cell["longest_paused_ms"][0] <= 2000
                      and cell["tpot_p99_x"][0] <= 1.5)
    return met


def _cell(value: tuple, digits: int) -> str:
    mean, half = value
    return f"{mean:.{digits}f}" if half is None else f"{mean:.{digits}f} ± {half:.{digits}f}"


def markdown(summary: dict) -> str:
    lines = []
    for name, cells in summary.items():
        met = goal(cells)
        lines.append(f"\n**{name}**\n")
        lines.append("| setting | seeds | " + " | ".join(h for _, h in METRICS) + " | goal |")
        lines.append("|---|---:|" + "---:|" * len(METRICS) + "---|")
        for label, cell in cells.items():
            digits = {"tpot_p99_x": 2, "gain_pct": 2}
            values = " | ".join(_cell(cell[k], digits.get(k, 1)) for k, _ in METRICS)
            mark = "" if label not in met else ("met" if met[label] else "no")
            lines.append(f"| {label} | {cell['seeds']} | {values} | {mark} |")
    return "\n".join(lines)


def plot(summary: dict, path: pathlib.Path) -> None:
    """Gain over DyntraLB off against the longest pause, one panel per workload, the
    Pareto front (more gain, shorter pause) joined."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(summary)
    fig, axes = plt.subplots(1, len(names), figsize=(5.2 * len(names), 4.6), squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        cells = {k: v for k, v in summary[name].items() if k != "off"}
        points, labels = [], {}
        for label, cell in cells.items():
            x = max(cell["longest_paused_ms"][0], 1.0) / 1e3
            y, yerr = cell["gain_pct"]
            xerr = cell["longest_paused_ms"][1]
            ax.errorbar(x, y, yerr=yerr or 0, xerr=(xerr or 0) / 1e3, fmt="o", capsize=3,
                        color="C3" if label == "production" else "C0")
            # settings that land on one point (within the plot's resolution) share a label
            key = (round(math.log10(x), 1), round(y, 1))
            labels.setdefault(key, [x, y, []])[2].append(label)
            points.append((x, y))
        for i, (x, y, names) in enumerate(sorted(labels.values())):  # alternate: neighbours
            ax.annotate("\n".join(names), (x, y), textcoords="offset points",
                        xytext=(5, -4 if i % 2 == 0 else 6), fontsize=7,
                        va="top" if i % 2 == 0 else "bottom")
        front, best = [], -math.inf
        for x, y in sorted(points):
            if y > best:
                front.append((x, y))
                best = y
        ax.plot(*zip(*front, strict=True), "--", color="C2", label="Pareto front")
        prod = summary[name].get("production")
        if prod is not None and prod["gain_pct"][0] > 0:
            ax.axhline(0.75 * prod["gain_pct"][0], color="grey", lw=0.8, ls=":",
                       label="75 % of production's gain")
        ax.axvline(2.0, color="grey", lw=0.8, ls="-.", label="2 s")
        ax.axhline(0, color="black", lw=0.5)
        ax.set_xscale("log")
        ax.set_xlabel("longest pause of one request (s, log)")
        ax.set_ylabel("throughput gain over DyntraLB off (%)")
        seeds = max(c["seeds"] for c in cells.values())
        ax.set_title(f"{name} ({seeds} seed{'s' if seeds > 1 else ''}, 95 % CI)")
        ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# ---------------------------------------------------------------------------- main

def _seeds(items: list[str]) -> dict[str, int]:
    seeds = {"default": 1, "pr12292": 10, "gpqa": 1, "mooncake": 1}
    for item in items:
        name, _, count = item.partition("=")
        if name not in seeds or not count.isdigit() or int(count) < 1:
            raise argparse.ArgumentTypeError(f"--seeds: expected NAME=N with NAME one of "
                                             f"{list(seeds)}, got {item!r}")
        seeds[name] = int(count)
    return seeds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", nargs="+", default=["default", "pr12292", "gpqa",
                                                           "mooncake"])
    parser.add_argument("--seeds", nargs="*", default=[], metavar="NAME=N",
                        help="seeds per workload (default: default=1 pr12292=10 gpqa=1 "
                             "mooncake=1)")
    parser.add_argument("--settings", nargs="+", default=LABELS, metavar="LABEL")
    parser.add_argument("--mooncake-s", type=float, default=45.0)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--json", type=pathlib.Path)
    parser.add_argument("--resume", action="store_true",
                        help="keep the runs --json holds, run only the others")
    parser.add_argument("--from-json", type=pathlib.Path,
                        help="run nothing: summarise the runs of this JSON")
    parser.add_argument("--plot", type=pathlib.Path)
    args = parser.parse_args(argv)
    try:
        seeds = _seeds(args.seeds)
    except argparse.ArgumentTypeError as exc:
        parser.error(str(exc))
    unknown = sorted(set(args.settings) - set(LABELS))
    if unknown:
        parser.error(f"--settings: unknown {unknown}; known: {LABELS}")

    runs: list[dict] = []
    if args.from_json:
        runs = json.loads(args.from_json.read_text())["runs"]
    else:
        if args.resume and args.json and args.json.exists():
            runs = json.loads(args.json.read_text())["runs"]
        done = {(r["workload"], r["seed"], r["setting"]) for r in runs}
        settings = ["off", *[s for s in args.settings if s != "off"]]
        jobs = [(name, seed, label) for name in args.workloads
                for seed in range(seeds[name]) for label in settings
                if (name, seed, label) not in done]
        print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python "
              f"{platform.python_version()}; {len(jobs)} runs, {args.jobs} at a time, "
              "rank threads", flush=True)
        with tempfile.TemporaryDirectory(prefix="starvation-") as tmp, \
                futures.ProcessPoolExecutor(args.jobs) as pool:
            pending = {pool.submit(run_job, *job, args.mooncake_s, tmp): job for job in jobs}
            for done_job in futures.as_completed(pending):
                r = done_job.result()
                runs.append(r)
                print(f"  {r['workload']} seed {r['seed']} {r['setting']}: "
                      f"{r['throughput_tok_s']:.1f} tok/s, longest pause "
                      f"{r['longest_paused_ms']:.0f} ms, {r['cpu_s']:.0f} s CPU", flush=True)
                if args.json:
                    args.json.write_text(json.dumps({"args": sys.argv[1:], "runs": runs},
                                                    indent=1) + "\n")
    summary = summarise(runs)
    print(markdown(summary))
    if args.plot:
        plot(summary, args.plot)
        print(f"\nplot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
