"""An opt-in planner against the reference: the same A/B as ``dyntra-emu ab``, with
the planner (``RunSpec.planner``) as the only difference between A and B.

``dyntra-emu ab`` takes one ``--planner`` for both sides, so this script runs each pair
itself: per bundled workload, A = ``reference`` and B = the opt-in planner, same trace,
DyntraLB config (static mode from step 0 unless ``--additional-config``), engine flags
and seed. It prints ``ab``'s own table (``emu.report.ab_table``) per workload, then one
summary row per workload with the numbers that matter for a planner: throughput, DP
bubble, TPOT p99, pauses, and the longest single pause of one request (the starvation
the ``fill-protect`` planner targets, quirk Q5). Results are virtual-time metrics, so
they are deterministic: one run per side is the measurement, no medians needed.

    .venv/bin/python benchmarks/planner_ab.py                         # all bundled, dp 4
    .venv/bin/python benchmarks/planner_ab.py --workloads default --out runs/pab

``--out DIR`` keeps every run (DIR/<workload>/a|b, each with metrics.json); by default
they go to a temporary directory. ``--transport thread`` (the default here) gives the
same metrics as ``process`` (byte-identical event logs), several times faster.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dyntra_lb.planner import registry as planners  # noqa: E402
from emu.report import ab_table  # noqa: E402
from emu.run import run  # noqa: E402
from emu.spec import RunSpec  # noqa: E402
from emu.workload import WORKLOADS_DIR, bundled_workloads, load_trace  # noqa: E402

WORKLOADS = bundled_workloads()
STATIC = {"scheduler_config": {"dyntra_lb_config": {
    "enabled": True, "mode": "static", "start_step": 0}}}


def run_side(workload: str, planner: str, args, out: pathlib.Path) -> dict:
    """One side's run (``emu.run.run``: metrics.json written into ``out``); its metrics."""
    trace = load_trace(WORKLOADS_DIR / f"{workload}.jsonl", dp_size=args.dp)
    spec = RunSpec(trace=trace, workload=workload, dp_size=args.dp, out_dir=out,
                   additional_config=args.additional_config, planner=planner,
                   transport=args.transport, device="cpu")
    return run(spec).metrics


def summary_row(workload: str, label: str, m: dict) -> str:
    p = m["pauses"]
    return (f"| {workload} | {label} | {m['throughput_tok_s']:.1f} | "
            f"{100 * m['bubble_ratio']:.2f} | {m['tpot_ms']['p99']:.1f} | "
            f"{m['e2e_ms']['p99'] / 1e3:.1f} | {p['total']} ({p['requests_paused']}) | "
            f"{p['per_request_max']} | {p['duration_ms']['max'] / 1e3:.1f} | "
            f"{m['virtual_time_s']:.1f} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--planner", default="fill-protect",
                        choices=[n for n in planners.NAMES if n != planners.REFERENCE],
                        help="the opt-in planner of side B (default: fill-protect)")
    parser.add_argument("--workloads", default=",".join(WORKLOADS),
                        help=f"comma-separated bundled workloads (default: all: "
                             f"{','.join(WORKLOADS)})")
    parser.add_argument("--dp", type=int, default=4)
    parser.add_argument("--additional-config", type=json.loads, default=STATIC,
                        help="the DyntraLB config of both sides, as JSON (default: static "
                             "mode from step 0)")
    parser.add_argument("--transport", choices=("thread", "process"), default="thread")
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = parser.parse_args()
    workloads = args.workloads.split(",")
    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown:
        parser.error(f"--workloads: unknown {unknown}; bundled: {WORKLOADS}")
    print(f"machine: {platform.machine()}, {os.cpu_count()} cpus, Python "
          f"{platform.python_version()}; dp {args.dp}, transport {args.transport}; "
          f"A = reference, B = {args.planner}; config {json.dumps(args.additional_config)}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="planner-ab-") as tmp:
        base = args.out or pathlib.Path(tmp)
        for workload in workloads:
            a = run_side(workload, planners.REFERENCE, args, base / workload / "a")
            b = run_side(workload, args.planner, args, base / workload / "b")
            print(f"\n## {workload}\n")
            print(ab_table(a, b, (planners.REFERENCE, args.planner)))
            rows += [summary_row(workload, planners.REFERENCE, a),
                     summary_row(workload, args.planner, b)]
    print("\n| workload | planner | throughput tok/s | bubble % | TPOT p99 ms | e2e p99 s | "
          "pauses (requests) | most pauses of one request | longest pause s | "
          "virtual time s |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
