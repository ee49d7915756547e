"""Is `dyntra-emu tune` worth having? A full `sweep` grid of DyntraLB's five knobs against
one `tune` study with at most a third of the grid's runs, on the same workload and seeds.

For each workload, the grid (``GRID``: mode x start_step x bubble_threshold in blocks and
as a ratio x long_req_block_threshold x dynamic_max_step, 48 points) runs as `dyntra-emu
sweep` once per search seed (each with its own DyntraLB-off baseline), and every point's
throughput gain over that baseline is averaged over the seeds with its 95 % confidence
interval (Student's t; none on a fixed trace, which is one workload whatever the seed).
Then `dyntra-emu tune` runs with the default objectives (throughput gain, TPOT p99,
longest pause; NSGA-II) and a trial budget that keeps its search and its A/B together
within a third of the grid's runs. The check: the mean gain tune's recommendation
reached on the search seeds lies within the best grid point's 95 % CI (or above it);
and, on a recipe, its A/B against DyntraLB off on fresh seeds wins (the CI of the gain
above 0). Runs are exact counts (each command's own record); wall times are the whole
commands'.

Workloads: the PR recipe with the flags of benchmarks/pr12292.py (dp 8, block size 2048,
16 requests per rank, 400 req/s, max concurrency 128), ``--n`` requests per seed, 3
seeds; and a bundled trace (``--bundled``, default ``default``: dp 4, block size 128).

    .venv/bin/python benchmarks/tune_vs_grid.py --out /tmp/tvg             # both workloads
    .venv/bin/python benchmarks/tune_vs_grid.py --only pr --n 100 --out /tmp/tvg
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from emu.recipes import mean_ci  # noqa: E402

BASE = json.dumps({"scheduler_config": {"dyntra_lb_config": {"enabled": True}}})
# The same for both workloads but long_req_block_threshold, which is in blocks of the
# workload's block size (the PR recipe's long prompts have 45 blocks of 2048 tokens; the
# bundled default's largest has 961 of 128).
GRID = {"mode": "static,dynamic", "start_step": "0,250", "bubble_threshold": "1,5,0.2",
        "dynamic_max_step": "64,256"}
WORKLOADS = {
    "pr": {"flags": ["--dp", "8", "--block-size", "2048", "--max-num-seqs", "16",
                     "--max-concurrency", "128"], "long_req": "20,40", "seeds": 3},
    "bundled": {"flags": ["--dp", "4", "--block-size", "128"], "long_req": "300,700",
                "seeds": 1},
}


def _command(args: list[str], out: pathlib.Path) -> float:
    """Run ``dyntra-emu ARGS --out OUT --quiet``; its wall time."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "emu", *args, "--quiet", "--out", str(out)],
                   check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
    return time.perf_counter() - start


def _interval(values: list[float]) -> tuple[float, float]:
    return (values[0], 0.0) if len(values) == 1 else mean_ci(values)


def grid(workload: str, flags: list[str], seeds: list[int], jobs: int, out: pathlib.Path,
         long_req: str) -> dict:
    """The sweep on each seed; every point's gain over its seed's baseline, mean and CI."""
    gains: dict[str, list[float]] = {}
    runs, wall = 0, 0.0
    grids = [a for key, values in {**GRID, "long_req_block_threshold": long_req}.items()
             for a in ("--grid", f"{key}={values}")]
    for seed in seeds:
        sweep_dir = out / f"sweep-seed{seed}"
        if not (sweep_dir / "sweep.json").exists():
            wall += _command(["sweep", "--workload", workload, *flags, "--device", "cpu",
                              "--seed", str(seed), "--additional-config", BASE, *grids,
                              "--yes", "--jobs", str(jobs)], sweep_dir)
        sweep = json.loads((sweep_dir / "sweep.json").read_text())
        runs += len(sweep["rows"])
        for row in sweep["rows"][1:]:
            gains.setdefault(row["label"], []).append(row["throughput_tok_s_delta_pct"])
    points = {label: _interval(values) for label, values in gains.items()}
    best = max(points, key=lambda label: points[label][0])
    return {"runs": runs, "wall_s": wall, "points": len(points), "best": best,
            "best_gain": points[best]}


