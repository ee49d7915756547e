"""emu/faults.py without rank processes: the --fault syntax, plan validation, what each
fault does to one rank's scheduler, connector, cost model and collective hook, and the
wave-boundary trace helpers."""

from __future__ import annotations

import math
import pickle
import signal

import pytest

from emu.faults import (
    DelayCollective,
    FaultPlan,
    KillRank,
    KVLoadFail,
    KVLoadNever,
    KVNotReady,
    KVTransferTimeout,
    SlowRank,
    parse_fault,
    plan_problems,
)
from emu.impl.kit.request import Request, RequestStatus
from emu.impl.kit.scheduler import Scheduler
from emu.rank import fault_injection
from emu.rank.costs import StepCostModel
from emu.rank.fault_injection import FaultInjector, injector_for
from emu.spec import RunSpec, SpecError, check
from emu.workload import TraceRequest, WaveEnd, insert_request, wave_boundary_trace, wave_ends
from tests.kit_steps import forward

TRACE = [TraceRequest("a", 0.0, 100, 10), TraceRequest("b", 0.5, 200, 10)]
STATIC = {"scheduler_config": {"dyntra_lb_config": {"enabled": True, "mode": "static"}}}
DYNAMIC = {"scheduler_config": {"dyntra_lb_config": {"enabled": True, "mode": "dynamic"}}}

# ------------------------------------------------------------------------ syntax

EVERY_KIND = [
    ("kill:rank=1,step=50", KillRank(1, 50)),
    ("slow:rank=0,extra_ms=5", SlowRank(0, 5.0)),
    ("slow:rank=0,extra_ms=0.25", SlowRank(0, 0.25)),
    ("kv_fail:request=req-7", KVLoadFail("req-7")),
    ("kv_never:request=req-7", KVLoadNever("req-7")),
    ("kv_never:request=req-7,timeout_s=2.5", KVLoadNever("req-7", 2.5)),
    ("not_ready:request=r/1.x,lookups=3", KVNotReady("r/1.x", 3)),
    ("delay:rank=1,site=dyntra_lb.allgather,step=40,seconds=2",
     DelayCollective(1, "dyntra_lb.allgather", 40, 2.0)),
]


@pytest.mark.parametrize("text, fault", EVERY_KIND)
def test_parse_and_spec_round_trip(text, fault):
    assert parse_fault(text) == fault
    assert fault.spec() == text
    assert parse_fault(fault.spec()) == fault


def test_keys_in_any_order_and_spaces_around_them():
    assert parse_fault("kill: step=3 , rank=0") == KillRank(0, 3)


@pytest.mark.parametrize("text, fragment", [
    ("", "expected KIND:KEY=VALUE,... with KIND one of kill, slow, kv_fail"),
    (":rank=1", "expected KIND:KEY=VALUE"),
    ("explode:rank=1", "unknown fault kind 'explode'; expected one of kill, slow"),
    ("kill", "kill needs rank=, step= (syntax KIND:KEY=VALUE,...)"),
    ("kill:", "kill needs rank=, step="),
    ("kill:rank=1", "kill needs step="),
    ("kill:rank=1,step", "'step': expected KEY=VALUE"),
    ("kill:rank=1,,step=2", "'': expected KEY=VALUE"),
    ("kill:=1,step=2", "'=1': expected KEY=VALUE"),
    ("kill:rank=1,step=2,signal=9", "unknown key 'signal' for kill; expected rank, step"),
    ("kill:rank=1,rank=2,step=3", "key 'rank' given twice"),
    ("kill:rank=x,step=5", "'rank=x': expected an integer >= 0"),
    ("kill:rank=-1,step=5", "'rank=-1': expected an integer >= 0"),
    ("kill:rank=1.0,step=5", "'rank=1.0': expected an integer >= 0"),
    ("kill:rank=1_0,step=5", "'rank=1_0': expected an integer >= 0"),
    ("kill:rank=1,step=", "'step=': expected an integer >= 0"),
    ("slow:rank=0,extra_ms=0", "'extra_ms=0': expected a number > 0"),
    ("slow:rank=0,extra_ms=nan", "'extra_ms=nan': expected a number > 0"),
    ("slow:rank=0,extra_ms=inf", "'extra_ms=inf': expected a number > 0"),
    ("slow:rank=0,extra_ms=fast", "'extra_ms=fast': expected a number > 0"),
    ("kv_fail:request=", "'request=': expected a non-empty request id"),
    ("kv_fail:request= ", "expected a non-empty request id"),
    ("kv_never:timeout_s=3", "kv_never needs request="),
    ("not_ready:request=a,lookups=0", "'lookups=0': expected an integer >= 1"),
    ("delay:rank=1,site=engine.bogus,step=1,seconds=1",
     "expected one of engine.lockstep, engine.dp_sync, dyntra_lb.flag, dyntra_lb.allgather"),
    ("delay:rank=1,site=engine.dp_sync,step=1", "delay needs seconds="),
])
def test_parse_errors_quote_the_value_and_name_the_bad_part(text, fragment):
    with pytest.raises(ValueError) as info:
        parse_fault(text)
    assert fragment in str(info.value)
    assert str(info.value).startswith(repr(text))


