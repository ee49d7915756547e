"""What launches of rank processes cost the machine, for two or more checkouts side by
side: the CPU time of the whole machine (``/proc/stat``: the launcher, its fork server,
every rank, the kernel's work for them) and the wall time of ``--runs`` tiny runs on the
process transport (dp 2, 10 requests, CPU), each checkout in a fresh Python process of
its own, the checkouts alternating (A B, B A, ...) over ``--repeats`` rounds.

``--tree`` names a checkout (the first is the baseline of the ratios); the sample
process imports ``emu`` from it. Give an idle machine: the CPU is the machine's, so
anything else running counts too. The fork server's start is left out (one run before
the clock starts); its exit counts: the machine's CPU is read ``SETTLE_S`` after the
sample process ends, by when the server (which exits once that process is gone) is gone.

    git worktree add /tmp/before <commit>
    .venv/bin/python benchmarks/launch_cpu_bench.py --tree /tmp/before --tree . --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

from sidebyside import end_line, machine_line

SETTLE_S = 2.0


def busy_seconds() -> float:
    """The machine's busy CPU time so far (every state but idle and iowait)."""
    fields = [int(v) for v in pathlib.Path("/proc/stat").read_text().split()[1:8]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def one(tree: str, runs: int, out: pathlib.Path) -> None:
    """In the sample process: one warm-up run, then ``runs`` runs, on ``tree``'s code."""
    sys.path.insert(0, tree)  # before this checkout, which sidebyside put first
    from emu.run import run_cluster
    from emu.spec import RunSpec
    from emu.workload import TraceRequest

    if not pathlib.Path(sys.modules["emu"].__file__).is_relative_to(tree):
        raise SystemExit(f"emu came from {sys.modules['emu'].__file__}, not {tree}")
    trace = [TraceRequest(f"r{i}", 0.01 * i, 40 + 150 * (i % 3), 8 + 9 * (i % 4))
             for i in range(10)]
    for i in range(runs + 1):
        run_cluster(RunSpec(trace=trace, dp_size=2, out_dir=out / str(i), device="cpu",
                            block_size=16, num_gpu_blocks=512, max_num_seqs=4))
        if i == 0:
            print("warm", flush=True)


def sample(tree: pathlib.Path, runs: int) -> dict:
    """The machine's CPU and the wall time of one sample process's runs on ``tree``."""
    with tempfile.TemporaryDirectory(prefix="launch-cpu-") as out:
        env = dict(os.environ, PYTHONPATH=str(tree))  # the fork server's and ranks' too
        proc = subprocess.Popen([sys.executable, __file__, "--one", str(tree), str(runs), out],
                                env=env, cwd=tree, stdout=subprocess.PIPE, text=True)
        if proc.stdout.readline().strip() != "warm":
            proc.wait()
            raise SystemExit(f"the warm-up run on {tree} failed")
        cpu, wall = busy_seconds(), time.perf_counter()
        if proc.wait() != 0:
            raise SystemExit(f"the sample on {tree} failed")
        wall = time.perf_counter() - wall
        time.sleep(SETTLE_S)
        return {"cpu_s": busy_seconds() - cpu, "wall_s": wall}


def main() -> int:
    if sys.argv[1:2] == ["--one"]:  # a sample process, started by ``sample``
        tree, runs, out = sys.argv[2:5]
        one(tree, int(runs), pathlib.Path(out))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", type=pathlib.Path, required=True)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    trees = [t.resolve() for t in args.tree]
    print(machine_line(f"{args.runs} runs per sample, {args.repeats} rounds"))
    samples: dict[pathlib.Path, list[dict]] = {t: [] for t in trees}
    for round_ in range(args.repeats):
        for tree in trees if round_ % 2 == 0 else trees[::-1]:
            samples[tree].append(sample(tree, args.runs))
            print(json.dumps({"tree": str(tree), **samples[tree][-1]}), flush=True)
    base = {k: statistics.median(s[k] for s in samples[trees[0]]) for k in ("cpu_s", "wall_s")}
    print("| checkout | machine CPU s, median | ratio | wall s, median | ratio |")
    print("|---|---:|---:|---:|---:|")
    for tree in trees:
        cpu = statistics.median(s["cpu_s"] for s in samples[tree])
        wall = statistics.median(s["wall_s"] for s in samples[tree])
        print(f"| {tree} | {cpu:.2f} | {cpu / base['cpu_s']:.2f} | {wall:.2f} | "
              f"{wall / base['wall_s']:.2f} |")
    print(end_line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
