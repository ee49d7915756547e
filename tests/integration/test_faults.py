"""Issue 6, faults: each injected fault on a real cluster (rank processes joined by real
gloo groups), and what must happen — a clean failure naming the rank, with no process
left behind, or a recovery in which every request still finishes exactly once.

Most tests compare against one undisturbed run of the same two-wave workload (dp=2,
DyntraLB static mode with bubble_threshold 1.0, so plans are made and applied)."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import psutil
import pytest

from emu.cluster.supervision import ClusterError
from emu.faults import FaultPlan
from emu.run import RunResult, run_cluster
from emu.spec import RunSpec
from emu.workload import TraceRequest, wave_boundary_trace, wave_ends
from tests.records import events

pytestmark = pytest.mark.integration

STATIC = {"scheduler_config": {"dyntra_lb_config": {
    "enabled": True, "mode": "static", "start_step": 0, "bubble_threshold": 1.0}}}
SECOND_WAVE_S = 20.0
BLOCK_SIZE = 16
# Pinned requests the KV faults target (every other request is routed round robin).
FAILING, UNREADY, HANGING = "a3", "a6", "a4"


def two_wave_trace() -> list[TraceRequest]:
    """Sixteen requests at the start, eight after an idle gap: two waves. Prompts of
    50..500 tokens, 10..38 output tokens."""
    trace = [TraceRequest(f"a{i}", 0.01 * i, 50 + 150 * (i % 4), 10 + 7 * (i % 5),
                          rank=1 if f"a{i}" in (FAILING, HANGING) else
                          0 if f"a{i}" == UNREADY else None)
             for i in range(16)]
    trace += [TraceRequest(f"b{i}", SECOND_WAVE_S + 0.01 * i, 50 + 150 * (i % 3),
                           10 + 5 * (i % 4)) for i in range(8)]
    return trace


def make_spec(out_dir, *, trace=None, faults=None, dp_size=2, **fields) -> RunSpec:
    return RunSpec(trace=two_wave_trace() if trace is None else trace, dp_size=dp_size,
                   out_dir=out_dir, additional_config=STATIC, max_num_seqs=4,
                   block_size=BLOCK_SIZE, num_gpu_blocks=1024, device="cpu",
                   max_steps=20_000, run_timeout_s=240.0, strict=True,
                   faults=None if faults is None else FaultPlan.of(faults), **fields)


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> RunResult:
    return run_cluster(make_spec(tmp_path_factory.mktemp("baseline")))


def steps(result: RunResult, rank: int) -> list[dict]:
    return [e for e in result.events(rank) if e["kind"] == "step"]


def requests(result: RunResult) -> dict[str, dict]:
    """Request records of every rank by id; fails on a request recorded twice."""
    records = [e for r in range(len(result.ranks)) for e in result.events(r)
               if e["kind"] == "request"]
    by_id = {e["request_id"]: e for e in records}
    assert len(by_id) == len(records), "a request was recorded on two ranks or twice"
    return by_id


def assert_nothing_lost(result: RunResult, trace: list[TraceRequest]) -> dict[str, dict]:
    """Every trace request finished exactly once, with all its output tokens."""
    by_id = requests(result)
    assert sorted(by_id) == sorted(r.request_id for r in trace)
    for request in trace:
        record = by_id[request.request_id]
        assert record["finish_s"] is not None, request.request_id
        assert len(record["token_times_s"]) == request.output_tokens
    assert not result.truncated
    return by_id


def bubble(result: RunResult, rank: int) -> float:
    return sum(s["step_time_s"] - s["own_cost_s"] for s in steps(result, rank))



# ---------------------------------------------------------------------------- kill


@pytest.mark.parametrize("dp_size, rank", [(2, 1), (4, 2)])
def test_killed_rank_is_named_and_every_rank_is_stopped(tmp_path, no_leftover_processes,
                                                        dp_size, rank):
    with pytest.raises(ClusterError) as info:
        run_cluster(make_spec(tmp_path, dp_size=dp_size, faults=[f"kill:rank={rank},step=30"]))
    err = info.value
    assert err.rank == rank
    assert err.message == "killed by signal SIGKILL"
    assert err.failed_ranks[0] == rank
    assert "killed by signal SIGKILL before reporting" in err.details[rank]
    for other in set(range(dp_size)) - {rank}:
        assert other in err.details  # each stopped rank reports where it was
    # the run's directory keeps the report, whoever launched it (emu.run)
    assert (tmp_path / "error.txt").read_text() == f"{err}\n"


def test_killed_rank_through_the_cli_exits_nonzero_and_leaves_no_process(tmp_path):
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(
        f'{{"request_id": "r{i}", "arrival_s": {0.01 * i:.2f}, "prompt_tokens": 64, '
        f'"output_tokens": 200}}\n' for i in range(6)))
    command = [sys.executable, "-m", "emu", "run", "--workload", str(trace), "--dp", "2",
               "--block-size", "16", "--max-num-seqs", "4", "--device", "cpu", "--quiet",
               "--fault", "kill:rank=1,step=40", "--out", str(tmp_path / "out")]
    proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    seen: set[psutil.Process] = set()
    try:
        deadline = time.monotonic() + 180
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                seen.update(psutil.Process(proc.pid).children(recursive=True))
            except psutil.NoSuchProcess:
                break
            time.sleep(0.05)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, (stdout, stderr)
    assert "dyntra-emu run: error: the cluster failed: rank 1 failed: killed by signal " \
           "SIGKILL" in stderr
    assert "[dyntra-emu fault kill:rank=1,step=40] rank 1 kills itself (SIGKILL) at step 40" \
        in stderr
    assert "Every rank was stopped." in stderr
    assert "DP bubble ratio" not in stdout
    assert len(seen) >= 2  # the ranks were seen running
    time.sleep(0.5)
    alive = []
    for p in seen:
        try:
            if (p.is_running() and p.status() != psutil.STATUS_ZOMBIE
                    and not any("resource_tracker" in part for part in p.cmdline())):
                alive.append(p)
        except psutil.NoSuchProcess:
            pass
    assert alive == []


# ---------------------------------------------------------------------------- slow


def test_slow_rank_completes_and_raises_the_bubble_of_the_others(tmp_path, baseline):
    slow = run_cluster(make_spec(tmp_path, faults=["slow:rank=0,extra_ms=5"]))
    assert_nothing_lost(slow, two_wave_trace())
    rank0, rank1 = steps(slow, 0), steps(slow, 1)
    # every step of rank 0 costs 5 ms more; the lockstep clock makes rank 1 wait for it
    assert {s["own_cost_s"] for s in rank0 if s["dummy"]} == {0.025}
    assert {s["own_cost_s"] for s in rank1 if s["dummy"]} == {0.020}
    assert min(s["step_time_s"] for s in rank0) >= 0.025
    assert [s["step_time_s"] for s in rank0] == [s["step_time_s"] for s in rank1]
    assert bubble(slow, 1) > bubble(baseline, 1) + 0.005 * len(rank1) / 2
    assert bubble(slow, 0) < bubble(baseline, 0)
    # the run takes longer in virtual time
    assert slow.ranks[0].clock_s > baseline.ranks[0].clock_s


# ------------------------------------------------------------------- KV transfers


@pytest.fixture(scope="module")
def kv_faults(tmp_path_factory) -> RunResult:
    """One run with a failing load (FAILING, rank 1) and a connector that answers
    "not ready" 25 times (UNREADY, rank 0)."""
    return run_cluster(make_spec(tmp_path_factory.mktemp("kv-faults"), faults=[
        f"kv_fail:request={FAILING}", f"not_ready:request={UNREADY},lookups=25"]))


def _admission(result: RunResult, rank: int, request_id: str) -> dict:
    return next(s for s in steps(result, rank) if request_id in s["admitted"])


def test_failed_kv_load_is_recomputed_and_nothing_is_lost(kv_faults, baseline):
    trace = {r.request_id: r for r in two_wave_trace()}
    got = assert_nothing_lost(kv_faults, list(trace.values()))
    base = requests(baseline)
    prompt = trace[FAILING].prompt_tokens
    # Normally the remote prompt leaves one token to compute when admitted; after the
    # failed load the rank prefills the whole prompt itself.
    assert _admission(baseline, 1, FAILING)["scheduled_tokens"] < prompt
    assert _admission(kv_faults, 1, FAILING)["scheduled_tokens"] >= prompt
    assert got[FAILING]["finish_s"] > base[FAILING]["finish_s"]
    # its blocks went back to the pool when it was promoted and were taken again at
    # admission: the pool never lost a block
    for s in steps(kv_faults, 1):
        assert s["kv_free_blocks"] + s["kv_held_blocks"] == 1024


def test_not_ready_request_waits_and_then_finishes(kv_faults, baseline):
    got = requests(kv_faults)
    base = requests(baseline)
    assert got[UNREADY]["first_scheduled_s"] > base[UNREADY]["first_scheduled_s"]
    assert got[UNREADY]["finish_s"] > base[UNREADY]["finish_s"]
    # (the waiting loop and DyntraLB's KV prefetch may each ask once per step)
    assert _admission(kv_faults, 0, UNREADY)["iter"] > _admission(baseline, 0, UNREADY)["iter"]


@pytest.mark.dp(2)
def test_never_completing_load_ends_in_a_named_failure(dyntra_cluster, tmp_path,
                                                        no_leftover_processes):
    # (through the pytest plugin's fixture, which takes faults as --fault strings)
    with pytest.raises(ClusterError) as info:
        dyntra_cluster(two_wave_trace(), additional_config=STATIC, max_num_seqs=4,
                       block_size=BLOCK_SIZE, num_gpu_blocks=1024, device="cpu", strict=True,
                       run_timeout_s=240.0, faults=[f"kv_never:request={HANGING},timeout_s=5"])
    err = info.value
    assert err.rank == 1  # the rank holding the request
    assert err.message.startswith(f"emu.faults.KVTransferTimeout: request '{HANGING}' on "
                                  "rank 1 has waited for its remote KV since virtual time")
    assert "stopped after 5 s of virtual time" in err.message
    # Rank 1 closed its log on the way out: everything else it held had finished, and
    # the stuck request kept the wave alive with dummy steps until the timeout.
    records = events(tmp_path / "dyntra-cluster-1", 1)
    rank1 = [r for r in records if r["kind"] == "step"]
    last = rank1[-1]
    assert last["clock_s"] + last["step_time_s"] >= 5.0
    assert (last["num_running"], last["num_waiting"], last["wave"]) == (0, 1, 0)
    assert all(r["dummy"] and r["num_waiting"] == 1 for r in rank1[-64:])
    # Its request record, written on the way out too, shows it never ran.
    [hanging] = [r for r in records if r["kind"] == "request" and r["request_id"] == HANGING]
    assert (hanging["first_scheduled_s"], hanging["token_times_s"], hanging["finish_s"]) == (
        None, [], None)


@pytest.mark.dp(2)
def test_a_rank_that_schedules_nothing_for_stall_steps_is_named(dyntra_cluster,
                                                                no_leftover_processes):
    # A load that never lands and no KV timeout: without the stall check the wave would
    # spin in dummy steps until max_steps.
    with pytest.raises(ClusterError) as info:
        dyntra_cluster(two_wave_trace(), additional_config=STATIC, max_num_seqs=4,
                       block_size=BLOCK_SIZE, num_gpu_blocks=1024, device="cpu",
                       stall_steps=200, run_timeout_s=240.0,
                       faults=[f"kv_never:request={HANGING},timeout_s=100000"])
    err = info.value
    assert err.rank == 1
    assert err.message.startswith("emu.rank.context.StallError: rank 1 is stuck: 1 unfinished "
                                  "request(s) but no token scheduled for 200 steps")
    assert f"{HANGING} (WAITING_FOR_REMOTE_KVS)" in err.message


# ----------------------------------------------------------------- collective delay


def test_delay_below_the_timeout_changes_nothing_in_the_event_logs(tmp_path, baseline):
    delayed = run_cluster(make_spec(tmp_path, faults=[
        "delay:rank=1,site=dyntra_lb.allgather,step=40,seconds=1.5",
        "delay:rank=0,site=engine.dp_sync,step=10,seconds=0.5"]))
    for rank in range(2):
        assert delayed.event_log(rank) == baseline.event_log(rank)


def test_delay_beyond_the_timeout_fails_named(tmp_path, no_leftover_processes):
    with pytest.raises(ClusterError) as info:
        run_cluster(make_spec(tmp_path, collective_timeout_s=3.0, faults=[
            "delay:rank=1,site=dyntra_lb.allgather,step=40,seconds=120"]))
    err = info.value
    text = str(err)
    # rank 0 waited in the all-gather until the timeout (named by gloo or the guard)...
    assert err.rank in (0, None)
    assert re.search(r"timed out|hang|timeout", text, re.IGNORECASE), text
    # ...while rank 1 was still in the injected sleep when it was stopped
    assert "_sleep_before_collective" in err.details[1]


# ------------------------------------------------------------ wave-boundary arrival


EDGE = TraceRequest("edge", 0.0, 300, 12, rank=1)


@pytest.mark.parametrize("offset_us", [0, -1], ids=["at-the-end", "during-the-last-step"])
def test_arrival_at_a_wave_boundary_starts_the_next_wave_everywhere(tmp_path, baseline,
                                                                    offset_us):
    base0 = steps(baseline, 0)
    end = wave_ends(base0)[0]
    trace = wave_boundary_trace(two_wave_trace(), base0, wave=0, request=EDGE,
                                offset_us=offset_us)
    run = run_cluster(make_spec(tmp_path, trace=trace))
    assert_nothing_lost(run, trace)
    for rank in range(2):
        records = steps(run, rank)
        before = [s for s in records if s["iter"] <= end.iter]
        # identical to the undisturbed run until the wave was over...
        assert before == [s for s in steps(baseline, rank) if s["iter"] <= end.iter]
        assert before[-1]["wave"] == 0 and before[-1]["step_counter"] % 32 == 0
        # ...then a new wave starts on every rank at that very moment, not at the
        # second burst
        first = records[len(before)]
        assert first["wave"] == 1 and first["step_counter"] == 1
        assert round(first["clock_s"] * 1e6) == end.end_us
        assert run.ranks[rank].waves == 3
    edge = requests(run)["edge"]
    assert edge["rank"] == 1 and edge["finish_s"] < SECOND_WAVE_S


def test_arrival_before_the_deciding_sync_joins_the_running_wave(tmp_path, baseline):
    """The contrast: arriving when the wave's last step starts, the request is taken
    by that step's intake, the sync sees it unfinished and the wave goes on."""
    base0 = steps(baseline, 0)
    end = wave_ends(base0)[0]
    trace = wave_boundary_trace(two_wave_trace(), base0, wave=0, request=EDGE,
                                offset_us=end.start_us - end.end_us)
    run = run_cluster(make_spec(tmp_path, trace=trace))
    assert_nothing_lost(run, trace)
    assert [r.waves for r in run.ranks] == [2, 2]
    edge = requests(run)["edge"]
    wave_of = {s["iter"]: s["wave"] for s in steps(run, 1)}
    finished_at = next(s["iter"] for s in steps(run, 1) if "edge" in s["finished"])
    assert wave_of[finished_at] == 0 and edge["finish_s"] < SECOND_WAVE_S