@pytest.mark.parametrize("make, fragment", [
    (lambda: KillRank(-1, 0), "rank must be an integer >= 0, got -1"),
    (lambda: KillRank(True, 0), "rank must be an integer >= 0, got True"),
    (lambda: KillRank(0, 1.5), "step must be an integer >= 0, got 1.5"),
    (lambda: SlowRank(0, 0), "extra_ms must be a finite number > 0, got 0"),
    (lambda: SlowRank(0, math.inf), "extra_ms must be a finite number > 0"),
    (lambda: KVLoadFail(""), "request must be a non-empty request id"),
    (lambda: KVLoadNever("a", timeout_s=-1), "timeout_s must be a finite number > 0"),
    (lambda: KVNotReady("a", 0), "lookups must be an integer >= 1, got 0"),
    (lambda: DelayCollective(0, "engine.sync", 0, 1.0), "site must be one of"),
    (lambda: DelayCollective(0, "engine.dp_sync", 0, "1"), "seconds must be a finite"),
])
def test_faults_validate_their_fields(make, fragment):
    with pytest.raises(ValueError, match=fragment.replace(".", r"\.")):
        make()


# ------------------------------------------------------------------------- plans


def test_plan_of_accepts_faults_strings_and_plans():
    plan = FaultPlan.of(["kill:rank=1,step=5", SlowRank(0, 2.0)])
    assert plan.faults == (KillRank(1, 5), SlowRank(0, 2.0))
    assert FaultPlan.of(plan) is plan
    assert FaultPlan.of("kv_fail:request=a").faults == (KVLoadFail("a"),)
    assert FaultPlan.of(KVLoadFail("a")).faults == (KVLoadFail("a"),)
    assert FaultPlan([KillRank(0, 1)]).faults == (KillRank(0, 1),)  # a list becomes a tuple


@pytest.mark.parametrize("items, fragment", [
    ([{"kind": "kill"}], "FaultPlan.faults[0] must be one of KillRank, SlowRank"),
    ([KillRank(0, 1), "kill:rank=1"], "kill needs step="),
    (5, "faults must be a list of faults or --fault strings, got 5"),
])
def test_plan_of_rejects_what_is_not_a_fault(items, fragment):
    with pytest.raises(ValueError) as info:
        FaultPlan.of(items)
    assert fragment in str(info.value)


def test_plan_rejects_a_string_as_the_sequence():
    with pytest.raises(ValueError, match="FaultPlan.faults must be a sequence of faults"):
        FaultPlan("kill:rank=0,step=1")


def test_plan_and_injector_inputs_pickle():
    plan = FaultPlan.of([text for text, _ in EVERY_KIND])
    assert pickle.loads(pickle.dumps(plan)) == plan
    spec = RunSpec(trace=TRACE, dp_size=2, out_dir="x", faults=plan)
    assert pickle.loads(pickle.dumps(spec)).faults == plan


def test_only_the_ranks_a_fault_names_get_an_injector():
    plan = FaultPlan.of(["kill:rank=1,step=5", "slow:rank=1,extra_ms=1"])
    assert injector_for(plan, 0) is None
    assert injector_for(plan, 1).kill == KillRank(1, 5)
    # KV faults follow the request, which may land on any rank
    kv = FaultPlan.of(["kv_fail:request=a"])
    assert injector_for(kv, 0) is not None and injector_for(kv, 3) is not None


