"""One cluster run for a command: launched, watched, its failure turned into a message,
its metrics written; and torchrun, where this process is one of the ranks.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from emu.cli.errors import PROG, ClusterFailed, RunInterrupted, UsageError
from emu.cli.flags import DEFAULT_DP
from emu.cli.inputs import Prepared, build_spec, describe_config
from emu.cli.progress import Progress, note
from emu.cluster.device import DeviceError


def run_one(args, prepared: Prepared, config, out_dir: Path, desc: str):
    """Run one cluster into out_dir with a progress bar and write its metrics.json;
    returns the metrics (None on the ranks other than 0 under torchrun)."""
    from emu.cluster.supervision import ClusterError, Interrupted
    from emu.metrics import compute_metrics, load_run, write_metrics

    spec = build_spec(args, prepared, config, out_dir)
    rank = 0 if args.torchrun is None else args.torchrun[0]
    if rank == 0:
        note(args, f"{desc}: {args.dp} ranks, workload {prepared.workload_label} "
                    f"({len(prepared.trace)} requests), {describe_config(config)}, "
                    f"seed {spec.seed}; writing {out_dir}")
    bar = rank == 0 and not args.quiet and sys.stderr.isatty()
    start = time.monotonic()
    try:
        with Progress(out_dir, args.dp, len(prepared.trace), desc, bar):
            summaries = _launch(spec, torchrun=args.torchrun is not None)
    except DeviceError as exc:
        raise UsageError(f"--device {spec.device}: {exc}") from None
    except ClusterError as exc:
        (out_dir / "error.txt").write_text(str(exc) + "\n")
        raise ClusterFailed(_cluster_error_text(exc, out_dir)) from None
    except Interrupted as exc:
        (out_dir / "error.txt").write_text(str(exc) + "\n")
        raise RunInterrupted(
            f"interrupted by {exc.signal_name}; every rank was stopped. {out_dir} holds a "
            f"partial run (run.json: interrupted); every rank's report: "
            f"{out_dir / 'error.txt'}", exc.exit_code) from None
    if rank != 0:
        return None
    note(args, f"{desc}: finished in {time.monotonic() - start:.1f} s wall-clock")
    if any(s.truncated for s in summaries):
        print(f"{PROG}: warning: the run hit max_steps and was cut short; metrics cover "
              "the steps run", file=sys.stderr)
    metrics = compute_metrics(load_run(out_dir),
                              config=_recorded_config(spec, prepared, summaries[0].device),
                              seed=spec.seed)
    write_metrics(metrics, out_dir / "metrics.json")
    return metrics


def _launch(spec, *, torchrun: bool) -> list:
    """Run the cluster; returns the rank summaries available here (all ranks when this
    process spawns them, its own under torchrun)."""
    if not torchrun:
        from emu.run import run_cluster

        return run_cluster(spec).ranks
    # Under torchrun this process is one rank.
    from emu.run import join_cluster

    try:
        summary = join_cluster(spec)
    except Exception as exc:  # torchrun stops the other ranks and reports the failure
        rank = os.environ.get("RANK")
        raise ClusterFailed(f"rank {rank} failed: {type(exc).__name__}: {exc}") from None
    return [summary]


def torchrun_env() -> tuple[int, int] | None:
    """(rank, world size) when this process was started by torchrun (or a launcher that
    sets the same variables), else None."""
    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    if not all(n in os.environ for n in names):
        return None
    try:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except ValueError:
        raise UsageError("RANK and WORLD_SIZE must be integers (set by torchrun)") from None


def resolve_dp(args) -> None:
    """--dp defaults to 4, or to WORLD_SIZE under torchrun (where it must equal it)."""
    args.torchrun = torchrun_env() if args.command in ("run", "ab") else None
    if args.torchrun is None:
        if args.dp is None:
            args.dp = DEFAULT_DP
        return
    if args.command == "ab":
        raise UsageError("ab runs two clusters one after the other and cannot run under "
                         "torchrun; start it directly (it spawns its own ranks)")
    if getattr(args, "transport", None) == "thread":
        raise UsageError("--transport thread: under torchrun every rank is its own process; "
                         "drop --transport (or start dyntra-emu directly for threads)")
    world = args.torchrun[1]
    if args.dp is not None and args.dp != world:
        raise UsageError(f"--dp {args.dp}: under torchrun the DP size is WORLD_SIZE={world}")
    args.dp = world
    if args.out is None:
        raise UsageError("--out: required under torchrun, so that every rank writes into "
                         "the same directory (on several nodes: a shared directory)")


def _recorded_config(spec, prepared: Prepared, device: str) -> dict:
    """The `config` of metrics.json: what produced the run."""
    return {
        "additional_config": spec.additional_config,
        "workload": prepared.workload_label,
        "dp_size": spec.dp_size,
        "max_num_seqs": spec.max_num_seqs,
        "max_num_batched_tokens": spec.max_num_batched_tokens,
        "block_size": spec.block_size,
        "num_gpu_blocks": spec.num_gpu_blocks,
        "router": spec.router,
        "scheduling_policy": spec.scheduling_policy,
        "max_concurrency": spec.max_concurrency,
        "device": device,  # the one used ("cpu" / "npu"), never "auto"
        "cost_model": spec.cost_model.to_dict(),
        **_recorded_impl(spec),
    }


def _recorded_impl(spec) -> dict:
    """Which DyntraLB ran: the impl and its planner and, for vllm-ascend, its tree and
    vLLM's version."""
    from emu import impl

    return impl.get(spec.impl).describe(spec)


def _cluster_error_text(exc, out_dir: Path) -> str:
    if exc.rank is None:
        head = f"the cluster failed: {exc.message}"
        body = ""
    else:
        head = f"the cluster failed: rank {exc.rank} failed: {exc.message}"
        body = f"\n--- rank {exc.rank} ---\n{exc.details.get(exc.rank, '').rstrip()}"
    return (f"{head}{body}\nEvery rank was stopped. Every rank's report: "
            f"{out_dir / 'error.txt'}; rank logs: {out_dir}")
