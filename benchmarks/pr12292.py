"""vllm-ascend PR #12292's DyntraLB benchmark, emulated: the A/B the PR published
(duration 401.14 s -> 376.32 s, -6.19 %; output throughput 3194 -> 3405 tok/s, +6.60 %)
run on the emulator for each bundled cost profile, next to the PR's figures.

Workload: the ``pr12292`` recipe of fixtures/generate.py (its docstring and constants
say what is published and what is assumed). Engine: dp=8, block size 2048, 16 requests
per rank (the PR's 128 concurrent requests over 8 ranks), round-robin routing. Clients:
the PR's ``vllm bench serve`` settings, request rate 400 req/s (Poisson) and max
concurrency 128 (``RunSpec.max_concurrency``: closed loop, at most 128 in flight).
A = DyntraLB off, B = ``{"enabled": true, "long_req_block_threshold": 40}`` (dynamic mode,
every other key at its default, as in the PR). Both runs of a pair use the same trace
and seed; each (profile, seed) pair runs one after the other, on the thread transport
(``--transport process`` for rank processes: the same numbers, several times slower).

MTP: the ``kv-token-mtp3`` profile runs the PR's 3 speculative tokens (each accepted
with an assumed probability of 0.7 given the earlier ones, docs/cost-models.md); the
other profiles emit one token per request per step. Scheduling: vLLM's async
scheduling, as the PR ran (vLLM's default for the node, on both impls);
``--no-async-scheduling`` runs vLLM's synchronous scheduling instead.

    .venv/bin/python benchmarks/pr12292.py                          # 1,000 requests, seed 0
    .venv/bin/python benchmarks/pr12292.py --n 300 --seeds 0 1 --profiles kv-token
    .venv/bin/python benchmarks/pr12292.py --profiles kv-token kv-token-mtp3   # MTP row
    .venv/bin/python benchmarks/pr12292.py --n 100 --check-transports   # thread == process
    .venv-upstream/bin/python benchmarks/pr12292.py --impl kit vllm-ascend \
        --profiles kv-token-mtp3 --seeds 0 1 2                    # on vllm-ascend's code too
    .venv-upstream/bin/python benchmarks/pr12292.py --impl kit vllm-ascend \
        --profiles kv-token-mtp3 --seeds 0 1 2 --async-scheduling   # the PR's mode, said

``--dp-sync-interval N`` runs vLLM >= 0.30's DP sync cadence (step 1 and every N
steps; default vLLM 0.27.1's 32); ``--router vllm`` routes with vLLM's balancer in
``--dp`` API servers (the default count) instead of round robin. Both A and B take them.

``--check-transports`` also runs the first seed's pairs on rank processes and checks
that their event logs are byte-identical to the thread runs' and the numbers equal.
``--impl kit vllm-ascend`` runs every pair on both impls (``--impl vllm-ascend``:
vllm-ascend's own DyntraLB on vLLM's scheduler, from ``--vllm-ascend PATH``, default
``$DYNTRA_VLLM_ASCEND`` or ../shared/upstream/vllm-ascend; needs vLLM, the
``.venv-upstream`` environment). Prints a table per pair, then per impl and profile the
mean change over the seeds with its 95 % confidence interval (Student's t), and with
``--json FILE`` writes every number.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from emu.cluster.supervision import ClusterError  # noqa: E402
from emu.rank.costs import PROFILES, CostProfileError, load_profile  # noqa: E402
from emu.recipes import generator, mean_ci  # noqa: E402
from emu.records.reader import event_lines, record_ranks  # noqa: E402
from emu.run import run  # noqa: E402
from emu.spec import RunSpec  # noqa: E402
from emu.workload import TraceRequest  # noqa: E402

generate = generator()
# The PR's settings, as fixtures/generate.py's RECIPE_SETUPS publishes them (with what is
# assumed); benchmarks/starvation.py runs the same.
SETUP = generate.RECIPE_SETUPS["pr12292"]
DP = 8  # one decode instance with internal DP 8
N = 1000  # requests, the PR's
MAX_NUM_SEQS = SETUP["max_num_seqs"]  # 128 concurrent requests / 8 ranks
MAX_CONCURRENCY = SETUP["max_concurrency"]  # the PR's vllm bench serve --max-concurrency
RATE = SETUP["rate"]  # the PR's --request-rate
BLOCK_SIZE = SETUP["block_size"]
CONFIG_B = SETUP["additional_config"]
# The RunSpec fields of every run of the PR's workload here.
ENGINE_FIELDS = {"dp_size": DP, "max_num_seqs": MAX_NUM_SEQS, "block_size": BLOCK_SIZE,
                 "max_concurrency": MAX_CONCURRENCY}
PR = {"duration_s": (401.14, 376.32), "throughput_tok_s": (3194.35, 3405.27)}


def trace(n: int, rate: float, seed: int) -> list[TraceRequest]:
    return [TraceRequest(r["request_id"], r["arrival_s"], r["prompt_tokens"],
                         r["output_tokens"]) for r in generate.pr12292(n, rate, seed)]


def event_logs(run_dir: pathlib.Path) -> list[bytes]:
    """Every rank's event log (``dyntra-emu events --rank r``), byte for byte."""
    return ["".join(line + "\n" for line in event_lines(run_dir, rank)).encode()
            for rank in record_ranks(run_dir)]


