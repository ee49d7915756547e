"""What vllm-ascend PR #12292 published about DyntraLB on hardware, next to what the
emulator gives for the same setup, on both impls (docs/fidelity.md says why they differ).

Three published figures:

- the GPQA accuracy run (``recipe:pr12292-gpqa`` in its published setup,
  ``RECIPE_SETUPS`` in fixtures/generate.py): 161 of 198 requests paused at least once;
- the throughput A/B in the PR's mode: async scheduling, MTP with 3 draft tokens, 10
  runs (``recipe:pr12292``, 1,000 requests at 400 req/s, 128 in flight, block size 2048,
  16 sequences per rank, ``kv-token-mtp3``; B = dynamic mode with
  ``long_req_block_threshold`` 40): +6.60 % output throughput;
- that A/B's absolute output throughput, DyntraLB off and on: 3,194 and 3,405 tok/s.

Each figure runs on every impl in ``--impls`` synchronously and, where the impl accepts
``--async-scheduling`` (vllm-ascend's code does; the kit once its async mode exists),
asynchronously, as the PR ran. Both runs route with ``--router vllm`` (vLLM's DP load
balancer, the PR's front end) unless ``--router`` says otherwise.

    .venv-upstream/bin/python benchmarks/fidelity.py --json fidelity.json
    .venv-upstream/bin/python benchmarks/fidelity.py --seeds 0 1 2 --gpqa-seeds 0
    .venv/bin/python benchmarks/fidelity.py --impls kit            # without vLLM

Prints one table (published | each impl and mode); RESULTS.md keeps it.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import tempfile
import time
from dataclasses import replace

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.fidelity_sweep import (  # noqa: E402
    DEFAULT_TREE,
    PUBLISHED_PAUSED,
    ROWS,
    async_impls,
    generate,
    run_cell,
)
from emu.rank.costs import load_profile  # noqa: E402
from emu.recipes import mean_ci  # noqa: E402
from emu.run import run  # noqa: E402
from emu.spec import RunSpec  # noqa: E402
from emu.workload import TraceRequest  # noqa: E402

PUBLISHED_GAIN_PCT = 6.60
PUBLISHED_THROUGHPUT = (3194.35, 3405.27)  # tok/s, DyntraLB off and on
AB_REQUESTS = 1000
AB_RATE = 400.0
AB_FIELDS = {"max_concurrency": 128, "block_size": generate.PR12292_BLOCK_SIZE,
             "max_num_seqs": 16, "cost_model": "kv-token-mtp3"}
AB_CONFIG_B = {"scheduler_config": {"dyntra_lb_config": {
    "enabled": True, "long_req_block_threshold": 40}}}


def ab_pair(impl: str, async_scheduling: bool, router: str, seed: int, tree: str,
            tmp: pathlib.Path) -> tuple[float, float]:
    """Output throughput (tok/s) of the PR's A/B on one workload seed: A DyntraLB off,
    B on."""
    trace = [TraceRequest(r["request_id"], r["arrival_s"], r["prompt_tokens"],
                          r["output_tokens"])
             for r in generate.pr12292(AB_REQUESTS, AB_RATE, seed)]
    fields = dict(AB_FIELDS, cost_model=load_profile(AB_FIELDS["cost_model"]))
    out = []
    for label, config in (("a", None), ("b", AB_CONFIG_B)):
        spec = RunSpec(trace=trace, dp_size=8, out_dir=tmp / f"ab-{impl}-{async_scheduling}"
                       f"-{seed}-{label}", additional_config=config, seed=seed, impl=impl,
                       vllm_ascend=tree if impl == "vllm-ascend" else None, router=router,
                       async_scheduling=async_scheduling, transport="thread", device="cpu",
                       collective_timeout_s=1200.0, **fields)
        out.append(run(spec).metrics["throughput_tok_s"])
    return out[0], out[1]


def columns(impl_names: list[str]) -> list[tuple[str, bool]]:
    """(impl, async) of every column: each impl synchronously, then asynchronously where
    it can."""
    can_async = async_impls(impl_names)
    return [(n, False) for n in impl_names] + [(n, True) for n in impl_names if n in can_async]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--impls", nargs="+", default=["kit", "vllm-ascend"],
                        choices=("kit", "vllm-ascend"))
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(10)),
                        help="workload seeds of the throughput A/B (default: 0-9, the PR's "
                             "10 runs)")
    parser.add_argument("--gpqa-seeds", type=int, nargs="+", default=[0, 1, 2],
                        help="workload seeds of the GPQA run (default: 0 1 2)")
    parser.add_argument("--router", default="vllm",
                        help="router of the A/B runs (default: vllm; the GPQA run uses its "
                             "published setup's)")
    parser.add_argument("--vllm-ascend", default=str(DEFAULT_TREE), metavar="PATH")
    parser.add_argument("--json", type=pathlib.Path, help="write every number here")
    args = parser.parse_args(argv)
    cols = columns(args.impls)
    base = next(r for r in ROWS if r.dimension == "base")
    results: dict = {"columns": cols, "paused": {}, "ab": {}}
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fidelity-") as tmp:
        for impl, async_ in cols:
            key = _key(impl, async_)
            row = replace(base, spec={"async_scheduling": True}) if async_ else base
            results["paused"][key] = [
                run_cell(row, impl, s, args.vllm_ascend,
                         pathlib.Path(tmp) / f"gpqa-{impl}-{async_}-{s}")["paused_pct"]
                for s in args.gpqa_seeds]
            print(f"GPQA paused share, {key}: {results['paused'][key]}", flush=True)
            results["ab"][key] = [ab_pair(impl, async_, args.router, s, args.vllm_ascend,
                                          pathlib.Path(tmp)) for s in args.seeds]
            print(f"A/B throughput, {key}: {results['ab'][key]}", flush=True)
            if args.json:
                args.json.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\n{table(results, cols)}\n\nwall: {time.monotonic() - start:.0f} s")
    return 0


def _key(impl: str, async_: bool) -> str:
    return f"{impl} ({'async' if async_ else 'sync'})"


def table(results: dict, cols) -> str:
    keys = [_key(*c) for c in cols]
    n_pause = {k: len(results["paused"][k]) for k in keys}
    n_ab = {k: len(results["ab"][k]) for k in keys}
    lines = ["| figure | published | " + " | ".join(keys) + " |",
             "|---|---:|" + "---:|" * len(keys)]
    done, total = PUBLISHED_PAUSED
    lines.append(f"| requests paused, GPQA run | {100 * done / total:.1f} % ({done} of {total}) | "
                 + " | ".join(f"{statistics.fmean(results['paused'][k]):.1f} % "
                              f"({n_pause[k]} seeds)" for k in keys) + " |")
    gains = {k: [(b - a) / a * 100 for a, b in results["ab"][k]] for k in keys}
    lines.append(f"| throughput gain, A/B (MTP 3) | +{PUBLISHED_GAIN_PCT:.2f} % (10 runs) | "
                 + " | ".join(_mean_ci(gains[k], "%") for k in keys) + " |")
    for i, label in enumerate(("DyntraLB off", "DyntraLB on")):
        lines.append(f"| output throughput, {label} | {PUBLISHED_THROUGHPUT[i]:,.0f} tok/s | "
                     + " | ".join(_mean_ci([p[i] for p in results["ab"][k]], "tok/s", 0)
                                  for k in keys) + " |")
    lines.append("| seeds of the A/B | 10 runs | " + " | ".join(str(n_ab[k]) for k in keys)
                 + " |")
    return "\n".join(lines)


def _mean_ci(values: list[float], unit: str, digits: int = 2) -> str:
    """Mean ± the half-width of its 95 % confidence interval (one value: itself); a
    change in percent gets its sign."""
    sign = "+" if unit == "%" else ""
    if len(values) < 2:
        return f"{values[0]:{sign},.{digits}f} {unit}"
    mean, half = mean_ci(values)
    return f"{mean:{sign},.{digits}f} ± {half:,.{digits}f} {unit}"


if __name__ == "__main__":
    sys.exit(main())
