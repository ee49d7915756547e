"""Planner speed: the literal oracle of docs/planner.md (tests/literal_planner.py, the production
algorithm), the Python planner (dyntra_lb.planner.front.balance_load_python) and the compiled
planner (dyntra_lb.planner.front.balance_load_native, numba) side by side in one process, on
generated snapshots.

Suites (payload-shaped: every rank's running list and waiting list both hold
``max_num_seqs`` requests, as on a loaded decode node):
  skewed   a quarter of the ranks hold about half of their requests at 700-2,500 blocks
           (uniform), everything else is lognormal around 30 blocks (median 30, sigma 0.8)
  uniform  every request lognormal around 30 blocks
at dp=8 / max_num_seqs=128, dp=16 / 256 and dp=32 / 256, threshold 5.0 (the default).

The compiled planner is timed on the input the coordinator gives it: int32 numpy
rows, views of the gathered buffers (``payload.unpack``); the column "lists ms" times it
on the same snapshots as Python lists (the input before issue 14's last step), so the
cost of the list conversion shows side by side. Every plan of both planners (the Python
one also with a no-op observer, the compiled one on both inputs) must equal the
oracle's; the script exits 1 otherwise. Times are medians in ms: per snapshot the oracle
runs once and each planner ``--repeats`` times (median taken), then the median over the
suite's snapshots. Wall-clock times, plus the compiled planner's process CPU time (less
sensitive to a shared machine). "step share" is the planner's median as a share of a
20 ms decode step. Before the suites, two fresh interpreters measure the compiled
planner's first call: compiling into an empty numba cache, then loading that cache.

    python benchmarks/planner_bench.py            # full run (about five minutes)
    python benchmarks/planner_bench.py --quick    # same tables, fewer snapshots
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from dyntra_lb.planner import front as planner

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("literal_planner",
                                               ROOT / "tests" / "literal_planner.py")
literal_planner = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(literal_planner)

THRESHOLD = 5.0
STEP_MS = 20.0
# (suite, dp, max_num_seqs, share of --cases): the oracle takes seconds per call at
# dp=16 / 256 when skewed (tens of seconds at dp=32), so those suites get fewer snapshots.
SUITES = [
    ("skewed", 8, 128, 1.0),
    ("skewed", 16, 256, 1 / 3),
    ("skewed", 32, 256, 1 / 15),
    ("uniform", 8, 128, 1.0),
    ("uniform", 16, 256, 1 / 3),
    ("uniform", 32, 256, 1 / 15),
]

# Run in a fresh interpreter: import, then time the first planner call (warm_up).
_FIRST_CALL = """
import time
t0 = time.perf_counter()
from dyntra_lb.planner import front as planner
t1, cpu = time.perf_counter(), time.process_time()
planner.warm_up()
print(planner.IMPLEMENTATION, t1 - t0, time.perf_counter() - t1, time.process_time() - cpu)
"""


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


def gathered_rows(snap):
    """``snap`` as the coordinator passes it: one int32 payload buffer per rank (block
    slots, split, long flag), each row a view of its buffer's block slots."""
    rows = []
    for blks, split in snap:
        buf = np.zeros(len(blks) + 2, np.int32)
        buf[:len(blks)] = blks
        buf[len(blks)] = split
        rows.append((buf[:len(blks)], int(buf[len(blks)])))
    return rows


