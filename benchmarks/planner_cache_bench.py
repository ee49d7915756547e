"""The compiled planner's disk cache when two environments share one checkout: the
README's `.venv` and `.venv-upstream` (whose vLLM pins another numba), used in turn.

Each measurement is one fresh interpreter loading the planner as a rank does
(`dyntra_lb.planner.front.warm_up()`: from numba's disk cache, or compiled when the cache has
nothing for it), timed from outside (wall) and by the child (CPU). Side by side in the
same run: this checkout's `dyntra_lb`, and the baseline's (`--baseline`, by default the
last commit before each environment kept its own cache files), unpacked from git into a
temporary directory so that each tree has its own `__pycache__`. Both trees are first
loaded once in every environment (not counted), then the environments take turns
`--switches` times; every counted load follows a load by the other environment.

    .venv/bin/python benchmarks/planner_cache_bench.py
    .venv/bin/python benchmarks/planner_cache_bench.py --python .venv/bin/python \
        .venv-upstream/bin/python --switches 3

Prints each load and a Markdown table of the medians (the one in benchmarks/RESULTS.md).
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASELINE = "0b88949"  # one index per source file, numba's default
# A tree from before dyntra_lb/planner/ became a package (the default baseline) has the
# planner in dyntra_lb/planner.py and dyntra_lb/planner_native.py.
LOAD = """
import resource, sys
sys.path.insert(0, sys.argv[1])
try:
    from dyntra_lb.planner import compiled, front
except ImportError:
    from dyntra_lb import planner as front, planner_native as compiled
assert compiled.__file__.startswith(sys.argv[1]), compiled.__file__
front.warm_up()
r = resource.getrusage(resource.RUSAGE_SELF)
print(r.ru_utime + r.ru_stime)
"""


def unpack(rev: str, into: Path) -> Path:
    """`dyntra_lb/` as of `rev`, in a directory of its own."""
    archive = subprocess.run(["git", "archive", rev, "dyntra_lb"], cwd=ROOT, check=True,
                             capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def load(python: str, tree: Path) -> tuple[float, float]:
    """(wall s, CPU s) of one interpreter loading the planner from `tree`."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    start = time.monotonic()
    out = subprocess.run([python, "-c", LOAD, str(tree)], cwd=tree, env=env, check=True,
                         capture_output=True, text=True).stdout
    return time.monotonic() - start, float(out.split()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", nargs=2, metavar=("A", "B"),
                        default=[str(ROOT / ".venv/bin/python"),
                                 str(ROOT / ".venv-upstream/bin/python")])
    parser.add_argument("--switches", type=int, default=3)
    parser.add_argument("--baseline", default=BASELINE, metavar="REV")
    args = parser.parse_args(argv)
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="planner-cache-") as tmp:
        trees = {"baseline": unpack(args.baseline, Path(tmp)), "this checkout": ROOT}
        for python in args.python:  # fill each tree's cache for each environment once
            for tree in trees.values():
                load(python, tree)
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in trees}
        for i in range(args.switches):
            for python in args.python:
                for name, tree in trees.items():
                    wall, cpu = load(python, tree)
                    times[name].append((wall, cpu))
                    print(f"switch {i + 1}, {python}, {name}: {wall:.2f} s wall, "
                          f"{cpu:.2f} s CPU", file=sys.stderr, flush=True)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.1f}; {time.monotonic() - began:.0f} s\n")
    print("| tree | loads after a switch | wall s, median | CPU s, median |")
    print("|---|---|---|---|")
    medians = {}
    for name, rows in times.items():
        medians[name] = statistics.median(c for _, c in rows)
        print(f"| {name} | {len(rows)} | {statistics.median(w for w, _ in rows):.2f} | "
              f"{medians[name]:.2f} |")
    print(f"\nCPU ratio baseline / this checkout: "
          f"{medians['baseline'] / medians['this checkout']:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
