"""The whole command's speed: virtual seconds per wall second of ``dyntra-emu run`` on
vllm-ascend PR #12292's workload, for this checkout against a baseline checkout.

The command is a user's: ``python -m emu run`` in a fresh process, start-up, metrics
and plots included, on rank threads, with the PR's benchmark settings
(``benchmarks/pr12292.py``: 1,000 requests at 400 req/s, dp 8, block size 2048, at most
128 in flight, the ``kv-token-mtp3`` profile) and the default additional config
(DyntraLB static from step 0). Each checkout runs its own code in its own environments
(``.venv`` for the kit, ``.venv-upstream`` for ``--impl vllm-ascend``), in the
environment this script was started in: on a machine that sets
``PYTHONDONTWRITEBYTECODE`` the baseline compiles every module at every start, as a
user's command would.

A round runs, for each impl and each checkout (their order alternating from round to
round), two samples of the command:

- plain: wall seconds (and the CPU seconds of the process and its children), and the
  run's virtual time from its metrics.json; virtual / wall is the headline;
- instrumented: the same command in one process with timers around the floor, the work
  the emulated cluster cannot do without: each rank's scheduler (``schedule()`` and
  ``update_from_output()``; for the kit these include its draft-acceptance rule) and
  the planner (the plans; run once per step, the ranks share them), and around the
  whole cluster (``run_cluster``: rank start-up and the rank loop). Two parts of the
  cluster are taken out of it: the import of the thread transport (``emu.cluster.
  threads``: torch and torch.distributed, about 1 s), which the sample makes before the
  command starts and times (``imports_s``), and the ranks' engine builds
  (``Implementation.make_engine``, ``build_s``: for vllm-ascend, importing vLLM and the
  tree is most of it). The harness is the cluster's time minus the floor and the
  builds: engine loop, collectives, clock, recorder, logs, control-plane pricing. Its
  share is of the instrumented sample's wall time; the rest of the wall time is
  start-up (the import above included), metrics and plots.

Medians over the rounds; the ratio of a checkout to the baseline is the median of the
per-round ratios (the samples of a round run back to back, so a change in the
machine's load between rounds moves both). ``--ab-seeds N`` also times ``dyntra-emu ab
--seeds N`` on the kit (20 runs for N = 10), plain samples only.

    .venv-upstream/bin/python benchmarks/speed.py --baseline ../h42-baseline
    .venv-upstream/bin/python benchmarks/speed.py --baseline ../h42-baseline --rounds 5 \\
        --impl kit --ab-seeds 10 --json speed.json

The machine's load average is printed with every sample: on a shared machine the
figures are only as good as it was quiet.
"""

from __future__ import annotations

import argparse
import importlib
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

ROOT = pathlib.Path(__file__).resolve().parent.parent
# benchmarks/pr12292.py's engine and clients.
PR_FLAGS = ("--workload", "recipe:pr12292,n=1000,rate=400", "--dp", "8", "--block-size",
            "2048", "--max-concurrency", "128", "--cost-model", "kv-token-mtp3",
            "--transport", "thread")
IMPLS = ("kit", "vllm-ascend")
DEFAULT_TREE = ROOT.parent / "shared" / "upstream" / "vllm-ascend"


def python_of(checkout: pathlib.Path, impl: str) -> str:
    return str(checkout / (".venv" if impl == "kit" else ".venv-upstream") / "bin" / "python")


def run_argv(impl: str, tree: pathlib.Path, out: pathlib.Path) -> list[str]:
    """``dyntra-emu run``'s arguments for one sample."""
    chosen = ["--impl", "kit"] if impl == "kit" else ["--impl", "vllm-ascend",
                                                      "--vllm-ascend", str(tree)]
    return ["run", *PR_FLAGS, *chosen, "--out", str(out), "--overwrite", "--quiet"]


