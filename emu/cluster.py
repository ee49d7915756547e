"""Run one emulated DP cluster: ``run_cluster(RunSpec(...)) -> RunResult``.

The single entry point the CLI, the pytest plugin, the tests and the benchmarks use
(under torchrun, each rank process calls ``join_cluster(spec)`` instead).
Everything in the spec is validated here, in the calling process, before any rank
starts: a bad config or trace is one ``ValueError`` naming the field and what was
expected. Then the launcher starts ``dp_size`` rank processes (or, with
``transport="thread"``, ``emu.threads`` starts ``dp_size`` rank threads), each runs an
``EngineCore`` over the whole trace, and the result lists every rank's summary and the
paths of the files it wrote into ``out_dir``:

- ``rank<r>.events.jsonl``: the deterministic event log (step and request records);
- ``rank<r>.wall.jsonl``: wall-clock times per step (planner, DyntraLB collectives);
- ``rank<r>.log``: the rank's ``dyntra_lb`` log (diagnostics lines when enabled);
- ``run.json``: whether the run finished (``emu.run_status``): "running" while it runs,
  then "complete", "failed" or "interrupted".
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import pathlib
import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dyntra_lb import planner
from dyntra_lb.blocks import num_blocks
from dyntra_lb.config import AdditionalConfig, load_additional_config
from emu import impl
from emu.costs import DEFAULT_PROFILE, PROFILES, StepCostModel
from emu.device import DEVICE_CHOICES
from emu.engine import RankSummary
from emu.faults import FaultPlan, check_plan
from emu.impl import IMPLS, PLANNERS
from emu.launcher import join_from_env, launch
from emu.limits import MAX_DP_SIZE, MAX_GPU_BLOCKS, MAX_NUM_SEQS, MAX_SECONDS
from emu.run_status import write_status
from emu.scheduler import SCHEDULING_POLICIES
from emu.threads import run_in_threads
from emu.workload import ROUTERS, TraceRequest, check_ranks

# How the ranks of a run are hosted (see RunSpec.transport).
TRANSPORTS = ("process", "thread")


@dataclass(frozen=True)
class RunSpec:
    """Everything one emulated run depends on. Same spec -> byte-identical event logs.

    - ``trace``: the workload (every rank sees all of it; ``router`` assigns each
      unpinned request to a rank).
    - ``additional_config``: vllm-ascend's ``--additional-config`` (dict, JSON text or
      None); DyntraLB lives in ``scheduler_config.dyntra_lb_config``. The node is a
      ``kv_consumer`` (decode) node with synchronous scheduling.
    - scheduler: ``max_num_seqs``, ``max_num_batched_tokens`` (token budget per step),
      ``block_size`` (tokens per KV block), ``num_gpu_blocks`` (KV pool per rank),
      ``scheduling_policy`` ("fcfs" | "priority").
    - ``cost_model``: the step-cost profile that prices each step (``emu.costs``: a
      bundled one from ``emu.costs.PROFILES`` or ``load_profile(path)``; default
      ``kv-token``).
    - ``kv_latency_fixed_s`` + ``kv_latency_per_block_s`` * blocks: virtual time for a
      prompt's KV to arrive from the prefill node.
    - ``seed``: every rank seeds Python's and numpy's RNG with it before the run.
    - ``device``: "cpu", "npu" or "auto" (where the lockstep collective runs).
    - ``collective_timeout_s``: a collective that waits longer fails the run;
      ``run_timeout_s``: wall-clock limit for the whole run (None: none).
    - ``max_steps``: safety limit on non-idle iterations per rank; a run that reaches
      it stops on every rank and is reported ``truncated``.
    - ``faults``: an ``emu.faults.FaultPlan`` (kill, slow, KV and collective faults),
      or None for a run without faults.
    - ``strict``: every rank checks the strict-mode invariants every step (requests and
      KV blocks conserved, paused requests keep their blocks, admission limited to the
      plan's set); a violation fails the run with ``emu.guard.InvariantError``.
    - ``stall_steps``: a rank that holds unfinished requests but schedules no token for
      this many consecutive steps fails the run with ``emu.engine.StallError`` naming
      its requests (instead of spinning in dummy steps until ``max_steps``).
    - ``impl``: what runs in each rank (``emu.impl``): "kit" (our DyntraLB in the stub
      engine) or "vllm-ascend" (vllm-ascend's DyntraLB on vLLM's engine and scheduler);
      ``vllm_ascend``: the vllm-ascend source tree for "vllm-ascend" (None: the
      ``DYNTRA_VLLM_ASCEND`` environment variable, else the installed package).
    - ``async_scheduling``: vLLM's async scheduling (``--impl vllm-ascend`` only).
    - ``transport``: "process" (one rank process each, real gloo groups; the default) or
      "thread" (every rank a thread of the calling process, collectives in memory:
      ``emu.threads``; CPU and ``impl`` "kit" only, no torchrun). Virtual time makes
      the event logs, rank logs and metrics of both byte-identical; "thread" is several
      times faster once ranks outnumber cores.
    - ``planner``: which planner the ranks run (``emu.impl.PLANNERS``): one of ours from
      ``dyntra_lb.planners`` ("reference" = production's algorithm, or an opt-in one),
      or "vllm-ascend" (``DyntraLBDPEngineCoreProc._balance_load``, impl "vllm-ascend"
      only); None: the impl's own ("reference" for the kit). In a "vllm-ascend" run one
      of ours takes the place of ``_balance_load`` and the rest of its code runs as is.
    """

    trace: Sequence[TraceRequest]
    dp_size: int
    out_dir: str | pathlib.Path
    additional_config: dict | str | None = None
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 8192
    block_size: int = 128
    num_gpu_blocks: int = 4096
    scheduling_policy: str = "fcfs"
    cost_model: StepCostModel = PROFILES[DEFAULT_PROFILE]
    kv_latency_fixed_s: float = 0.002
    kv_latency_per_block_s: float = 20e-6
    router: str = "round_robin"
    seed: int = 0
    device: str = "auto"
    collective_timeout_s: float = 60.0
    run_timeout_s: float | None = None
    max_steps: int = 1_000_000
    faults: FaultPlan | None = None
    strict: bool = False
    stall_steps: int = 10_000
    impl: str = "kit"
    vllm_ascend: str | None = None
    async_scheduling: bool = False
    transport: str = "process"
    planner: str | None = None


@dataclass(frozen=True)
class RunResult:
    """Summaries (by rank) and the files each rank wrote."""

    out_dir: pathlib.Path
    ranks: list[RankSummary]
    event_logs: list[pathlib.Path]
    wall_logs: list[pathlib.Path]
    logs: list[pathlib.Path]

    @property
    def truncated(self) -> bool:
        return any(r.truncated for r in self.ranks)

    @property
    def device(self) -> str:
        """Where the lockstep collective ran: "cpu" or "npu"."""
        return self.ranks[0].device

    def events(self, rank: int) -> list[dict]:
        """Parsed records of ``rank``'s event log, in file order."""
        with open(self.event_logs[rank]) as f:
            return [json.loads(line) for line in f]


def _positive_int(name: str, value, upper: int | None = None) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"RunSpec.{name} must be an int >= 1, got {value!r}")
    if upper is not None and value > upper:
        raise ValueError(f"RunSpec.{name} must be at most {upper}, got {value!r}")


def _non_negative(name: str, value) -> None:
    if (not isinstance(value, (int, float)) or isinstance(value, bool)
            or not math.isfinite(value) or value < 0):
        raise ValueError(f"RunSpec.{name} must be a finite number >= 0 (seconds), "
                         f"got {value!r}")


def validate(spec: RunSpec) -> AdditionalConfig:
    """Check the whole spec; returns the parsed additional config. Raises ValueError
    (``TraceError`` for trace problems) naming the field; nothing has started yet."""
    _positive_int("dp_size", spec.dp_size, MAX_DP_SIZE)
    _positive_int("max_num_seqs", spec.max_num_seqs, MAX_NUM_SEQS)
    _positive_int("num_gpu_blocks", spec.num_gpu_blocks, MAX_GPU_BLOCKS)
    for name in ("max_num_batched_tokens", "block_size", "max_steps", "stall_steps"):
        _positive_int(name, getattr(spec, name))
    if spec.scheduling_policy not in SCHEDULING_POLICIES:
        raise ValueError(f"RunSpec.scheduling_policy must be one of "
                         f"{list(SCHEDULING_POLICIES)}, got {spec.scheduling_policy!r}")
    for name in ("strict", "async_scheduling"):
        if not isinstance(getattr(spec, name), bool):
            raise ValueError(f"RunSpec.{name} must be a bool, got {getattr(spec, name)!r}")
    if spec.impl not in IMPLS:
        raise ValueError(f"RunSpec.impl must be one of {list(IMPLS)}, got {spec.impl!r}")
    if spec.planner is not None and spec.planner not in PLANNERS:
        raise ValueError(f"RunSpec.planner must be one of {list(PLANNERS)} or None, got "
                         f"{spec.planner!r}")
    if spec.impl == "kit" and spec.planner == "vllm-ascend":
        raise ValueError("RunSpec.planner 'vllm-ascend' needs impl 'vllm-ascend' (the kit "
                         "runs the planners of dyntra_lb.planners)")
    if spec.router not in ROUTERS:
        raise ValueError(f"RunSpec.router must be one of {list(ROUTERS)}, got {spec.router!r}")
    if spec.device not in DEVICE_CHOICES:
        raise ValueError(f"RunSpec.device must be one of {list(DEVICE_CHOICES)}, "
                         f"got {spec.device!r}")
    if spec.transport not in TRANSPORTS:
        raise ValueError(f"RunSpec.transport must be one of {list(TRANSPORTS)}, "
                         f"got {spec.transport!r}")
    if spec.transport == "thread" and spec.device == "npu":
        raise ValueError("RunSpec.transport 'thread' runs every rank on the CPU; "
                         "device must be 'cpu' or 'auto', got 'npu'")
    if spec.transport == "thread" and spec.impl != "kit":
        raise ValueError(f"RunSpec.transport 'thread' runs impl 'kit' only; {spec.impl!r} "
                         "brings vLLM's engine, which keeps per-process state")
    if not isinstance(spec.cost_model, StepCostModel):
        raise ValueError(f"RunSpec.cost_model must be a StepCostModel, "
                         f"got {type(spec.cost_model).__name__}")
    _non_negative("kv_latency_fixed_s", spec.kv_latency_fixed_s)
    _non_negative("kv_latency_per_block_s", spec.kv_latency_per_block_s)
    if not isinstance(spec.seed, int) or isinstance(spec.seed, bool):
        raise ValueError(f"RunSpec.seed must be an int, got {spec.seed!r}")
    timeout = spec.collective_timeout_s
    if (not isinstance(timeout, (int, float)) or isinstance(timeout, bool)
            or not 0 < timeout <= MAX_SECONDS):
        raise ValueError(f"RunSpec.collective_timeout_s must be > 0 and at most "
                         f"{MAX_SECONDS:g}, got {timeout!r}")
    run_timeout = spec.run_timeout_s
    if run_timeout is not None and (not isinstance(run_timeout, (int, float))
                                    or isinstance(run_timeout, bool)
                                    or not 0 < run_timeout <= MAX_SECONDS):
        raise ValueError(f"RunSpec.run_timeout_s must be > 0 and at most {MAX_SECONDS:g}, "
                         f"or None, got {run_timeout!r}")
    if spec.out_dir is None:
        raise ValueError("RunSpec.out_dir must be a directory path, got None")

    _validate_trace(spec)

    config = load_additional_config(spec.additional_config)
    if spec.faults is not None:
        lb = config.dyntra_lb
        check_plan(spec.faults, dp_size=spec.dp_size, trace=spec.trace,
                   lb_mode=lb.mode if lb.enabled else None)
    impl.check(spec.impl, config, dp_size=spec.dp_size, async_scheduling=spec.async_scheduling,
               vllm_ascend=spec.vllm_ascend, faults=spec.faults)
    return config


def _validate_trace(spec: RunSpec) -> None:
    trace = spec.trace
    if isinstance(trace, (str, bytes)) or not isinstance(trace, Sequence):
        raise ValueError("RunSpec.trace must be a list of TraceRequest "
                         "(load a file with emu.workload.load_trace)")
    if not trace:
        raise ValueError("RunSpec.trace is empty (expected at least one request)")
    seen: set[str] = set()
    previous = 0.0
    for i, request in enumerate(trace):
        where = f"RunSpec.trace[{i}]"
        if not isinstance(request, TraceRequest):
            raise ValueError(f"{where} must be a TraceRequest, got {type(request).__name__}")
        if request.request_id in seen:
            raise ValueError(f"{where}: duplicate request_id {request.request_id!r}")
        seen.add(request.request_id)
        if request.arrival_s < previous:
            raise ValueError(f"{where}: arrival_s must be non-decreasing, got "
                             f"{request.arrival_s} after {previous}")
        previous = request.arrival_s
        needed = num_blocks(request.prompt_tokens + request.output_tokens, spec.block_size)
        if needed > spec.num_gpu_blocks:
            raise ValueError(
                f"{where}: request {request.request_id!r} needs {needed} KV blocks "
                f"({request.prompt_tokens} prompt + {request.output_tokens} output tokens, "
                f"block_size {spec.block_size}) but a rank has num_gpu_blocks="
                f"{spec.num_gpu_blocks}; it could never run")
    check_ranks(list(trace), spec.dp_size)


def run_cluster(spec: RunSpec) -> RunResult:
    """Validate ``spec``, run the cluster to completion and return its result. Raises
    ValueError before anything starts, ``emu.launcher.ClusterError`` when a rank fails
    (every rank is stopped), ``emu.device.DeviceError`` for an unusable device."""
    config = validate(spec)
    out_dir = pathlib.Path(spec.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if config.dyntra_lb.enabled:
        # Compile the numba planner here, once, so that the ranks load numba's disk cache
        # at start-up instead of each compiling it while the others wait in a collective.
        planner.warm_up()
    with _status_recorded(out_dir, spec):
        if spec.transport == "thread":
            summaries = run_in_threads(
                _rank_main,
                (spec, config),
                dp_size=spec.dp_size,
                out_dir=out_dir,
                collective_timeout_s=spec.collective_timeout_s,
                run_timeout_s=spec.run_timeout_s,
            )
        else:
            summaries = launch(
                _rank_main,
                (spec, config),
                dp_size=spec.dp_size,
                device=spec.device,
                out_dir=out_dir,
                collective_timeout_s=spec.collective_timeout_s,
                run_timeout_s=spec.run_timeout_s,
            )
    ranks = range(spec.dp_size)
    return RunResult(
        out_dir=out_dir,
        ranks=list(summaries),
        event_logs=[out_dir / f"rank{r}.events.jsonl" for r in ranks],
        wall_logs=[out_dir / f"rank{r}.wall.jsonl" for r in ranks],
        logs=[out_dir / f"rank{r}.log" for r in ranks],
    )


def join_cluster(spec: RunSpec) -> RankSummary:
    """Run this process as one rank of ``spec``'s cluster, started by torchrun (or any
    launcher that sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT); returns
    this rank's summary. Validates first (ValueError before any group is made). The
    launcher's watchdog is not there: torchrun owns the processes, a hang ends with the
    collective timeout, and failures propagate as exceptions."""
    config = validate(spec)
    if spec.transport != "process":
        raise ValueError(f"RunSpec.transport {spec.transport!r}: under torchrun every rank "
                         "is its own process; use transport 'process'")
    world = os.environ.get("WORLD_SIZE")
    if world is not None and world != str(spec.dp_size):
        raise ValueError(f"RunSpec.dp_size is {spec.dp_size} but this process is one of "
                         f"WORLD_SIZE={world} ranks")
    join = functools.partial(join_from_env, _rank_main, (spec, config), device=spec.device,
                             out_dir=spec.out_dir,
                             collective_timeout_s=spec.collective_timeout_s)
    if os.environ.get("RANK") != "0":
        return join()
    out_dir = pathlib.Path(spec.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with _status_recorded(out_dir, spec):
        return join()


@contextlib.contextmanager
def _status_recorded(out_dir: pathlib.Path, spec: RunSpec):
    """run.json (emu.run_status) around a launch: "running" before any rank starts, then
    "complete", "interrupted" (SIGINT / SIGTERM) or "failed" with the reason."""
    write_status(out_dir, "running", dp_size=spec.dp_size, requests=len(spec.trace))
    try:
        yield
    except KeyboardInterrupt as exc:
        write_status(out_dir, "interrupted", dp_size=spec.dp_size, requests=len(spec.trace),
                     reason=str(exc).splitlines()[0] if str(exc) else "KeyboardInterrupt")
        raise
    except BaseException as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        write_status(out_dir, "failed", dp_size=spec.dp_size, requests=len(spec.trace),
                     reason=reason)
        raise
    write_status(out_dir, "complete", dp_size=spec.dp_size, requests=len(spec.trace))


def _rank_main(ctx, args) -> RankSummary:
    """Body of each rank: the launcher's target in a rank process, or the thread
    transport's in a rank thread."""
    spec, config = args
    return make_engine(ctx, spec, config).run()


def make_engine(ctx, spec: RunSpec, config: AdditionalConfig):
    """This rank's engine for ``spec`` (validated), seeded, writing into
    ``ctx.out_dir``. Tests that need a sabotaged rank start from here. Under the thread
    transport every rank seeds the same process-wide RNGs with the same seed; no engine
    code draws from them (a draw would depend on how the threads interleave)."""
    random.seed(spec.seed)
    np.random.seed(spec.seed)
    return impl.get(spec.impl).build(ctx, spec, config, pathlib.Path(ctx.out_dir))
