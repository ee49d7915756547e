"""The planner inside vllm-ascend's engine: vllm-ascend's ``_balance_load`` against ours
(``dyntra_lb.planner.front.balance_load``, ``RunSpec.planner="reference"``), per planning step.

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
import pathlib
import sys
import tempfile
import time

from sidebyside import (
    REPO,
    STATIC,
    TREE,
    end_line,
    event_logs,
    machine_line,
    pairs,
    planner_times,
    print_planner_table,
)

from emu.run import run_cluster
from emu.spec import RunSpec
from emu.workload import load_trace

PLANNERS = ("vllm-ascend", "reference")


def one_run(planner: str, trace, dp: int, out: pathlib.Path) -> dict:
    spec = RunSpec(trace=trace, dp_size=dp, out_dir=out, additional_config=STATIC,
                   device="cpu", impl="vllm-ascend", vllm_ascend=TREE, planner=planner)
    start = time.perf_counter()
    result = run_cluster(spec)
    return {"times": planner_times(result.out_dir), "wall_s": time.perf_counter() - start,
            "events": event_logs(result.out_dir),
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
    print(machine_line(f"workload {args.workload} ({len(trace)} requests), dp {args.dp}, "
                       "static mode from step 0"))
    times: dict[str, list] = {p: [] for p in PLANNERS}
    with tempfile.TemporaryDirectory(prefix="planner-swap-") as tmp:
        for runs in pairs(PLANNERS, args.repeats, lambda pair, p: one_run(
                p, trace, args.dp, pathlib.Path(tmp) / f"{pair}-{p}")):
            if runs["reference"]["events"] != runs["vllm-ascend"]["events"]:
                print("event logs differ between the planners", file=sys.stderr)
                return 1
            for p, run in runs.items():
                times[p].append(run["times"])
            steps, plans = runs["reference"]["steps"], runs["reference"]["plans"]
    print(f"{steps} steps, {plans} planning steps per rank; event logs byte-identical")
    print_planner_table(times, "vllm-ascend", "reference")
    print(end_line())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
