"""Which assumption moves the share of requests DyntraLB pauses? The sensitivity sweep
of docs/fidelity.md around vllm-ascend PR #12292's GPQA accuracy run.

Production published one behavioural figure: in its GPQA Diamond run (198 requests,
static mode, batch size 128, async scheduling) 161 of 198 requests, 81 %, were paused at
least once. The base of this sweep is ``recipe:pr12292-gpqa`` in its published setup
(``RECIPE_SETUPS["pr12292-gpqa"]`` in fixtures/generate.py: 128 in flight, block size
128, vLLM's default 256 sequences per rank, vLLM's DP load balancer, the Ascend
Qwen3-30B-A3B cost profile, static mode from the default ``start_step`` 250); each row
changes one assumption. Every row runs in each scheduling mode of ``--modes`` (async, as
published, and/or sync) on each impl of ``--impls`` (vllm-ascend's own code needs
``.venv-upstream``).

    .venv-upstream/bin/python benchmarks/fidelity_sweep.py --json sweep.json
    .venv/bin/python benchmarks/fidelity_sweep.py --only routing --modes sync --seeds 0 1

Every row prints the paused share (mean over ``--seeds`` workload seeds, each seed's
value in brackets), the pauses, and the longest time one request spent paused. Runs use
the thread transport; a row's runs are deterministic, so the table is reproducible to
the digit with the same seeds and code.
"""

from __future__ import annotations

import argparse
import itertools
import json
import pathlib
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from emu.cluster.supervision import ClusterError  # noqa: E402
from emu.rank.costs import load_profile  # noqa: E402
from emu.recipes import generator  # noqa: E402
from emu.run import run  # noqa: E402
from emu.spec import RunSpec  # noqa: E402
from emu.workload import TraceRequest  # noqa: E402

generate = generator()

DP = 8
SETUP = generate.RECIPE_SETUPS["pr12292-gpqa"]
PUBLISHED_PAUSED = (161, 198)
DEFAULT_TREE = ROOT.parent / "shared" / "upstream" / "vllm-ascend"
BASE_BLOCK_SIZE = SETUP["block_size"]
# KV blocks per rank at block size 128 (RunSpec's default, 524,288 tokens); rows with
# another block size keep the same tokens of KV.
BASE_GPU_BLOCKS = 4096


@dataclass(frozen=True)
class Row:
    """One cell of the sweep: ``spec`` overrides the base RunSpec fields, ``trace`` the
    recipe's arguments."""

    dimension: str
    label: str
    spec: dict = field(default_factory=dict)
    trace: dict = field(default_factory=dict)


