"""``RunSpec``, everything one emulated run depends on, and ``validate``, its one check.

Same spec, same event logs, byte for byte. The CLI, the pytest plugin, the tests and the
benchmarks build a RunSpec and hand it to ``emu.run.run_cluster``, which validates
it in the calling process before any rank starts; the ranks receive it whole.

Most fields are engine knobs declared with ``emu.knobs.knob``: their kind checks them
here and, with a help text, the CLI makes them a flag (``emu.cli.flags``). This module
imports neither torch nor vLLM, so the CLI can build its parser from it quickly.
"""

from __future__ import annotations

import pathlib
from collections.abc import Sequence
from dataclasses import dataclass, field, fields

from dyntra_lb.blocks import num_blocks
from dyntra_lb.config import AdditionalConfig, load_additional_config
from emu import impl
from emu.cluster.device import DEVICE_CHOICES
from emu.faults import FaultPlan, check_plan
from emu.impl import IMPLS, PLANNERS
from emu.impl.kit.scheduler import SCHEDULING_POLICIES
from emu.impl.vllm_ascend.tree import ENV_VAR as VLLM_ASCEND_ENV
from emu.knobs import Choice, Int, Knob, NonNegativeSeconds, Seconds, Switch, Text, knob
from emu.limits import MAX_DP_SIZE, MAX_GPU_BLOCKS, MAX_NUM_SEQS, MAX_SECONDS
from emu.rank.control_costs import PLANNER_COSTS
from emu.rank.costs import DEFAULT_PROFILE, PROFILES, StepCostModel
from emu.workload import ROUTERS, TraceRequest, check_ranks

# How the ranks of a run are hosted (see RunSpec.transport).
TRANSPORTS = ("process", "thread")


@dataclass(frozen=True)
class RunSpec:
    """One emulated run. The fields without a flag:

    - ``trace``: the workload (every rank sees all of it; ``router`` assigns each
      unpinned request to a rank).
    - ``dp_size``: the number of DP ranks.
    - ``out_dir``: where the ranks write their event logs, wall logs and rank logs.
    - ``additional_config``: vllm-ascend's ``--additional-config`` (dict, JSON text or
      None); DyntraLB lives in ``scheduler_config.dyntra_lb_config``. The node is a
      ``kv_consumer`` (decode) node.
    - ``cost_model``: the step-cost profile that prices each step (``emu.rank.costs``: a
      bundled one from ``emu.rank.costs.PROFILES`` or ``load_profile(path)``).
    - ``kv_latency_fixed_s`` + ``kv_latency_per_block_s`` * blocks: virtual time for a
      prompt's KV to arrive from the prefill node.
    - ``max_steps``: safety limit on non-idle iterations per rank; a run that reaches
      it stops on every rank and is reported ``truncated``.
    - ``faults``: an ``emu.faults.FaultPlan`` (kill, slow, KV and collective faults),
      or None for a run without faults.

    The others are described by their ``help``.
    """

    trace: Sequence[TraceRequest]
    dp_size: int = field(metadata={"knob": Knob(Int(1, MAX_DP_SIZE))})
    out_dir: str | pathlib.Path
    additional_config: dict | str | None = None
    max_num_seqs: int = knob(
        16, Int(1, MAX_NUM_SEQS, "requests per rank"), "vLLM max_num_seqs per rank")
    block_size: int = knob(128, Int(1), "tokens per KV block")
    num_gpu_blocks: int = knob(
        4096, Int(1, MAX_GPU_BLOCKS, "each rank keeps every block id"), "KV blocks per rank")
    max_num_batched_tokens: int = knob(8192, Int(1), "token budget per step per rank")
    router: str = knob(
        "round_robin", Choice(ROUTERS),
        "how unpinned requests are assigned to ranks: round_robin, or least_loaded (vLLM's "
        "front end: lowest waiting*4 + running)")
    scheduling_policy: str = knob("fcfs", Choice(SCHEDULING_POLICIES), "vLLM scheduling policy")
    cost_model: StepCostModel = PROFILES[DEFAULT_PROFILE]
    kv_latency_fixed_s: float = knob(0.002, NonNegativeSeconds())
    kv_latency_per_block_s: float = knob(20e-6, NonNegativeSeconds())
    impl: str = knob(
        "kit", Choice(tuple(IMPLS)),
        "which DyntraLB runs in the ranks: kit (ours, dyntra_lb/, in the stub engine) or "
        "vllm-ascend (vllm-ascend's own, unmodified, on vLLM's engine loop and scheduler; "
        "needs vLLM, see README)")
    vllm_ascend: str | None = knob(
        None, Text("PATH"), "vllm-ascend source tree for --impl vllm-ascend",
        shown_default=f"${VLLM_ASCEND_ENV}, else the installed vllm_ascend")
    planner: str | None = knob(
        None, Choice(PLANNERS, optional=True),
        "which planner the ranks run: reference (production's algorithm, "
        "dyntra_lb/planner.py) or fill-protect (opt-in: the throughput drop never takes "
        "a request the fill step admitted), from dyntra_lb/planners.py, with either impl "
        "(in vllm-ascend ranks in place of _balance_load); or vllm-ascend (its own "
        "_balance_load, --impl vllm-ascend only)",
        shown_default="the impl's own: reference for kit, vllm-ascend for vllm-ascend")
    planner_cost: str = knob(
        "model", Choice(PLANNER_COSTS),
        "how DyntraLB's planner is charged in virtual time: model (the cost profile's "
        "control_plane terms, deterministic) or measured (each planner call's measured "
        "wall time, the slowest rank's; not deterministic, a what-if)")
    async_scheduling: bool = knob(
        False, Switch(),
        "vLLM's async scheduling (the Async* DyntraLB scheduler; --impl vllm-ascend only)")
    device: str = knob(
        "auto", Choice(DEVICE_CHOICES),
        "where the ranks' lockstep collective runs: cpu (gloo), npu (HCCL, needs "
        "torch_npu), auto = npu when usable")
    seed: int = knob(0, Int(0, 2**32 - 1),
                     "seed of every rank's RNGs and of a generated (recipe:) workload")
    collective_timeout_s: float = knob(
        60.0, Seconds(MAX_SECONDS), "a collective that waits longer than S seconds fails the run",
        section="run", flag="--collective-timeout")
    run_timeout_s: float | None = knob(
        None, Seconds(MAX_SECONDS, optional=True),
        "stop the run after S seconds of wall-clock time", section="run", flag="--run-timeout",
        shown_default="none")
    max_steps: int = knob(1_000_000, Int(1))
    faults: FaultPlan | None = None
    strict: bool = knob(
        False, Switch(),
        "check invariants every step on every rank (requests and KV blocks conserved, "
        "paused requests keep their KV, admission only from the plan's set); slower",
        section="run")
    stall_steps: int = knob(
        10_000, Int(1),
        "a rank that holds unfinished requests but schedules no token for N consecutive "
        "steps fails the run, naming those requests", section="run")
    max_concurrency: int | None = knob(
        None, Int(1, optional=True),
        "closed-loop clients, as vllm bench serve --max-concurrency: requests are sent in "
        "trace order, each at its arrival_s or once a slot frees, with at most N in "
        "flight across all ranks; TTFT and latencies count from the send",
        shown_default="none: every request is sent at its arrival_s")
    transport: str = knob(
        "process", Choice(TRANSPORTS),
        "process: one process per rank over gloo; thread: every rank a thread of this "
        "process, collectives in memory (CPU only; same event logs and metrics, many times "
        "faster with more ranks than cores)", section="run")


