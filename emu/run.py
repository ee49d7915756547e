"""Run one emulated DP cluster: ``run(spec) -> RunResult``, measured and recorded.

The one way the CLI, the batches, the pytest plugin and the benchmarks run a spec:
``run_checked`` runs the cluster (``run_cluster``'s part, which tests that only need
the ranks' files call directly), computes its metrics and writes them to
``metrics.json`` with the recorded config (``recorded_config``: everything that produced
the run, read from the checked run alone, so the same spec is recorded the same way
whoever ran it). Under torchrun, each rank process calls ``join_cluster`` instead, and
rank 0 then calls ``measure``.

Each entry takes one type. ``run``, ``run_cluster`` and ``join_cluster`` take a
``RunSpec``, what a caller builds, and check it here, in the calling process, before any
rank starts: a bad spec is one ``emu.spec.SpecError`` (a ValueError) listing every
problem. ``run_checked`` and ``join_checked`` take the checked run (``emu.spec.check``:
the spec judged, and what it needs worked out once) of a caller that checked it already:
a command, which words the problems with its flags, and a batch's jobs. Then the spec's
transport (``emu.cluster.transport``: rank processes, or rank threads
with ``transport="thread"``) runs ``dp_size`` ranks, each handed the run's engine spec
(``emu.rank.engine_spec.EngineSpec``) and running the implementation's engine over the
whole trace (``emu.impl.Implementation.run_rank``), and the result lists every rank's
summary and the paths of the files it wrote into ``out_dir``:

- ``rank<r>.steps/``, ``rank<r>.requests/``: the deterministic step and
  request records (docs/records.md; ``dyntra-emu events`` prints them as JSON Lines);
- ``rank<r>.wall/``: wall-clock times per step (planner, DyntraLB collectives);
- ``rank<r>.log``: the rank's ``dyntra_lb`` log (diagnostics lines when enabled);
- ``run.json``: whether the run finished (``emu.run_status``): "running" while it runs,
  then "complete", "failed" or "interrupted";
- ``metrics.json`` (``run`` and ``measure`` only): docs/metrics.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
from dataclasses import dataclass

from emu.cluster.supervision import ClusterError, Interrupted
from emu.cluster.transport import (
    ProcessTransport,
    ThreadTransport,
    TorchrunTransport,
    Transport,
)
from emu.metrics import Run, compute_metrics, load_run, write_metrics
from emu.rank import dp_sync
from emu.rank.context import RankSummary
from emu.records.reader import event_lines, event_records
from emu.run_status import write_status
from emu.spec import CheckedRun, RunSpec, check


@dataclass(frozen=True)
class RunResult:
    """Summaries (by rank), the logs each rank wrote and, from ``run``, the metrics
    (metrics.json's dictionary) and the run as its records read (``loaded``: what
    the metrics were computed from, for plots and timelines without reading the records
    again); both None from ``run_cluster``."""

    out_dir: pathlib.Path
    ranks: list[RankSummary]
    logs: list[pathlib.Path]
    metrics: dict | None = None
    loaded: Run | None = None

    @property
    def truncated(self) -> bool:
        return any(r.truncated for r in self.ranks)

    def event_log(self, rank: int) -> bytes:
        """``rank``'s event log as JSON Lines (what ``dyntra-emu events --rank`` prints)."""
        return "".join(line + "\n" for line in event_lines(self.out_dir, rank)).encode()

    def events(self, rank: int) -> list[dict]:
        """``rank``'s step and request records, in event-log order
        (``emu.records.reader.event_records``)."""
        return list(event_records(self.out_dir, rank))


def run(spec: RunSpec) -> RunResult:
    """Check ``spec`` and run it as ``run_checked`` does."""
    return run_checked(check(spec))


def run_checked(checked: CheckedRun) -> RunResult:
    """Run ``checked`` to completion, measure it and record what ran: its cluster, then
    ``measure``; returns the result with its ``metrics`` and the ``loaded`` run. Raises
    as ``run_cluster`` does (nothing is measured then)."""
    result = _run_cluster(checked)
    loaded = load_run(result.out_dir)
    return dataclasses.replace(result, metrics=measure(checked, loaded), loaded=loaded)


def measure(checked: CheckedRun, loaded: Run) -> dict:
    """The metrics of the finished run of ``checked`` (``loaded`` from its ``out_dir``),
    written to its ``metrics.json`` and returned. Called by ``run`` and, under torchrun,
    by rank 0 once every rank has finished."""
    spec = checked.spec
    metrics = compute_metrics(loaded, config=recorded_config(checked), seed=spec.seed)
    write_metrics(metrics, pathlib.Path(spec.out_dir) / "metrics.json")
    return metrics