def run_one(requests, config, profile, seed, out_dir, transport: str, impl: str = "kit",
            tree: str | None = None, async_scheduling: bool | None = None,
            **fields) -> dict:
    """One emulated run on ``impl`` (vllm-ascend's from ``tree``); its metrics plus the
    wall time it took. ``fields``: other RunSpec fields (``dp_sync_interval``,
    ``router``)."""
    spec = RunSpec(trace=requests, out_dir=out_dir, additional_config=config,
                   cost_model=profile, seed=seed, device="cpu", collective_timeout_s=600.0,
                   transport=transport, impl=impl, **ENGINE_FIELDS,
                   vllm_ascend=tree if impl == "vllm-ascend" else None,
                   async_scheduling=async_scheduling, **fields)
    start = time.monotonic()
    result = run(spec)
    wall_s = time.monotonic() - start
    m = result.metrics
    # Duration as the PR measures it: from the first request's dispatch to the last
    # completion (the emulated run starts at the first arrival, t = 0).
    return {"run_dir": str(result.out_dir),
            "duration_s": m["virtual_time_s"], "throughput_tok_s": m["throughput_tok_s"],
            "output_tokens": m["output_tokens"], "bubble_ratio": m["bubble_ratio"],
            "balance_ratio": m["balance_ratio"], "headroom": m["headroom"],
            "plan_steps": m["plan_churn"]["active_steps"],
            "pauses": m["pauses"]["total"], "planner_steps": m["lb_activity"]["planner_steps"],
            "requests_paused_pct": m["pauses"]["requests_paused_pct"],
            "wall_s": wall_s}