def _timed(fn):
    """(result, wall seconds, process CPU seconds) of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def _median_of_runs(fn, repeats):
    """(last result, median wall seconds, median CPU seconds) over ``repeats`` calls."""
    walls, cpus = [], []
    for _ in range(repeats):
        result, wall, cpu = _timed(fn)
        walls.append(wall)
        cpus.append(cpu)
    return result, statistics.median(walls), statistics.median(cpus)


def run_suite(rng, suite, dp, max_num_seqs, cases, repeats, compiled):
    """Time the oracle and both planners on ``cases`` snapshots; returns (row of medians
    in ms, number of plans that differ from the oracle's)."""
    times = {"oracle": [], "python": [], "observer": [], "compiled": [], "compiled_cpu": [],
             "lists": []}
    mismatches = 0
    kw = {"max_num_seqs": max_num_seqs, "threshold": THRESHOLD}
    for _ in range(cases):
        snap = snapshot(rng, dp, max_num_seqs, suite == "skewed")
        expected, t, _ = _timed(lambda snap=snap: literal_planner.literal_balance_load(
            snap, dp, **kw))
        times["oracle"].append(t)
        results = []
        plans, t, _ = _median_of_runs(
            lambda snap=snap: planner.balance_load_python(snap, dp, **kw), repeats)
        times["python"].append(t)
        results.append(plans)
        plans, t, _ = _median_of_runs(lambda snap=snap: planner.balance_load_python(
            snap, dp, observer=_no_op, **kw), repeats)
        times["observer"].append(t)
        results.append(plans)
        if compiled:
            rows = gathered_rows(snap)
            plans, t, cpu = _median_of_runs(
                lambda rows=rows: planner.balance_load_native(rows, dp, **kw), repeats)
            times["compiled"].append(t)
            times["compiled_cpu"].append(cpu)
            results.append(plans)
            plans, t, _ = _median_of_runs(
                lambda snap=snap: planner.balance_load_native(snap, dp, **kw), repeats)
            times["lists"].append(t)
            results.append(plans)
        mismatches += sum(plans is None or [p.to_dict() for p in plans] != expected
                          for plans in results)
    return {name: statistics.median(v) * 1e3 for name, v in times.items() if v}, mismatches


def _no_op(event) -> None:
    pass


def first_call_costs() -> list[tuple[str, float, float, float]]:
    """(label, import s, first call s, its CPU s) in fresh interpreters: an empty numba
    cache (compile), then the same cache again (load)."""
    rows = []
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache)
        for label in ("empty cache (compile)", "warm cache (load)"):
            out = subprocess.run([sys.executable, "-c", _FIRST_CALL], env=env, check=True,
                                 capture_output=True, text=True).stdout.split()
            rows.append((label, float(out[1]), float(out[2]), float(out[3])))
    return rows


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def _fmt(row, key, digits):
    return f"{row[key]:.{digits}f}" if key in row else "-"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0, help="snapshot generator seed")
    parser.add_argument("--cases", type=int, default=30,
                        help="snapshots per dp=8 suite (dp=16 a third, dp=32 a fifteenth)")
    parser.add_argument("--repeats", type=int, default=5,
                        help="timed runs of each planner per snapshot")
    parser.add_argument("--quick", action="store_true",
                        help="3 snapshots per dp=8 suite, 1 per dp=16 and dp=32 suite")
    args = parser.parse_args(argv)
    cases = 3 if args.quick else args.cases
    if cases < 1 or args.repeats < 1:
        parser.error("--cases and --repeats must be >= 1")
    compiled = planner.IMPLEMENTATION == "numba"

    print(f"planner benchmark: seed={args.seed} threshold={THRESHOLD} "
          f"repeats={args.repeats}{' (quick)' if args.quick else ''}")
    print(f"python {platform.python_version()}, numpy {np.__version__}, "
          f"{os.cpu_count()} CPUs ({_cpu_model()}), {platform.system()}, "
          f"load average {os.getloadavg()[0]:.1f}")
    if compiled:
        import numba
        print(f"compiled planner: numba {numba.__version__}")
        for label, imported, first, cpu in first_call_costs():
            print(f"  first call, {label}: {first:.2f} s wall, {cpu:.2f} s CPU (import of "
                  f"dyntra_lb.planner.front {imported:.2f} s)")
        planner.warm_up()
    else:
        print("compiled planner: numba not installed, Python planner only")
    header = (f"{'suite':<8} {'dp':>3} {'mns':>4} {'cases':>5} {'oracle ms':>10} "
              f"{'python ms':>10} {'+obs ms':>8} {'compiled ms':>11} {'(cpu ms)':>9} "
              f"{'lists ms':>9} "
              f"{'oracle/comp':>11} {'py/comp':>8} {'step share py':>13} "
              f"{'step share comp':>15}")
    print(header)
    print("-" * len(header))
    rng = np.random.default_rng(args.seed)
    failed = 0
    for suite, dp, max_num_seqs, share in SUITES:
        n = max(1, round(cases * share))
        row, mismatches = run_suite(rng, suite, dp, max_num_seqs, n, args.repeats, compiled)
        failed += mismatches
        ratios = (f"{row['oracle'] / row['compiled']:>10.0f}x "
                  f"{row['python'] / row['compiled']:>7.1f}x" if compiled
                  else f"{'-':>11} {'-':>8}")
        share_comp = (f"{row['compiled'] / STEP_MS:>15.1%}" if compiled else f"{'-':>15}")
        print(f"{suite:<8} {dp:>3} {max_num_seqs:>4} {n:>5} {row['oracle']:>10.1f} "
              f"{row['python']:>10.3f} {row['observer']:>8.3f} "
              f"{_fmt(row, 'compiled', 3):>11} {_fmt(row, 'compiled_cpu', 3):>9} "
              f"{_fmt(row, 'lists', 3):>9} {ratios} "
              f"{row['python'] / STEP_MS:>13.1%} {share_comp}", flush=True)
    if failed:
        print(f"FAIL: {failed} plan(s) differ from the literal oracle")
        return 1
    print("all plans identical to the literal oracle")
    return 0


if __name__ == "__main__":
    sys.exit(main())
