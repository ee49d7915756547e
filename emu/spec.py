"""``RunSpec``, everything one emulated run depends on, and ``check``, every rule that
refuses one, which hands back the run resolved once: a ``CheckedRun``.

Same spec, same event logs, byte for byte. The CLI, the pytest plugin, the sweep, the
tests and the benchmarks build a RunSpec; ``check`` judges it in the calling process,
before any rank starts, and works out once what the run needs: the parsed additional
config, the implementation (``emu.impl.Implementation``: for vllm-ascend its tree, git
commit and, when the run is recorded, content hash), the device and the ranks' engine
spec (``emu.rank.engine_spec.EngineSpec``). ``emu.run.run_checked`` runs the checked
run (``emu.run.run`` and ``run_cluster`` check a RunSpec first); everything downstream
(the batches' jobs, the transports, the ranks, metrics.json's ``config``) is handed the
checked run and reads what it holds, so a spec is checked once.

Most fields are engine knobs declared with ``emu.knobs.knob``: their kind checks them
here and, with a help text, the CLI makes them a flag (``emu.cli.flags``). This module
imports neither torch nor vLLM, so the CLI can build its parser from it quickly.

``check(spec, names)`` raises ``SpecError`` with every problem at once, each a
``Problem`` naming the field (and, for a request of the trace or a fault, its index).
``names`` words them: by default in RunSpec's own terms (``RunSpec.trace[3]``,
``block_size=16``); the CLI passes its own, which says ``file:line`` and ``--block-size
16`` instead, so a user of the command line and a caller in Python are refused by the
same rules.
"""

from __future__ import annotations

import functools
import pathlib
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from typing import Any, Protocol