def _pct(a: float, b: float) -> str:
    return f"{(b - a) / a * 100:+.2f} %"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=N, help=f"requests (default {N})")
    parser.add_argument("--rate", type=float, default=RATE,
                        help=f"request rate, requests/s, before the concurrency limit "
                             f"(default {RATE:g}, the PR's)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0],
                        help="workload seeds (default: 0)")
    parser.add_argument("--profiles", nargs="+", default=list(PROFILES),
                        metavar="NAME|FILE.json",
                        help="cost profiles, bundled names or profile files (default: all "
                             "bundled)")
    parser.add_argument("--transport", choices=("thread", "process"), default="thread",
                        help="how the ranks run (default thread)")
    parser.add_argument("--check-transports", action="store_true",
                        help="run the first seed on rank processes too and compare")
    parser.add_argument("--impl", nargs="+", default=["kit"], choices=("kit", "vllm-ascend"),
                        help="which DyntraLB runs in the ranks; several: each pair on each "
                             "(default: kit)")
    parser.add_argument("--vllm-ascend", default=_default_tree(), metavar="PATH",
                        help="the vllm-ascend tree of --impl vllm-ascend (default: "
                             "$DYNTRA_VLLM_ASCEND, else ../shared/upstream/vllm-ascend)")
    parser.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction,
                        default=None,
                        help="vLLM's async scheduling (default: on, vLLM's default for the "
                             "node, as the PR ran)")
    parser.add_argument("--dp-sync-interval", type=int, metavar="N",
                        help="vLLM >= 0.30's DP sync cadence, step 1 and every N steps "
                             "(default: vLLM 0.27.1's, every 32 steps)")
    parser.add_argument("--router", default="round_robin",
                        help="how requests are routed to ranks (default round_robin, as "
                             "recorded before the recipe carried its setup)")
    parser.add_argument("--json", type=pathlib.Path, help="write every number here")
    args = parser.parse_args(argv)
    try:
        profiles = {name: load_profile(name) for name in args.profiles}
    except CostProfileError as exc:
        parser.error(f"--profiles: {exc}")

    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python "
          f"{platform.python_version()}; dp={DP}, block size {BLOCK_SIZE}, "
          f"max_num_seqs {MAX_NUM_SEQS}, n={args.n}, {args.rate:g} req/s, max concurrency "
          f"{MAX_CONCURRENCY}, transport {args.transport}, impl {' '.join(args.impl)}, "
          f"{'synchronous' if args.async_scheduling is False else 'async'} scheduling",
          flush=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="pr12292-") as tmp:
        for seed in args.seeds:
            requests = trace(args.n, args.rate, seed)
            for name, impl in ((name, impl) for name in args.profiles for impl in args.impl):
                pair = {}
                for label, config in (("A", None), ("B", CONFIG_B)):
                    out = pathlib.Path(tmp) / f"{seed}-{profiles[name].name}-{impl}-{label}"
                    try:
                        pair[label] = run_one(requests, config, profiles[name], seed, out,
                                              args.transport, impl, args.vllm_ascend,
                                              args.async_scheduling, **_fields(args))
                    except ClusterError as exc:  # e.g. the watchdog on an overloaded host
                        print(f"  seed {seed} {name} {impl} {label}: FAILED: "
                              f"{str(exc).splitlines()[0][:300]}", flush=True)
                        break
                    print(f"  seed {seed} {name} {impl} {label}: "
                          f"{pair[label]['duration_s']:.2f} s virtual, "
                          f"{pair[label]['wall_s']:.0f} s wall", flush=True)
                if len(pair) < 2:
                    continue
                results.append({"seed": seed, "profile": profiles[name].name, "impl": impl,
                                **pair})
                print(f"  {_row(results[-1])}", flush=True)
                if args.check_transports and seed == args.seeds[0] and impl == "kit":
                    check_transports(requests, profiles[name], seed, pair, pathlib.Path(tmp),
                                     args)
                if args.json:  # after every pair, so an interrupted run keeps its numbers
                    args.json.write_text(json.dumps(
                        {"args": vars(args) | {"json": str(args.json)},
                         "results": results}, indent=2) + "\n")

    header = (f"{'profile':<30} {'seed':>4} {'duration A -> B (s)':>22} {'change':>9} "
              f"{'output tok/s A -> B':>22} {'change':>9} {'bubble A -> B':>15} "
              f"{'bound gain A':>12} {'plans':>6} {'pauses':>6}")
    print("\n" + header)
    print("-" * len(header))
    pa, pb = PR["duration_s"]
    ta, tb = PR["throughput_tok_s"]
    print(f"{'PR #12292 (published)':<30} {'':>4} {f'{pa:.2f} -> {pb:.2f}':>22} "
          f"{_pct(pa, pb):>9} {f'{ta:.1f} -> {tb:.1f}':>22} {_pct(ta, tb):>9}")
    for r in results:
        print(_row(r))
    print_means(results)
    return 0


