"""vLLM 0.27.1's DP load balancer as a router (emu/vllm_dp_lb.py): each case is a rule of
``DPLBAsyncMPClient.get_core_engine_for_request`` (vllm/v1/engine/core_client.py) or of
the DP coordinator's publishing (vllm/v1/engine/coordinator.py), worked by hand."""

from __future__ import annotations

from emu.rank.clock import RankStats
from emu.vllm_dp_lb import VllmDPLBRouter
from emu.workload import TraceRequest, make_router


def req(i: int, rank: int | None = None) -> TraceRequest:
    return TraceRequest(f"r{i}", 0.0, 10, 10, rank=rank)


def stats(*per_rank) -> list[RankStats]:
    """(waiting, running, finished, kv permille) per rank."""
    return [RankStats(*s) for s in per_rank]


def test_a_burst_before_any_stats_goes_round_robin():
    # No published counts yet: the in-flight floor and the rotating scan start spread a
    # burst one request per engine in turn.
    router = make_router("vllm", 4)
    assert [router.route(req(i)) for i in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert [router.inflight(r) for r in range(4)] == [2, 2, 2, 2]


def test_a_finish_frees_its_engine_once_the_coordinator_publishes():
    router = VllmDPLBRouter(3)
    for i in range(6):
        router.route(req(i))  # two on each engine
    router.observe(stats((0, 2, 0, 0), (0, 2, 0, 0), (0, 2, 0, 0)), at_us=0)
    # Engine 2 finishes one at 50 ms: the client knows (in flight 1), but the last
    # publish was 50 ms ago, so the coordinator's view still says 2 running there. Every
    # engine scores 2; the scan starts at engine 0 (six routed so far): engine 0 wins.
    router.observe(stats((0, 2, 0, 0), (0, 2, 0, 0), (0, 1, 1, 0)), at_us=50_000)
    assert router.inflight(2) == 1
    assert router.route(req(6)) == 0
    # 100 ms after the last publish the changed counts are published: engine 2 scores
    # max(1, 0 + 1) = 1 against engine 0's max(3, 2) = 3 and engine 1's 2.
    router.observe(stats((0, 3, 0, 0), (0, 2, 0, 0), (0, 1, 1, 0)), at_us=100_000)
    assert router.route(req(7)) == 2


def test_local_waiting_increments_last_until_the_next_publish():
    router = VllmDPLBRouter(2)
    router.observe(stats((0, 5, 0, 0), (0, 1, 0, 0)), at_us=0)
    # engine 1: max(0, 0 + 1) = 1; after each pick its waiting count grows by one
    assert [router.route(req(i)) for i in range(4)] == [1, 1, 1, 1]
    assert router.lb_engines[1][0] == 4
    # unchanged counts are republished after 5 s, which drops the local increments
    router.observe(stats((0, 5, 0, 0), (0, 1, 0, 0)), at_us=4_999_999)
    assert router.lb_engines[1][0] == 4
    router.observe(stats((0, 5, 0, 0), (0, 1, 0, 0)), at_us=5_000_000)
    assert router.lb_engines[1][0] == 0


def test_waiting_on_a_full_kv_cache_is_penalised():
    router = VllmDPLBRouter(2)
    # engine 0: 2 waiting + 2 running at 90 % KV usage scores 4 + 2 * 6 * 0.4 = 8.8;
    # engine 1: 7 running, nothing waiting, scores 7 and wins
    router.observe(stats((2, 2, 0, 900), (0, 7, 0, 950)), at_us=0)
    assert router.route(req(0)) == 1
    # at 50 % usage the penalty is off: engine 0 scores 4 and wins
    router = VllmDPLBRouter(2)
    router.observe(stats((2, 2, 0, 500), (0, 7, 0, 950)), at_us=0)
    assert router.route(req(0)) == 0


def test_a_pinned_request_counts_in_flight_and_nothing_else():
    router = VllmDPLBRouter(2)
    assert router.route(req(0, rank=0)) == 0
    assert router.route(req(1, rank=0)) == 0
    assert router.eng_start_index == 0 and router.lb_engines[0][0] == 0
    # engine 0 has two in flight: the unpinned ones go to engine 1 until it has as many
    assert [router.route(req(i)) for i in range(2, 6)] == [1, 1, 0, 1]


def test_api_servers_each_learn_only_their_own_finishes():
    from emu.rank.clock import RankStats
    from emu.routers import make_router

    servers = make_router("vllm", 2, api_servers=2, seed=3)
    assert [s.eng_start_index for s in servers.servers] == [0, 1]  # (2 * i) // 2
    assert all(s.client_count == 2 for s in servers.servers)
    taken = [servers.route(TraceRequest(f"r{i}", 0.0, 16, 4, rank=0)) for i in range(6)]
    assert taken == [0] * 6
    mine = [sum(servers.server_of(f"r{i}") == s for i in range(6)) for s in (0, 1)]
    assert [servers.servers[s].inflight(0) for s in (0, 1)] == mine
    # rank 0 reports one finish of server 1's requests: only server 1's count drops
    stats = [RankStats(0, 5, 1, 0, (0, 1)), RankStats(0, 0, 0, 0, (0, 0))]
    servers.observe(stats, 0)
    assert [servers.servers[s].inflight(0) for s in (0, 1)] == [mine[0], mine[1] - 1]
    # the same seed draws the same servers; another seed other ones
    again = make_router("vllm", 2, api_servers=2, seed=3)
    for i in range(6):
        again.route(TraceRequest(f"r{i}", 0.0, 16, 4, rank=0))
    assert [again.server_of(f"r{i}") for i in range(6)] == [
        servers.server_of(f"r{i}") for i in range(6)]


def test_every_api_server_gets_the_coordinators_publishes_in_a_copy_of_its_own():
    """One coordinator publishes to every server's client: none of them sees changed
    counts before 100 ms after the last publish, all of them at it, and the waiting
    count a server adds for its own picks stays in its own copy."""
    from emu.routers import make_router

    servers = make_router("vllm", 2, api_servers=3, seed=1)
    servers.observe([RankStats(0, 4, 0, 0, (0, 0, 0)), RankStats(0, 1, 0, 0, (0, 0, 0))], 0)
    assert [s.lb_engines for s in servers.servers] == [[[0, 4, 0.0], [0, 1, 0.0]]] * 3
    servers.observe([RankStats(0, 0, 0, 0, (0, 0, 0)), RankStats(0, 9, 0, 0, (0, 0, 0))],
                    99_999)
    assert [s.lb_engines for s in servers.servers] == [[[0, 4, 0.0], [0, 1, 0.0]]] * 3
    servers.observe([RankStats(0, 0, 0, 0, (0, 0, 0)), RankStats(0, 9, 0, 0, (0, 0, 0))],
                    100_000)
    assert [s.lb_engines for s in servers.servers] == [[[0, 0, 0.0], [0, 9, 0.0]]] * 3
    first = servers.servers[0]
    first.route(req(0))  # engine 0 scores 0: its waiting count grows by the 3 clients
    assert first.lb_engines[0][0] == 3
    assert [s.lb_engines[0][0] for s in servers.servers[1:]] == [0, 0]
    # unchanged counts are published again 5 s after the last publish, to every server
    servers.observe([RankStats(0, 0, 0, 0, (0, 0, 0)), RankStats(0, 9, 0, 0, (0, 0, 0))],
                    5_099_999)
    assert first.lb_engines[0][0] == 3
    servers.observe([RankStats(0, 0, 0, 0, (0, 0, 0)), RankStats(0, 9, 0, 0, (0, 0, 0))],
                    5_100_000)
    assert [s.lb_engines for s in servers.servers] == [[[0, 0, 0.0], [0, 9, 0.0]]] * 3