from dyntra_lb.blocks import num_blocks
from dyntra_lb.config import AdditionalConfig, check_deployment, load_additional_config
from dyntra_lb.pause_limit import VICTIMS as PAUSE_VICTIMS
from dyntra_lb.pause_limit import PauseLimit
from emu import impl as impls
from emu.cluster.device import DEVICE_CHOICES, DeviceError, select_device
from emu.faults import FaultPlan, plan_problems
from emu.impl import IMPLS, PLANNERS, Implementation, planner_name
from emu.knobs import Choice, Int, Knob, NonNegativeSeconds, Seconds, Switch, Text, knob
from emu.limits import MAX_DP_SIZE, MAX_GPU_BLOCKS, MAX_NUM_SEQS, MAX_SECONDS
from emu.rank.control_costs import PLANNER_COSTS
from emu.rank.costs import DEFAULT_PROFILE, PROFILES, StepCostModel
from emu.rank.engine_spec import SCHEDULING_POLICIES, EngineSpec
from emu.routers import DEFAULT_ROUTER, ROUTERS, router_help
from emu.workload import (
    ArrivalOrder,
    TraceRequest,
    UniqueIds,
    arrival_problem,
    pinned_rank_problem,
)

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
    - ``workload``: what ``trace`` is called in ``metrics.json`` (``config.workload``):
      a bundled workload's name, a trace file, a recipe; None when it has no name. It
      changes nothing in the run.
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
    workload: str | None = None
    max_num_seqs: int = knob(
        16, Int(1, MAX_NUM_SEQS, "requests per rank"), "vLLM max_num_seqs per rank")
    block_size: int = knob(128, Int(1), "tokens per KV block")
    num_gpu_blocks: int = knob(
        4096, Int(1, MAX_GPU_BLOCKS, "each rank keeps every block id"), "KV blocks per rank")
    max_num_batched_tokens: int = knob(8192, Int(1), "token budget per step per rank")
    router: str = knob(DEFAULT_ROUTER, Choice(tuple(ROUTERS)), router_help())
    api_server_count: int | None = knob(
        None, Int(1, MAX_DP_SIZE, "one lockstep slot per server and rank", optional=True),
        "API servers in front of the ranks with --router vllm, each with its own "
        "in-flight counts and client_count N; which one takes a request is a uniform "
        "choice seeded with --seed (the kernel's among processes accepting on one socket)",
        shown_default="the DP size, as vLLM's default under internal load balancing")
    scheduling_policy: str = knob("fcfs", Choice(SCHEDULING_POLICIES), "vLLM scheduling policy")
    cost_model: StepCostModel = PROFILES[DEFAULT_PROFILE]
    kv_latency_fixed_s: float = knob(0.002, NonNegativeSeconds())
    kv_latency_per_block_s: float = knob(20e-6, NonNegativeSeconds())
    impl: str = knob(
        "kit", Choice(tuple(IMPLS)),
        "which DyntraLB runs in the ranks: kit (ours, dyntra_lb/, in the stub engine) or "
        "vllm-ascend (vllm-ascend's own, unmodified, on vLLM's engine loop and scheduler; "
        "needs vLLM, see docs/vllm-ascend.md)")
    vllm_ascend: str | None = knob(
        None, Text("PATH"), "vllm-ascend source tree for --impl vllm-ascend",
        shown_default=impls.get("vllm-ascend").tree_default)
    planner: str | None = knob(
        None, Choice(PLANNERS, optional=True),
        "which planner the ranks run: reference (production's algorithm, "
        "dyntra_lb/planner/front.py) or fill-protect (opt-in: the throughput drop never "
        "takes a request the fill step admitted), from dyntra_lb/planner/registry.py, with "
        "either impl (in vllm-ascend ranks in place of _balance_load); or vllm-ascend (its own "
        "_balance_load, --impl vllm-ascend only)",
        shown_default="the impl's own: reference for kit, vllm-ascend for vllm-ascend")
    pause_limit_ms: int | None = knob(
        None, Int(1, optional=True),
        "opt-in, --impl kit only (not in production; docs/pause-limit.md): no request stays "
        "DyntraLB-paused longer than MS in total over its life (from the step that pauses "
        "it to the step that resumes it, summed; caught by --strict past MS plus one step); "
        "a request at its limit is never paused and is resumed first; runs with DyntraLB "
        "off (ab's A, the baselines of sweep and tune) have nothing to limit",
        flag="--pause-limit-ms", metavar="MS", shown_default="none, production's pauses")
    pause_victim: str = knob(
        "next", Choice(PAUSE_VICTIMS),
        "--impl kit only, with --pause-limit-ms (least-paused also alone): which running "
        "request an out_blk value pauses. next: production's choice, or the next request "
        "of the same block count not at its limit, none: the value is dropped; drop: "
        "production's choice, dropped if at its limit; least-paused: the request of that "
        "block count paused least so far (spreads pauses)")
    planner_cost: str = knob(
        "model", Choice(PLANNER_COSTS),
        "how DyntraLB's planner is charged in virtual time: model (the cost profile's "
        "control_plane terms, deterministic) or measured (each planner call's measured "
        "wall time, the slowest rank's; not deterministic, a what-if)")
    async_scheduling: bool | None = knob(
        None, Switch(both=True),
        "vLLM's async scheduling: two steps in flight, each step's output processed after "
        "the next step is scheduled (vLLM's AsyncScheduler; with DyntraLB vllm-ascend's "
        "AsyncDyntraLBScheduler)",
        shown_default="on, as vLLM resolves it for this node (emu.spec."
                      "resolve_async_scheduling)")
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
    dp_sync_interval: int | None = knob(
        None, Int(1, optional=True),
        "vLLM >= 0.30's DP sync cadence: the DP group all-reduces its unfinished state at "
        "a wave's step 1 and every N steps (vLLM's --dp-sync-interval, default 16 there); "
        "a wave can end only on such a step. With --impl vllm-ascend the installed vLLM "
        "decides, and this flag must agree with it",
        shown_default="vLLM 0.27.1's: every 32 steps; with --impl vllm-ascend, the "
                      "installed vLLM's")
    transport: str = knob(
        "process", Choice(TRANSPORTS),
        "process: one process per rank over gloo; thread: every rank a thread of this "
        "process, collectives in memory (CPU only; same event logs and metrics, many times "
        "faster with more ranks than cores)", section="run")

    def __post_init__(self):
        object.__setattr__(self, "async_scheduling",
                           resolve_async_scheduling(self.async_scheduling))


