"""Emulator speed: emulated steps per second against a bare collective loop.

For each DP size and mode (DyntraLB off, DyntraLB static with ``start_step=0`` — an
all-gather and a planner run every step), one cluster is launched. In it, every rank
first runs the emulator once as a warm-up and records its collective sequence from the
event log, then runs ``--repeats`` pairs of:

- the emulator: a fresh ``EngineCore`` over the same trace (scheduler, cost model,
  DyntraLB, event log and wall log written as in a normal run), timed over its busy
  loop;
- the bare loop: the very same collective sequence (lockstep all-reduce on the device
  group, wave sync, DyntraLB flag/all-gather on the DP group; same shapes, same order)
  with preallocated tensors and no emulator work.

Ranks meet at a barrier before each timed segment; a segment's time is the slowest
rank's. Headline: emulator rate / bare-loop rate (1.0 = the emulator adds nothing to
the collectives' cost), the median over the emulator/bare pairs. Each pair runs back
to back, so a change in machine load between pairs (gloo collectives on a shared
2-core machine vary several-fold) does not bias the ratio; short segments and many
pairs keep the median stable. Prints a table (and the load average, which matters
here) and, with ``--json``, writes the raw numbers.

    .venv/bin/python benchmarks/emu_bench.py            # dp 2 and 4, 15 pairs each
    .venv/bin/python benchmarks/emu_bench.py --dp 2 --repeats 3
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import platform
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from emu.cluster.launcher import launch  # noqa: E402
from emu.records.reader import step_records
from emu.spec import RunSpec, check  # noqa: E402
from emu.workload import TraceRequest  # noqa: E402

MAX_NUM_SEQS = 16
BLOCK_SIZE = 128
MODES = {
    "off": None,
    "static": {"scheduler_config": {"dyntra_lb_config": {
        "enabled": True, "mode": "static", "start_step": 0}}},
}


def bench_trace(dp_size: int, steps: int) -> list[TraceRequest]:
    """A steady decode load: 1.5 * max_num_seqs requests per rank at t=0 (so ranks
    always hold admission candidates), prompts of 2-24 blocks, output lengths spread
    over [steps/4, steps] so that requests finish and are replaced all along."""
    count = dp_size * MAX_NUM_SEQS * 3 // 2
    return [
        TraceRequest(
            f"req-{i:04d}", 0.0,
            prompt_tokens=BLOCK_SIZE * (2 + (7 * i) % 23) - (13 * i) % 100,
            output_tokens=steps // 4 + (i * 37) % (3 * steps // 4),
        )
        for i in range(count)
    ]


def _collective_plan(run_dir: pathlib.Path, ctx) -> list:
    """The recorded collective sequence of this rank as ready-to-call closures on
    preallocated tensors (one buffer set per site)."""
    buffers: dict[tuple, tuple] = {}
    calls = []
    for record in step_records(run_dir, ctx.rank):
        for c in record["collectives"]:
            key = (c["site"], c["op"], tuple(c["shape"]))
            if key not in buffers:
                tensor = torch.zeros(c["shape"], dtype=getattr(torch, c["dtype"]))
                outputs = [torch.zeros_like(tensor) for _ in range(ctx.dp_size)]
                group = ctx.device_group if c["site"] == "engine.lockstep" else ctx.dp_group
                buffers[key] = (tensor, outputs, group)
            tensor, outputs, group = buffers[key]
            if c["op"] == "all_gather":
                calls.append((dist.all_gather, (outputs, tensor), {"group": group}))
            else:
                op = dist.ReduceOp.SUM if c["op"] == "all_reduce_sum" else dist.ReduceOp.MAX
                calls.append((dist.all_reduce, (tensor,), {"op": op, "group": group}))
    return calls


def _rank_bench(ctx, args) -> dict:
    implementation, engine_spec, repeats = args
    out_dir = pathlib.Path(ctx.out_dir) / f"rank{ctx.rank}"
    out_dir.mkdir(parents=True, exist_ok=True)
    ctx = dataclasses.replace(ctx, out_dir=out_dir)
    summary = implementation.make_engine(ctx, engine_spec).run()
    calls = _collective_plan(out_dir, ctx)
    emu_s, bare_s = [], []
    for pair in range(repeats):
        # Alternate which half of the pair runs first, so that a drift in machine
        # load does not favour one side.
        for side in ("emu", "bare") if pair % 2 == 0 else ("bare", "emu"):
            if side == "emu":
                engine = implementation.make_engine(ctx, engine_spec)
                dist.barrier(group=ctx.dp_group)
                emu_s.append(engine.run().loop_wall_s)
            else:
                dist.barrier(group=ctx.dp_group)
                start = time.perf_counter()
                for fn, fargs, kwargs in calls:
                    fn(*fargs, **kwargs)
                bare_s.append(time.perf_counter() - start)
    return {"steps": summary.steps, "num_plans": summary.num_plans,
            "collectives": len(calls), "emu_s": emu_s, "bare_s": bare_s}


def run_case(dp_size: int, mode: str, steps: int, repeats: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="emu-bench-") as tmp:
        spec = RunSpec(trace=bench_trace(dp_size, steps), dp_size=dp_size, out_dir=tmp,
                       additional_config=MODES[mode], max_num_seqs=MAX_NUM_SEQS,
                       block_size=BLOCK_SIZE, device="cpu")
        checked = check(spec)
        results = launch(_rank_bench, (checked.implementation, checked.engine_spec, repeats),
                         dp_size=dp_size, device="cpu", out_dir=tmp,
                         collective_timeout_s=120.0)
    steps_done = results[0]["steps"]
    assert all(r["steps"] == steps_done for r in results)
    # A segment lasts as long as its slowest rank.
    emu = [max(r["emu_s"][i] for r in results) for i in range(repeats)]
    bare = [max(r["bare_s"][i] for r in results) for i in range(repeats)]
    ratios = [b / e for e, b in zip(emu, bare, strict=True)]
    return {
        "dp_size": dp_size,
        "mode": mode,
        "steps": steps_done,
        "plans_per_rank": results[0]["num_plans"],
        "collectives_per_rank": results[0]["collectives"],
        "emu_steps_per_s": [steps_done / s for s in emu],
        "bare_steps_per_s": [steps_done / s for s in bare],
        "ratio": ratios,
        "median_emu_steps_per_s": statistics.median(steps_done / s for s in emu),
        "median_bare_steps_per_s": statistics.median(steps_done / s for s in bare),
        "median_ratio": statistics.median(ratios),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dp", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--steps", type=int, default=300,
                        help="approximate emulated steps per run (longest output length)")
    parser.add_argument("--repeats", type=int, default=15,
                        help="emulator/bare-loop pairs per case")
    parser.add_argument("--json", type=pathlib.Path, help="write the raw results here")
    args = parser.parse_args(argv)

    print(f"machine: {platform.machine()} {platform.processor() or ''}, "
          f"{os.cpu_count()} CPUs, Python {platform.python_version()}, torch {torch.__version__}; "
          f"load average {os.getloadavg()[0]:.1f}")
    cases = []
    print(f"{'dp':>3} {'mode':>7} {'steps':>6} {'emu steps/s':>12} {'bare steps/s':>13} "
          f"{'ratio':>6}  (medians of {args.repeats})")
    for dp_size in args.dp:
        for mode in args.modes:
            case = run_case(dp_size, mode, args.steps, args.repeats)
            cases.append(case)
            print(f"{dp_size:>3} {mode:>7} {case['steps']:>6} "
                  f"{case['median_emu_steps_per_s']:>12.0f} "
                  f"{case['median_bare_steps_per_s']:>13.0f} {case['median_ratio']:>6.2f}",
                  flush=True)
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    if args.json:
        args.json.write_text(json.dumps(cases, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
