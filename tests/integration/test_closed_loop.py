"""Closed-loop clients (``RunSpec.max_concurrency``, issue 15 item 1) in real rank
processes over gloo: what the schedulers held never exceeds the limit across the
instance, send times follow finishes on any rank exactly as vLLM's benchmark client
would send, a hand-computed case comes out to the microsecond, and the thread transport
gives the same bytes. The hand-computed timelines are those of synchronous scheduling;
under vLLM's async scheduling a finish reaches the engine (and the client) one iteration
after the forward that produced it, so a send follows the finish by one step."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from emu.rank.costs import StepCostModel
from emu.run import run_cluster
from emu.sites import LOCKSTEP_SITE
from emu.spec import RunSpec
from emu.workload import WORKLOADS_DIR, TraceRequest, load_trace

pytestmark = pytest.mark.integration

# Every step costs 10 ms, and a prompt's KV arrives within the step it is requested in.
FLAT = StepCostModel(name="flat-10ms", fixed_s=0.010, per_kv_token_s=0.0,
                     per_scheduled_token_s=0.0)
STATIC = {"scheduler_config": {"dyntra_lb_config": {"enabled": True, "mode": "static",
                                                    "start_step": 0}}}


def read(run, kind: str) -> list[dict]:
    return [r for rank in range(len(run.ranks)) for r in run.events(rank)
            if r["kind"] == kind]


def held_per_iteration(run) -> Counter:
    """Requests every scheduler held (running + waiting) per iteration, summed over
    ranks: the ranks step in lockstep, so iteration k is the same moment on each."""
    held = Counter()
    for step in read(run, "step"):
        held[step["iter"]] += step["num_running"] + step["num_waiting"]
    return held


def hand_spec(tmp_path, trace, limit: int, **fields) -> RunSpec:
    return RunSpec(trace=trace, dp_size=2, out_dir=tmp_path, max_concurrency=limit,
                   cost_model=FLAT, kv_latency_fixed_s=0.0, kv_latency_per_block_s=0.0,
                   device="cpu", strict=True, run_timeout_s=120.0, async_scheduling=False,
                   **fields)


def timeline(run) -> dict[str, tuple]:
    """request -> (rank, sent, first scheduled, first token, finished), in seconds."""
    return {r["request_id"]: (r["rank"], r["arrival_s"], r["first_scheduled_s"],
                              r["token_times_s"][0], r["finish_s"])
            for r in read(run, "request")}


# By hand, with 10 ms steps and instant KV: a request taken in at an intake at t waits
# one step for its KV (t + 10 ms it is scheduled), emits its first token at t + 20 ms and
# its o-th at t + 10 ms * (o + 1). A finish at T (a step's end) is reported by the next
# step's lockstep collective, which starts at T: the freed slot sends the next request
# at T (its send time), and every rank takes it in at that step's end, T + 10 ms. When
# the wave has ended, the clock jumps to the next send time, which is then its arrival.


def test_one_slot_sends_each_request_when_the_previous_finishes(tmp_path):
    # r0..r2 at 0 s, r3 at 0.5 s; outputs 3, 5, 2, 4 tokens; round robin: ranks 0,1,0,1.
    trace = [TraceRequest(f"r{i}", 0.0 if i < 3 else 0.5, 16, out)
             for i, out in enumerate([3, 5, 2, 4])]
    run = run_cluster(hand_spec(tmp_path, trace, 1))
    assert timeline(run) == {
        "r0": (0, 0.0, 0.01, 0.02, 0.04),    # taken at 0
        "r1": (1, 0.04, 0.06, 0.07, 0.11),   # sent at r0's finish, taken at 0.05
        "r2": (0, 0.11, 0.13, 0.14, 0.15),   # sent at r1's finish (other rank), taken 0.12
        "r3": (1, 0.5, 0.51, 0.52, 0.55),    # its slot was free at 0.15; sent on arrival
    }
    assert max(held_per_iteration(run).values()) == 1


def test_two_slots_and_the_first_finish_anywhere_frees_one(tmp_path):
    trace = [TraceRequest(f"r{i}", 0.0, 16, out) for i, out in enumerate([3, 5, 2, 4])]
    run = run_cluster(hand_spec(tmp_path, trace, 2))
    assert timeline(run) == {
        "r0": (0, 0.0, 0.01, 0.02, 0.04),
        "r1": (1, 0.0, 0.01, 0.02, 0.06),
        "r2": (0, 0.04, 0.06, 0.07, 0.08),   # r0's finish frees the first slot
        "r3": (1, 0.06, 0.08, 0.09, 0.12),   # r1's the second
    }
    assert max(held_per_iteration(run).values()) == 2


def bundled_prefix(name: str, n: int, max_output: int = 40) -> list[TraceRequest]:
    return [dataclasses.replace(r, output_tokens=min(r.output_tokens, max_output))
            for r in load_trace(WORKLOADS_DIR / f"{name}.jsonl")[:n]]


@pytest.mark.parametrize("limit,async_scheduling", [(3, False), (8, True)])
def test_never_more_in_flight_than_the_limit_and_sends_follow_finishes(tmp_path, limit,
                                                                       async_scheduling):
    trace = bundled_prefix("default", 24)
    spec = RunSpec(trace=trace, dp_size=4, out_dir=tmp_path / "process",
                   additional_config=STATIC, max_concurrency=limit, max_num_seqs=4,
                   block_size=16, num_gpu_blocks=1024, device="cpu", strict=True,
                   run_timeout_s=300.0, async_scheduling=async_scheduling)
    run = run_cluster(spec)
    requests = read(run, "request")
    assert len(requests) == len(trace) and all(r["finish_s"] is not None for r in requests)
    held = held_per_iteration(run)
    assert max(held.values()) == limit  # reached, never exceeded
    # vLLM's client: request j goes out at its arrival or when the (j - limit + 1)-th
    # request to finish (anywhere) frees a slot, whichever is later: at the finish, or
    # with async scheduling once the finish has reached the engine, one step later.
    sent = {r["request_id"]: r["arrival_s"] for r in requests}
    finishes = sorted(r["finish_s"] for r in requests)
    step_ends = sorted({round(s["clock_s"] + s["step_time_s"], 6)
                        for s in read(run, "step")})
    for j, request in enumerate(trace):
        freed = finishes[j - limit] if j >= limit else request.arrival_s
        # async: the output is processed in the next iteration, after its forward or, when
        # it has none, before its dummy step, whose collective then reports it
        allowed = [freed]
        if async_scheduling and j >= limit:
            allowed.append(next(t for t in step_ends if t > freed + 1e-9))
        assert any(sent[request.request_id] == pytest.approx(max(request.arrival_s, t),
                                                             abs=1e-9)
                   for t in allowed), request
    # Never more than the limit between send and finish, at any send time.
    for t in sent.values():
        assert sum(s <= t < r["finish_s"] for r in requests
                   for s in [sent[r["request_id"]]]) <= limit
    # The limit binds: some requests went out later than their trace arrival.
    assert sum(sent[r.request_id] > r.arrival_s + 1e-9 for r in trace) > len(trace) // 2
    # The thread transport, byte for byte.
    threads = run_cluster(dataclasses.replace(spec, transport="thread",
                                              out_dir=tmp_path / "thread"))
    for rank in range(spec.dp_size):
        assert run.event_log(rank) == threads.event_log(rank)


def test_without_a_limit_the_lockstep_collective_keeps_its_shape(tmp_path):
    trace = bundled_prefix("default", 6, max_output=4)
    shapes = {}
    for limit in (None, 2):
        run = run_cluster(RunSpec(trace=trace, dp_size=2, out_dir=tmp_path / str(limit),
                                  max_concurrency=limit, block_size=16, device="cpu"))
        shapes[limit] = {tuple(c["shape"]) for s in read(run, "step")
                         for c in s["collectives"] if c["site"] == LOCKSTEP_SITE}
    assert shapes == {None: {(5,)}, 2: {(7,)}}


def test_the_fixture_takes_the_limit(dyntra_cluster):
    trace = [{"request_id": f"r{i}", "arrival_s": 0.0, "prompt_tokens": 64,
              "output_tokens": 6} for i in range(6)]
    run = dyntra_cluster(trace=trace, max_concurrency=2, block_size=16)
    assert run.metrics["requests_finished"] == 6
    held = Counter()
    for rank in range(2):
        for step in run.steps(rank):
            held[step["iter"]] += step["num_running"] + step["num_waiting"]
    assert max(held.values()) == 2