def _problems(items, dp_size=2, lb_mode="static"):
    return plan_problems(FaultPlan.of(items).faults, dp_size=dp_size, trace=TRACE,
                         lb_mode=lb_mode)


def test_plan_problems_against_the_run():
    assert _problems([text for text, _ in EVERY_KIND[:3]]) == []
    assert _problems(["kill:rank=2,step=1", "kv_fail:request=zz"]) == [
        (0, "rank 2 is not a rank of this cluster (dp_size=2)"),
        (1, "request 'zz' is not in the trace")]
    assert _problems(["delay:rank=0,site=dyntra_lb.allgather,step=1,seconds=1"],
                     lb_mode=None) == [
        (0, "site dyntra_lb.allgather is never entered: DyntraLB is disabled")]
    assert _problems(["delay:rank=0,site=dyntra_lb.flag,step=1,seconds=1"]) == [
        (0, "site dyntra_lb.flag is never entered: only DyntraLB's dynamic mode issues the "
            "flag all-reduce (mode is 'static')")]
    assert _problems(["delay:rank=0,site=dyntra_lb.flag,step=1,seconds=1"],
                     lb_mode="dynamic") == []
    assert _problems(["delay:rank=1,site=engine.dp_sync,step=1,seconds=1"], lb_mode=None) == []
    assert _problems(["kv_fail:request=a", "not_ready:request=a,lookups=2",
                      "kv_never:request=a"]) == [
        (2, "request 'a' already has the fault kv_fail:request=a; its load fails or hangs "
            "only once")]


def test_spec_check_names_every_bad_fault_and_needs_a_plan(tmp_path):
    def spec(faults):
        return RunSpec(trace=TRACE, dp_size=2, out_dir=tmp_path, faults=faults)

    with pytest.raises(SpecError) as info:
        check(spec(FaultPlan.of(["kv_fail:request=a", "kill:rank=5,step=0",
                                    "kill:rank=6,step=0"])))
    assert [(p.field, p.index) for p in info.value.problems] == [("faults", 1), ("faults", 2)]
    assert str(info.value.problems[0]) == (
        "RunSpec.faults[1] (kill:rank=5,step=0): rank 5 is not a rank of this cluster "
        "(dp_size=2)")
    with pytest.raises(ValueError, match="RunSpec.faults: must be a FaultPlan or None"):
        check(spec(["kill:rank=0,step=1"]))


def test_run_spec_validation_checks_the_plan(tmp_path):
    def spec(items, config=STATIC):
        return RunSpec(trace=TRACE, dp_size=2, out_dir=tmp_path, additional_config=config,
                       faults=items if items is None or not isinstance(items, list)
                       else FaultPlan.of(items))

    assert check(spec(None)).config.dyntra_lb.enabled
    check(spec(["delay:rank=1,site=dyntra_lb.flag,step=3,seconds=1"], DYNAMIC))
    with pytest.raises(ValueError, match=r"RunSpec.faults\[0\] \(delay:rank=1,site=dyntra_lb"
                                         r"\.flag,step=3,seconds=1\): site dyntra_lb.flag"):
        check(spec(["delay:rank=1,site=dyntra_lb.flag,step=3,seconds=1"]))
    with pytest.raises(ValueError, match="RunSpec.faults: must be a FaultPlan"):
        check(spec("kill:rank=0,step=1"))


# -------------------------------------------------------------- inside one rank


def test_slow_rank_pays_more_for_every_step():
    base = StepCostModel()
    slow = FaultInjector([SlowRank(0, 5.0), SlowRank(0, 2.5)], 0).cost_model(base)
    assert slow.cost(10, 1000, 2, 3, dummy=True) == base.cost(10, 1000, 2, 3, dummy=True) + 7500
    assert (slow.cost(10, 1000, 2, 3, dummy=False)
            == base.cost(10, 1000, 2, 3, dummy=False) + 7500)
    assert FaultInjector([KillRank(0, 1)], 0).cost_model(base) is base


def test_kill_sends_sigkill_to_itself_at_its_step(monkeypatch, capfd):
    sent = []
    monkeypatch.setattr(fault_injection.os, "kill", lambda pid, sig: sent.append((pid, sig)))
    injector = FaultInjector([KillRank(1, 7)], 1)
    for iteration in range(7):
        injector.before_step(iteration, 1000 * iteration)
    assert sent == []
    injector.before_step(7, 7000)
    assert sent == [(fault_injection.os.getpid(), signal.SIGKILL)]
    assert "kill:rank=1,step=7] rank 1 kills itself (SIGKILL) at step 7" in capfd.readouterr().err