def _blocks(block_size: int) -> dict:
    return {"block_size": block_size,
            "num_gpu_blocks": BASE_GPU_BLOCKS * BASE_BLOCK_SIZE // block_size}


def _static(start_step: int | None) -> dict:
    lb = {"enabled": True, "mode": "static"}
    if start_step is not None:
        lb["start_step"] = start_step
    return {"additional_config": {"scheduler_config": {"dyntra_lb_config": lb}}}


MEAN = generate.GPQA_OUTPUT_MEAN_TOKENS
ROWS = [
    Row("base", "recipe:pr12292-gpqa, published setup"),
    # Output lengths: the cited mean with other spreads; longer means (a 2x thinker, and
    # the mean the same paper measured for Qwen3-0.6B, 14,566 tokens).
    Row("output_lengths", f"lognormal mean {MEAN:,}, sigma 0.5", trace={"output_sigma": 0.5}),
    Row("output_lengths", f"lognormal mean {MEAN:,}, sigma 1.2", trace={"output_sigma": 1.2}),
    Row("output_lengths", f"lognormal mean {2 * MEAN:,}, sigma 0.8",
        trace={"output_mean": 2 * MEAN}),
    Row("output_lengths", "lognormal mean 14,566, sigma 0.8", trace={"output_mean": 14_566}),
    Row("block_size", "16", spec=_blocks(16)),
    Row("block_size", "2048", spec=_blocks(2048)),
    Row("start_step", "0", spec=_static(0)),
    Row("start_step", "1000", spec=_static(1000)),
    Row("routing", "round_robin", spec={"router": "round_robin"}),
    Row("routing", "least_loaded (waiting*4 + running)", spec={"router": "least_loaded"}),
    Row("max_num_seqs", "8", spec={"max_num_seqs": 8}),
    Row("max_num_seqs", "12", spec={"max_num_seqs": 12}),
    Row("max_num_seqs", "15", spec={"max_num_seqs": 15}),
    Row("max_num_seqs", "16 (= 128 in flight / 8 ranks)", spec={"max_num_seqs": 16}),
    Row("max_num_seqs", "16, round_robin", spec={"max_num_seqs": 16, "router": "round_robin"}),
    Row("max_num_seqs", "32", spec={"max_num_seqs": 32}),
    Row("kv_pool", "1,024 blocks per rank (131 k tokens)", spec={"num_gpu_blocks": 1024}),
    Row("kv_pool", "512 blocks per rank (65 k tokens)", spec={"num_gpu_blocks": 512}),
    Row("kv_arrival", "prefill + KV transfer 200 ms", spec={"kv_latency_fixed_s": 0.2}),
    Row("kv_arrival", "prefill + KV transfer 1 s", spec={"kv_latency_fixed_s": 1.0}),
    Row("kv_arrival", "first 128 arrive over ~2 s (64 req/s)", trace={"rate": 64.0}),
    Row("cost_model", "kv-token (fixed 20 ms + per KV token)", spec={"cost_model": "kv-token"}),
    Row("cost_model", "planner-heuristic (per KV block)",
        spec={"cost_model": "planner-heuristic"}),
    Row("cost_model", "kv-token-mtp3 (MTP, 3 drafts)", spec={"cost_model": "kv-token-mtp3"}),
]
MODES = {"async": True, "sync": False}


def base_fields() -> dict:
    """The RunSpec fields of the published setup (the base row)."""
    fields_ = {k: v for k, v in SETUP.items() if k != "async_scheduling"}
    fields_["cost_model"] = load_profile(fields_["cost_model"])
    return fields_


def trace(seed: int, **kwargs) -> list[TraceRequest]:
    return [TraceRequest(r["request_id"], r["arrival_s"], r["prompt_tokens"],
                         r["output_tokens"]) for r in generate.pr12292_gpqa(seed=seed, **kwargs)]


def run_cell(row: Row, impl: str, mode: str, seed: int, tree: str,
             out_dir: pathlib.Path) -> dict:
    """One run of ``row`` on ``impl`` in scheduling ``mode`` with workload seed ``seed``,
    its files in ``out_dir``: its pause numbers."""
    fields_ = base_fields()
    fields_["async_scheduling"] = MODES[mode]
    spec_over = dict(row.spec)
    if isinstance(spec_over.get("cost_model"), str):
        spec_over["cost_model"] = load_profile(spec_over["cost_model"])
    fields_.update(spec_over)
    spec = RunSpec(trace=trace(seed, **row.trace), dp_size=DP, out_dir=out_dir, seed=seed,
                   impl=impl, vllm_ascend=tree if impl == "vllm-ascend" else None,
                   transport="thread", device="cpu", collective_timeout_s=1200.0, **fields_)
    start = time.monotonic()
    m = run(spec).metrics
    p = m["pauses"]
    return {"impl": impl, "mode": mode, "seed": seed, "paused_pct": p["requests_paused_pct"],
            "requests_paused": p["requests_paused"], "requests": m["requests_total"],
            "pauses": p["total"], "longest_paused_s": p["longest_paused_ms"] / 1e3,
            "virtual_time_s": m["virtual_time_s"], "wall_s": time.monotonic() - start}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0],
                        help="workload seeds of every row (default: 0)")
    parser.add_argument("--impls", nargs="+", default=["kit"], choices=("kit", "vllm-ascend"),
                        help="the impls every row runs on (default: kit)")
    parser.add_argument("--modes", nargs="+", default=["async"], choices=tuple(MODES),
                        help="the scheduling modes every row runs in (default: async, as "
                             "published)")
    parser.add_argument("--only", nargs="+", metavar="DIMENSION[=VALUE]",
                        help="only these dimensions, or the rows of a dimension whose value "
                             "starts with VALUE: "
                             + ", ".join(dict.fromkeys(r.dimension for r in ROWS)))
    parser.add_argument("--vllm-ascend", default=str(DEFAULT_TREE), metavar="PATH",
                        help="vllm-ascend tree of the vllm-ascend rows")
    parser.add_argument("--json", type=pathlib.Path, help="write every number here")
    args = parser.parse_args(argv)
    rows = [r for r in ROWS if args.only is None
            or any(f"{r.dimension}={r.label}".startswith(o) if "=" in o else r.dimension == o
                   for o in args.only)]
    results = []
    print(f"published: {PUBLISHED_PAUSED[0]} of {PUBLISHED_PAUSED[1]} requests paused "
          f"({100 * PUBLISHED_PAUSED[0] / PUBLISHED_PAUSED[1]:.1f} %)", flush=True)
    with tempfile.TemporaryDirectory(prefix="fidelity-sweep-") as tmp:
        for row, mode, impl in itertools.product(rows, args.modes, args.impls):
            cells = []
            for seed in args.seeds:
                out = pathlib.Path(tmp) / f"{row.dimension}-{ROWS.index(row)}-{impl}-{mode}-{seed}"
                try:
                    cells.append(run_cell(row, impl, mode, seed, args.vllm_ascend, out))
                except ClusterError as exc:
                    print(f"  {row.dimension} {row.label} {impl} {mode} seed {seed}: FAILED: "
                          f"{str(exc).splitlines()[0][:200]}", flush=True)
            if cells:
                results.append({"dimension": row.dimension, "label": row.label,
                                "impl": impl, "mode": mode, "cells": cells})
                print(_line(results[-1]), flush=True)
                if args.json:
                    args.json.write_text(json.dumps({"seeds": args.seeds,
                                                     "published": PUBLISHED_PAUSED,
                                                     "rows": results}, indent=2) + "\n")
    print("\n" + table(results))
    return 0


