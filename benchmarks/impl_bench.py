"""``--impl vllm-ascend`` against ``--impl kit``: steps per second on the same trace, and
what starting a rank costs.

For each DP size, ``--repeats`` pairs of whole cluster runs (``run_cluster``) on the
same trace and config, alternating which impl runs first. A run's rate is its
non-idle iterations per second of busy loop (the slowest rank's ``loop_wall_s``, start-up
excluded); its start-up is the run's wall time minus that loop (spawning the ranks,
``import torch`` — and for vllm-ascend ``import vllm`` and the tree —, groups, engine
construction, teardown). Both impls run the same virtual-time step model, so the
iteration counts are close but not equal (vLLM's scheduler is not the kit's).
Needs vLLM 0.27.1 (the ``.venv-upstream`` of the README).

    .venv-upstream/bin/python benchmarks/impl_bench.py                 # dp 2 and 4, 3 pairs
    .venv-upstream/bin/python benchmarks/impl_bench.py --dp 2 --repeats 1
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from sidebyside import REPO, STATIC, TREE, end_line, machine_line, pairs

from emu.run import run_cluster
from emu.spec import RunSpec
from emu.workload import load_trace

IMPLS = ("kit", "vllm-ascend")


def one_run(impl: str, dp: int, workload: str) -> dict:
    trace = load_trace(REPO / "fixtures" / "workloads" / f"{workload}.jsonl", dp_size=dp)
    with tempfile.TemporaryDirectory(prefix="impl-bench-") as tmp:
        spec = RunSpec(trace=trace, dp_size=dp, out_dir=tmp, additional_config=STATIC,
                       device="cpu", impl=impl, vllm_ascend=TREE)
        start = time.perf_counter()
        result = run_cluster(spec)
        wall = time.perf_counter() - start
    loop = max(r.loop_wall_s for r in result.ranks)
    steps = result.ranks[0].steps
    return {"steps": steps, "loop_s": loop, "rate": steps / loop, "startup_s": wall - loop,
            "plans": result.ranks[0].num_plans}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dp", type=int, action="append", help="DP sizes (default 2, 4)")
    parser.add_argument("--repeats", type=int, default=3, help="pairs per DP size")
    parser.add_argument("--workload", default="uniform", help="bundled workload")
    args = parser.parse_args()
    print(machine_line(f"workload {args.workload}, static mode from step 0"))
    print(f"{'dp':>3} {'impl':<12} {'steps':>6} {'steps/s':>9} {'start-up s':>10} "
          f"{'ratio (va/kit)':>14}")
    for dp in args.dp or [2, 4]:
        runs: dict[str, list[dict]] = {impl: [] for impl in IMPLS}
        def run(_pair: int, impl: str, dp: int = dp) -> dict:
            return one_run(impl, dp, args.workload)

        for pair in pairs(IMPLS, args.repeats, run):
            for impl, result in pair.items():
                runs[impl].append(result)
        ratios = [v["rate"] / k["rate"] for k, v in zip(runs["kit"], runs["vllm-ascend"],
                                                         strict=True)]
        for impl, rows in runs.items():
            rate = statistics.median(r["rate"] for r in rows)
            startup = statistics.median(r["startup_s"] for r in rows)
            ratio = f"{statistics.median(ratios):.2f}" if impl == "vllm-ascend" else ""
            print(f"{dp:>3} {impl:<12} {rows[0]['steps']:>6} {rate:>9.1f} {startup:>10.1f} "
                  f"{ratio:>14}")
    print(end_line())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
