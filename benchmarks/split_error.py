"""The error of ``run --split N`` (docs/split.md): one trace run whole and split into N
windows with several warm-ups, every split compared with the whole run on throughput,
bubble ratio, TPOT p50/p99, TTFT p99, share of requests paused and longest pause; with
each run's wall time, CPU time and how many requests the split replays in all (its
warm-ups and cool-downs) per request of the trace.

    .venv/bin/python benchmarks/split_error.py --workload trace.jsonl --dp 16 \\
        --windows 2,4,8 --warmups 30,60,120 --label mooncake-1h --results split.json
    .venv/bin/python benchmarks/split_error.py --workload pr.jsonl --dp 8 \\
        --run-flags "--block-size 2048 --router vllm" --windows 4 --warmups 60 \\
        --executor ray --two-nodes --label pr-ray --results split.json
    .venv/bin/python benchmarks/split_error.py --results split.json --table

Every run is ``.venv/bin/dyntra-emu run --workload W --dp D --transport thread`` (the
same figures as rank processes, by design) with ``--run-flags``; a split adds ``--split
N --split-warmup S`` and ``--jobs J`` (local) or ``--executor ray`` (``--two-nodes``: a
Ray cluster of two nodes of 2 CPUs each on this machine, as ``ray.cluster_utils.Cluster``
starts it for tests/cli/test_cli_ray_cluster.py). CPU time is user + sys of the command's
process tree, polled every 0.5 s (each process's last poll: a process's last half
second can be missed); on Ray the workers are not in the tree, so only wall time is
given. Results accumulate in ``--results`` (one entry per label and run).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
FIGURES = (("throughput", ("throughput_tok_s",)), ("bubble", ("bubble_ratio",)),
           ("TPOT p50", ("tpot_ms", "p50")), ("TPOT p99", ("tpot_ms", "p99")),
           ("TTFT p99", ("ttft_ms", "p99")),
           ("paused %", ("pauses", "requests_paused_pct")),
           ("longest pause", ("pauses", "longest_paused_ms")))


def _get(metrics: dict, path: tuple[str, ...]):
    for key in path:
        metrics = metrics[key]
    return metrics


def _timed(command: list[str]) -> tuple[float, float, str]:
    """Run ``command``; returns its wall seconds, its process tree's CPU seconds and its
    stderr (a failure raises)."""
    start = time.monotonic()
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, cwd=REPO)
    root = psutil.Process(proc.pid)
    cpu: dict[int, float] = {}
    while proc.poll() is None:
        with contextlib.suppress(psutil.Error):
            for p in [root, *root.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    t = p.cpu_times()
                    cpu[p.pid] = t.user + t.system
        time.sleep(0.5)
    stderr = proc.stderr.read()
    wall = time.monotonic() - start
    if proc.returncode != 0:
        raise SystemExit(f"{shlex.join(command)} failed ({proc.returncode}):\n{stderr}")
    return wall, sum(cpu.values()), stderr


def _run(args, out: Path, split: tuple[int, float] | None, address: str | None) -> dict:
    command = [str(REPO / ".venv/bin/dyntra-emu"), "run", "--workload", args.workload,
               "--dp", str(args.dp), "--transport", "thread", "--quiet", "--out", str(out),
               "--overwrite", *shlex.split(args.run_flags)]
    if split is not None:
        command += ["--split", str(split[0]), "--split-warmup", f"{split[1]:g}"]
        if args.executor == "ray":
            command += ["--executor", "ray"] + (["--ray-address", address] if address
                                                 else [])
        else:
            command += ["--jobs", str(args.jobs)]
    wall, cpu, _ = _timed(command)
    metrics = json.loads((out / "metrics.json").read_text())
    entry = {"figures": {name: _get(metrics, path) for name, path in FIGURES},
             "wall_s": wall, "cpu_s": None if args.executor == "ray" and split else cpu,
             "requests": metrics["requests_total"], "executor": args.executor,
             "command": shlex.join(command)}
    if split is not None:
        windows = metrics["split"]["per_window"]
        entry["replayed_per_request"] = (
            sum(w["requests"] + w["warmup_requests"] + w["cooldown_requests"]
                for w in windows) / sum(w["requests"] for w in windows))
    return entry


@contextlib.contextmanager
def _two_nodes():
    """A Ray cluster of two 2-CPU nodes on this machine; yields its address."""
    from ray.cluster_utils import Cluster

    from emu.executors.ray_cluster import SYSTEM_CONFIG

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "_system_config": SYSTEM_CONFIG})
    cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    try:
        yield cluster.address
    finally:
        cluster.shutdown()


def _measure(args) -> None:
    results = json.loads(args.results.read_text()) if args.results.exists() else {}
    mine = results.setdefault(args.label, {})
    scratch = Path(args.scratch)
    if "whole" not in mine:
        mine["whole"] = _run(args, scratch / "whole", None, None)
        args.results.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
        print(f"whole: {mine['whole']['wall_s']:.0f} s wall", file=sys.stderr)
    with _two_nodes() if args.two_nodes else contextlib.nullcontext() as address:
        for n in args.windows:
            for warmup in args.warmups:
                key = f"N={n} warm-up={warmup:g}" + (" ray" if args.executor == "ray" else "")
                mine[key] = _run(args, scratch / f"split{n}-{warmup:g}", (n, warmup),
                                 address)
                args.results.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
                print(f"{key}: {mine[key]['wall_s']:.0f} s wall", file=sys.stderr)


def _table(results: dict) -> str:
    """Markdown: per label, the whole run's figures, then each split's relative error."""
    names = [name for name, _ in FIGURES]
    lines = ["| trace | run | " + " | ".join(names) + " | wall s | CPU s | replayed |",
             "|---|---|" + "---:|" * (len(names) + 3)]
    for label, runs in results.items():
        whole = runs["whole"]["figures"]
        for key, entry in runs.items():
            cells = []
            for name in names:
                value, base = entry["figures"][name], whole[name]
                if key == "whole":
                    cells.append(f"{value:.4g}" if value is not None else "-")
                elif value is None or not base:
                    cells.append("-")
                else:
                    cells.append(f"{(value - base) / base * 100:+.1f} %")
            cpu = entry["cpu_s"]
            replayed = entry.get("replayed_per_request")
            lines.append(f"| {label} | {key} | " + " | ".join(cells)
                         + f" | {entry['wall_s']:.0f} | "
                         + ("-" if cpu is None else f"{cpu:.0f}") + " | "
                         + ("1" if replayed is None else f"{replayed:.2f}") + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload")
    parser.add_argument("--dp", type=int, default=16)
    parser.add_argument("--run-flags", default="", help="more flags of every run")
    parser.add_argument("--windows", type=lambda s: [int(x) for x in s.split(",")],
                        default=[2, 4, 8])
    parser.add_argument("--warmups", type=lambda s: [float(x) for x in s.split(",")],
                        default=[30.0, 60.0, 120.0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--executor", choices=("local", "ray"), default="local")
    parser.add_argument("--two-nodes", action="store_true",
                        help="with --executor ray: on a two-node Ray cluster on this machine")
    parser.add_argument("--label", default="trace")
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument("--scratch", default="/tmp/split_error")
    parser.add_argument("--table", action="store_true", help="only print the table")
    args = parser.parse_args()
    if not args.table:
        if args.workload is None:
            parser.error("--workload: required unless --table")
        _measure(args)
    print(_table(json.loads(args.results.read_text())))


if __name__ == "__main__":
    main()
