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

Each figure runs on every impl of ``--impls`` in every scheduling mode of ``--modes``
(default: async, as the PR ran). The GPQA run routes as its published setup says
(``--router vllm``, vLLM's DP load balancer); the A/B is ``benchmarks/pr12292.py``'s
(round-robin routing), so its 10 seeds reproduce that benchmark's RESULTS.md figures.

    .venv-upstream/bin/python benchmarks/fidelity.py --json fidelity.json   # 10 seeds: slow
    .venv-upstream/bin/python benchmarks/fidelity.py --seeds 0 --gpqa-seeds 0
    .venv/bin/python benchmarks/fidelity.py --impls kit --modes sync async   # without vLLM

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

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import pr12292  # noqa: E402
from benchmarks.fidelity_sweep import (  # noqa: E402
    DEFAULT_TREE,
    MODES,
    PUBLISHED_PAUSED,
    ROWS,
    run_cell,
)
from emu.rank.costs import load_profile  # noqa: E402
from emu.recipes import mean_ci  # noqa: E402

PUBLISHED_GAIN_PCT = 6.60
AB_PROFILE = "kv-token-mtp3"  # the PR's MTP with 3 draft tokens
AB_REQUESTS = 1000


def ab_pair(impl: str, mode: str, seed: int, tree: str,
            tmp: pathlib.Path) -> tuple[float, float]:
    """Output throughput (tok/s) of the PR's A/B (``benchmarks/pr12292.py``) on one
    workload seed: A DyntraLB off, B on."""
    requests = pr12292.trace(AB_REQUESTS, pr12292.RATE, seed)
    profile = load_profile(AB_PROFILE)
    return tuple(pr12292.run_one(requests, config, profile, seed,
                                 tmp / f"ab-{impl}-{mode}-{seed}-{label}", "thread", impl,
                                 tree, MODES[mode])["throughput_tok_s"]
                 for label, config in (("a", None), ("b", pr12292.CONFIG_B)))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--impls", nargs="+", default=["kit", "vllm-ascend"],
                        choices=("kit", "vllm-ascend"))
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(10)),
                        help="workload seeds of the throughput A/B (default: 0-9, the PR's "
                             "10 runs)")
    parser.add_argument("--gpqa-seeds", type=int, nargs="+", default=[0, 1, 2],
                        help="workload seeds of the GPQA run (default: 0 1 2)")
    parser.add_argument("--modes", nargs="+", default=["async"], choices=tuple(MODES),
                        help="scheduling modes (default: async, as the PR ran)")
    parser.add_argument("--vllm-ascend", default=str(DEFAULT_TREE), metavar="PATH")
    parser.add_argument("--json", type=pathlib.Path, help="write every number here")
    args = parser.parse_args(argv)
    cols = [(impl, mode) for mode in args.modes for impl in args.impls]
    base = next(r for r in ROWS if r.dimension == "base")
    results: dict = {"columns": cols, "paused": {}, "ab": {}}
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fidelity-") as tmp:
        for impl, mode in cols:
            key = _key(impl, mode)
            results["paused"][key] = [
                run_cell(base, impl, mode, s, args.vllm_ascend,
                         pathlib.Path(tmp) / f"gpqa-{impl}-{mode}-{s}")["paused_pct"]
                for s in args.gpqa_seeds]
            print(f"GPQA paused share, {key}: {results['paused'][key]}", flush=True)
            results["ab"][key] = [ab_pair(impl, mode, s, args.vllm_ascend, pathlib.Path(tmp))
                                  for s in args.seeds]
            print(f"A/B throughput, {key}: {results['ab'][key]}", flush=True)
            if args.json:
                args.json.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\n{table(results, cols)}\n\nwall: {time.monotonic() - start:.0f} s")
    return 0


def _key(impl: str, mode: str) -> str:
    return f"{impl} ({mode})"


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
        published = pr12292.PR["throughput_tok_s"][i]
        lines.append(f"| output throughput, {label} | {published:,.0f} tok/s | "
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
