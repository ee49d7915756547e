"""Strict mode in real clusters: the shared workloads (pauses, plan-limited admission, KV
loads) run clean under it, and the kit's own invariants (requests and KV blocks
conserved), broken on purpose inside one rank, stop the run with a ClusterError naming
that rank, the iteration and the request. DyntraLB's promises, broken the same way:
test_strict_promises.py."""

from __future__ import annotations

import re

import pytest

from emu.cluster.launcher import launch
from emu.cluster.supervision import ClusterError
from emu.offline import replay
from emu.offline.logscan import read_log
from emu.run import run_cluster
from emu.spec import RunSpec, check
from emu.workload import TraceRequest
from tests.records import events

pytestmark = pytest.mark.integration

STATIC = {"scheduler_config": {"dyntra_lb_config": {
    "enabled": True, "mode": "static", "start_step": 0, "bubble_threshold": 1.0}}}
STATIC_DIAGNOSTICS = {"scheduler_config": {"dyntra_lb_config": {
    **STATIC["scheduler_config"]["dyntra_lb_config"], "enable_diagnostics": True}}}
DYNAMIC = {"scheduler_config": {"dyntra_lb_config": {
    "enabled": True, "mode": "dynamic", "start_step": 0, "long_req_block_threshold": 20,
    "dynamic_max_step": 4}}}


def _spec(trace, out_dir, config=STATIC, max_num_seqs=2) -> RunSpec:
    return RunSpec(trace=trace, dp_size=2, out_dir=out_dir, additional_config=config,
                   max_num_seqs=max_num_seqs, block_size=16, num_gpu_blocks=1024,
                   device="cpu", strict=True, collective_timeout_s=30.0, run_timeout_s=240.0)


# --- sabotage inside one rank (module level: spawn pickles targets by name) ------------


def _leak_blocks_of_finished(engine, request_id):
    kv = engine.scheduler.kv_cache_manager
    free = kv.free

    def leaky_free(request):
        if not (request.request_id == request_id and request.is_finished()):
            free(request)

    kv.free = leaky_free


def _lose_request(engine, request_id):
    scheduler = engine.scheduler
    add = scheduler.add_request

    def add_request(request):
        if request.request_id == request_id:  # known to the scheduler, in no queue
            scheduler.requests[request.request_id] = request
        else:
            add(request)

    scheduler.add_request = add_request


SABOTAGE = {"leak": _leak_blocks_of_finished, "lose": _lose_request}


def sabotaged_target(ctx, args):
    implementation, engine_spec, broken_rank, kind, request_id = args
    engine = implementation.make_engine(ctx, engine_spec)
    if ctx.rank == broken_rank:
        SABOTAGE[kind](engine, request_id)
    return engine.run()


def _run_sabotaged(spec, broken_rank, kind, request_id=None) -> ClusterError:
    checked = check(spec)
    with pytest.raises(ClusterError) as info:
        launch(sabotaged_target,
               (checked.implementation, checked.engine_spec, broken_rank, kind, request_id),
               dp_size=spec.dp_size, device="cpu", out_dir=spec.out_dir,
               collective_timeout_s=spec.collective_timeout_s,
               run_timeout_s=spec.run_timeout_s)
    err = info.value
    assert err.rank == broken_rank
    assert err.message.startswith(f"emu.rank.invariants.InvariantError: strict invariant "
                                  f"violated on rank {broken_rank} at iteration ")
    # the report also has every rank's collectives, and the failing rank's traceback
    assert "emu/impl/kit/invariants.py" in err.details[broken_rank]  # raised by the strict checks
    assert all(d.startswith("last entered collective: seq ") for d in err.details.values())
    return err


def _small_trace():
    return [TraceRequest("victim", 0.0, 100, 6, rank=1),
            TraceRequest("other", 0.0, 300, 12, rank=1),
            TraceRequest("ghost", 0.0, 50, 4, rank=0),
            TraceRequest("busy", 0.0, 50, 10, rank=0)]


# --- tests ------------------------------------------------------------------------------


def test_shared_workloads_run_clean_in_strict_mode(kit, tmp_path):
    static = run_cluster(_spec(kit.static_trace(2), tmp_path / "static", STATIC_DIAGNOSTICS))
    steps = [e for r in (0, 1) for e in static.events(r) if e["kind"] == "step"]
    # what the invariants are about did happen: pauses, admissions under a plan
    assert any(s["paused"] for s in steps)
    assert any(s["admitted"] and s["plan_applied"] is not None for s in steps)
    # the rank log says max_num_seqs, so replaying it needs no flag
    report = replay.replay(read_log(static.logs[0]))
    assert report.assumptions == []
    assert {r.max_num_seqs for r in report.results} == {2}
    assert report.summary()["reproduced"] == report.summary()["snapshots"] > 0
    trace = [TraceRequest(f"r{i}", 0.05 * i, 64 + (97 * i) % 500, 10 + i % 25)
             for i in range(60)]
    dynamic = run_cluster(_spec(trace, tmp_path / "dynamic", DYNAMIC, max_num_seqs=4))
    assert sum(r.num_finished for r in dynamic.ranks) == len(trace)
    assert dynamic.ranks[0].num_plans > 0


def test_leaked_kv_blocks_are_named(tmp_path):
    err = _run_sabotaged(_spec(_small_trace(), tmp_path), 1, "leak", "victim")
    # named at the very step victim finished (its step record is the last one written;
    # the failed rank's request records follow it)
    records = events(tmp_path, 1)
    last = [r for r in records if r["kind"] == "step"][-1]
    assert last["finished"] == ["victim"]
    assert re.fullmatch(
        rf"emu\.rank\.invariants\.InvariantError: strict invariant violated on rank 1 at iteration "
        rf"{last['iter']} \(wave 0, step_counter {last['step_counter']}\): KV blocks not "
        r"conserved: the pool has \d+ in use, the requests in flight hold \d+ and \d+ wait "
        r"for a step in flight; blocks held by requests no longer in flight: \['victim'\]",
        err.message)


def test_a_request_lost_from_the_queues_is_named(tmp_path):
    err = _run_sabotaged(_spec(_small_trace(), tmp_path), 0, "lose", "ghost")
    assert err.message.endswith(
        "at iteration 0 (wave 0, step_counter 1): requests in flight and queues disagree: "
        "in no queue ['ghost'], queued but not in flight [], in two queues []")
