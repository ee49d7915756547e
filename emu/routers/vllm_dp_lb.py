"""vLLM 0.27.1's DP load balancer in the API servers, as a router (``--router vllm``).

A decode node with internal data parallelism serves every DP rank behind its API
server(s). Each server's engine client, ``DPLBAsyncMPClient``, picks the rank of each new request
in ``get_core_engine_for_request`` (vllm/v1/engine/core_client.py), from two views of
the engines:

- its own exact count of unfinished requests per engine (``engine_inflight``: +1 when it
  routes a request there, -1 when that engine's output says the request finished);
- the DP coordinator's last published per-engine ``[waiting, running, kv_cache_usage]``
  (``lb_engines``; vllm/v1/engine/coordinator.py, ``DPCoordinatorProc.
  process_input_socket``). The coordinator republishes those at most every
  ``min_stats_update_interval_ms`` = 100 ms while they change (else every 5 s), a
  snapshot of a step boundary; each publish replaces the client's copy, and between
  publishes the client adds ``client_count`` to the waiting count of each engine it
  picks.

Score of an engine: ``max(client_count * inflight, waiting + running)``, plus
``waiting * 6 * max(0, kv_cache_usage - 0.5)`` when it has waiting requests; the lowest
score wins, ties to the first engine of a scan that starts one engine further on every
routed request (``eng_start_index``). A request pinned to a rank
(``data_parallel_rank``) goes there, counts as in flight, and changes nothing else.

The emulator feeds the router from the lockstep collective every rank already joins
(``emu.rank.clock.LockstepClock`` carries each rank's queues, requests finished so far
and KV usage): the client learns a finish at the next step's start, and the coordinator's
publish clock runs on the step start times (virtual). Every rank holds the same router
and sees the same numbers, so every rank agrees on every assignment.

Several API servers (``--api-server-count`` N; vLLM's default under internal load
balancing is one per DP rank, ``ServeSubcommand.cmd``, vllm/entrypoints/cli/serve.py:
103-126): server i is a client of its own (``VllmDPLBRouter`` with ``client_index`` i and
``client_count`` N): its own in-flight counts (of the requests it routed, finished as its
own outputs report them), its own copy of the coordinator's publishes, and its own scan
start, ``(dp_size * i) // N`` at first (``DPLBAsyncMPClient.__init__``). Which server
accepts a connection is the kernel's choice among the processes listening on the shared
socket; it is modelled as a uniform choice per request from a generator seeded with the
run's seed (``VllmAPIServers``), the same on every rank.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

# vllm/v1/engine/coordinator.py: DPCoordinatorProc(min_stats_update_interval_ms=100), and
# "otherwise every 5 seconds" when the stats did not change.
PUBLISH_INTERVAL_US = 100_000
UNCHANGED_PUBLISH_INTERVAL_US = 5_000_000
# vllm/v1/engine/core_client.py: DPLBAsyncMPClient.get_core_engine_for_request
WAITING_KV_PENALTY = 6.0
KV_PENALTY_FROM = 0.5


class CoordinatorPublishes:
    """The DP coordinator's publish clock (``DPCoordinatorProc``): which lockstep steps'
    engine counts it publishes to the API servers' clients. One per node: every server
    gets the same publishes."""

    def __init__(self) -> None:
        self._published: list[tuple[int, int, int]] | None = None
        self._published_us: int | None = None

    def publish(self, stats: Sequence, at_us: int) -> list[tuple[int, int, int]] | None:
        """The engine counts of the step that started at ``at_us`` (``engine_counts`` of
        its ``stats``) if the coordinator publishes them: the first, changed ones 100 ms
        after the last publish, unchanged ones after 5 s; None otherwise. The counts are
        made only once 100 ms are up (a step is shorter: most steps publish nothing)."""
        since = None if self._published_us is None else at_us - self._published_us
        if since is not None and since < PUBLISH_INTERVAL_US:
            return None
        counts = engine_counts(stats)
        if since is None or counts != self._published or (
                since >= UNCHANGED_PUBLISH_INTERVAL_US):
            self._published = counts
            self._published_us = at_us
            return counts
        return None


class VllmDPLBRouter:
    """vLLM's ``DPLBAsyncMPClient`` routing for one API server, client ``client_index``
    of ``client_count`` (see the module docstring). ``observe`` takes each lockstep
    step's numbers; ``route`` picks a rank."""

    name = "vllm"
    observes_engines = True  # the lockstep must carry finished counts and KV usage
    api_servers = 1

    def __init__(self, dp_size: int, client_count: int = 1, client_index: int = 0):
        self.dp_size = dp_size
        self.client_count = client_count
        self.eng_start_index = (dp_size * client_index) // client_count
        self._lb_engines: list[list[float]] | None = [[0, 0, 0.0] for _ in range(dp_size)]
        self._published: list[tuple[int, int, int]] = []  # the last publish, not yet copied
        self._routed = [0] * dp_size  # requests this client sent to each engine
        self._finished: Sequence[int] = [0] * dp_size  # of those, finished as it knows
        self._coordinator = CoordinatorPublishes()  # a lone server's

    @property
    def lb_engines(self) -> list[list[float]]:
        """This client's ``[waiting, running, kv_cache_usage]`` per engine: the last
        publish, with what it added since. Copied from the publish when first read after
        it (every server gets each publish, at about every other step; a server reads its
        copy only to route a request)."""
        if self._lb_engines is None:
            self._lb_engines = [[w, r, kv / 1000] for w, r, kv in self._published]
        return self._lb_engines

    def inflight(self, rank: int) -> int:
        """This client's unfinished requests on ``rank`` (vLLM's ``engine_inflight``)."""
        return self._routed[rank] - self._finished[rank]

    def observe(self, stats: Sequence, at_us: int) -> None:
        """A lockstep step that started at ``at_us``: the finishes it reports reach the
        client; the coordinator publishes the engines' counts if its interval is up.
        ``stats``: every rank's ``emu.rank.clock.RankStats``, by rank."""
        self.observe_finished([s.finished for s in stats],
                              self._coordinator.publish(stats, at_us))

    def server_of(self, request_id: str) -> int:
        return 0

    def observe_finished(self, finished: Sequence[int],
                         published: list[tuple[int, int, int]] | None) -> None:
        """A lockstep step for this client: its own requests finished per rank
        (``finished``: with several API servers each learns only the finishes of the
        requests it routed), and the engine counts the coordinator published at that
        step (None: no publish), which replace the client's copy."""
        self._finished = finished
        if published is not None:
            self._published = published
            self._lb_engines = None

    def route(self, request, counts=None) -> int:
        """The rank vLLM's client sends ``request`` to; ``counts`` (the one-step-old
        queues other routers read) is not used: this router keeps its own views."""
        if request.rank is not None:
            rank = request.rank
        else:
            rank = self._least_loaded()
            self.lb_engines[rank][0] += self.client_count
            self.eng_start_index = (self.eng_start_index + 1) % self.dp_size
        self._routed[rank] += 1
        return rank

    def _least_loaded(self) -> int:
        best, best_score = 0, None
        lb_engines = self.lb_engines
        for i in range(self.dp_size):
            rank = (self.eng_start_index + i) % self.dp_size
            waiting, running, kv_usage = lb_engines[rank]
            score = max(self.client_count * self.inflight(rank), waiting + running)
            if waiting:
                score += waiting * WAITING_KV_PENALTY * max(0.0, kv_usage - KV_PENALTY_FROM)
            if best_score is None or score < best_score:
                best, best_score = rank, score
        return best