def resolve_async_scheduling(requested: bool | None) -> bool:
    """Whether the emulated decode node runs vLLM's async scheduling: ``requested`` when
    given, else what vLLM 0.27.1 resolves for it. ``VllmConfig.__post_init__``
    (vllm/config/vllm.py:1095-1143) turns an unset ``async_scheduling`` on unless the
    model is a pooling model, the speculative method is not EAGLE/MTP-like, the drafter
    batch is not padded, the executor cannot, or it is ROCm with DeepEP DBO; the node
    emulated here is a generative MoE with MTP drafts or none, on an executor that
    supports it, on Ascend. vLLM's CPU platform would turn it off again
    (vllm/platforms/cpu.py:143-144, "async scheduling is not required on CPU"), but the
    node is an NPU node, whose platform (vllm_ascend/platform.py,
    ``check_and_update_config``) keeps it. So: on."""
    return True if requested is None else requested


def knobs() -> list:
    """(field name, default, Knob) of every RunSpec field declared with a knob."""
    return [(f.name, f.default, f.metadata["knob"]) for f in fields(RunSpec)
            if "knob" in f.metadata]


# ----------------------------------------------------------------------- problems


@dataclass(frozen=True)
class Problem:
    """One reason a RunSpec cannot run: the field at fault (``index``: which request of
    ``trace`` or which fault of ``faults``), where that is as the checker's ``Names``
    say it, and what is wrong."""

    field: str
    where: str
    message: str
    index: int | None = None

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


class SpecError(ValueError):
    """A RunSpec that cannot run; ``problems`` lists every reason (``Problem``)."""

    def __init__(self, problems: Sequence[Problem]):
        self.problems = list(problems)
        lines = [str(p) for p in self.problems]
        if len(lines) > 1:
            lines = [f"{len(lines)} problems:", *(f"  {line}" for line in lines)]
        super().__init__("\n".join(lines))


class Names(Protocol):
    """How problems name the settings of a spec (``check``'s second argument)."""

    def where(self, field: str, index: int | None = None) -> str:
        """Where a problem is: the field (and the request or fault at ``index``)."""

    def setting(self, field: str, value: Any) -> str:
        """A setting a message refers to, e.g. a field with the value it needs."""


@dataclass(frozen=True)
class SpecNames:
    """RunSpec's own words: ``RunSpec.planner='vllm-ascend'``, ``RunSpec.trace[3]``,
    ``block_size=16``: what a Python caller wrote."""

    spec: RunSpec

    def where(self, field: str, index: int | None = None) -> str:
        if field == "faults" and index is not None:
            return f"RunSpec.faults[{index}] ({self.spec.faults.faults[index].spec()})"
        if index is not None:
            return f"RunSpec.{field}[{index}]"
        if field == "cost_model":
            return f"RunSpec.cost_model {self.spec.cost_model.name!r}"
        if field in ("additional_config", "trace", "faults", "out_dir"):
            return f"RunSpec.{field}"
        return f"RunSpec.{field}={getattr(self.spec, field)!r}"

    def setting(self, field: str, value: Any) -> str:
        if field == "additional_config":
            return "additional_config={}" if value == {} else "additional_config"
        return f"{field}={value!r}"


@dataclass(frozen=True)
class CheckedRun:
    """A RunSpec that passed every rule of ``check``, with what the check worked out for
    it, once:

    - ``config``: the additional config, parsed;
    - ``implementation``: the DyntraLB implementation, resolved (``emu.impl``: for
      vllm-ascend, its tree and the tree's git commit);
    - ``device``: where the ranks' lockstep collective runs, "cpu" or "npu" (never
      "auto");
    - ``engine_spec``: what every rank reads (``emu.rank.engine_spec.EngineSpec``),
      the DP sync cadence resolved for the implementation.
    """

    spec: RunSpec
    config: AdditionalConfig
    implementation: Implementation
    device: str
    engine_spec: EngineSpec

    @cached_property
    def description(self) -> dict:
        """What metrics.json records of the implementation the run used
        (``emu.impl.Implementation.describe``; for vllm-ascend the tree's content
        hash, computed here, once)."""
        return self.implementation.describe(self.engine_spec)

    def at(self, out_dir: str | pathlib.Path) -> CheckedRun:
        """The same run writing into ``out_dir``, without checking it again: no rule reads
        the output directory beyond its being given, and nothing the check worked out
        depends on it. A Ray task moves its run into a directory of its worker's node."""
        moved = replace(self, spec=replace(self.spec, out_dir=out_dir))
        if "description" in self.__dict__:  # worked out once, wherever the run goes
            moved.__dict__["description"] = self.__dict__["description"]
        return moved


