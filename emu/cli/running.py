"""How a command takes part in a run (``Launch``: the DP size, torchrun or not) and one
checked run for a command: launched through ``emu.run.run_checked``, its progress on
stderr (``emu.cli.progress``), its failure turned into a message; under torchrun this
process is one of the ranks.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from emu.cli.errors import PROG, ClusterFailed, RunInterrupted, UsageError
from emu.cli.flags import DEFAULT_DP
from emu.cli.inputs import describe_config, local_ranks
from emu.cli.progress import Progress, note, show_for
from emu.cli.recipe_hint import recipe_note
from emu.rank import dp_sync
from emu.spec import CheckedRun

if TYPE_CHECKING:
    from emu.metrics import Run


# How a rank's failure names a TreeError (emu.impl.vllm_ascend.tree).
_TREE_ERROR = "emu.impl.vllm_ascend.tree.TreeError: "


@dataclass(frozen=True)
class Launch:
    """How this command runs its clusters: ``dp`` ranks each, spawned here
    (``torchrun`` None) or, under torchrun, as rank ``torchrun[0]`` of
    ``torchrun[1]``."""

    dp: int
    torchrun: tuple[int, int] | None = None

    @property
    def rank(self) -> int:
        """This process's rank under torchrun; 0 when it spawns the ranks itself."""
        return 0 if self.torchrun is None else self.torchrun[0]

    @property
    def local_ranks(self) -> int:
        return local_ranks(self.dp, self.torchrun is not None)


class Measured(NamedTuple):
    """A finished run as a command reports it: its metrics (metrics.json's dictionary)
    and the run they were computed from (``emu.metrics.Run``, for plots)."""

    metrics: dict
    run: Run


def resolve_launch(args) -> Launch:
    """--dp (default 4) and, for `run` and `ab`, whether torchrun started this process:
    then the DP size is WORLD_SIZE (--dp must agree) and --out is required."""
    torchrun = torchrun_env() if args.command in ("run", "ab") else None
    if torchrun is None:
        return Launch(DEFAULT_DP if args.dp is None else args.dp)
    if args.command == "ab":
        raise UsageError("ab runs two clusters one after the other and cannot run under "
                         "torchrun; start it directly (it spawns its own ranks)")
    if getattr(args, "transport", None) == "thread":
        raise UsageError("--transport thread: under torchrun every rank is its own process; "
                         "drop --transport (or start dyntra-emu directly for threads)")
    world = torchrun[1]
    if args.dp is not None and args.dp != world:
        raise UsageError(f"--dp {args.dp}: under torchrun the DP size is WORLD_SIZE={world}")
    if args.out is None:
        raise UsageError("--out: required under torchrun, so that every rank writes into "
                         "the same directory (on several nodes: a shared directory)")
    return Launch(world, torchrun)


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


def run_one(args, checked: CheckedRun, launch: Launch, desc: str, *, apart: bool = False
            ) -> Measured | None:
    """Run ``checked`` into its out_dir, showing its progress; metrics.json is written
    there. Returns its metrics and the run they were computed from (None on the ranks
    other than 0 under torchrun). ``apart``: in a fresh process of its own
    (``emu.run_apart``; ab's runs of two vllm-ascend trees on rank threads)."""
    from emu.cluster.supervision import ClusterError, Interrupted

    spec = checked.spec
    out_dir = Path(spec.out_dir)
    if launch.rank == 0:
        note(args, f"{desc}: {spec.dp_size} ranks, workload {spec.workload} "
                   f"({len(spec.trace)} requests), {describe_config(checked.config)}, "
                   f"{'async' if spec.async_scheduling else 'synchronous'} scheduling, "
                   f"DP sync {dp_sync.describe(checked.engine_spec.dp_sync_interval)}, "
                   f"seed {spec.seed}{recipe_note(args)}; writing {out_dir}")
    show = show_for(args, leader=launch.rank == 0)
    start = time.monotonic()
    try:
        with Progress([out_dir], spec.dp_size, len(spec.trace), desc, show):
            measured, truncated = _run(checked, launch, apart)
    except ClusterError as exc:
        raise ClusterFailed(_cluster_error_text(exc, out_dir)) from None
    except Interrupted as exc:
        ranks = ("every rank was stopped" if exc.details else
                 "no rank had started yet")
        reports = "every rank's report" if exc.details else "the report"
        raise RunInterrupted(
            f"interrupted by {exc.signal_name}; {ranks}. {out_dir} holds a partial run "
            f"(run.json: interrupted); {reports}: {out_dir / 'error.txt'}",
            exc.exit_code) from None
    if launch.rank != 0:
        return None
    note(args, f"{desc}: finished in {time.monotonic() - start:.1f} s wall-clock")
    if truncated:
        print(f"{PROG}: warning: the run hit max_steps and was cut short; metrics cover "
              "the steps run", file=sys.stderr)
    return measured


def _run(checked: CheckedRun, launch: Launch, apart: bool) -> tuple[Measured | None, bool]:
    """Run the cluster (in a fresh process when ``apart``); returns its metrics and run
    (None on a rank other than 0 under torchrun) and whether a rank hit max_steps (as far
    as this process knows)."""
    if launch.torchrun is None:
        from emu.run_apart import run_here_or_apart

        result = run_here_or_apart(checked, apart=apart)
        return Measured(result.metrics, result.loaded), result.truncated
    # Under torchrun this process is one rank; rank 0 measures once every rank is done.
    from emu.metrics import load_run
    from emu.run import join_checked, measure

    try:
        summary = join_checked(checked)
    except Exception as exc:  # torchrun stops the other ranks and reports the failure
        rank = os.environ.get("RANK")
        raise ClusterFailed(f"rank {rank} failed: {type(exc).__name__}: {exc}") from None
    if launch.rank != 0:
        return None, summary.truncated
    loaded = load_run(checked.spec.out_dir)
    return Measured(measure(checked, loaded), loaded), summary.truncated


def _cluster_error_text(exc, out_dir: Path) -> str:
    if exc.message.startswith(_TREE_ERROR):  # one line says it all (a vLLM it does not fit)
        return (f"the cluster failed: rank {exc.rank}: {exc.message[len(_TREE_ERROR):]}\n"
                f"Every rank was stopped. Every rank's report: {out_dir / 'error.txt'}")
    if exc.rank is None:
        head = f"the cluster failed: {exc.message}"
        body = ""
    else:
        head = f"the cluster failed: rank {exc.rank} failed: {exc.message}"
        body = f"\n--- rank {exc.rank} ---\n{exc.details.get(exc.rank, '').rstrip()}"
    return (f"{head}{body}\nEvery rank was stopped. Every rank's report: "
            f"{out_dir / 'error.txt'}; rank logs: {out_dir}")