BS = 16


def _scheduler(injector: FaultInjector, latency_s=0.010, **kwargs) -> Scheduler:
    """A scheduler whose remote loads take ``latency_s`` (default: within one step)."""
    connector = injector.make_connector(latency_s, 0.0)
    args = dict(max_num_seqs=4, max_num_batched_tokens=256, block_size=BS,
                num_gpu_blocks=64, connector=connector)
    args.update(kwargs)
    return Scheduler(**args)


def _run(scheduler, injector, steps, dt_us=20_000, start_iter=0):
    """Drive the scheduler like the engine does; returns (outputs, finished ids)."""
    outputs, finished = [], []
    for i in range(start_iter, start_iter + steps):
        now_us = i * dt_us
        injector.before_step(i, now_us)
        output = scheduler.schedule(now_us / 1e6)
        outputs.append(output)
        finished += [r.request_id for r in
                     forward(scheduler, output, (now_us + dt_us) / 1e6)]
        kv = scheduler.kv_cache_manager
        assert kv.pool.num_used_blocks == kv.num_held_blocks
    return outputs, finished


def _first_scheduled_step(fault) -> int:
    injector = FaultInjector([fault], 0)
    scheduler = _scheduler(injector)
    scheduler.add_request(Request("a", 40, 3))
    outputs, finished = _run(scheduler, injector, 12)
    assert finished == ["a"]
    return next(i for i, o in enumerate(outputs) if o.new_req_ids)


def test_not_ready_parks_the_request_for_n_lookups():
    # without the fault: the lookup at step 0 starts the load, it lands by the end of
    # the step, and the request runs at step 1; each "not ready" answer costs a step
    assert _first_scheduled_step(KVNotReady("other", 1)) == 1
    assert _first_scheduled_step(KVNotReady("a", 1)) == 2
    assert _first_scheduled_step(KVNotReady("a", 3)) == 4


def test_failed_load_recomputes_the_prompt_locally():
    injector = FaultInjector([KVLoadFail("a")], 0)
    scheduler = _scheduler(injector, latency_s=0.030)  # lands during step 1
    request = Request("a", 40, 3)
    scheduler.add_request(request)
    outputs, _ = _run(scheduler, injector, 1)
    assert request.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    assert scheduler.kv_cache_manager.num_blocks_of(request) == 3  # 40 tokens at 16
    outputs, finished = _run(scheduler, injector, 1, start_iter=1)
    # the load completed with every block invalid: nothing computed; as in vLLM the
    # blocks are released when the request is promoted, at the next schedule()
    assert request.num_computed_tokens == 0
    assert scheduler.kv_cache_manager.num_blocks_of(request) == 3
    outputs, finished = _run(scheduler, injector, 5, start_iter=2)
    # promoted (blocks released and allocated again), then the whole prompt is
    # prefilled here (a good load leaves 1 token)
    assert outputs[0].new_req_ids == ["a"]
    assert outputs[0].num_scheduled_tokens == {"a": 40}
    assert finished == ["a"] and request.num_output_tokens == 3
    assert scheduler.kv_cache_manager.pool.num_used_blocks == 0


def test_failed_load_with_a_small_token_budget_prefills_in_chunks():
    injector = FaultInjector([KVLoadFail("a")], 0)
    scheduler = _scheduler(injector, max_num_batched_tokens=16)
    scheduler.add_request(Request("a", 40, 2))
    outputs, finished = _run(scheduler, injector, 10)
    tokens = [o.num_scheduled_tokens.get("a", 0) for o in outputs]
    assert tokens[:5] == [0, 16, 16, 8, 1]
    assert finished == ["a"]


def test_never_ending_load_fails_the_rank_after_its_timeout():
    injector = FaultInjector([KVLoadNever("a", timeout_s=1.0)], 3)
    scheduler = _scheduler(injector)
    request = Request("a", 40, 3)
    scheduler.add_request(request)
    scheduler.add_request(Request("b", 40, 3))
    # the load starts at step 0 (t = 0); 50 steps of 20 ms reach t = 0.98 s
    _, finished = _run(scheduler, injector, 50)
    assert finished == ["b"]
    assert request.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    assert scheduler.kv_cache_manager.num_blocks_of(request) == 3  # held all along
    with pytest.raises(KVTransferTimeout) as info:
        injector.before_step(50, 1_000_000)
    message = str(info.value)
    assert "request 'a' on rank 3 has waited for its remote KV since virtual time 0." in message
    assert "fault kv_never" in message and "after 1 s of virtual time at step 50" in message


