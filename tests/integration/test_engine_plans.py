"""Issue 3, property 2: a plan computed at iteration k is applied at iteration k+1 —
never earlier or later — and the first step of every wave runs without a plan."""

from __future__ import annotations

import pytest

from dyntra_lb.blocks import num_blocks

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("dp_size", [2, 4])
@pytest.mark.parametrize("name", ["static", "dynamic"])
def test_plan_of_iteration_k_is_applied_at_k_plus_1(shared_run, kit, name, dp_size):
    result = shared_run(name, dp_size)
    changes = 0
    for rank in range(dp_size):
        records = kit.steps(result, rank)
        by_id = {r["request_id"]: r for r in kit.requests(result, rank)}
        assert [s["iter"] for s in records] == list(range(len(records)))
        first_steps = 0
        for prev, cur in zip([None, *records], records, strict=False):
            where = f"rank {rank} iter {cur['iter']}"
            if cur["step_counter"] == 1:
                first_steps += 1
                assert cur["plan_applied"] is None, where
            else:
                assert prev["wave"] == cur["wave"], where
                assert cur["plan_applied"] == prev["plan_generated"], where
                if None not in (prev["plan_generated"], cur["plan_generated"]):
                    changes += prev["plan_generated"] != cur["plan_generated"]

            # The plan was really applied at this step: pauses match out_blk by block
            # count (prompt + tokens generated so far); with a plan at most in_blk-many
            # requests enter, none when frozen.
            plan = cur["plan_applied"]
            if plan is None:
                assert cur["paused"] == [], where
                continue
            entered = len(cur["admitted"]) + len(cur["resumed"])
            assert entered <= (0 if plan["freeze"] else len(plan["in_blk"])), where
            remaining = list(plan["out_blk"])
            for rid in cur["paused"]:
                req = by_id[rid]
                generated = sum(1 for t in req["token_times_s"] if t <= cur["clock_s"])
                remaining.remove(num_blocks(req["prompt_tokens"] + generated, kit.BLOCK_SIZE))
        assert first_steps == result.ranks[rank].waves
    # Consecutive plans differ somewhere, so applying a plan one step early or late
    # would be caught.
    assert changes > 0