def recorded_config(checked: CheckedRun) -> dict:
    """metrics.json's ``config``: what produced the run, from the checked run alone: the
    additional config as parsed, the workload's name, the engine settings, the device it
    ran on, the cost profile, and which DyntraLB ran (``CheckedRun.description``: the
    impl, its planner, for vllm-ascend its tree and vLLM's version)."""
    spec = checked.spec
    return {
        "additional_config": checked.config.raw,
        "workload": spec.workload,
        "dp_size": spec.dp_size,
        "max_num_seqs": spec.max_num_seqs,
        "max_num_batched_tokens": spec.max_num_batched_tokens,
        "block_size": spec.block_size,
        "num_gpu_blocks": spec.num_gpu_blocks,
        "router": spec.router,
        "api_server_count": checked.engine_spec.api_server_count,
        "scheduling_policy": spec.scheduling_policy,
        "max_concurrency": spec.max_concurrency,
        "device": checked.device,  # the one used ("cpu" / "npu"), never "auto"
        "cost_model": spec.cost_model.to_dict(),
        "dp_sync": dp_sync.record(checked.engine_spec.dp_sync_interval),
        **checked.description,
    }


def run_cluster(spec: RunSpec) -> RunResult:
    """Check ``spec`` and run its cluster to completion, unmeasured; returns its result.
    Raises ValueError before anything starts (``emu.spec.SpecError``: a bad spec, an
    unusable device) and ``emu.cluster.supervision.ClusterError`` when a rank fails
    (every rank is stopped)."""
    return _run_cluster(check(spec))


def _run_cluster(checked: CheckedRun) -> RunResult:
    spec, implementation = checked.spec, checked.implementation
    if spec.transport == "thread":
        implementation.check_rank_threads()
        transport = ThreadTransport()
    else:
        transport = ProcessTransport(checked.device, implementation.preload())
    out_dir = pathlib.Path(spec.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with _status_recorded(out_dir, spec):
        summaries = _run(transport, checked)
    ranks = range(spec.dp_size)
    return RunResult(
        out_dir=out_dir,
        ranks=list(summaries),
        logs=[out_dir / f"rank{r}.log" for r in ranks],
    )


def join_cluster(spec: RunSpec) -> RankSummary:
    """Check ``spec`` for this machine's ranks (ValueError before any group is made) and
    join its cluster as ``join_checked`` does."""
    return join_checked(check(spec, local_ranks=_local_ranks()))


def join_checked(checked: CheckedRun) -> RankSummary:
    """Run this process as one rank of ``checked``'s cluster, started by torchrun (or any
    launcher that sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT); returns
    this rank's summary; rank 0 records ``run.json``."""
    spec = checked.spec
    if spec.transport != "process":
        raise ValueError(f"RunSpec.transport {spec.transport!r}: under torchrun every rank "
                         "is its own process; use transport 'process'")
    world = os.environ.get("WORLD_SIZE")
    if world is not None and world != str(spec.dp_size):
        raise ValueError(f"RunSpec.dp_size is {spec.dp_size} but this process is one of "
                         f"WORLD_SIZE={world} ranks")
    transport = TorchrunTransport(checked.device)
    out_dir = pathlib.Path(spec.out_dir)
    if os.environ.get("RANK") != "0":
        return _run(transport, checked)[0]
    out_dir.mkdir(parents=True, exist_ok=True)
    with _status_recorded(out_dir, spec):
        return _run(transport, checked)[0]


def _local_ranks() -> int:
    """The ranks torchrun runs on this machine: LOCAL_WORLD_SIZE (torchrun sets it), else
    as many as this rank's LOCAL_RANK implies."""
    for name, more in (("LOCAL_WORLD_SIZE", 0), ("LOCAL_RANK", 1)):
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value) + more
    return 1


def _run(transport: Transport, checked: CheckedRun) -> list[RankSummary]:
    """Every rank runs the implementation's engine on the run's engine spec."""
    spec = checked.spec
    return transport.run(checked.implementation.run_rank, checked.engine_spec,
                         dp_size=spec.dp_size, out_dir=pathlib.Path(spec.out_dir),
                         collective_timeout_s=spec.collective_timeout_s,
                         run_timeout_s=spec.run_timeout_s)


@contextlib.contextmanager
def _status_recorded(out_dir: pathlib.Path, spec: RunSpec):
    """run.json (emu.run_status) around a launch: "running" before any rank starts, then
    "complete", "interrupted" (SIGINT / SIGTERM) or "failed" with the reason; a launch
    that failed or was interrupted leaves every rank's report in error.txt."""
    write_status(out_dir, "running", dp_size=spec.dp_size, requests=len(spec.trace))
    try:
        yield
    except KeyboardInterrupt as exc:
        _write_report(out_dir, exc)
        write_status(out_dir, "interrupted", dp_size=spec.dp_size, requests=len(spec.trace),
                     reason=str(exc).splitlines()[0] if str(exc) else "KeyboardInterrupt")
        raise
    except BaseException as exc:
        _write_report(out_dir, exc)
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        write_status(out_dir, "failed", dp_size=spec.dp_size, requests=len(spec.trace),
                     reason=reason)
        raise
    write_status(out_dir, "complete", dp_size=spec.dp_size, requests=len(spec.trace))


def _write_report(out_dir: pathlib.Path, exc: BaseException) -> None:
    """error.txt: the report of a launch that failed (``ClusterError``) or was interrupted
    (``Interrupted``), which names the rank and holds every rank's last collectives and
    stack."""
    if isinstance(exc, (ClusterError, Interrupted)):
        (out_dir / "error.txt").write_text(str(exc) + "\n")