def knobs() -> list:
    """(field name, default, Knob) of every RunSpec field declared with a knob."""
    return [(f.name, f.default, f.metadata["knob"]) for f in fields(RunSpec)
            if "knob" in f.metadata]


def validate(spec: RunSpec) -> AdditionalConfig:
    """Check the whole spec; returns the parsed additional config. Raises ValueError
    (``TraceError`` for trace problems) naming the field; nothing has started yet."""
    for name, _, field_knob in knobs():
        field_knob.kind.check(name, getattr(spec, name))
    _check_combinations(spec)
    if not isinstance(spec.cost_model, StepCostModel):
        raise ValueError(f"RunSpec.cost_model must be a StepCostModel, "
                         f"got {type(spec.cost_model).__name__}")
    if spec.planner_cost == "measured" and spec.cost_model.control_plane is None:
        raise ValueError(f"RunSpec.planner_cost 'measured' charges the planner's wall time "
                         f"to the control plane, but cost model {spec.cost_model.name!r} "
                         "has the control plane off (control_plane null)")
    if spec.out_dir is None:
        raise ValueError("RunSpec.out_dir must be a directory path, got None")
    _validate_trace(spec)
    config = load_additional_config(spec.additional_config)
    if spec.faults is not None:
        lb = config.dyntra_lb
        check_plan(spec.faults, dp_size=spec.dp_size, trace=spec.trace,
                   lb_mode=lb.mode if lb.enabled else None)
    impl.get(spec.impl).check(config, dp_size=spec.dp_size,
                              async_scheduling=spec.async_scheduling,
                              vllm_ascend=spec.vllm_ascend)
    return config


def _check_combinations(spec: RunSpec) -> None:
    """Settings that are each valid but cannot run together."""
    if spec.impl == "kit" and spec.planner == "vllm-ascend":
        raise ValueError("RunSpec.planner 'vllm-ascend' needs impl 'vllm-ascend' (the kit "
                         "runs the planners of dyntra_lb.planners)")
    if spec.transport == "thread" and spec.device == "npu":
        raise ValueError("RunSpec.transport 'thread' runs every rank on the CPU; "
                         "device must be 'cpu' or 'auto', got 'npu'")


def kv_fit_problem(request: TraceRequest, block_size: int, num_gpu_blocks: int) -> str | None:
    """Why ``request`` could never run on a rank with ``num_gpu_blocks`` KV blocks of
    ``block_size`` tokens, or None when it fits (its prompt and whole output at once)."""
    needed = num_blocks(request.prompt_tokens + request.output_tokens, block_size)
    if needed <= num_gpu_blocks:
        return None
    return (f"request {request.request_id!r} needs {needed} KV blocks "
            f"({request.prompt_tokens} prompt + {request.output_tokens} output tokens, "
            f"--block-size {block_size}) but a rank has --num-gpu-blocks "
            f"{num_gpu_blocks}; it could never run")


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
        problem = kv_fit_problem(request, spec.block_size, spec.num_gpu_blocks)
        if problem is not None:
            raise ValueError(f"{where}: {problem}")
    check_ranks(list(trace), spec.dp_size)
