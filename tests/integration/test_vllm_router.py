"""``--router vllm`` (vLLM 0.27.1's DP load balancer, emu/vllm_dp_lb.py) in a running
cluster: requests pinned to a rank count as in flight there, so the balancer sends the
unpinned ones elsewhere, where round robin and the older least-loaded rule do not; the
lockstep collective carries what the balancer reads."""

from __future__ import annotations

import pytest

from emu.run import run_cluster
from emu.sites import LOCKSTEP_SITE
from emu.spec import RunSpec
from emu.workload import TraceRequest

pytestmark = pytest.mark.integration

# Two requests pinned to rank 0, then two unpinned, all at once.
TRACE = [TraceRequest("p0", 0.0, 16, 4, rank=0), TraceRequest("p1", 0.0, 16, 4, rank=0),
         TraceRequest("u0", 0.0, 16, 4), TraceRequest("u1", 0.0, 16, 4)]


def ranks_and_shapes(tmp_path, router: str) -> tuple[dict, set]:
    servers = {"api_server_count": 1} if router == "vllm" else {}  # one client's rules
    run = run_cluster(RunSpec(trace=TRACE, dp_size=2, out_dir=tmp_path / router,
                              router=router, block_size=16, device="cpu",
                              transport="thread", **servers))
    records = [r for rank in range(len(run.ranks)) for r in run.events(rank)]
    ranks = {r["request_id"]: r["rank"] for r in records if r["kind"] == "request"}
    shapes = {tuple(c["shape"]) for r in records if r["kind"] == "step"
              for c in r["collectives"] if c["site"] == LOCKSTEP_SITE}
    return ranks, shapes


def test_pinned_requests_count_in_flight(tmp_path):
    # vLLM: rank 0 has 2 in flight, rank 1 none: u0 scores 2 against 0, u1 2 against 1
    ranks, shapes = ranks_and_shapes(tmp_path, "vllm")
    assert ranks == {"p0": 0, "p1": 0, "u0": 1, "u1": 1}
    assert shapes == {(1 + 4 * 2,)}  # own cost, then waiting, running, finished, KV usage
    # the routers that do not count pinned requests split the unpinned pair
    for router in ("round_robin", "least_loaded"):
        ranks, shapes = ranks_and_shapes(tmp_path, router)
        assert (ranks["u0"], ranks["u1"]) == (0, 1), router
        assert shapes == {(1 + 2 * 2,)}


def test_finished_requests_leave_the_balancers_count(tmp_path):
    # Rank 0's three short requests have finished (and the coordinator has published
    # that) long before u0 arrives at 0.5 s, while rank 1 still runs q0: vLLM's client
    # has 0 in flight on rank 0 and 1 on rank 1, so u0 goes to rank 0.
    trace = [*(TraceRequest(f"p{i}", 0.0, 16, 2, rank=0) for i in range(3)),
             TraceRequest("q0", 0.0, 16, 100, rank=1), TraceRequest("u0", 0.5, 16, 4)]
    run = run_cluster(RunSpec(trace=trace, dp_size=2, out_dir=tmp_path, router="vllm",
                              block_size=16, device="cpu", transport="thread",
                              api_server_count=1))
    records = [r for rank in range(len(run.ranks)) for r in run.events(rank)]
    request = {r["request_id"]: r for r in records if r["kind"] == "request"}
    assert max(request[f"p{i}"]["finish_s"] for i in range(3)) < 0.4
    assert request["q0"]["finish_s"] > 0.6  # rank 1 still busy when u0 arrives
    assert request["u0"]["rank"] == 0


def test_each_api_server_counts_only_its_own_requests_in_flight(tmp_path):
    # Four requests pinned to rank 0, then one unpinned, all at once, through 2 API
    # servers drawn per request (emu/routers/vllm_dp_lb.py). vLLM's client of server s
    # scores rank 0 with 2 * (its own in-flight requests there): with any of the pinned
    # four it sends the unpinned one to rank 1; with none, all engines tie and its scan
    # starts at (2 * s) // 2 = s. A seed where the unpinned request's server took none
    # of the pinned ones, and is server 0, tells the servers' counts from a shared one.
    import random

    def draws(seed):
        rng = random.Random(f"api-server-choice:{seed}")
        return [rng.randrange(2) for _ in range(5)]

    seed = next(s for s in range(500) if draws(s) == [1, 1, 1, 1, 0])
    trace = [*(TraceRequest(f"p{i}", 0.0, 16, 4, rank=0) for i in range(4)),
             TraceRequest("u0", 0.0, 16, 4)]
    run = run_cluster(RunSpec(trace=trace, dp_size=2, out_dir=tmp_path, router="vllm",
                              block_size=16, device="cpu", transport="thread", seed=seed))
    records = [r for rank in range(len(run.ranks)) for r in run.events(rank)]
    ranks = {r["request_id"]: r["rank"] for r in records if r["kind"] == "request"}
    assert ranks["u0"] == 0  # one shared count (4 in flight on rank 0) would say rank 1
    # the lockstep carries each rank's finishes per server: (w, r, f0, f1, kv) per rank
    shapes = {tuple(c["shape"]) for r in records if r["kind"] == "step"
              for c in r["collectives"] if c["site"] == LOCKSTEP_SITE}
    assert shapes == {(1 + 5 * 2,)}
