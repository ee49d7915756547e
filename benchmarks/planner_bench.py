"""Planner speed: the real planner (dyntra_lb.planner) against the literal oracle of spec D
(tests/literal_planner.py), side by side in one process, on generated snapshots.

Suites (payload-shaped: every rank's running list and waiting list both hold
``max_num_seqs`` requests, as on a loaded decode node):
  skewed   a quarter of the ranks hold about half of their requests at 700-2,500 blocks
           (uniform), everything else is lognormal around 30 blocks (median 30, sigma 0.8)
  uniform  every request lognormal around 30 blocks
at dp=8 / max_num_seqs=128 and dp=16 / max_num_seqs=256, threshold 5.0 (the default).

Every plan of the real planner (with and without a no-op observer) must equal the
oracle's; the script exits 1 otherwise. Times are wall-clock medians in ms: per snapshot
the oracle runs once and the real planner ``--repeats`` times (median taken), then the
median over the suite's snapshots. The ratio is oracle median / planner median.

    python benchmarks/planner_bench.py            # full run (about two minutes)
    python benchmarks/planner_bench.py --quick    # same tables, fewer snapshots
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from dyntra_lb.planner import balance_load

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("literal_planner",
                                               ROOT / "tests" / "literal_planner.py")
literal_planner = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(literal_planner)

THRESHOLD = 5.0
# (suite, dp, max_num_seqs, share of --cases): the oracle takes seconds per call at
# dp=16 / 256 when skewed, so that suite gets a third of the snapshots.
SUITES = [
    ("skewed", 8, 128, 1.0),
    ("skewed", 16, 256, 1 / 3),
    ("uniform", 8, 128, 1.0),
    ("uniform", 16, 256, 1 / 3),
]


def snapshot(rng: np.random.Generator, dp: int, max_num_seqs: int, skewed: bool):
    """One gathered snapshot as ``requests_by_rank``: running then waiting, both full."""
    heavy = set(rng.choice(dp, size=max(1, dp // 4), replace=False).tolist()) if skewed else ()
    rows = []
    for rank in range(dp):
        n = 2 * max_num_seqs
        blks = np.maximum(1, np.rint(rng.lognormal(np.log(30), 0.8, size=n))).astype(np.int64)
        if rank in heavy:
            long = rng.random(n) < 0.5
            blks[long] = rng.integers(700, 2501, size=int(long.sum()))
        rows.append((blks.tolist(), max_num_seqs))
    return rows


def _timed(fn):
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def run_suite(rng, suite, dp, max_num_seqs, cases, repeats):
    """Time both implementations on ``cases`` snapshots; returns (row dict, mismatches)."""
    oracle_s, real_s, observed_s, mismatches = [], [], [], 0
    for _ in range(cases):
        snap = snapshot(rng, dp, max_num_seqs, suite == "skewed")
        expected, t = _timed(lambda snap=snap: literal_planner.literal_balance_load(
            snap, dp, max_num_seqs=max_num_seqs, threshold=THRESHOLD))
        oracle_s.append(t)
        times, times_obs = [], []
        for _ in range(repeats):
            plans, t = _timed(lambda snap=snap: balance_load(
                snap, dp, max_num_seqs=max_num_seqs, threshold=THRESHOLD))
            times.append(t)
            observed, t = _timed(lambda snap=snap: balance_load(
                snap, dp, max_num_seqs=max_num_seqs, threshold=THRESHOLD,
                observer=_no_op))
            times_obs.append(t)
        real_s.append(statistics.median(times))
        observed_s.append(statistics.median(times_obs))
        for got in (plans, observed):
            if [p.to_dict() for p in got] != expected:
                mismatches += 1
    ms = {name: statistics.median(v) * 1e3
          for name, v in (("oracle", oracle_s), ("real", real_s), ("observer", observed_s))}
    return {"suite": suite, "dp": dp, "max_num_seqs": max_num_seqs, "cases": cases, **ms,
            "ratio": ms["oracle"] / ms["real"]}, mismatches


def _no_op(event) -> None:
    pass


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0, help="snapshot generator seed")
    parser.add_argument("--cases", type=int, default=30,
                        help="snapshots per dp=8 suite (dp=16 suites get a third)")
    parser.add_argument("--repeats", type=int, default=5,
                        help="timed runs of the real planner per snapshot")
    parser.add_argument("--quick", action="store_true",
                        help="3 snapshots per dp=8 suite, 1 per dp=16 suite")
    args = parser.parse_args(argv)
    cases = 3 if args.quick else args.cases
    if cases < 1 or args.repeats < 1:
        parser.error("--cases and --repeats must be >= 1")

    print(f"planner benchmark: seed={args.seed} threshold={THRESHOLD} "
          f"repeats={args.repeats}{' (quick)' if args.quick else ''}")
    print(f"python {platform.python_version()}, numpy {np.__version__}, "
          f"{os.cpu_count()} CPUs ({_cpu_model()}), {platform.system()}")
    header = (f"{'suite':<8} {'dp':>3} {'max_num_seqs':>12} {'cases':>5} "
              f"{'oracle ms':>11} {'planner ms':>11} {'ratio':>8} {'+observer ms':>13}")
    print(header)
    print("-" * len(header))
    rng = np.random.default_rng(args.seed)
    failed = 0
    for suite, dp, max_num_seqs, share in SUITES:
        n = max(1, round(cases * share))
        row, mismatches = run_suite(rng, suite, dp, max_num_seqs, n, args.repeats)
        failed += mismatches
        print(f"{suite:<8} {dp:>3} {max_num_seqs:>12} {n:>5} {row['oracle']:>11.2f} "
              f"{row['real']:>11.3f} {row['ratio']:>7.0f}x {row['observer']:>13.3f}",
              flush=True)
    if failed:
        print(f"FAIL: {failed} plan(s) differ from the literal oracle")
        return 1
    print("all plans identical to the literal oracle")
    return 0


if __name__ == "__main__":
    sys.exit(main())
