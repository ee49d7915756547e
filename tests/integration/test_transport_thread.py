"""Issue 13, the thread transport: every rank a thread of this process over in-memory
collectives must give byte for byte the event logs, rank logs and metrics (wall-clock
section aside) of real rank processes over gloo, and fail the way they fail: a hang or
a disagreement named by the watchdog, a killed rank named, every rank thread ended.

Each comparison runs a complete (small) run both ways: the first requests of a bundled
workload, outputs capped so that a process run takes seconds."""

from __future__ import annotations

import dataclasses
import threading

import pytest

from dyntra_lb.planner import registry as planners
from emu.cluster import threads
from emu.cluster.supervision import ClusterError
from emu.faults import FaultPlan
from emu.metrics import compute_metrics, load_run
from emu.rank.costs import PROFILES
from emu.run import run_cluster
from emu.spec import RunSpec
from emu.workload import WORKLOADS_DIR, TraceRequest, load_trace

pytestmark = pytest.mark.integration

BLOCK_SIZE = 16


def lb(**keys) -> dict:
    return {"scheduler_config": {"dyntra_lb_config": {"enabled": True, **keys}}}


STATIC = lb(mode="static", start_step=0, bubble_threshold=1.0, enable_diagnostics=True)
# Longtail's longest prompts (~2,000 tokens) hold more than 100 blocks of 16 tokens.
DYNAMIC = lb(mode="dynamic", start_step=0, long_req_block_threshold=100,
             dynamic_max_step=8, enable_diagnostics=True)


def bundled_prefix(name: str, n: int = 32, max_output: int = 48) -> list[TraceRequest]:
    trace = load_trace(WORKLOADS_DIR / f"{name}.jsonl")[:n]
    return [dataclasses.replace(r, output_tokens=min(r.output_tokens, max_output))
            for r in trace]


CASES = {
    # name: (workload, additional config, faults, other RunSpec fields); vLLM's async
    # scheduling unless a case says otherwise
    "static": ("default", STATIC, None, {}),
    "dynamic": ("longtail", DYNAMIC, None, {}),
    "off": ("bimodal", None, None, {}),
    "slow-mtp": ("uniform", STATIC, ["slow:rank=1,extra_ms=7"],
                 {"cost_model": PROFILES["kv-token-mtp3"]}),
    "kv_fail": ("default", STATIC, ["kv_fail:request={second}"], {}),
    "static-sync": ("default", STATIC, None, {"async_scheduling": False}),
}


def case_spec(name: str, dp_size: int, out_dir) -> RunSpec:
    workload, config, faults, fields = CASES[name]
    trace = bundled_prefix(workload)
    if faults is not None:
        faults = FaultPlan.of([f.format(second=trace[1].request_id) for f in faults])
    return RunSpec(trace=trace, dp_size=dp_size, out_dir=out_dir, additional_config=config,
                   max_num_seqs=4, block_size=BLOCK_SIZE, num_gpu_blocks=1024, device="cpu",
                   strict=True, faults=faults, run_timeout_s=300.0, **fields)


def without_wall(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if k != "wall"}


def rank_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("dyntra-emu-rank")]


@pytest.mark.parametrize("name,dp_size", [*((name, dp) for name in CASES if name != "static-sync"
                                            for dp in (2, 4)), ("static-sync", 2)])
def test_thread_transport_is_byte_identical_to_processes(tmp_path, name, dp_size,
                                                         no_leftover_processes):
    spec = case_spec(name, dp_size, tmp_path / "process")
    processes = run_cluster(spec)
    threads = run_cluster(dataclasses.replace(spec, transport="thread",
                                              out_dir=tmp_path / "thread"))
    assert not rank_threads()
    assert [s.steps for s in threads.ranks] == [s.steps for s in processes.ranks]
    for rank in range(dp_size):
        a = processes.event_log(rank)
        assert a and a == threads.event_log(rank), f"rank {rank} event log"
        assert processes.logs[rank].read_bytes() == threads.logs[rank].read_bytes()
        assert (threads.out_dir / f"rank{rank}.wall" / "_complete").exists()
    a = compute_metrics(load_run(processes.out_dir))
    b = compute_metrics(load_run(threads.out_dir))
    assert without_wall(a) == without_wall(b)
    assert a["requests_finished"] == len(spec.trace)
    # The run exercises what its case is about.
    if CASES[name][1] is not None:
        assert a["plan_churn"]["active_steps"] > 0
        assert "[dyntra_lb]" in processes.logs[0].read_text()
    steps = [e for r in range(dp_size) for e in threads.events(r) if e["kind"] == "step"]
    if name == "dynamic":  # switched on by a long request, and off again
        assert any(s["lb_active"] for s in steps) and not all(s["lb_active"] for s in steps)
    if name == "slow-mtp":
        assert min(s["own_cost_s"] for s in steps if s["rank"] == 1) >= 0.027
    if name == "kv_fail":  # the failed request's prompt is recomputed on its rank
        assert max(s["scheduled_tokens"] for s in steps) >= spec.trace[1].prompt_tokens
    if name == "slow-mtp":  # decoding requests verified drafts: more tokens than requests
        assert any(s["scheduled_tokens"] > s["num_running"] > 0 for s in steps)


