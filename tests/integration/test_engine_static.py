"""Issue 3, property 3: static mode with start_step=0 — pauses and admissions happen,
every request finishes exactly once (none lost or duplicated), a paused request keeps
its KV blocks until it resumes, KV blocks are conserved."""

from __future__ import annotations

from collections import Counter

import pytest

from dyntra_lb.blocks import num_blocks

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("dp_size", [2, 4])
def test_static_mode_pauses_admits_and_conserves(shared_run, kit, dp_size):
    result = shared_run("static", dp_size)
    trace = {r.request_id: r for r in kit.static_trace(dp_size)}
    assert not result.truncated

    finished, admitted, resumed, paused = Counter(), Counter(), Counter(), Counter()
    finished_paused = Counter()  # async scheduling: a pause ended by the late last token
    admitted_under_plan = 0
    for rank in range(dp_size):
        records = kit.steps(result, rank)
        reqs = {r["request_id"]: r for r in kit.requests(result, rank)}
        assert all(r["finish_s"] is not None for r in reqs.values())
        assert set(reqs) == {rid for rid, t in trace.items() if t.rank == rank}
        for rid, req in reqs.items():
            assert len(req["token_times_s"]) == trace[rid].output_tokens
        for record in records:
            finished.update(record["finished"])
            admitted.update(record["admitted"])
            resumed.update(record["resumed"])
            paused.update(record["paused"])
            finished_paused.update(set(record["paused"]) & set(record["finished"]))
            if record["plan_applied"] is not None:
                admitted_under_plan += len(record["admitted"]) + len(record["resumed"])
            # Conservation: every block is either free or held by exactly one request.
            assert record["kv_free_blocks"] + record["kv_held_blocks"] == kit.NUM_GPU_BLOCKS
            assert record["preempted"] == []
        assert records[-1]["kv_held_blocks"] == 0  # everything was returned at the end
        _check_paused_requests_keep_kv(records, reqs, rank, kit.BLOCK_SIZE)

    assert sum(paused.values()) > 0 and admitted_under_plan > 0
    assert finished == Counter(trace.keys())  # every request exactly once, nothing else
    assert admitted == Counter(trace.keys())  # each admitted (as new) exactly once
    assert resumed + finished_paused == paused  # every pause ended by a resume (or finish)


def _check_paused_requests_keep_kv(records, reqs, rank, block_size):
    """From its pause to its resume a request holds the same number of KV blocks, at
    least enough for its prompt and generated tokens, and its pause is recorded. Under
    async scheduling a pause can also end with the request's finish: the output of its
    last step, in flight when it was paused, was its last token."""
    open_pauses: dict[str, tuple[dict, int]] = {}
    for record in records:
        for rid in record["resumed"]:
            if rid in open_pauses:
                start, _ = open_pauses.pop(rid)
                assert [start["clock_s"], record["clock_s"]] in reqs[rid]["pauses"]
        for rid in record["finished"]:
            if open_pauses.pop(rid, None) is not None:
                assert reqs[rid]["pauses"][-1][1] is None  # never resumed
        for rid in record["paused"]:
            if rid in record["finished"]:
                assert reqs[rid]["pauses"][-1] == [record["clock_s"], None]
                continue
            req = reqs[rid]
            held = record["paused_kv_blocks"][rid]
            generated = sum(1 for t in req["token_times_s"] if t <= record["clock_s"])
            assert held >= num_blocks(req["prompt_tokens"] + generated - 1, block_size)
            open_pauses[rid] = (record, held)
        for rid, (_, held) in open_pauses.items():
            assert record["paused_kv_blocks"].get(rid) == held, (
                f"rank {rank} iter {record['iter']}: paused {rid} lost KV")
    assert open_pauses == {}