def test_delay_sleeps_once_before_the_first_matching_collective(monkeypatch, capfd):
    slept = []
    monkeypatch.setattr(fault_injection.time, "sleep", slept.append)
    calls = []

    class Recorder:
        seq = 41

        def __call__(self, site, op, tensor, fn, origin=None):
            calls.append(site)
            return fn()

        def take(self):
            return ["records"]

    injector = FaultInjector([DelayCollective(0, "engine.dp_sync", 3, 0.5)], 0)
    hook = injector.wrap_recorder(Recorder())
    for iteration in range(6):
        injector.before_step(iteration, 0)
        assert hook("engine.lockstep", "all_reduce_max", None, lambda: "x") == "x"
        if iteration in (1, 4, 5):  # the sync of iteration 1 is before the delay's step
            hook("engine.dp_sync", "all_reduce_sum", None, lambda: None)
    assert slept == [0.5]  # at iteration 4, only once
    assert calls.count("engine.dp_sync") == 3
    assert hook.seq == 41 and hook.take() == ["records"]
    assert "rank 0 sleeps 0.5 s before engine.dp_sync at step 4" in capfd.readouterr().err
    plain = Recorder()
    assert FaultInjector([SlowRank(0, 1.0)], 0).wrap_recorder(plain) is plain


# ------------------------------------------------------------ wave boundaries


def _steps(*rows):
    """Step records from (iter, wave, clock_us, step_us) rows."""
    return [{"kind": "step", "iter": i, "wave": w, "clock_s": c / 1e6, "step_time_s": s / 1e6}
            for i, w, c, s in rows]


STEPS = _steps((0, 0, 0, 20_000), (1, 0, 20_000, 20_013), (2, 1, 5_000_000, 20_000),
               (3, 1, 5_020_000, 21_111))


def test_wave_ends_lists_each_wave_last_step():
    assert wave_ends(STEPS) == [WaveEnd(0, 1, 20_000, 40_013),
                                WaveEnd(1, 3, 5_020_000, 5_041_111)]
    with pytest.raises(ValueError, match="expects step records"):
        wave_ends([{"kind": "request"}])


def test_wave_boundary_trace_places_the_request_exactly_at_the_end():
    trace = [TraceRequest("x", 0.0, 10, 2), TraceRequest("y", 0.040013, 10, 2),
             TraceRequest("z", 5.0, 10, 2)]
    extra = TraceRequest("edge", 999.0, 30, 4, rank=1)
    new = wave_boundary_trace(trace, STEPS, wave=0, request=extra)
    assert [r.request_id for r in new] == ["x", "y", "edge", "z"]
    assert new[2] == TraceRequest("edge", 0.040013, 30, 4, rank=1)
    assert round(new[2].arrival_s * 1e6) == 40_013  # the engine's arrival_us
    before = wave_boundary_trace(trace, STEPS, wave=0, request=extra, offset_us=-1)
    assert [r.request_id for r in before] == ["x", "edge", "y", "z"]
    assert round(before[1].arrival_s * 1e6) == 40_012
    last = wave_boundary_trace(trace, STEPS, wave=1, request=extra)
    assert last[-1].request_id == "edge" and round(last[-1].arrival_s * 1e6) == 5_041_111
    with pytest.raises(ValueError, match=r"wave 2 is not in the step records \(waves: \[0, 1\]"):
        wave_boundary_trace(trace, STEPS, wave=2, request=extra)
    with pytest.raises(ValueError, match="before time 0"):
        wave_boundary_trace(trace, STEPS, wave=0, request=extra, offset_us=-10**9)


def test_insert_request_refuses_a_used_id():
    with pytest.raises(ValueError, match="request id 'a' is already in the trace"):
        insert_request(TRACE, TraceRequest("a", 1.0, 1, 1))
    assert [r.request_id for r in insert_request(TRACE, TraceRequest("c", 0.0, 1, 1))] == \
        ["a", "c", "b"]
