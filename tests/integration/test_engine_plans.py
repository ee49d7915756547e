"""Issue 3, property 2: a plan computed at iteration k is applied at iteration k+1 —
never earlier or later — and the first step of every wave runs without a plan.

Checked by its effect on the scheduler, not by the engine's own `plan_applied` field:
from the event log this rebuilds which requests were running when each step began
(admitted / resumed / paused / preempted / finished ids, checked against `num_running`)
and every request's block count at that moment (prompt + the tokens the scheduler had
from it, from its request record: those of the forwards that ended by the step's start,
or under vLLM's async scheduling, whose outputs land an iteration late, by the previous
step's start), then requires that the requests paused and admitted at step k+1
are exactly what the plan generated at step k asks for (docs/protocol.md, "Applying the
plan"): per block count v,
min(#v in out_blk, #running with v) requests paused; the entering requests' block
counts drawn from in_blk, none when frozen; nothing paused without a plan. The same
check against the plan of step k+1 (applied in the step that made it) or of step k-1
(a step late) must fail, so the data can tell the three apart.
"""

from __future__ import annotations

from collections import Counter

import pytest

from dyntra_lb.blocks import num_blocks
from tests.integration.conftest import spec

pytestmark = pytest.mark.integration


def _blocks(request: dict, known_s: float, block_size: int) -> int:
    """The request's DyntraLB block count when a step schedules: its prompt and the tokens
    of the forwards that ended by ``known_s`` (their outputs processed by then)."""
    generated = sum(1 for t in request["token_times_s"] if t <= known_s)
    return num_blocks(request["prompt_tokens"] + generated, block_size)


def _plan_for(records: list[dict], j: int, shift: int) -> dict | None:
    """The plan step j must follow if plans take effect `1 - shift` steps after they are
    made (shift 0: the previous step's plan). A wave's first step has none."""
    cur = records[j]
    source = j - 1 + shift
    if cur["step_counter"] == 1 or not 0 <= source < len(records):
        return None
    if records[source]["wave"] != cur["wave"]:
        return None
    return records[source]["plan_generated"]


def plan_effect_mismatches(records: list[dict], requests: dict[str, dict], block_size: int,
                           shift: int = 0, async_scheduling: bool = False) -> list[str]:
    """Every step whose pauses and admissions disagree with `_plan_for(..., shift)`."""
    problems = []
    running: set[str] = set()
    for j, cur in enumerate(records):
        where = f"iter {cur['iter']}"
        plan = _plan_for(records, j, shift)
        paused, entered = cur["paused"], cur["admitted"] + cur["resumed"]
        if not set(paused) <= running:
            problems.append(f"{where}: paused {paused} were not running")
        if plan is None:
            if paused:
                problems.append(f"{where}: paused {paused} without a plan")
        else:
            # the outputs the scheduler had processed when this step scheduled
            clock = (records[j - 1]["clock_s"] if async_scheduling else cur["clock_s"])
            running_blocks = Counter(_blocks(requests[r], clock, block_size) for r in running)
            paused_blocks = Counter(_blocks(requests[r], clock, block_size) for r in paused)
            out = Counter(plan["out_blk"])
            expected = {v: min(n, running_blocks[v]) for v, n in out.items()}
            if +paused_blocks != +Counter(expected):
                problems.append(f"{where}: paused block counts {dict(paused_blocks)}, the plan "
                                f"out_blk {plan['out_blk']} over running {dict(running_blocks)} "
                                f"asks for {expected}")
            entered_blocks = Counter(_blocks(requests[r], clock, block_size) for r in entered)
            allowed = Counter() if plan["freeze"] else Counter(plan["in_blk"])
            if entered_blocks - allowed:
                problems.append(f"{where}: entered block counts {dict(entered_blocks)} beyond "
                                f"the plan's in_blk {plan['in_blk']} (freeze {plan['freeze']})")
        running = (running - set(paused) - set(cur["preempted"])) | set(entered)
        running -= set(cur["finished"])
        assert len(running) == cur["num_running"], (where, sorted(running))
    return problems


@pytest.mark.parametrize("dp_size", [2, 4])
@pytest.mark.parametrize("name", ["static", "dynamic"])
def test_plan_of_iteration_k_is_applied_at_k_plus_1(shared_run, kit, name, dp_size):
    result = shared_run(name, dp_size)
    early = late = 0
    active = 0
    for rank in range(dp_size):
        records = kit.steps(result, rank)
        by_id = {r["request_id"]: r for r in kit.requests(result, rank)}
        assert [s["iter"] for s in records] == list(range(len(records)))
        assert sum(s["step_counter"] == 1 for s in records) == result.ranks[rank].waves

        mode = spec(name, dp_size, "-").async_scheduling  # the shared runs': vLLM's default
        assert plan_effect_mismatches(records, by_id, kit.BLOCK_SIZE,
                                      async_scheduling=mode) == [], f"rank {rank}"
        early += len(plan_effect_mismatches(records, by_id, kit.BLOCK_SIZE, shift=1,
                                            async_scheduling=mode))
        late += len(plan_effect_mismatches(records, by_id, kit.BLOCK_SIZE, shift=-1,
                                           async_scheduling=mode))
        active += sum(bool(s["paused"] or s["admitted"] or s["resumed"]) for s in records
                      if s["plan_applied"] is not None)
    assert active > 0  # plans took effect
    # Applying each plan in the step that made it, or one step late, would be caught.
    assert early > 0 and late > 0