def print_means(results: list[dict]) -> None:
    """Per impl and profile: the mean change of B against A over the seeds with its 95 %
    confidence interval (two or more seeds), and the mean wall time of a run."""
    groups: dict[tuple, list[dict]] = {}
    for r in results:
        groups.setdefault((r["impl"], r["profile"]), []).append(r)
    print(f"\n{'impl':<12} {'profile':<22} {'seeds':>5} {'duration change':>18} "
          f"{'throughput change':>18} {'wall per run':>12}")
    for (impl, profile), rows in groups.items():
        cells = []
        for key in ("duration_s", "throughput_tok_s"):
            changes = [(r["B"][key] - r["A"][key]) / r["A"][key] * 100 for r in rows]
            if len(changes) < 2:
                cells.append(f"{changes[0]:+.2f} %")
                continue
            mean, half = mean_ci(changes)
            cells.append(f"{mean:+.2f} ± {half:.2f} %")
        wall = sum(r[side]["wall_s"] for r in rows for side in "AB") / (2 * len(rows))
        paused = [r["B"]["requests_paused_pct"] for r in rows]
        share = (f"{paused[0]:.1f} %" if len(paused) < 2 else
                 "{:.1f} ± {:.1f} %".format(*mean_ci(paused)))
        print(f"{impl:<12} {profile:<22} {len(rows):>5} {cells[0]:>18} {cells[1]:>18} "
              f"{wall:>10.0f} s   B's requests paused: {share}")


def _fields(args) -> dict:
    """The RunSpec fields the flags set beyond the PR's own setup."""
    return {"dp_sync_interval": args.dp_sync_interval, "router": args.router}


def _default_tree() -> str:
    return os.environ.get("DYNTRA_VLLM_ASCEND") or str(
        ROOT.parent / "shared" / "upstream" / "vllm-ascend")


def check_transports(requests, profile, seed, pair, tmp, args) -> None:
    """Run the pair again on the other transport; print whether every rank's event log
    is byte-identical and the table's numbers equal (wall time aside)."""
    other = "process" if args.transport == "thread" else "thread"
    for label, config in (("A", None), ("B", CONFIG_B)):
        again = run_one(requests, config, profile, seed,
                        tmp / f"{seed}-{profile.name}-{label}-{other}", other,
                        async_scheduling=args.async_scheduling, **_fields(args))
        same_logs = all(
            a == b for a, b in zip(event_logs(pathlib.Path(pair[label]["run_dir"])),
                                   event_logs(pathlib.Path(again["run_dir"])), strict=True))
        keys = [k for k in again if k not in ("wall_s", "run_dir")]
        same_numbers = all(again[k] == pair[label][k] for k in keys)
        print(f"  seed {seed} {profile.name} {label}: {other} transport "
              f"{again['wall_s']:.0f} s wall "
              f"({args.transport} {pair[label]['wall_s']:.0f} s); event logs "
              f"{'identical' if same_logs else 'DIFFERENT'}, numbers "
              f"{'equal' if same_numbers else 'DIFFERENT'}", flush=True)


def _row(r: dict) -> str:
    """One (profile, seed) pair as a table row."""
    a, b = r["A"], r["B"]
    dur = f"{a['duration_s']:.2f} -> {b['duration_s']:.2f}"
    thr = f"{a['throughput_tok_s']:.1f} -> {b['throughput_tok_s']:.1f}"
    bub = f"{a['bubble_ratio'] * 100:.1f} -> {b['bubble_ratio'] * 100:.1f} %"
    gain = a["headroom"]["max_gain"]
    name = r["profile"] if r.get("impl", "kit") == "kit" else f"{r['profile']} [{r['impl']}]"
    return (f"{name:<30} {r['seed']:>4} {dur:>22} "
            f"{_pct(a['duration_s'], b['duration_s']):>9} {thr:>22} "
            f"{_pct(a['throughput_tok_s'], b['throughput_tok_s']):>9} {bub:>15} "
            f"{gain * 100:>+11.1f}% {b['plan_steps']:>6} {b['pauses']:>6}")


if __name__ == "__main__":
    sys.exit(main())