def check(spec: RunSpec, names: Names | None = None, *,
          local_ranks: int | None = None) -> CheckedRun:
    """Every rule a spec must pass before a rank starts; returns the checked run, or
    raises SpecError (a ValueError) listing every problem found, worded by ``names``
    (default: ``SpecNames``). ``local_ranks``: how many of its ranks run on this machine,
    which an NPU must have one each of (default: all of them; under torchrun, its
    LOCAL_WORLD_SIZE).

    Rules that need a field in order (its type, the config parsed) are skipped while
    that field has a problem, so each problem is a reason of its own."""
    names = names or SpecNames(spec)
    problems = _kind_problems(spec)
    if problems:  # the rules below read these fields as their kinds say
        raise SpecError(problems)
    problems = _pause_limit_problems(spec, names)
    if problems:  # the kit's opt-in on another impl: one line, before the impl resolves
        raise SpecError(problems)
    if spec.out_dir is None:
        problems.append(Problem("out_dir", names.where("out_dir"),
                                "must be a directory path, got None"))
    config, implementation, config_problems = _config_problems(spec, names)
    problems += config_problems
    cadence = spec.dp_sync_interval
    if implementation is not None:
        try:
            cadence = implementation.dp_sync_interval(spec.dp_sync_interval)
        except ValueError as exc:
            problems.append(Problem("dp_sync_interval", names.where("dp_sync_interval"),
                                    str(exc)))
    problems += _trace_problems(spec, names)
    problems += _combination_problems(spec, names)
    if config is not None and _is_trace(spec.trace):
        problems += _fault_problems(spec, config, names)
    device, device_problems = _device(spec, names,
                                      spec.dp_size if local_ranks is None else local_ranks)
    problems += device_problems
    if problems:
        raise SpecError(problems)
    return CheckedRun(spec, config, implementation, device,
                      _engine_spec(spec, config, cadence))


def _engine_spec(spec: RunSpec, config: AdditionalConfig,
                 dp_sync_interval: int | None) -> EngineSpec:
    """What the ranks of ``spec`` read: its engine fields, the parsed config, the
    planner they run and the DP sync cadence the implementation resolved."""
    return EngineSpec(
        trace=spec.trace, router=spec.router, max_concurrency=spec.max_concurrency,
        config=config, planner=planner_name(spec.planner, spec.impl),
        planner_cost=spec.planner_cost, max_num_seqs=spec.max_num_seqs,
        max_num_batched_tokens=spec.max_num_batched_tokens, block_size=spec.block_size,
        num_gpu_blocks=spec.num_gpu_blocks, scheduling_policy=spec.scheduling_policy,
        async_scheduling=spec.async_scheduling, cost_model=spec.cost_model,
        api_server_count=api_server_count(spec),
        kv_latency_fixed_s=spec.kv_latency_fixed_s,
        kv_latency_per_block_s=spec.kv_latency_per_block_s, seed=spec.seed,
        max_steps=spec.max_steps, stall_steps=spec.stall_steps, strict=spec.strict,
        faults=spec.faults, dp_sync_interval=dp_sync_interval,
        pause_limit=pause_limit(spec, config))


def api_server_count(spec: RunSpec) -> int:
    """The API servers of ``spec``'s router: ``api_server_count``, by default the DP
    size (vLLM's ``ServeSubcommand.cmd`` under internal load balancing); 1 for a router
    without API servers."""
    if not ROUTERS[spec.router].has_api_servers:
        return 1
    return spec.dp_size if spec.api_server_count is None else spec.api_server_count


def pause_limit(spec: RunSpec, config: AdditionalConfig) -> PauseLimit | None:
    """The run's opt-in pause limit (``dyntra_lb.pause_limit``), None for production's
    pauses: no limit and production's victim, or DyntraLB off (nothing is paused: the
    baseline of ab, sweep and tune runs so with the flags of the DyntraLB runs)."""
    if not config.dyntra_lb.enabled or (spec.pause_limit_ms is None
                                        and spec.pause_victim == "next"):
        return None
    limit_s = None if spec.pause_limit_ms is None else spec.pause_limit_ms / 1e3
    return PauseLimit(limit_s, spec.pause_victim)


