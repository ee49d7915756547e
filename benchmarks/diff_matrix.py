"""`dyntra-emu diff` (kit against vllm-ascend's DyntraLB) over a matrix: workload x mode
x config x KV pressure at each ``--dp``, block size 16. Prints one row per cell:
identical, or the divergence kinds with their first iteration. The traces are the first ``--n``
requests of the bundled workloads with output lengths capped at ``--max-output`` (so
that a cell runs in a few minutes on a loaded laptop), or with ``--whole`` the whole
workloads. "KV pressure" gives each rank ``--num-gpu-blocks`` just above what the
largest request needs; without it a rank has 1,024 blocks, or with ``--whole`` enough for
every request of the trace at once (paused requests keep their KV, so fewer can stall a
rank for good: docs/upstream-findings.md). A run that fails (``--stall-steps``) is
compared as far as every rank logged; the row says whether both failed the same way.

    DYNTRA_VLLM_ASCEND=../shared/upstream/vllm-ascend \\
        .venv-upstream/bin/python benchmarks/diff_matrix.py --out runs/diff-matrix

``--cost-model NAME`` runs every cell with that step-cost profile (e.g. ``kv-token-mtp3``:
MTP with 3 draft tokens on both impls). Both runs of a cell use vLLM's scheduling mode as
the emulator resolves it (async, vLLM's default) unless ``--no-async-scheduling`` is
given; ``--max-concurrency N`` runs them closed-loop; ``--transport thread`` runs the
ranks as threads (the same event logs, faster); mode ``off`` (``--grid full``, or
``--only off``) runs without DyntraLB.

``--grid full`` runs every combination of the four bundled workloads, static and
dynamic mode, the default config and ``bubble_threshold`` 0.2, with and without KV
pressure, and DyntraLB off with and without KV pressure (40 cells per DP size); the
default runs the 10 cells listed in ``CELLS``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
BLOCK_SIZE = 16
CELLS = [  # (workload, mode, config, kv pressure)
    ("uniform", "static", "default", False),
    ("uniform", "static", "bt0.2", False),
    ("uniform", "dynamic", "default", False),
    ("uniform", "static", "default", True),
    ("longtail", "static", "default", False),
    ("longtail", "static", "bt0.2", False),
    ("longtail", "dynamic", "default", False),
    ("longtail", "dynamic", "bt0.2", False),
    ("longtail", "static", "default", True),
    ("longtail", "dynamic", "default", True),
]


WORKLOADS = ("uniform", "longtail", "default", "bimodal")
FULL = [*itertools.product(WORKLOADS, ("static", "dynamic"), ("default", "bt0.2"),
                           (False, True)),
        *itertools.product(WORKLOADS, ("off",), ("default",), (False, True))]


def small_trace(workload: str, n: int | None, max_output: int | None,
                out: pathlib.Path) -> tuple:
    """Write the first ``n`` requests of a bundled workload (all of them for None), their
    outputs capped at ``max_output`` (uncapped for None); return the file and the KV blocks
    the largest request and all of them need."""
    lines = (REPO / "fixtures" / "workloads" / f"{workload}.jsonl").read_text().splitlines()
    requests = [json.loads(line) for line in lines if line.strip()][:n]
    for r in requests:
        if max_output is not None:
            r["output_tokens"] = min(r["output_tokens"], max_output)
    out.write_text("".join(json.dumps(r) + "\n" for r in requests))
    needs = [-(-(r["prompt_tokens"] + r["output_tokens"]) // BLOCK_SIZE) for r in requests]
    return out, max(needs), sum(needs)


def config(mode: str, variant: str) -> dict:
    if mode == "off":
        return {}
    lb = {"enabled": True, "mode": mode, "start_step": 0, "enable_diagnostics": True}
    if mode == "dynamic":
        lb["long_req_block_threshold"] = 40  # > 640 prompt tokens at block size 16
    if variant == "bt0.2":
        lb["bubble_threshold"] = 0.2
    return {"scheduler_config": {"dyntra_lb_config": lb}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--n", type=int, default=16)
    parser.add_argument("--max-output", type=int, default=60)
    parser.add_argument("--max-num-seqs", type=int, default=4)
    parser.add_argument("--only", default=None, help="run only cells whose name contains this")
    parser.add_argument("--dp", type=int, nargs="+", default=[2])
    parser.add_argument("--grid", choices=("listed", "full"), default="listed")
    parser.add_argument("--stall-steps", type=int, default=2000,
                        help="steps without a token after which a rank counts as stuck")
    parser.add_argument("--cost-model", default=None,
                        help="the step-cost profile of every run (default: kv-token)")
    parser.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction,
                        default=None, help="vLLM's async scheduling in both runs (default: "
                                           "as the emulator resolves it, on)")
    parser.add_argument("--max-concurrency", type=int, default=None,
                        help="closed-loop clients in both runs (default: open loop)")
    parser.add_argument("--transport", choices=("process", "thread"), default="process")
    parser.add_argument("--whole", action="store_true",
                        help="whole workloads, outputs uncapped (ignores --n, --max-output)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    exe = pathlib.Path(sys.executable).with_name("dyntra-emu")
    cells = CELLS if args.grid == "listed" else FULL
    for dp, (workload, mode, variant, pressure) in itertools.product(args.dp, cells):
        name = f"dp{dp}-{workload}-{mode}-{variant}{'-kv' if pressure else ''}"
        if args.only and args.only not in name:
            continue
        n, max_output = (None, None) if args.whole else (args.n, args.max_output)
        trace, need, total = small_trace(workload, n, max_output,
                                         args.out / f"{workload}.jsonl")
        blocks = need + 8 if pressure else (total if args.whole else 1024)
        cmd = [str(exe), "diff", "--workload", str(trace), "--dp", str(dp), "--block-size",
               str(BLOCK_SIZE), "--num-gpu-blocks", str(blocks), "--max-num-seqs",
               str(args.max_num_seqs), "--stall-steps", str(args.stall_steps),
               "--device", "cpu", "--quiet", "--overwrite",
               "--additional-config", json.dumps(config(mode, variant)),
               "--out", str(args.out / name)]
        if args.cost_model is not None:
            cmd += ["--cost-model", args.cost_model]
        if args.async_scheduling is not None:
            cmd.append("--async-scheduling" if args.async_scheduling
                       else "--no-async-scheduling")
        if args.max_concurrency is not None:
            cmd += ["--max-concurrency", str(args.max_concurrency)]
        cmd += ["--transport", args.transport]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        report_path = args.out / name / "diff.json"
        if proc.returncode not in (0, 1) or not report_path.exists():
            print(f"{name:<34} failed (exit {proc.returncode}): {proc.stderr.strip()[-300:]}",
                  flush=True)
            continue
        report = json.loads(report_path.read_text())
        steps = report["counts"]["steps"]
        failed = [f for f in report["failures"] if f is not None]
        if report["identical"]:
            verdict = f"identical ({steps} step records)" + (
                f"; both FAILED the same way: {failed[0][:160]}" if failed else "")
        else:
            first = report["first"]
            kinds = ", ".join(f"{k} x{g['count']}" for k, g in report["by_kind"].items())
            verdict = (f"DIVERGENT first {first['kind']} rank {first['rank']} iter "
                       f"{first['iter']}: {kinds}")
        print(f"{name:<34} blocks={blocks:<5} {verdict}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
