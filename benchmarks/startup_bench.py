"""Rank start-up: ranks forked from the launcher's fork server (the CPU default) against
spawned ranks (each a fresh interpreter that imports torch; the NPU path), side by side.

Each sample is a fresh Python process (``--one``) that imports ``emu.run`` and then
calls ``run_cluster`` twice on a tiny trace (4 requests per rank, DyntraLB static mode
from step 0, CPU, 16-token blocks), with ``emu.cluster.rank_start.START_METHOD["cpu"]`` set to the
method under test:

* ``first``: the first ``run_cluster`` of the process, what one ``dyntra-emu run`` pays
  (forkserver: the fork server's own start and imports included);
* ``again``: the second one, what every later launch of the same process pays (the test
  suite, ``dyntra-emu ab``'s second run, a script calling ``run_cluster`` in a loop);
* ``process``: the wall time of the whole sample process (interpreter start, imports,
  both runs).

Samples alternate between the methods (spawn, forkserver, forkserver, spawn, ...) so a
change in machine load hits both; reported are medians over ``--repeats`` samples and
the ratio spawn / forkserver. The event logs of every run are compared byte for byte
across methods (the script exits 1 if they differ): the start method must change
nothing but the time.

    .venv/bin/python benchmarks/startup_bench.py                  # dp 2 and 4, 5 samples each
    .venv/bin/python benchmarks/startup_bench.py --dp 2 --repeats 1
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile
import time

from emu.records.reader import event_lines

METHODS = ("spawn", "forkserver")
BLOCK_SIZE = 16


def one(method: str, dp: int, out: pathlib.Path) -> dict:
    """One sample in this process: the wall time of two run_cluster calls."""
    import emu.cluster.rank_start
    from emu.run import run_cluster
    from emu.spec import RunSpec
    from emu.workload import TraceRequest

    emu.cluster.rank_start.START_METHOD["cpu"] = method
    trace = [TraceRequest(f"r{i}", 0.01 * i, 40 + 150 * (i % 3), 8 + 9 * (i % 4))
             for i in range(4 * dp)]
    config = {"scheduler_config": {"dyntra_lb_config": {
        "enabled": True, "mode": "static", "start_step": 0}}}
    times = {}
    for name in ("first", "again"):
        spec = RunSpec(trace=trace, dp_size=dp, out_dir=out / name, device="cpu",
                       block_size=BLOCK_SIZE, num_gpu_blocks=512, max_num_seqs=4,
                       additional_config=config)
        start = time.perf_counter()
        run_cluster(spec)
        times[name] = time.perf_counter() - start
    return times


def sample(method: str, dp: int, out: pathlib.Path) -> dict:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, "--one", method, str(dp), str(out)],
                          capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"sample {method} dp={dp} failed:\n{proc.stderr}")
    return {**json.loads(proc.stdout.splitlines()[-1]), "process": wall}


def event_logs(out: pathlib.Path, dp: int) -> list[bytes]:
    return ["".join(line + "\n" for line in event_lines(out / run, r)).encode()
            for run in ("first", "again") for r in range(dp)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dp", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--one", nargs=3, metavar=("METHOD", "DP", "OUT"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        method, dp, out = args.one
        print(json.dumps(one(method, int(dp), pathlib.Path(out))))
        return

    print(f"# {platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, "
          f"Python {platform.python_version()}, load average at start "
          f"{os.getloadavg()[0]:.1f}")
    rows = []
    identical = True
    with tempfile.TemporaryDirectory(prefix="startup-bench-") as tmp:
        for dp in args.dp:
            results: dict[str, list[dict]] = {m: [] for m in METHODS}
            reference = None
            for i in range(args.repeats):
                order = METHODS if i % 2 == 0 else METHODS[::-1]
                for method in order:
                    out = pathlib.Path(tmp) / f"dp{dp}-{method}-{i}"
                    results[method].append(sample(method, dp, out))
                    logs = event_logs(out, dp)
                    reference = reference or logs
                    identical &= logs == reference
            medians = {m: {k: statistics.median(r[k] for r in results[m])
                           for k in ("first", "again", "process")} for m in METHODS}
            rows.append((dp, medians))
    print("| dp | samples | first run: spawn s | forkserver s | ratio | later runs: "
          "spawn s | forkserver s | ratio | process: spawn s | forkserver s | ratio |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for dp, m in rows:
        cells = []
        for key in ("first", "again", "process"):
            s, f = m["spawn"][key], m["forkserver"][key]
            cells += [f"{s:.2f}", f"{f:.2f}", f"{s / f:.1f}x"]
        print(f"| {dp} | {args.repeats} | " + " | ".join(cells) + " |")
    print(f"# load average at end {os.getloadavg()[0]:.1f}; event logs identical across "
          f"methods: {'yes' if identical else 'NO'}")
    if not identical:
        sys.exit(1)


if __name__ == "__main__":
    main()