def _kind_problems(spec: RunSpec) -> list[Problem]:
    """Each knob's value against its kind, and the fields whose type the other rules
    rely on (cost model, faults)."""
    problems = []
    for name, _, field_knob in knobs():
        message = field_knob.kind.problem(getattr(spec, name))
        if message is not None:
            problems.append(Problem(name, f"RunSpec.{name}", message))
    if spec.workload is not None and not isinstance(spec.workload, str):
        problems.append(Problem("workload", "RunSpec.workload",
                                f"must be a string or None, got {spec.workload!r}"))
    if not isinstance(spec.cost_model, StepCostModel):
        problems.append(Problem("cost_model", "RunSpec.cost_model",
                                f"must be a StepCostModel, got {type(spec.cost_model).__name__}"))
    if spec.faults is not None and not isinstance(spec.faults, FaultPlan):
        problems.append(Problem("faults", "RunSpec.faults",
                                "must be a FaultPlan or None (FaultPlan.of(...) builds one "
                                f"from faults or --fault strings), got {spec.faults!r}"))
    return problems


def _is_trace(trace) -> bool:
    """A list of TraceRequests (whatever their values): what the fault rules can read."""
    return (isinstance(trace, Sequence) and not isinstance(trace, (str, bytes))
            and all(isinstance(r, TraceRequest) for r in trace))


def _trace_problems(spec: RunSpec, names: Names) -> list[Problem]:
    """The trace as the engine needs it: TraceRequests that pass the rules of every trace
    (``emu.workload``: arrival times, unique ids, arrival order, pinned ranks that
    exist), each fitting a rank's KV pool."""
    trace = spec.trace
    where = names.where("trace")
    if isinstance(trace, (str, bytes)) or not isinstance(trace, Sequence):
        return [Problem("trace", where, "must be a list of TraceRequest (load a file with "
                                        "emu.workload.load_trace)")]
    if not trace:
        return [Problem("trace", where, "is empty (expected at least one request)")]
    problems = []
    place = functools.partial(names.where, "trace")
    ids, order = UniqueIds(place), ArrivalOrder(place)
    for i, request in enumerate(trace):
        def problem(message: str | None, field: str | None = None, i=i) -> None:
            if message is not None:
                text = message if field is None else f"field {field!r}: {message}"
                problems.append(Problem("trace", place(i), text, i))

        if not isinstance(request, TraceRequest):
            problem(f"must be a TraceRequest, got {type(request).__name__}")
            continue
        problem(ids.check(request.request_id, i), "request_id")
        arrival = arrival_problem(request.arrival_s)
        problem(arrival or order.check(request.arrival_s, i), "arrival_s")
        if request.rank is not None:
            problem(pinned_rank_problem(request.rank, spec.dp_size), "rank")
        needed = num_blocks(request.prompt_tokens + request.output_tokens, spec.block_size)
        if needed > spec.num_gpu_blocks:
            problem(f"request {request.request_id!r} needs {needed} KV blocks "
                    f"({request.prompt_tokens} prompt + {request.output_tokens} output "
                    f"tokens, {names.setting('block_size', spec.block_size)}) but a rank "
                    f"has {names.setting('num_gpu_blocks', spec.num_gpu_blocks)}; it could "
                    "never run")
    return problems


def _config_problems(spec: RunSpec, names: Names) -> tuple[
        AdditionalConfig | None, Implementation | None, list[Problem]]:
    """The additional config parsed, then the startup checks of a decode
    (``kv_consumer``) node with ``dp_size`` ranks, then the implementation resolved
    (``emu.impl.Implementation.resolve``: what it needs); each None when it fails."""
    where = names.where("additional_config")
    try:
        config = load_additional_config(spec.additional_config)
    except ValueError as exc:
        return None, None, [Problem("additional_config", where, str(exc))]
    try:
        check_deployment(config, kv_role="kv_consumer", data_parallel_size=spec.dp_size,
                         async_scheduling=spec.async_scheduling)
    except ValueError as exc:
        if config.dyntra_lb.enabled and spec.dp_size <= 1:
            return config, None, [Problem(
                "dp_size", names.where("dp_size"),
                f"{exc} DyntraLB is enabled by {names.setting('additional_config', config.raw)}"
                f"; use {names.setting('dp_size', 2)} or more, or run plain DP "
                f"({names.setting('additional_config', {})})")]
        return config, None, [Problem("additional_config", where, str(exc))]
    try:
        implementation = impls.get(spec.impl).resolve(
            config, dp_size=spec.dp_size, async_scheduling=spec.async_scheduling,
            vllm_ascend=spec.vllm_ascend)
    except ValueError as exc:
        return config, None, [Problem("impl", names.where("impl"), str(exc))]
    return config, implementation, []