class VllmAPIServers:
    """``--api-server-count`` N API servers, each vLLM's client ``VllmDPLBRouter`` with
    ``client_index`` i of N (see the module docstring); each request goes to a server
    drawn uniformly from a generator seeded with ``seed`` (N > 1; one server is
    ``VllmDPLBRouter`` itself)."""

    name = "vllm"
    observes_engines = True

    def __init__(self, dp_size: int, api_servers: int = 1, seed: int = 0):
        self.dp_size = dp_size
        self.api_servers = api_servers
        self.servers = [VllmDPLBRouter(dp_size, api_servers, i) for i in range(api_servers)]
        self._choice = random.Random(f"api-server-choice:{seed}")
        self._server_of: dict[str, int] = {}
        self._coordinator = CoordinatorPublishes()  # the node's, for every server

    def route(self, request, counts=None) -> int:
        """The rank the server that accepted ``request`` sends it to."""
        server = self._choice.randrange(self.api_servers)
        self._server_of[request.request_id] = server
        return self.servers[server].route(request)

    def server_of(self, request_id: str) -> int:
        return self._server_of[request_id]

    def observe(self, stats: Sequence, at_us: int) -> None:
        """A lockstep step: each server learns the finishes of its own requests
        (``RankStats.finished_by_server``) and the coordinator's publish, which reaches
        every server."""
        published = self._coordinator.publish(stats, at_us)
        by_server = zip(*(s.finished_by_server for s in stats), strict=True)
        for server, finished in zip(self.servers, by_server, strict=True):
            server.observe_finished(finished, published)


def engine_counts(stats: Sequence) -> list[tuple[int, int, int]]:
    """Every engine's ``(waiting, running, kv_usage_permille)`` from the lockstep's
    ``RankStats``: what the DP coordinator would publish at this step."""
    return [(s.waiting, s.running, s.kv_usage_permille) for s in stats]