def tune(workload: str, flags: list[str], seeds: int, trials: int, jobs: int,
         out: pathlib.Path) -> dict:
    tune_dir = out / "tune"
    wall = 0.0
    if not (tune_dir / "tune.json").exists():
        seed_flags = ["--seeds", str(seeds), "--ab-seeds", str(seeds)] if seeds > 1 else []
        wall = _command(["tune", "--workload", workload, *flags, "--device", "cpu",
                         "--additional-config", BASE, "--trials", str(trials), *seed_flags,
                         "--jobs", str(jobs)], tune_dir)
    report = json.loads((tune_dir / "tune.json").read_text())
    rec = report["recommended"]
    ab = report["ab"]
    return {"runs": report["runs"]["search"] + report["runs"]["ab"],
            "search_runs": report["runs"]["search"], "ab_runs": report["runs"]["ab"],
            "wall_s": wall, "trials": report["trial_counts"], "recommended": rec["values"],
            "gain": tuple(rec["estimates"]["throughput"]),
            "ab_gain": None if ab is None else (ab["deltas"][0]["mean"],
                                                ab["deltas"][0]["ci95"]),
            "confidence": report["confidence"]}


def trials_within(grid_runs: int, seeds: int) -> int:
    """The most trials whose runs (the baselines, every trial on every seed, the A/B on
    as many fresh seeds) stay within a third of the grid's runs."""
    ab = 2 * seeds if seeds > 1 else 0
    return (grid_runs // 3 - seeds - ab) // seeds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=200, help="requests of the PR recipe")
    parser.add_argument("--bundled", default="default", help="the bundled workload")
    parser.add_argument("--only", choices=tuple(WORKLOADS), help="one workload only")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", type=pathlib.Path, required=True,
                        help="where the commands write (kept: a second call reuses what "
                             "finished)")
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python "
          f"{platform.python_version()}; --jobs {args.jobs}", flush=True)
    results = {}
    for name, setup in WORKLOADS.items():
        if args.only not in (None, name):
            continue
        workload = (f"recipe:pr12292,n={args.n},rate=400" if name == "pr" else args.bundled)
        seeds = list(range(setup["seeds"]))
        out = args.out / name
        g = grid(workload, setup["flags"], seeds, args.jobs, out, setup["long_req"])
        trials = trials_within(g["runs"], len(seeds))
        t = tune(workload, setup["flags"], len(seeds), trials, args.jobs, out)
        mean, half = g["best_gain"]
        within = t["gain"][0] >= mean - half
        results[name] = {"workload": workload, "grid": g, "tune": t, "trials": trials,
                         "within_ci": within}
        print(f"\n{workload} ({' '.join(setup['flags'])}), {len(seeds)} seed(s):")
        print(f"  grid: {g['points']} points, {g['runs']} runs, {g['wall_s']:.0f} s; best "
              f"{g['best']}: {mean:+.2f} ± {half:.2f} %")
        print(f"  tune: {trials} trials ({t['trials']}), {t['runs']} runs ({t['search_runs']} "
              f"search + {t['ab_runs']} A/B), {t['wall_s']:.0f} s; recommended "
              f"{t['recommended']}: {t['gain'][0]:+.2f} ± {t['gain'][1]:.2f} % on the search "
              f"seeds; within the grid best's CI: {'yes' if within else 'NO'}")
        if t["ab_gain"] is not None:
            print(f"  fresh-seed A/B: {t['ab_gain'][0]:+.2f} ± {t['ab_gain'][1]:.2f} %")
        print(f"  {t['confidence']}", flush=True)
    (args.out / "tune_vs_grid.json").write_text(json.dumps(results, indent=1) + "\n")
    return 0 if all(r["within_ci"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
