"""The planner inside vllm-ascend's engine: vllm-ascend's ``_balance_load`` against ours
(``dyntra_lb.planner.balance_load``, ``RunSpec.planner="reference"``), per planning step.

Each pair is two ``--impl vllm-ascend`` cluster runs on the same trace, config and seed,
one per planner (the order alternates between pairs); their event logs must be
byte-identical (the script exits 1 otherwise), so both planners plan exactly the same
snapshots. Per run, every rank's wall log gives ``planner_s`` for each step where the
planner ran; the table shows p50 / p99 over all ranks and steps (median over the
pairs), and the ratio vllm-ascend / reference. Ours is timed with the conversion of its plans
to vllm-ascend's dicts. Needs vLLM 0.27.1 (the README's ``.venv-upstream``).

    .venv-upstream/bin/python benchmarks/planner_swap_bench.py            # dp 4, longtail
    .venv-upstream/bin/python benchmarks/planner_swap_bench.py --n 80 --repeats 1
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from emu.cluster import RunSpec, run_cluster  # noqa: E402
from emu.workload import load_trace  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parent.parent
TREE = os.environ.get("DYNTRA_VLLM_ASCEND") or str(REPO.parent / "shared" / "upstream" /
                                                   "vllm-ascend")
STATIC = {"scheduler_config": {"dyntra_lb_config": {
    "enabled": True, "mode": "static", "start_step": 0}}}
PLANNERS = ("vllm-ascend", "reference")


def one_run(planner: str, trace, dp: int, out: pathlib.Path) -> dict:
    spec = RunSpec(trace=trace, dp_size=dp, out_dir=out, additional_config=STATIC,
                   device="cpu", impl="vllm-ascend", vllm_ascend=TREE, planner=planner)
    start = time.perf_counter()
    result = run_cluster(spec)
    times = [w["planner_s"] for path in result.wall_logs for w in map(json.loads, path.open())
             if w.get("planner_s")]
    return {"times": np.array(times), "wall_s": time.perf_counter() - start,
            "events": [p.read_bytes() for p in result.event_logs],
            "steps": result.ranks[0].steps, "plans": result.ranks[0].num_plans}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dp", type=int, default=4)
    parser.add_argument("--workload", default="longtail", help="bundled workload")
    parser.add_argument("--n", type=int, default=None,
                        help="only the first N requests of the workload (default: all)")
    parser.add_argument("--repeats", type=int, default=1, help="pairs of runs")
    args = parser.parse_args()
    trace = load_trace(REPO / "fixtures" / "workloads" / f"{args.workload}.jsonl",
                       dp_size=args.dp)[:args.n]
    print(f"machine: {platform.machine()}, {os.cpu_count()} cpus, Python "
          f"{platform.python_version()}, load average {os.getloadavg()[0]:.1f}; workload "
          f"{args.workload} ({len(trace)} requests), dp {args.dp}, static mode from step 0")
    stats: dict[str, list[tuple[float, float]]] = {p: [] for p in PLANNERS}
    with tempfile.TemporaryDirectory(prefix="planner-swap-") as tmp:
        for pair in range(args.repeats):
            order = PLANNERS if pair % 2 == 0 else PLANNERS[::-1]
            runs = {p: one_run(p, trace, args.dp, pathlib.Path(tmp) / f"{pair}-{p}")
                    for p in order}
            if runs["reference"]["events"] != runs["vllm-ascend"]["events"]:
                print("event logs differ between the planners", file=sys.stderr)
                return 1
            for p, run in runs.items():
                stats[p].append((np.percentile(run["times"], 50) * 1e3,
                                 np.percentile(run["times"], 99) * 1e3))
            steps, plans = runs["reference"]["steps"], runs["reference"]["plans"]
    print(f"{steps} steps, {plans} planning steps per rank; event logs byte-identical")
    print(f"{'planner':<12} {'p50 ms':>8} {'p99 ms':>8}")
    p50 = {p: statistics.median(s[0] for s in stats[p]) for p in PLANNERS}
    p99 = {p: statistics.median(s[1] for s in stats[p]) for p in PLANNERS}
    for p in PLANNERS:
        print(f"{p:<12} {p50[p]:>8.3f} {p99[p]:>8.3f}")
    print(f"ratio vllm-ascend / reference: p50 {p50['vllm-ascend'] / p50['reference']:.2f}x, "
          f"p99 {p99['vllm-ascend'] / p99['reference']:.2f}x")
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
