"""``--impl vllm-ascend`` at the kit's speed: start-up against dp, and rank processes
against rank threads on the bundled ``default`` workload.

Every sample is a fresh Python process (``--one``), so that nothing a sample imported
or started (vLLM, a fork server) helps the next; samples of the two sides of a table
alternate (A B B A ...) so that a change of machine load hits both, and the tables give
medians over ``--repeats`` samples and the ratio of the medians.

``startup``: a run of a tiny trace (4 requests per rank, DyntraLB static from step 0),
twice in the sample process. ``preloaded`` is today's way: CPU ranks fork from a fork
server that has imported vLLM and the tree once (``emu.cluster.rank_start``);
``per-rank`` is how ranks started before, each importing vLLM and the tree itself (the
sample makes the implementation's preload the kit's). ``first``: the first run of a
process, the fork server's own start included (one ``dyntra-emu run``); ``again``: a
later run of the same process (a test worker, ``ab``'s second run).

``transport``: the whole bundled ``default`` workload (300 requests) with DyntraLB on
(static from step 0), on rank processes and on rank threads: the wall time of the run
(start-up included) and the event logs, which must be byte-identical.

``scale``: one thread run at a large dp, its wall time and the sample's peak memory.

    .venv-upstream/bin/python benchmarks/vllm_ascend_bench.py startup --dp 2 4 8
    .venv-upstream/bin/python benchmarks/vllm_ascend_bench.py transport --dp 2 4 8
    .venv-upstream/bin/python benchmarks/vllm_ascend_bench.py scale --dp 32
"""

from __future__ import annotations

import argparse
import json
import pathlib
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from sidebyside import REPO, STATIC, TREE, end_line, machine_line

from emu.records.reader import event_lines

BLOCK_SIZE = 16


def _spec(trace, dp: int, out: pathlib.Path, transport: str, **fields):
    from emu.spec import RunSpec

    return RunSpec(trace=trace, dp_size=dp, out_dir=out, additional_config=STATIC,
                   device="cpu", impl="vllm-ascend", vllm_ascend=TREE, transport=transport,
                   **fields)


def startup(side: str, dp: int, out: pathlib.Path) -> dict:
    """One start-up sample in this process."""
    from emu import impl
    from emu.run import run_cluster
    from emu.workload import TraceRequest

    if side == "per-rank":
        vllm_ascend = impl.get("vllm-ascend")
        vllm_ascend.preload = impl.get("kit").preload
    trace = [TraceRequest(f"r{i}", 0.01 * i, 40 + 150 * (i % 3), 8 + 9 * (i % 4))
             for i in range(4 * dp)]
    times = {}
    for name in ("first", "again"):
        # Ranks that import vLLM each (per-rank) meet in their first collective only once
        # the slowest import ends: minutes at dp 8 on 2 loaded cores.
        spec = _spec(trace, dp, out / name, "process", block_size=BLOCK_SIZE,
                     num_gpu_blocks=512, max_num_seqs=4, collective_timeout_s=900.0)
        start = time.perf_counter()
        run_cluster(spec)
        times[name] = time.perf_counter() - start
    return times


def transport(side: str, dp: int, out: pathlib.Path) -> dict:
    """One whole run of the bundled default workload in this process."""
    from emu.run import run_cluster
    from emu.workload import load_trace

    trace = load_trace(REPO / "fixtures" / "workloads" / "default.jsonl", dp_size=dp)
    start = time.perf_counter()
    result = run_cluster(_spec(trace, dp, out, side))
    return {"wall": time.perf_counter() - start, "steps": result.ranks[0].steps}


def scale(side: str, dp: int, out: pathlib.Path) -> dict:
    return transport(side, dp, out)


TABLES = {"startup": (startup, ("per-rank", "preloaded"), ("first", "again")),
          "transport": (transport, ("process", "thread"), ("wall",)),
          "scale": (scale, ("thread",), ("wall",))}


def sample(table: str, side: str, dp: int, out: pathlib.Path) -> dict:
    """One sample in a fresh process; its results and peak memory (MB)."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, table, "--one", table, side, str(dp),
                           str(out)],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.exit(f"sample {table} {side} dp={dp} failed:\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.splitlines()[-1])
    return {**result, "process": time.perf_counter() - start}


def event_logs(out: pathlib.Path) -> list[bytes]:
    return ["".join(line + "\n" for line in event_lines(p.parent, int(
        p.name[len("rank"):-len(".steps")]))).encode()
            for p in sorted(out.rglob("rank*.steps"))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("table", choices=TABLES)
    parser.add_argument("--dp", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--one", nargs=4, help=argparse.SUPPRESS)
    args, _ = parser.parse_known_args()
    if args.one:
        table, side, dp, out = args.one
        result = TABLES[table][0](side, int(dp), pathlib.Path(out))
        result["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        result["children_peak_mb"] = resource.getrusage(
            resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        print(json.dumps(result))
        return 0

    _, sides, keys = TABLES[args.table]
    print(machine_line(f"--impl vllm-ascend, {args.table}, {args.repeats} samples per side"))
    identical = True
    header = " | ".join(f"{s} {k} s" for k in keys for s in sides)
    ratio = ("".join(f" | ratio {sides[0]}/{sides[1]} {k}" for k in keys)
             if len(sides) == 2 else "")
    print(f"| dp | {header}{ratio} | peak MB |")
    with tempfile.TemporaryDirectory(prefix="vllm-ascend-bench-") as tmp:
        for dp in args.dp:
            runs: dict[str, list[dict]] = {s: [] for s in sides}
            reference = None
            for i in range(args.repeats):
                for side in sides if i % 2 == 0 else sides[::-1]:
                    out = pathlib.Path(tmp) / f"{args.table}-dp{dp}-{side}-{i}"
                    runs[side].append(sample(args.table, side, dp, out))
                    logs = event_logs(out)
                    reference = reference or logs
                    identical &= logs == reference
            medians = {s: {k: statistics.median(r[k] for r in runs[s]) for k in keys}
                       for s in sides}
            cells = [f"{medians[s][k]:.1f}" for k in keys for s in sides]
            if len(sides) == 2:
                cells += [f"{medians[sides[0]][k] / medians[sides[1]][k]:.1f}x" for k in keys]
            peak = max(max(r["peak_mb"], r["children_peak_mb"]) for s in sides
                       for r in runs[s])
            print(f"| {dp} | " + " | ".join(cells) + f" | {peak:.0f} |", flush=True)
    print(f"{end_line()}; event logs identical across sides: {'yes' if identical else 'NO'}")
    return 0 if identical else 1


if __name__ == "__main__":
    raise SystemExit(main())
