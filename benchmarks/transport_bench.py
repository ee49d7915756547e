"""Wall-clock of a run: the thread transport against rank processes, and the thread
transport at large DP sizes.

1. Side by side: the bundled default workload (300 requests, DyntraLB static mode from
   step 0 — `dyntra-emu run`'s defaults, CPU) at each ``--dp`` size, ``--repeats`` runs
   per transport, alternating process / thread so that a change in machine load hits
   both. Reported: the median wall-clock of ``run_cluster`` (start of the ranks to the
   last rank's summary), the ratio process / thread, and that the event logs of the two
   transports were byte-identical (the script exits 1 otherwise).
2. Scale: the thread transport alone at each ``--scale-dp`` size N on a workload that
   keeps every rank as busy as the default workload keeps 4 ranks (generated with
   fixtures/generate.py: the default's kind and arrival process, 75 * N requests at
   5 * N requests/s, N very long prompts), ``--scale-repeats`` runs each: median
   wall-clock, emulated steps per second and the peak resident memory of the process.

Every run happens in a fresh Python process (``--one``), so the memory figure is that
run's and no run inherits another's state.

    .venv/bin/python benchmarks/transport_bench.py                 # dp 2 4 8, scale 16 32 64
    .venv/bin/python benchmarks/transport_bench.py --dp 2 --repeats 1 --scale-dp
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from emu.records.reader import event_lines

ROOT = pathlib.Path(__file__).resolve().parent.parent
DEFAULT_WORKLOAD = ROOT / "fixtures" / "workloads" / "default.jsonl"


def one(args: dict) -> dict:
    """One run in this process: ``{"wall_s", "steps", "maxrss_mb", "runner_cpu_s"}``;
    ``runner_cpu_s`` (thread transport only): the CPU time of the runner thread, in which
    every rank thread runs (``emu.cluster.rank_scheduler``), i.e. the ranks' own work."""
    from emu.cli.inputs import DEFAULT_ADDITIONAL_CONFIG
    from emu.impl import Implementation
    from emu.run import run_cluster
    from emu.spec import RunSpec
    from emu.workload import load_trace

    cpu: list[float] = []
    body = Implementation.run_rank

    def timed(self, ctx, engine):
        try:
            return body(self, ctx, engine)
        finally:
            cpu.append(time.thread_time())  # the runner's CPU time when this rank ends

    if args["transport"] == "thread":  # rank processes need a picklable target
        Implementation.run_rank = timed

    trace = load_trace(args["workload"])
    spec = RunSpec(trace=trace, dp_size=args["dp"], out_dir=args["out"],
                   additional_config=DEFAULT_ADDITIONAL_CONFIG, device="cpu",
                   transport=args["transport"],
                   collective_timeout_s=args["collective_timeout_s"])
    start = time.perf_counter()
    try:
        result = run_cluster(spec)
    except Exception as exc:
        pathlib.Path(args["out"], "error.txt").write_text(str(exc))
        raise
    wall = time.perf_counter() - start
    return {"wall_s": wall, "steps": result.ranks[0].steps,
            "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "runner_cpu_s": max(cpu, default=None)}


def run_one(workload: pathlib.Path, dp: int, transport: str, out: pathlib.Path,
            collective_timeout_s: float = 60.0) -> dict:
    payload = json.dumps({"workload": str(workload), "dp": dp, "transport": transport,
                          "out": str(out), "collective_timeout_s": collective_timeout_s})
    proc = subprocess.run([sys.executable, __file__, "--one", payload], cwd=ROOT,
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        error = (out / "error.txt").read_text() if (out / "error.txt").exists() else ""
        sys.exit(f"run dp={dp} {transport} failed:\n{error[:3000] or proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def same_event_logs(a: pathlib.Path, b: pathlib.Path, dp: int) -> bool:
    return all(list(event_lines(a, r)) == list(event_lines(b, r)) for r in range(dp))


def scaled_workload(dp: int, tmp: pathlib.Path) -> pathlib.Path:
    path = tmp / f"scaled-dp{dp}.jsonl"
    subprocess.run([sys.executable, str(ROOT / "fixtures" / "generate.py"), "--kind",
                    "longtail", "--arrivals", "gamma", "--n", str(75 * dp), "--rate",
                    str(5.0 * dp), "--seed", "0", "--long-prompts", str(dp), "--out",
                    str(path)], check=True, capture_output=True)
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dp", type=int, nargs="*", default=[2, 4, 8])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--scale-dp", type=int, nargs="*", default=[16, 32, 64])
    parser.add_argument("--scale-repeats", type=int, default=2)
    parser.add_argument("--scale-collective-timeout", type=float, default=60.0,
                        help="collective timeout of the scale runs, seconds (RunSpec's "
                             "default 60; on a loaded machine the serialized work of 64 "
                             "rank threads between two collectives can exceed it)")
    parser.add_argument("--json", type=pathlib.Path, help="also write the raw numbers here")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(json.loads(args.one))))
        return 0

    print(f"machine: {os.cpu_count()} CPUs, {platform.platform()}, Python "
          f"{platform.python_version()}; load average {os.getloadavg()[0]:.1f} at start")
    raw: dict = {"side_by_side": {}, "scale": {}}
    identical = True
    with tempfile.TemporaryDirectory(prefix="transport-bench-") as tmp_name:
        tmp = pathlib.Path(tmp_name)
        if args.dp:
            print("\nbundled default workload, DyntraLB static from step 0")
            print("| dp | process s (median) | thread s (median) | process / thread | "
                  "thread: runner CPU s | runs | event logs identical |")
            print("|---:|---:|---:|---:|---:|---:|---|")
        for dp in args.dp:
            walls = {"process": [], "thread": []}
            runner_cpu = []
            same = True
            for i in range(args.repeats):
                order = ("process", "thread") if i % 2 == 0 else ("thread", "process")
                for transport in order:
                    out = tmp / f"dp{dp}-{transport}-{i}"
                    run = run_one(DEFAULT_WORKLOAD, dp, transport, out)
                    walls[transport].append(run["wall_s"])
                    if transport == "thread":
                        runner_cpu.append(run["runner_cpu_s"])
                same &= same_event_logs(tmp / f"dp{dp}-process-{i}",
                                        tmp / f"dp{dp}-thread-{i}", dp)
            identical &= same
            p, t = statistics.median(walls["process"]), statistics.median(walls["thread"])
            raw["side_by_side"][dp] = walls
            print(f"| {dp} | {p:.1f} | {t:.1f} | {p / t:.1f}x | "
                  f"{statistics.median(runner_cpu):.1f} | {args.repeats} | "
                  f"{'yes' if same else 'NO'} |", flush=True)
        if args.scale_dp:
            print("\nthread transport, workload scaled with dp (75 requests and 5 req/s "
                  "per rank)")
            print("| dp | requests | wall s (median) | steps | steps/s | runner CPU s | "
                  "peak RSS MB | runs |")
            print("|---:|---:|---:|---:|---:|---:|---:|---:|")
        for dp in args.scale_dp:
            workload = scaled_workload(dp, tmp)
            runs = [run_one(workload, dp, "thread", tmp / f"scale-dp{dp}-{i}",
                            args.scale_collective_timeout)
                    for i in range(args.scale_repeats)]
            wall = statistics.median(r["wall_s"] for r in runs)
            rss = max(r["maxrss_mb"] for r in runs)
            steps = runs[0]["steps"]
            raw["scale"][dp] = runs
            cpu = statistics.median(r["runner_cpu_s"] for r in runs)
            print(f"| {dp} | {75 * dp} | {wall:.1f} | {steps} | {steps / wall:.0f} | "
                  f"{cpu:.1f} | {rss:.0f} | {args.scale_repeats} |", flush=True)
    print(f"\nload average {os.getloadavg()[0]:.1f} at the end")
    if args.json:
        args.json.write_text(json.dumps(raw, indent=1))
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