def test_each_gathered_snapshot_is_planned_by_one_rank_thread(tmp_path, monkeypatch):
    """The DP group's plan memo: every rank gathers the same snapshot, one runs the
    planner and the others take its plans (byte identity is the test above)."""
    calls = []
    reference = planners.PLANNERS[planners.REFERENCE]

    def counted(*args, **kwargs):
        if kwargs.get("observer") is None:  # not the control plane's count of its work
            calls.append(threading.current_thread().name)
        return reference(*args, **kwargs)

    monkeypatch.setitem(planners.PLANNERS, planners.REFERENCE, counted)
    spec = dataclasses.replace(case_spec("static", 4, tmp_path), transport="thread")
    run = run_cluster(spec)
    planned = [sum(1 for e in run.events(r) if e["kind"] == "step" and e["lb_active"])
               for r in range(4)]
    assert planned[0] > 0 and planned == planned[:1] * 4
    # At most one planner run per gathered snapshot (fewer when consecutive steps
    # gather identical snapshots), not one per rank and step.
    assert 0 < len(calls) <= planned[0]


def _thread_spec(tmp_path, trace, **fields) -> RunSpec:
    return RunSpec(trace=trace, dp_size=2, out_dir=tmp_path, additional_config=STATIC,
                   max_num_seqs=4, block_size=BLOCK_SIZE, device="cpu", strict=True,
                   transport="thread", run_timeout_s=120.0, **fields)


def test_hang_in_thread_mode_names_the_waiting_rank_and_stops_every_thread(tmp_path):
    trace = bundled_prefix("default", n=8)
    spec = _thread_spec(tmp_path, trace, collective_timeout_s=1.0,
                        faults=FaultPlan.of(["delay:rank=1,site=engine.lockstep,step=5,"
                                             "seconds=3"]))
    with pytest.raises(ClusterError) as info:
        run_cluster(spec)
    err = info.value
    assert err.rank is None
    assert err.message.startswith("collective hang: no rank completed a collective for 1 s")
    assert "waiting: rank 0 in seq " in err.message
    assert err.message.endswith("engine.lockstep; not in a collective: rank 1")
    assert err.collectives[0]["inside"] and not err.collectives[1]["inside"]
    assert err.collectives[0]["entered"]["site"] == "engine.lockstep"
    assert err.collectives[0]["entered"]["iteration"] == 5
    assert "stopped by the launcher; Python stack:" in err.details[1]
    assert "_sleep_before_collective" in err.details[1]
    assert not rank_threads()


def test_a_rank_holding_the_runner_past_the_stop_is_named_by_the_ranks_it_holds_back(
        tmp_path, monkeypatch):
    """Rank threads share one runner thread: rank 0, waiting in a collective, cannot
    unwind while rank 1 sleeps outside one; its report says so and names rank 1."""
    monkeypatch.setattr(threads, "_STOP_GRACE_S", 0.5)
    spec = _thread_spec(tmp_path, bundled_prefix("default", n=8), collective_timeout_s=1.0,
                        faults=FaultPlan.of(["delay:rank=1,site=engine.lockstep,step=5,"
                                             "seconds=3"]))
    with pytest.raises(ClusterError) as info:
        run_cluster(spec)
    err = info.value
    assert err.message.endswith("not in a collective: rank 1")
    assert ("stopped by the launcher but still running 0.5 s later (it cannot unwind while "
            "rank 1 holds the runner thread); Python stack:") in err.details[0]
    assert "_sleep_before_collective" in err.details[1]
    assert "rank 1 holds" not in err.details[1]
    for thread in rank_threads():  # the sleep ends; then every rank unwinds
        thread.join(10.0)
    assert not rank_threads()


def test_killed_rank_thread_is_named_and_the_run_stops(tmp_path, capfd):
    trace = bundled_prefix("default", n=16)
    with pytest.raises(ClusterError) as info:
        run_cluster(_thread_spec(tmp_path, trace, faults=FaultPlan.of(["kill:rank=1,step=30"])))
    err = info.value
    assert err.rank == 1 and err.failed_ranks == [1]
    assert err.message == "killed by fault kill:rank=1,step=30 at step 30"
    assert "RankKilled" in err.details[1]
    assert "stopped by the launcher" in err.details[0]
    assert "rank 1 ends its thread at step 30" in capfd.readouterr().err
    assert not rank_threads()


def test_rank_error_in_thread_mode_is_named(tmp_path):
    trace = bundled_prefix("default", n=8)
    target = trace[1].request_id
    with pytest.raises(ClusterError) as info:
        run_cluster(_thread_spec(tmp_path, trace, faults=FaultPlan.of(
            [f"kv_never:request={target},timeout_s=0.5"])))
    err = info.value
    assert err.rank == 1
    assert err.message.startswith(f"emu.faults.KVTransferTimeout: request '{target}' "
                                  "on rank 1")
    assert not rank_threads()


def test_thread_transport_refuses_the_npu(tmp_path):
    with pytest.raises(ValueError, match="RunSpec.transport='thread': runs every rank on the CPU"):
        run_cluster(dataclasses.replace(_thread_spec(tmp_path, bundled_prefix("default", 4)),
                                        device="npu"))


@pytest.mark.dp(2)
def test_plugin_fixture_runs_threads(dyntra_cluster):
    run = dyntra_cluster(trace=bundled_prefix("default", n=8), additional_config=STATIC,
                         block_size=BLOCK_SIZE, max_num_seqs=4, transport="thread")
    assert run.spec.transport == "thread"
    assert run.metrics["requests_finished"] == 8
    assert run.metrics["plan_churn"]["active_steps"] > 0
    assert not rank_threads()
