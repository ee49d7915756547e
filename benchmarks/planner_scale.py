"""Production's planner at scale (docs/upstream-findings.md, "Production's planner at
scale"): vllm-ascend's ``_balance_load`` (imported from the vllm-ascend tree) against our
compiled planner over dp x max_num_seqs x {uniform, skewed} snapshots: the time of each,
whether their plans are equal, and what production's planner costs next to the decode
step it delays.

Snapshots are ``benchmarks/planner_bench.py``'s, payload-full: every rank runs
``max_num_seqs`` requests with as many waiting; *uniform* requests are lognormal around
30 blocks, *skewed* puts about half of a quarter of the ranks' requests at 700-2,500
blocks. Threshold 5 (the default). Times are process CPU time (a shared machine inflates
wall time far more): the median of ``--repeats`` calls per snapshot (one call when
production's takes over a second), then the median over ``--cases`` snapshots.

Columns: both planners' medians; ``model ms``, what the bundled profiles charge for the
planner on those snapshots (``emu.rank.control_plane``, fitted to production's);
``step ms``, the DP step the plan comes after under the default ``kv-token`` profile at
block size 128 (the busiest rank's own cost: 20 ms + 0.15 us per KV token + 5 us per
scheduled token); ``prod/step``, production's median over it; ``same``, snapshots whose
plans are equal. The first setting (in grid order) whose production planner takes more
than 5 % of its step is named at the end.

    .venv-upstream/bin/python benchmarks/planner_scale.py                   # the grid
    .venv-upstream/bin/python benchmarks/planner_scale.py --dp 4 8 --max-num-seqs 16 64
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np
from planner_bench import snapshot
from sidebyside import TREE, end_line, machine_line

from dyntra_lb.planner import front as planner
from emu.rank.control_plane import planner_work
from emu.rank.costs import PROFILES

THRESHOLD = 5.0
BLOCK_SIZE = 128
BUDGET = 0.05  # the share of a step that counts as costly
# A production call over this many seconds is timed once.
_LONG_S = 1.0


def production_planner():
    from emu.impl.vllm_ascend.tree import import_tree, resolve

    return import_tree(resolve(TREE).root).DyntraLBDPEngineCoreProc._balance_load


def step_ms(snap, mns: int) -> float:
    """The DP step time (ms) before this plan: the busiest rank's kv-token cost."""
    cost = PROFILES["kv-token"].cost
    return max(cost(sum(blks[:split]), sum(blks[:split]) * BLOCK_SIZE, split, split, False)
               for blks, split in snap) / 1e3


def cpu_time(fn, repeats: int):
    """(result, median process CPU seconds): one call, more if it was quick."""
    start = time.process_time()
    result = fn()
    times = [time.process_time() - start]
    if times[0] < _LONG_S:
        for _ in range(repeats - 1):
            start = time.process_time()
            fn()
            times.append(time.process_time() - start)
    return result, statistics.median(times)


def cell(rng, prod, dp: int, mns: int, suite: str, cases: int, repeats: int) -> dict:
    """Time both planners on ``cases`` snapshots of one grid cell."""
    terms = PROFILES["kv-token"].control_plane
    kw = {"max_num_seqs": mns, "threshold": THRESHOLD}
    prod_s, ours_s, model_us, steps, same = [], [], [], [], 0
    for _ in range(cases):
        snap = snapshot(rng, dp, mns, suite == "skewed")
        expected, t = cpu_time(lambda s=snap: prod(s, dp, **kw), repeats)
        prod_s.append(t)
        plans, t = cpu_time(lambda s=snap: planner.balance_load(s, dp, **kw), repeats)
        ours_s.append(t)
        same += [p.to_dict() for p in plans] == expected
        model_us.append(terms.planner_us(planner_work(snap, dp, planner="reference", **kw)))
        steps.append(step_ms(snap, mns))
    prod_ms = statistics.median(prod_s) * 1e3
    step = statistics.median(steps)
    return {"suite": suite, "dp": dp, "max_num_seqs": mns, "cases": cases,
            "production_ms": prod_ms, "ours_ms": statistics.median(ours_s) * 1e3,
            "model_ms": statistics.median(model_us) / 1e3, "step_ms": step,
            "production_share": prod_ms / step, "same_plans": same}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dp", type=int, nargs="+", default=[4, 8, 16, 32])
    parser.add_argument("--max-num-seqs", type=int, nargs="+", default=[16, 64, 128, 256])
    parser.add_argument("--suites", nargs="+", default=["uniform", "skewed"],
                        choices=["uniform", "skewed"])
    parser.add_argument("--cases", type=int, default=3, help="snapshots per cell")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="FILE", help="also write the rows here")
    args = parser.parse_args(argv)
    print(machine_line(f"production's planner at scale: seed {args.seed}, {args.cases} "
                       f"snapshots per cell, CPU time median of {args.repeats} (1 call "
                       f"over {_LONG_S:g} s); vllm-ascend tree {TREE}"))
    planner.warm_up()
    prod = production_planner()
    rng = np.random.default_rng(args.seed)
    print(f"{'suite':<8} {'dp':>3} {'mns':>4} {'production ms':>14} {'ours ms':>8} "
          f"{'model ms':>9} {'step ms':>8} {'prod/step':>9} {'same':>5}")
    rows, first = [], None
    for dp in args.dp:
        for mns in args.max_num_seqs:
            for suite in args.suites:
                row = cell(rng, prod, dp, mns, suite, args.cases, args.repeats)
                rows.append(row)
                print(f"{suite:<8} {dp:>3} {mns:>4} {row['production_ms']:>14.3f} "
                      f"{row['ours_ms']:>8.3f} {row['model_ms']:>9.3f} "
                      f"{row['step_ms']:>8.1f} {row['production_share']:>9.1%} "
                      f"{row['same_plans']:>2}/{row['cases']}", flush=True)
                if first is None and row["production_share"] > BUDGET:
                    first = row
    if first is not None:
        print(f"first over {BUDGET:.0%} of a step: {first['suite']} dp {first['dp']} x "
              f"max_num_seqs {first['max_num_seqs']} ({first['production_share']:.1%})")
    else:
        print(f"production's planner stays under {BUDGET:.0%} of a step everywhere")
    different = sum(r["cases"] - r["same_plans"] for r in rows)
    print(f"plans of ours different from production's: {different}")
    print(end_line())
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 1 if different else 0


if __name__ == "__main__":
    sys.exit(main())
