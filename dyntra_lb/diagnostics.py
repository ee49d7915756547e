"""Text of every DyntraLB diagnostics line and table, byte for byte; each
function's docstring starts with the heading of its entry in docs/diagnostics.md.

Pure functions: each returns the exact text, the caller decides whether diagnostics are
on and logs it at INFO through ``logging.getLogger("dyntra_lb")`` — one logger call per
line or table (tables are returned as one string joined by ``"\\n"``). The emulator's
replay tool parses the same text, so these formats are a contract: change them only when
vllm-ascend's change.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dyntra_lb.blocks import num_blocks

PREFIX = "[dyntra_lb]"
_CONFIG_KEYS = (
    "enable_diagnostics",
    "mode",
    "start_step",
    "end_step",
    "bubble_threshold",
    "long_req_block_threshold",
    "dynamic_max_step",
)


def enable_line() -> str:
    """Enable line: the engine-core wrapper found DyntraLB enabled (rank 0)."""
    return f"{PREFIX} Enable DyntraLB DP load balancing."


def config_lines(cfg: Any) -> list[str]:
    """Config dump: the effective config at DP init (rank 0). The first line always says
    ``enabled = True`` because it is only printed when DyntraLB is on."""
    lines = [f"{PREFIX} dyntra_lb_config.enabled = True"]
    lines += [f"{PREFIX} dyntra_lb_config.{key} = {getattr(cfg, key)}" for key in _CONFIG_KEYS]
    return lines


def step_counter_line(step_counter: int) -> str:
    """Step-counter line: every ``_has_global_unfinished_reqs`` call on every rank, with the
    step counter before upstream increments it. No prefix."""
    return f"_has_global_unfinished_reqs | step_counter: {step_counter}"


def wave_end_line(next_wave: int) -> str:
    """Wave-end line: a wave ended (no engine running); ``next_wave`` is the incremented wave."""
    return (
        f"{PREFIX} run_busy_loop() | No engines running, step_counter set to 0, "
        f"current_wave incremented to {next_wave}."
    )


def activation_line(blk_num: int, threshold: int, current_wave: int, step_counter: int) -> str:
    """Dynamic activation: switched on by a long request (``blk_num`` is the global max)."""
    return (
        f"{PREFIX} Dynamic LB enabled by long request: blk_num={blk_num}, "
        f"threshold={threshold}, current_wave={current_wave}, step_counter={step_counter}"
    )


def deactivation_line(k: int, current_wave: int, step_counter: int) -> str:
    """Dynamic deactivation: switched off after ``k`` active steps without a long request."""
    return (
        f"{PREFIX} Dynamic LB disabled after {k} steps without long request: "
        f"current_wave={current_wave}, step_counter={step_counter}"
    )


def _items(values: Iterable[int]) -> str:
    return ", ".join(f"{v:3d}" for v in values)


def requests_table(requests_by_rank: Sequence[tuple[Sequence[int], int]]) -> str:
    """Requests table: the gathered snapshot, printed on rank 0 after planning. Waiting shows only
    the positive entries after the split (the zero padding is hidden)."""
    lines = ["=" * 85, f"{PREFIX} requests_by_rank (DP Workload Status):"]
    for rank, (blks, split) in enumerate(requests_by_rank):
        running = blks[:split]
        waiting = [b for b in blks[split:] if b > 0]
        running_str = f"Run({len(running)}): [{_items(running)}]"
        waiting_str = f"Wait({len(waiting)}): [{_items(waiting)}]"
        lines.append(f" DP{rank} | {running_str:<55} | {waiting_str}")
    lines.append("=" * 85)
    return "\n".join(lines)


def _plan_fields(plan: Any) -> tuple[Sequence[int], Sequence[int], bool]:
    if isinstance(plan, Mapping):
        return plan["out_blk"], plan["in_blk"], plan["freeze"]
    return plan.out_blk, plan.in_blk, plan.freeze


def modifications_table(plans: Sequence[Any]) -> str:
    """Modifications table: one plan per rank (``Plan`` objects or the reference's plan
    dicts), printed
    on rank 0 right after the requests table."""
    lines = ["=" * 60, f"{PREFIX} modifications:"]
    for rank, plan in enumerate(plans):
        out_blk, in_blk, freeze = _plan_fields(plan)
        out_str = f"Out: [{_items(out_blk)}]"
        in_str = f"In: [{_items(in_blk)}]"
        lines.append(f" DP{rank} | {out_str:<15} | {in_str:<15} | Freeze: {freeze}")
    lines.append("=" * 60)
    return "\n".join(lines)


def pause_line(request_id: str) -> str:
    """``DYNTRA_LB_PAUSE``: the scheduler paused a running request (keeps its KV)."""
    return f"DYNTRA_LB_PAUSE request_id={request_id}"


def _status_name(request: Any) -> str:
    status = request.status
    return getattr(status, "name", status)


def scheduler_summary_line(
    running: Iterable[Any],
    waiting: Iterable[Any],
    skipped_waiting: Iterable[Any],
    paused_ids: Iterable[str] | None,
    scheduler_block_size: int,
    cache_block_size: int,
) -> str:
    """Scheduler summary: printed at the end of every ``schedule()``.

    Requests need ``status`` (a ``RequestStatus`` member, compared by name, or its name
    as a string), ``request_id`` and ``num_tokens``. "Schedulable" means WAITING or
    LB-paused; block counts use ``cache_block_size`` (the DyntraLB block size).
    """
    paused = set(paused_ids or ())
    running = list(running)
    queued = [*waiting, *skipped_waiting]
    schedulable = []
    remote_kvs = grammar = preempted = 0
    for request in queued:
        name = _status_name(request)
        is_paused = request.request_id in paused
        if name == "WAITING" or is_paused:
            schedulable.append(request)
        if name == "WAITING_FOR_REMOTE_KVS":
            remote_kvs += 1
        elif name == "WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR":
            grammar += 1
        elif name == "PREEMPTED" and not is_paused:
            preempted += 1

    def total_blocks(requests: list[Any]) -> int:
        return sum(num_blocks(r.num_tokens, cache_block_size) for r in requests)

    counts = [len(running), len(queued), len(schedulable), remote_kvs, grammar, preempted]
    blks = [total_blocks(running), total_blocks(queued), total_blocks(schedulable)]
    return (
        f"schedule() | scheduler req num: [{', '.join(map(str, counts))}] "
        f"| blk num [{', '.join(map(str, blks))}] "
        f"| block size [scheduler={scheduler_block_size}, dyntra_lb={cache_block_size}]"
    )