def _combination_problems(spec: RunSpec, names: Names) -> list[Problem]:
    """Settings that are each valid but cannot run together."""
    problems = []
    if spec.impl == "kit" and spec.planner == "vllm-ascend":
        problems.append(Problem(
            "planner", names.where("planner"),
            f"only with {names.setting('impl', 'vllm-ascend')} (the kit runs the planners "
            "of dyntra_lb/planner/registry.py: reference, fill-protect)"))
    if spec.api_server_count is not None and not ROUTERS[spec.router].has_api_servers:
        problems.append(Problem(
            "api_server_count", names.where("api_server_count"),
            f"only with {names.setting('router', 'vllm')} (the router that models vLLM's "
            f"API servers); {names.where('router')} has none"))
    if spec.transport == "thread" and spec.device == "npu":
        problems.append(Problem(
            "transport", names.where("transport"),
            f"runs every rank on the CPU; {names.setting('device', 'npu')} needs rank "
            f"processes (use {names.setting('device', 'cpu')} or "
            f"{names.setting('device', 'auto')})"))
    if spec.planner_cost == "measured" and spec.cost_model.control_plane is None:
        problems.append(Problem(
            "planner_cost", names.where("planner_cost"),
            f"charges the planner's wall time to DyntraLB's control plane, but "
            f"{names.where('cost_model')} has it off (control_plane null)"))
    return problems


def _pause_limit_problems(spec: RunSpec, names: Names) -> list[Problem]:
    """The pause limit is ours (dyntra_lb.pause_limit), not vllm-ascend's, and drop only
    differs from production's victim under a limit."""
    changed = [f for f, off in (("pause_limit_ms", None), ("pause_victim", "next"))
               if getattr(spec, f) != off]
    if changed and spec.impl != "kit":
        return [Problem(changed[0], names.where(changed[0]),
                        f"is the kit's opt-in, not vllm-ascend's code; run it with "
                        f"{names.setting('impl', 'kit')} (docs/pause-limit.md)")]
    if spec.pause_victim == "drop" and spec.pause_limit_ms is None:
        return [Problem("pause_victim", names.where("pause_victim"),
                        "drops the out_blk values whose victim is at its pause limit, "
                        f"so it needs {names.setting('pause_limit_ms', 2000)} (or another "
                        "limit)")]
    return []


def _fault_problems(spec: RunSpec, config: AdditionalConfig, names: Names) -> list[Problem]:
    """The faults against the run they would be injected into (``emu.faults.
    plan_problems``: ranks, request ids, collective sites the config enters)."""
    if spec.faults is None:
        return []
    lb = config.dyntra_lb
    return [Problem("faults", names.where("faults", i), message, i)
            for i, message in plan_problems(spec.faults.faults, dp_size=spec.dp_size,
                                            trace=spec.trace,
                                            lb_mode=lb.mode if lb.enabled else None)]


def _device(spec: RunSpec, names: Names, local_ranks: int) -> tuple[str, list[Problem]]:
    """Where the lockstep collective of ``spec`` runs ("cpu" or "npu"): rank threads
    share this process's CPU; rank processes take the NPU when ``spec.device`` asks for
    it (or finds one, "auto") and this machine has one for each of its ``local_ranks``
    (``emu.cluster.device.select_device``)."""
    if spec.transport == "thread":
        return "cpu", []
    try:
        return select_device(spec.device, local_ranks=local_ranks), []
    except DeviceError as exc:
        return "cpu", [Problem("device", names.where("device"), str(exc))]
