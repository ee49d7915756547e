"""vllm-ascend's DyntraLB, unmodified, on vLLM's engine loop in real rank processes over
real gloo groups: the runs the kit's integration tier makes, with ``--impl vllm-ascend``.
Every check reads what the scheduler did (the event log and the request records), not
fields the engine writes about itself."""

from __future__ import annotations

import collections
import json

import pytest

from tests.upstream.conftest import dyntra_emu, upstream_spec

# A shared run may wait for another worker's run of vLLM-importing ranks.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]

RUNS = [("static", 2), ("static", 4), ("dynamic", 2), ("dynamic", 4), ("plain", 2),
        ("plain", 4)]
BALANCED = [run for run in RUNS if run[0] != "plain"]


def _trace(name, dp):
    return upstream_spec(name, dp, "unused").trace


def _blocks_at(request: dict, known_s: float, block_size: int) -> int:
    """The request's KV-block count when a step schedules: its prompt and the tokens of
    the forwards that ended by ``known_s`` (their outputs processed by then)."""
    tokens = request["prompt_tokens"] + sum(t <= known_s for t in request["token_times_s"])
    return -(-tokens // block_size)


@pytest.mark.parametrize("name,dp", RUNS)
def test_every_request_finishes_with_all_its_tokens(upstream_run, kit, name, dp):
    result = upstream_run(name, dp)
    records = {r["request_id"]: r for rank in range(dp) for r in kit.requests(result, rank)}
    trace = _trace(name, dp)
    assert sorted(records) == sorted(t.request_id for t in trace)
    for t in trace:
        record = records[t.request_id]
        assert record["finish_s"] is not None, t.request_id
        assert len(record["token_times_s"]) == t.output_tokens
    assert not result.truncated


@pytest.mark.parametrize("name,dp", RUNS)
def test_ranks_issue_the_same_collectives_at_the_same_step_counter_and_wave(
        upstream_run, kit, name, dp):
    result = upstream_run(name, dp)
    per_rank = [[(s["iter"], s["step_counter"], s["wave"],
                  [(c["site"], c["op"], c["shape"], c["dtype"]) for c in s["collectives"]])
                 for s in kit.steps(result, rank)] for rank in range(dp)]
    assert all(steps == per_rank[0] for steps in per_rank[1:])
    sites = {c[0] for step in per_rank[0] for c in step[3]}
    if name == "plain":
        assert sites == {"engine.lockstep", "engine.dp_sync"}
    else:
        assert "dyntra_lb.allgather" in sites
    if name == "dynamic":
        assert "dyntra_lb.flag" in sites


@pytest.mark.parametrize("name,dp", BALANCED)
def test_plan_of_step_k_is_what_the_scheduler_does_at_step_k_plus_1(upstream_run, kit,
                                                                    name, dp):
    """Pauses at step k+1 are running requests whose block counts the plan of step k
    named in out_blk; a frozen plan admits nothing at k+1; without a plan nothing is
    paused."""
    result = upstream_run(name, dp)
    async_scheduling = upstream_spec(name, dp, "-").async_scheduling  # vLLM's default
    pauses = admissions = plans = 0
    for rank in range(dp):
        records = {r["request_id"]: r for r in kit.requests(result, rank)}
        steps = kit.steps(result, rank)
        for prev, cur in zip(steps, steps[1:], strict=False):
            # the outputs processed when cur scheduled: a step later under async scheduling
            known_s = prev["clock_s"] if async_scheduling else cur["clock_s"]
            plan = prev["plan_generated"]
            if plan is None or prev["wave"] != cur["wave"]:
                assert cur["paused"] == [], (rank, cur["iter"])
                continue
            plans += 1
            paused = collections.Counter(
                _blocks_at(records[rid], known_s, kit.BLOCK_SIZE) for rid in cur["paused"])
            assert not paused - collections.Counter(plan["out_blk"]), (rank, cur["iter"])
            entered = cur["admitted"] + cur["resumed"]
            if plan["freeze"]:
                assert entered == [], (rank, cur["iter"])
            assert len(entered) <= len(plan["in_blk"]), (rank, cur["iter"])
            pauses += len(cur["paused"])
            admissions += len(entered)
    assert plans > 0
    if name == "static":  # the static trace is built for the plans to act
        assert pauses > 0 and admissions > 0


@pytest.mark.parametrize("name,dp", [run for run in BALANCED if run[0] == "static"])
def test_paused_requests_keep_their_kv(upstream_run, kit, name, dp):
    """From pause to resume a paused request holds the same number of KV blocks (the
    ranks ran in strict mode, which compares the block ids themselves)."""
    result = upstream_run(name, dp)
    held: dict[tuple[int, str], int] = {}
    checked = 0
    for rank in range(dp):
        for step in kit.steps(result, rank):
            for rid, blocks in step["paused_kv_blocks"].items():
                assert blocks > 0
                assert held.setdefault((rank, rid), blocks) == blocks, (rank, rid, step["iter"])
                checked += 1
            for rid in step["resumed"]:
                held.pop((rank, rid), None)
    assert checked > 0


def test_event_logs_are_byte_identical_across_two_runs(upstream_run, kit):
    first, again = upstream_run("static", 2), upstream_run("static-again", 2)
    for rank in range(2):
        assert first.event_log(rank) == again.event_log(rank)


def test_plain_dp_runs_vllms_engine_without_dyntra_lb(upstream_run, kit):
    result = upstream_run("plain", 2)
    for rank in range(2):
        assert all(s["plan_applied"] is None and not s["lb_active"]
                   for s in kit.steps(result, rank))
        assert "[dyntra_lb]" not in result.logs[rank].read_text()


def test_replay_of_vllm_ascends_diagnostics_reproduces_every_plan(upstream_run, kit):
    result = upstream_run("static", 2)
    out = dyntra_emu("replay", "--json", result.logs[0])
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    plans = sum(s["plan_generated"] is not None for s in kit.steps(result, 0))
    assert report["summary"]["snapshots"] == plans > 0
    assert report["summary"]["reproduced"] == plans


@pytest.mark.parametrize("name,scheduler", [
    ("static", "vllm_ascend.core.dyntra_lb_scheduler.AsyncDyntraLBScheduler"),
    ("static-sync", "vllm_ascend.core.dyntra_lb_scheduler.DyntraLBScheduler"),
    ("static-recompute",
     "vllm_ascend.core.recompute_scheduler.AsyncDyntraLBRecomputeScheduler"),
])
def test_scheduler_variants_run_production_s_class_to_the_end(upstream_run, kit, name,
                                                              scheduler):
    """vLLM's default (async scheduling), synchronous scheduling and the recompute
    scheduler (async by default) select the DyntraLB scheduler class production selects,
    and the run completes with plans on every rank."""
    result = upstream_run(name, 2)
    assert scheduler in (result.out_dir / "rank0.vllm.log").read_text()
    records = [r for rank in range(2) for r in kit.requests(result, rank)]
    assert sorted(r["request_id"] for r in records) == sorted(
        t.request_id for t in _trace("static", 2))
    assert all(r["finish_s"] is not None for r in records)
    assert all(summary.num_plans > 0 for summary in result.ranks)
