"""A sweep on a local Ray (``--executor ray``) against the local executor (``--executor
local --jobs N``), side by side: the same grid, workload and flags, the whole command
timed (``dyntra-emu sweep`` as a subprocess: interpreter, Ray's start and shutdown
included) and the sweep's own wall time (``wall_s`` of sweep.json: its runs only).

Samples alternate (local, ray, ray, local, ...) so that a change in machine load hits
both; reported are medians over ``--repeats`` samples per executor and the ratio ray /
local. Every sample's sweep.json rows are compared with the first local sample's (the
script exits 1 if they differ): the executor must change nothing but the time.

    .venv/bin/python benchmarks/executor_bench.py                 # longtail, dp 4, 2 x 2 grid
    .venv/bin/python benchmarks/executor_bench.py --repeats 1 --workload default
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

GRID = ["--grid", "bubble_threshold=1,5", "--grid", "mode=static,dynamic"]


def sample(executor: str, args, out: pathlib.Path) -> dict:
    flags = (["--executor", "local", "--jobs", str(args.jobs)] if executor == "local"
             else ["--executor", "ray"])
    command = [sys.executable, "-m", "emu", "sweep", "--workload", args.workload, "--dp",
               str(args.dp), "--device", "cpu", *GRID, *flags, "--quiet", "--out", str(out)]
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    command_s = time.perf_counter() - start
    sweep = json.loads((out / "sweep.json").read_text())
    return {"command_s": command_s, "sweep_s": sweep["wall_s"], "rows": sweep["rows"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="longtail")
    parser.add_argument("--dp", type=int, default=4)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="the local executor's jobs (default: the cores)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    order = [e for i in range(args.repeats)
             for e in (("local", "ray") if i % 2 == 0 else ("ray", "local"))]
    samples: dict[str, list[dict]] = {"local": [], "ray": []}
    reference = None
    with tempfile.TemporaryDirectory(prefix="executor-bench-") as tmp:
        for i, executor in enumerate(order):
            result = sample(executor, args, pathlib.Path(tmp) / f"{i}-{executor}")
            reference = reference or (result["rows"] if executor == "local" else None)
            if reference is not None and result["rows"] != reference:
                print(f"sample {i} ({executor}): sweep.json rows differ from local's")
                return 1
            samples[executor].append(result)
            print(f"sample {i}: {executor:5}  command {result['command_s']:.1f} s  "
                  f"sweep {result['sweep_s']:.1f} s", flush=True)
    load = os.getloadavg()[0]
    print(f"\n{platform.node()}: {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"load average {load:.2f} at the end")
    print(f"sweep --workload {args.workload} --dp {args.dp} {' '.join(GRID)} "
          f"(5 runs), medians of {args.repeats}:")
    medians = {e: {k: statistics.median(s[k] for s in samples[e])
                   for k in ("command_s", "sweep_s")} for e in samples}
    for executor, flags in (("local", f"--executor local --jobs {args.jobs}"),
                            ("ray", "--executor ray (a local Ray)")):
        m = medians[executor]
        print(f"  {flags:32}  command {m['command_s']:6.1f} s  sweep {m['sweep_s']:6.1f} s")
    ratio = {k: medians["ray"][k] / medians["local"][k] for k in ("command_s", "sweep_s")}
    print(f"  ray / local: command {ratio['command_s']:.2f}x, sweep {ratio['sweep_s']:.2f}x; "
          "sweep.json rows identical in every sample")
    return 0


if __name__ == "__main__":
    sys.exit(main())
