"""``EngineSpec``: what every rank of a run reads, and nothing else.

The launching process checks a run (``emu.spec.check``), resolving what it needs once,
and makes the run's engine spec from it (``emu.spec.CheckedRun.engine_spec``); the
transports hand it to every rank, where the implementation builds the rank's engine
from it (``emu.impl.Implementation.run_rank``). What only the launcher needs (the
out_dir, which transport and device, the timeouts, the workload's name, which
vllm-ascend tree) stays in the launching process: a rank learns where it writes and
runs from its ``RankContext``, and vllm-ascend's tree travels with its
implementation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dyntra_lb.config import AdditionalConfig
from dyntra_lb.pause_limit import PauseLimit
from emu.faults import FaultPlan
from emu.rank.costs import StepCostModel
from emu.workload import TraceRequest

# vLLM's scheduling policies (``SchedulerConfig.policy``), which both engines run.
SCHEDULING_POLICIES = ("fcfs", "priority")


@dataclass(frozen=True)
class EngineSpec:
    """One run as its ranks see it, checked (``emu.spec.RunSpec`` says what each field
    means):

    - the workload: ``trace`` (every rank holds all of it), the ``router`` of unpinned
      requests and its ``api_server_count`` (1 for a router without API servers),
      ``max_concurrency`` closed-loop clients (None: open loop);
    - DyntraLB: ``config``, the parsed additional config, and ``planner``, the planner
      every rank runs (the implementation's own when the run names none), charged as
      ``planner_cost`` says;
    - vLLM's engine: ``max_num_seqs``, ``max_num_batched_tokens``, ``block_size``,
      ``num_gpu_blocks``, ``scheduling_policy``, ``async_scheduling``, and the DP sync
      cadence ``dp_sync_interval`` (``emu.rank.dp_sync``; None: vLLM < 0.30's);
    - virtual time: the step-cost profile ``cost_model`` and the KV transfer latency
      ``kv_latency_fixed_s`` + ``kv_latency_per_block_s`` * blocks;
    - the run's control: ``seed``, ``max_steps``, ``stall_steps``, ``strict``, and the
      ``faults`` to inject (None: none);
    - ``pause_limit``: the kit's opt-in bound on paused time (None: production's pauses).
    """

    trace: Sequence[TraceRequest]
    router: str
    max_concurrency: int | None
    config: AdditionalConfig
    planner: str
    planner_cost: str
    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int
    num_gpu_blocks: int
    scheduling_policy: str
    async_scheduling: bool
    cost_model: StepCostModel
    kv_latency_fixed_s: float
    kv_latency_per_block_s: float
    seed: int
    max_steps: int
    stall_steps: int
    strict: bool
    faults: FaultPlan | None
    dp_sync_interval: int | None = None
    api_server_count: int = 1
    pause_limit: PauseLimit | None = None