def timed(argv: list[str], cwd: pathlib.Path) -> tuple[float, float]:
    """Run ``argv`` to completion: (wall seconds, CPU seconds of it and its children)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"speed.py: {' '.join(argv)} exited {proc.returncode}:\n{proc.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def virtual_s(out: pathlib.Path) -> float:
    return json.loads((out / "metrics.json").read_text())["virtual_time_s"]


def plain_sample(checkout: pathlib.Path, impl: str, tree: pathlib.Path,
                 out: pathlib.Path) -> dict:
    wall, cpu = timed([python_of(checkout, impl), "-m", "emu",
                       *run_argv(impl, tree, out)], checkout)
    virtual = virtual_s(out)
    return {"wall_s": wall, "cpu_s": cpu, "virtual_s": virtual, "x_real_time": virtual / wall,
            "load": os.getloadavg()[0]}


def instrumented_sample(checkout: pathlib.Path, impl: str, tree: pathlib.Path,
                        out: pathlib.Path) -> dict:
    report = out.parent / f"{out.name}.floor.json"
    wall, _ = timed([python_of(checkout, impl), str(pathlib.Path(__file__).resolve()),
                     "--instrumented", str(report), "--", *run_argv(impl, tree, out)],
                    checkout)
    parts = json.loads(report.read_text())
    floor = parts["schedule_s"] + parts["update_s"] + parts["planner_s"]
    harness = parts["cluster_s"] - floor - parts["build_s"]
    return {"wall_s": wall, **parts, "floor_s": floor, "harness_s": harness,
            "harness_share": harness / wall, "floor_share": floor / wall,
            "outside_cluster_s": wall - parts["cluster_s"], "load": os.getloadavg()[0]}


# ------------------------------------------------------------------ the instrumented child


def instrumented_main(report: str, argv: list[str]) -> int:
    """In the checkout's own interpreter: ``dyntra-emu`` with ``argv``, timers around
    the schedulers, the planner and the cluster; their totals into ``report``."""
    importlib.import_module("emu.cli")  # first, as the command: it sets the bytecode cache
    from emu import impl as impl_module
    from emu import run as run_module

    totals = {"schedule_s": 0.0, "update_s": 0.0, "planner_s": 0.0, "cluster_s": 0.0,
              "build_s": 0.0}
    clock = time.perf_counter
    start = clock()
    importlib.import_module("emu.cluster.threads")  # what the cluster would import first
    totals["imports_s"] = clock() - start

    def timer(fn, name):
        def timed_call(*args, **kwargs):
            start = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                totals[name] += clock() - start
        return timed_call

    planners: dict = {}  # one timer per planner function: the ranks' plan memo keys on it

    def planner_timer(fn):
        if fn not in planners:
            planners[fn] = timer(fn, "planner_s")
        return planners[fn]

    # Where a rank's engine is made: a method of the implementation since issue 43, a
    # module function in the checkouts before it.
    owner = getattr(impl_module, "Implementation", impl_module)
    owner = owner if hasattr(owner, "make_engine") else impl_module
    make_engine = owner.make_engine

    def make_timed_engine(*args, **kwargs):
        start = clock()
        engine = make_engine(*args, **kwargs)
        totals["build_s"] += clock() - start
        scheduler = engine.scheduler
        scheduler.schedule = timer(scheduler.schedule, "schedule_s")
        scheduler.update_from_output = timer(scheduler.update_from_output, "update_s")
        coordinator = getattr(engine, "coordinator", None)  # the kit's DyntraLB
        if coordinator is not None:
            coordinator._balance_load = planner_timer(coordinator._balance_load)
        core = getattr(engine, "engine", None)  # vLLM's engine core around vllm-ascend's
        if core is not None and hasattr(core, "_plans"):
            core._plans = timer(core._plans, "planner_s")
        return engine

    owner.make_engine = make_timed_engine
    # The cluster's run: run_checked calls the module's _run_cluster (run_cluster, the
    # unchecked entry, calls it too); checkouts before it had run_cluster alone.
    cluster = "_run_cluster" if hasattr(run_module, "_run_cluster") else "run_cluster"
    setattr(run_module, cluster, timer(getattr(run_module, cluster), "cluster_s"))
    from emu.cli.main import main

    code = main(argv)
    pathlib.Path(report).write_text(json.dumps(totals))
    return code


# ------------------------------------------------------------------ the rounds


def ab_seeds_sample(checkout: pathlib.Path, seeds: int, out: pathlib.Path) -> dict:
    wall, cpu = timed([python_of(checkout, "kit"), "-m", "emu", "ab", "--seeds", str(seeds),
                       *PR_FLAGS, "--out", str(out), "--overwrite", "--quiet"], checkout)
    return {"wall_s": wall, "cpu_s": cpu, "load": os.getloadavg()[0]}


def median(samples: list[dict], key: str) -> float:
    return statistics.median(s[key] for s in samples)


def ratio(samples: dict, checkout: str, baseline: str, key: str = "wall_s") -> float:
    """Median over rounds of checkout / baseline."""
    return statistics.median(a[key] / b[key] for a, b in
                             zip(samples[checkout], samples[baseline], strict=True))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=pathlib.Path, required=True,
                        help="a checkout to compare with (its .venv / .venv-upstream)")
    parser.add_argument("--impl", nargs="+", choices=IMPLS, default=list(IMPLS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--vllm-ascend", type=pathlib.Path, default=DEFAULT_TREE)
    parser.add_argument("--ab-seeds", type=int, default=0,
                        help="also time `ab --seeds N` on the kit (0: not)")
    parser.add_argument("--json", type=pathlib.Path)
    args = parser.parse_args()
    checkouts = {"this": ROOT, "baseline": args.baseline.resolve()}
    print(f"machine: {platform.node()}, {os.cpu_count()} CPUs, Python "
          f"{platform.python_version()}; PYTHONDONTWRITEBYTECODE="
          f"{os.environ.get('PYTHONDONTWRITEBYTECODE', '')!r}, PYTHONPYCACHEPREFIX="
          f"{os.environ.get('PYTHONPYCACHEPREFIX', '')!r}")
    results: dict = {"rounds": args.rounds, "impls": {}, "ab_seeds": None}
    with tempfile.TemporaryDirectory(prefix="speed-") as tmp:
        tmp = pathlib.Path(tmp)
        for impl in args.impl:
            # warm-up: bytecode caches, numba's planner cache, the first-run costs
            for name, checkout in checkouts.items():
                plain_sample(checkout, impl, args.vllm_ascend, tmp / f"{impl}-{name}")
            plain = {name: [] for name in checkouts}
            inst = {name: [] for name in checkouts}
            for round_ in range(args.rounds):
                order = list(checkouts) if round_ % 2 == 0 else list(checkouts)[::-1]
                for name in order:
                    out = tmp / f"{impl}-{name}"
                    plain[name].append(plain_sample(checkouts[name], impl, args.vllm_ascend,
                                                    out))
                    inst[name].append(instrumented_sample(checkouts[name], impl,
                                                          args.vllm_ascend, out))
                    p, i = plain[name][-1], inst[name][-1]
                    print(f"  {impl} {name} round {round_}: {p['wall_s']:.2f} s wall, "
                          f"{p['cpu_s']:.2f} s CPU, {p['x_real_time']:.1f}x; instrumented "
                          f"{i['wall_s']:.2f} s, floor {i['floor_s']:.2f} s, cluster "
                          f"{i['cluster_s']:.2f} s of which builds {i['build_s']:.2f} s, "
                          f"import {i['imports_s']:.2f} s (load {p['load']:.2f})", flush=True)
            results["impls"][impl] = {"plain": plain, "instrumented": inst}
            print_impl(impl, plain, inst)
        if args.ab_seeds:
            samples = {name: [] for name in checkouts}  # the run samples above warmed up
            for round_ in range(args.rounds):
                order = list(checkouts) if round_ % 2 == 0 else list(checkouts)[::-1]
                for name in order:
                    samples[name].append(ab_seeds_sample(checkouts[name], args.ab_seeds,
                                                         tmp / f"ab-{name}"))
                    s = samples[name][-1]
                    print(f"  ab --seeds {args.ab_seeds} {name} round {round_}: "
                          f"{s['wall_s']:.1f} s wall, {s['cpu_s']:.1f} s CPU "
                          f"(load {s['load']:.2f})", flush=True)
            results["ab_seeds"] = {"seeds": args.ab_seeds, "samples": samples}
            print(f"\n`ab --seeds {args.ab_seeds}`, kit: this "
                  f"{median(samples['this'], 'wall_s'):.1f} s, baseline "
                  f"{median(samples['baseline'], 'wall_s'):.1f} s (median wall); "
                  f"this / baseline {ratio(samples, 'this', 'baseline'):.2f} (wall), "
                  f"{ratio(samples, 'this', 'baseline', 'cpu_s'):.2f} (CPU)")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


def print_impl(impl: str, plain: dict, inst: dict) -> None:
    print(f"\n{impl}: median of {len(plain['this'])} rounds")
    print("| checkout | wall s | CPU s | x real time | floor s | builds s | cluster s "
          "| harness share | floor share | outside the cluster s | of which torch's import s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in plain:
        p, i = plain[name], inst[name]
        print(f"| {name} | {median(p, 'wall_s'):.2f} | {median(p, 'cpu_s'):.2f} | "
              f"{median(p, 'x_real_time'):.1f} | {median(i, 'floor_s'):.2f} | "
              f"{median(i, 'build_s'):.2f} | "
              f"{median(i, 'cluster_s'):.2f} | {median(i, 'harness_share'):.0%} | "
              f"{median(i, 'floor_share'):.0%} | {median(i, 'outside_cluster_s'):.2f} | "
              f"{median(i, 'imports_s'):.2f} |")
    print(f"this / baseline: wall {ratio(plain, 'this', 'baseline'):.2f}, CPU "
          f"{ratio(plain, 'this', 'baseline', 'cpu_s'):.2f}")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--instrumented":
        sys.exit(instrumented_main(sys.argv[2], sys.argv[4:]))
    sys.exit(main())
