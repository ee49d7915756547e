"""The planner terms of the control-plane cost (docs/cost-models.md, "DyntraLB's control
plane"), fitted: production's ``_balance_load`` (imported from the vllm-ascend tree) and
our compiled planner timed on the same snapshots, against the work
``emu.rank.control_plane.planner_work`` counts on each (the function the ranks charge
with: requests parsed, (running, waiting) pairs the swap searches examine, rounds).

Snapshots, all planned with threshold 5 (the default) and ``max_num_seqs`` of their size:

- generated (``benchmarks/planner_bench.py``'s generator): *uniform* (every request
  lognormal around 30 blocks) and *skewed* (a quarter of the ranks hold about half of
  their requests at 700-2,500 blocks), payload-full (``max_num_seqs`` running and as
  many waiting per rank) and *partial* (half to all of the slots running, 0 to
  ``max_num_seqs`` waiting), at dp 2-16 x max_num_seqs 16-128;
- gathered in emulated runs (``--runs``): the snapshots a kit run's rank 0 logged with
  diagnostics on (``emu.offline.logscan``), sampled evenly: the PR #12292 recipe at dp 8
  x 16 sequences (the PR's setting) and the bundled longtail workload at dp 4 x 64.

Times are process CPU time (a shared machine inflates wall time far more), the median
of ``--repeats`` calls. The fit: non-negative least squares of the relative error
(each snapshot weighs 1/time, so a 0.05 ms snapshot counts as much as a 1 s one),
dropping a term whose coefficient comes out negative. Printed: the coefficients in the
units of ``ControlPlaneCost`` and the relative error (median, p90, max) per group.

    .venv-upstream/bin/python benchmarks/planner_cost_fit.py --json fit.json
    .venv-upstream/bin/python benchmarks/planner_cost_fit.py --quick      # fewer snapshots
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time

import numpy as np
from planner_bench import snapshot
from sidebyside import REPO, TREE, end_line, machine_line

from dyntra_lb.planner import front as planner
from emu.offline.logscan import read_log
from emu.rank.control_plane import planner_work
from emu.rank.costs import PROFILES
from emu.run import run_cluster
from emu.spec import RunSpec
from emu.workload import TraceRequest, load_trace

THRESHOLD = 5.0
TERMS = ("planner_fixed_s", "planner_per_request_s", "planner_per_pair_s",
         "planner_per_round_s")
GRID = [(dp, mns) for dp in (2, 4, 8, 16) for mns in (16, 32, 64, 128)]
# Above this many pairs a call of production's planner takes seconds: one timed call.
_LONG_PAIRS = 2_000_000


def production_planner():
    from emu.impl.vllm_ascend.tree import import_tree, resolve

    return import_tree(resolve(TREE).root).DyntraLBDPEngineCoreProc._balance_load


def partial(rng, dp: int, mns: int, skewed: bool):
    """A generated snapshot with half to all slots running and 0 to ``mns`` waiting."""
    rows = []
    for blks, _ in snapshot(rng, dp, mns, skewed):
        running = int(rng.integers(max(1, mns // 2), mns + 1))
        waiting = int(rng.integers(0, mns + 1))
        row = blks[:running] + blks[mns:mns + waiting]
        rows.append((row + [0] * (2 * mns - len(row)), running))
    return rows


def generated(rng, per_cell: int):
    """(group, dp, max_num_seqs, snapshot) over GRID, both suites, full and partial."""
    for dp, mns in GRID:
        for suite in ("uniform", "skewed"):
            for shape in ("full", "partial"):
                for _ in range(per_cell):
                    make = snapshot if shape == "full" else partial
                    yield f"{suite} {shape}", dp, mns, make(rng, dp, mns, suite == "skewed")


def _pr_trace(n: int):
    sys.path.insert(0, str(REPO / "benchmarks"))
    from pr12292 import trace

    return trace(n, 400.0, 0)


# (group, dp, max_num_seqs, block size, max concurrency, trace)
RUNS = (
    ("pr12292 run", 8, 16, 2048, 128, lambda: _pr_trace(300)),
    ("longtail run", 4, 64, 128, None,
     lambda: load_trace(REPO / "fixtures" / "workloads" / "longtail.jsonl")),
)


def gathered(per_run: int):
    """(group, dp, max_num_seqs, snapshot): snapshots rank 0 of a kit run logged, with
    diagnostics on, static mode from step 0, sampled evenly (``per_run`` of each)."""
    config = {"scheduler_config": {"dyntra_lb_config": {
        "enabled": True, "mode": "static", "start_step": 0, "enable_diagnostics": True}}}
    for group, dp, mns, block_size, concurrency, make_trace in RUNS:
        with tempfile.TemporaryDirectory() as out:
            requests = [TraceRequest(r.request_id, r.arrival_s, r.prompt_tokens,
                                     r.output_tokens) for r in make_trace()]
            run_cluster(RunSpec(trace=requests, dp_size=dp, out_dir=out,
                                additional_config=config, max_num_seqs=mns,
                                block_size=block_size, max_concurrency=concurrency,
                                device="cpu", transport="thread"))
            snaps = [s.requests_by_rank for s in read_log(f"{out}/rank0.log").snapshots
                     if s.requests_by_rank is not None]
        step = max(1, len(snaps) // per_run)
        for snap in snaps[::step][:per_run]:
            yield group, dp, mns, snap


def cpu_time(fn, repeats: int):
    """(result, median process CPU seconds of ``repeats`` calls)."""
    times = []
    for _ in range(repeats):
        start = time.process_time()
        result = fn()
        times.append(time.process_time() - start)
    return result, statistics.median(times)


def measure(snaps, prod, repeats: int) -> list[dict]:
    rows = []
    for group, dp, mns, snap in snaps:
        work = planner_work(snap, dp, max_num_seqs=mns, threshold=THRESHOLD,
                            planner="reference")
        reps = 1 if work.pairs > _LONG_PAIRS else repeats
        expected, t_prod = cpu_time(lambda s=snap, d=dp, m=mns: prod(
            s, d, max_num_seqs=m, threshold=THRESHOLD), reps)
        ours, t_ours = cpu_time(lambda s=snap, d=dp, m=mns: planner.balance_load(
            s, d, max_num_seqs=m, threshold=THRESHOLD), repeats)
        rows.append({"group": group, "dp": dp, "max_num_seqs": mns, **work._asdict(),
                     "production_s": t_prod, "ours_s": t_ours,
                     "same_plans": [p.to_dict() for p in ours] == expected})
    return rows


def fit(rows: list[dict], key: str) -> tuple[dict, np.ndarray]:
    """Non-negative weighted least squares of ``key`` on the work (see the docstring);
    returns the coefficients by term and the relative errors."""
    y = np.array([r[key] for r in rows])
    columns = {"planner_fixed_s": np.ones(len(rows)),
               "planner_per_request_s": np.array([r["requests"] for r in rows], float),
               "planner_per_pair_s": np.array([r["pairs"] for r in rows], float),
               "planner_per_round_s": np.array([r["rounds"] for r in rows], float)}
    terms = list(TERMS)
    weight = 1 / y
    while True:
        design = np.column_stack([columns[t] for t in terms])
        coef, *_ = np.linalg.lstsq(design * weight[:, None], y * weight, rcond=None)
        negative = [t for t, c in zip(terms, coef, strict=True) if c < 0]
        if not negative:
            break
        terms.remove(min(negative, key=lambda t: coef[terms.index(t)]))
    values = dict.fromkeys(TERMS, 0.0)
    values.update({t: float(c) for t, c in zip(terms, coef, strict=True)})
    predicted = sum(values[t] * columns[t] for t in TERMS)
    return values, predicted / y - 1


def report(rows: list[dict], key: str, label: str) -> dict:
    values, errors = fit(rows, key)
    print(f"\n{label}: " + ", ".join(
        f"{t} = {v * 1e6:.4g} us" if t != "planner_per_pair_s" else f"{t} = {v * 1e9:.4g} ns"
        for t, v in values.items()))
    print(f"  {'group':<16} {'n':>3} {'median ms':>10} {'max ms':>10} "
          f"{'|err| p50':>9} {'|err| p90':>9} {'|err| max':>9}")
    groups = sorted({r["group"] for r in rows})
    for group in [*groups, "all"]:
        chosen = [i for i, r in enumerate(rows) if group in ("all", r["group"])]
        times = [rows[i][key] * 1e3 for i in chosen]
        err = np.abs(errors[chosen])
        print(f"  {group:<16} {len(chosen):>3} {statistics.median(times):>10.3f} "
              f"{max(times):>10.3f} {np.percentile(err, 50):>9.0%} "
              f"{np.percentile(err, 90):>9.0%} {err.max():>9.0%}")
    return {"terms": values, "abs_rel_error_p50": float(np.percentile(np.abs(errors), 50)),
            "abs_rel_error_p90": float(np.percentile(np.abs(errors), 90))}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--per-cell", type=int, default=2,
                        help="generated snapshots per (dp, max_num_seqs, suite, shape)")
    parser.add_argument("--runs", type=int, default=40,
                        help="snapshots sampled from each emulated run (0: none)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="--per-cell 1 --runs 10")
    parser.add_argument("--json", metavar="FILE", help="write every row and both fits")
    args = parser.parse_args(argv)
    if args.quick:
        args.per_cell, args.runs = 1, 10
    print(machine_line(f"planner cost fit: seed {args.seed}, {args.per_cell} generated "
                       f"snapshots per cell, {args.runs} per emulated run, CPU time median "
                       f"of {args.repeats}; vllm-ascend tree {TREE}"))
    planner.warm_up()
    prod = production_planner()
    rng = np.random.default_rng(args.seed)
    snaps = list(generated(rng, args.per_cell))
    if args.runs:
        snaps += list(gathered(args.runs))
    rows = measure(snaps, prod, args.repeats)
    different = sum(not r["same_plans"] for r in rows)
    print(f"{len(rows)} snapshots; plans of ours different from production's: {different}")
    fits = {"production": report(rows, "production_s", "production's _balance_load"),
            "ours": report(rows, "ours_s", "our compiled planner")}
    default = PROFILES["kv-token"].control_plane
    print("\nthe bundled profiles' terms now: " + default.formula())
    print(end_line())
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "fits": fits}, f, indent=2)
    return 1 if different else 0


if __name__ == "__main__":
    sys.exit(main())
