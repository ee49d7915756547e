"""The planner inside the kit's engine: planner wall time per planning step, from the
wall logs of real runs, with the pure-Python planner and with the compiled one.

Each pair is two ``dyntra-emu run`` clusters (one process per rank, gloo) on the same
workload, config and seed, one per planner; the order alternates between pairs. The
Python side runs with numba hidden: a directory on ``PYTHONPATH`` whose ``numba``
package fails to import, which is how ``dyntra_lb.planner.front`` falls back to the Python
planner on a machine without numba (``IMPLEMENTATION == "python"``; the script prints
what each side reports). The event logs of both runs of a pair must be byte-identical
(same plans; the script exits 1 otherwise). Per run: p50 / p99 of ``planner_s`` over
every planning step of every rank (``rank<r>.wall/``); the table shows the median
over the pairs and the ratio Python / compiled.

    .venv/bin/python benchmarks/planner_engine_bench.py                 # longtail, dp 4, 3 pairs
    .venv/bin/python benchmarks/planner_engine_bench.py --workload default --repeats 1
"""

from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys
import tempfile

from sidebyside import (
    REPO,
    end_line,
    event_logs,
    machine_line,
    pairs,
    planner_times,
    print_planner_table,
)

SIDES = ("python", "compiled")
_NO_NUMBA = 'raise ImportError("numba hidden by benchmarks/planner_engine_bench.py")\n'


def side_env(side: str, shim: pathlib.Path) -> dict:
    env = dict(os.environ)
    if side == "python":
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(shim),
                                                          env.get("PYTHONPATH")]))
    return env


def implementation(env: dict) -> str:
    code = "from dyntra_lb.planner.front import IMPLEMENTATION; print(IMPLEMENTATION)"
    return subprocess.run([sys.executable, "-c", code], env=env, check=True,
                          capture_output=True, text=True).stdout.strip()


def one_run(args, env: dict, out: pathlib.Path) -> dict:
    subprocess.run([sys.executable, "-m", "emu", "run", "--workload", args.workload,
                    "--dp", str(args.dp), "--out", str(out), "--quiet"],
                   env=env, check=True, capture_output=True, cwd=REPO)
    return {"times": planner_times(out), "events": event_logs(out)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="longtail", help="bundled workload")
    parser.add_argument("--dp", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3, help="pairs of runs")
    args = parser.parse_args()
    print(machine_line(f"workload {args.workload}, dp {args.dp}, `dyntra-emu run` defaults "
                       "(static from step 0, max_num_seqs 16, block size 128), transport "
                       "process"))
    times: dict[str, list] = {s: [] for s in SIDES}
    with tempfile.TemporaryDirectory(prefix="planner-engine-") as tmp:
        shim = pathlib.Path(tmp) / "no-numba"
        (shim / "numba").mkdir(parents=True)
        (shim / "numba" / "__init__.py").write_text(_NO_NUMBA)
        envs = {s: side_env(s, shim) for s in SIDES}
        for side in SIDES:
            print(f"{side}: dyntra_lb.planner.front.IMPLEMENTATION = {implementation(envs[side])}")
        count = 0
        for runs in pairs(SIDES, args.repeats, lambda pair, s: one_run(
                args, envs[s], pathlib.Path(tmp) / f"{pair}-{s}")):
            if runs["python"]["events"] != runs["compiled"]["events"]:
                print("event logs differ between the planners", file=sys.stderr)
                return 1
            for side, run in runs.items():
                times[side].append(run["times"])
            count = runs["compiled"]["times"].size
    print(f"{count} planning steps over all ranks per run; event logs byte-identical")
    print_planner_table(times, "python", "compiled")
    print(end_line())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