def _line(result: dict) -> str:
    cells = result["cells"]
    pct = statistics.fmean(c["paused_pct"] for c in cells)
    each = ", ".join(f"{c['paused_pct']:.1f}" for c in cells)
    return (f"{result['dimension']:<15} {result['label']:<42} {result['impl']:<12} "
            f"{result['mode']:<6} "
            f"{pct:5.1f} % [{each}]  pauses {statistics.fmean(c['pauses'] for c in cells):.0f}"
            f"  longest paused {max(c['longest_paused_s'] for c in cells):.1f} s  "
            f"wall {sum(c['wall_s'] for c in cells):.0f} s")


def table(results: list[dict]) -> str:
    """The markdown table of docs/fidelity.md."""
    lines = ["| assumption | value | impl | scheduling | requests paused (mean over seeds) | "
             "each seed | pauses | longest time one request paused |",
             "|---|---|---|---|---:|---|---:|---:|"]
    for r in results:
        cells = r["cells"]
        pct = statistics.fmean(c["paused_pct"] for c in cells)
        lines.append(
            f"| {r['dimension']} | {r['label']} | {r['impl']} | {r['mode']} | {pct:.1f} % | "
            + ", ".join(f"{c['requests_paused']}/{c['requests']}" for c in cells)
            + f" | {statistics.fmean(c['pauses'] for c in cells):.0f} | "
            f"{max(c['longest_paused_s'] for c in cells):.1f} s |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
