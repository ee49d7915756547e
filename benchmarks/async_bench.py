"""The kit's async scheduling against its synchronous scheduling: wall time of the same
run side by side (issue 41: async at most 1.2x sync).

The run: vllm-ascend PR #12292's recipe as ``benchmarks/pr12292.py`` runs it (dp 8,
block size 2048, 16 requests per rank, 400 req/s with at most 128 in flight, MTP with 3
draft tokens, ``kv-token-mtp3``), DyntraLB as the PR's B (``{"enabled": true,
"long_req_block_threshold": 40}``), rank threads. ``--repeats`` pairs of runs in this
process (``run_cluster``), the order of each pair alternating; per mode the median wall
time of a run (start of the ranks to the last summary) and of its busy loop (the
slowest rank's), the steps it ran and its steps per second of loop, then the ratio
async / sync of the medians.

    .venv/bin/python benchmarks/async_bench.py                       # 1,000 requests, 3 pairs
    .venv/bin/python benchmarks/async_bench.py --n 300 --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from pr12292 import BLOCK_SIZE, CONFIG_B, DP, MAX_CONCURRENCY, MAX_NUM_SEQS, RATE, trace
from sidebyside import end_line, machine_line, pairs

from emu.rank.costs import PROFILES
from emu.run import run_cluster
from emu.spec import RunSpec

MODES = {"sync": False, "async": True}


def one_run(requests, async_scheduling: bool) -> dict:
    with tempfile.TemporaryDirectory(prefix="async-bench-") as tmp:
        spec = RunSpec(trace=requests, dp_size=DP, out_dir=tmp, additional_config=CONFIG_B,
                       max_num_seqs=MAX_NUM_SEQS, block_size=BLOCK_SIZE,
                       cost_model=PROFILES["kv-token-mtp3"], device="cpu",
                       max_concurrency=MAX_CONCURRENCY, transport="thread",
                       async_scheduling=async_scheduling, collective_timeout_s=600.0)
        start = time.perf_counter()
        result = run_cluster(spec)
        wall = time.perf_counter() - start
    loop = max(r.loop_wall_s for r in result.ranks)
    steps = result.ranks[0].steps
    return {"wall_s": wall, "loop_s": loop, "steps": steps, "rate": steps / loop}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1000, help="requests (default 1000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3, help="pairs of runs (default 3)")
    args = parser.parse_args()
    print(machine_line(f"PR #12292 recipe, n={args.n}, seed {args.seed}, dp {DP}, "
                       "kv-token-mtp3, DyntraLB B, rank threads"), flush=True)
    requests = trace(args.n, RATE, args.seed)
    one_run(requests[:20], True)  # warm-up: imports and first-use costs, not measured
    runs: dict[str, list[dict]] = {mode: [] for mode in MODES}
    for pair in pairs(list(MODES), args.repeats,
                      lambda _pair, mode: one_run(requests, MODES[mode])):
        for mode, run in pair.items():
            runs[mode].append(run)
            print(f"  {mode:<5} {run['wall_s']:7.1f} s wall, loop {run['loop_s']:7.1f} s, "
                  f"{run['steps']} steps", flush=True)
    print(f"{'mode':<6} {'wall s':>8} {'loop s':>8} {'steps':>7} {'steps/s':>8}  "
          f"(medians of {args.repeats})")
    median = {mode: {key: statistics.median(r[key] for r in rs)
                     for key in ("wall_s", "loop_s", "steps", "rate")}
              for mode, rs in runs.items()}
    for mode, m in median.items():
        print(f"{mode:<6} {m['wall_s']:>8.1f} {m['loop_s']:>8.1f} {m['steps']:>7.0f} "
              f"{m['rate']:>8.0f}")
    print(f"ratio async / sync: wall {median['async']['wall_s'] / median['sync']['wall_s']:.2f}x"
          f", loop {median['async']['loop_s'] / median['sync']['loop_s']:.2f}x, per step "
          f"{median['sync']['rate'] / median['async']['rate']:.2f}x")
    print(end_line())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
