"""How the decode node's front end assigns unpinned requests to DP ranks: the routers,
behind one protocol (``Router``) and one registry (``ROUTERS``), from which
``--router``'s choices and help are made.

Every rank of a run builds the same router (``make_router``) and feeds it the same
inputs (the trace in order; with ``observes_engines``, every lockstep step's
``emu.rank.clock.RankStats``), so every rank agrees on every assignment without talking
to another. A router that knows several API servers (``api_servers`` > 1) also says which
server took each request (``server_of``): each rank counts its finishes per server and
the lockstep carries those counts (``emu.rank.clock.LockstepClock``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from emu.routers.simple import LeastLoadedRouter, RoundRobinRouter, Routed, check_dp_size
from emu.routers.vllm_dp_lb import VllmAPIServers, VllmDPLBRouter

__all__ = ["DEFAULT_ROUTER", "ROUTERS", "LeastLoadedRouter", "RoundRobinRouter", "Router",
           "RouterType", "VllmAPIServers", "VllmDPLBRouter", "check_dp_size", "make_router",
           "router_help"]


class Router(Protocol):
    """What the ranks' intake (``emu.rank.intake.Arrivals``) calls."""

    name: str
    # Whether it reads every lockstep step (``observe``): the lockstep then carries each
    # rank's finished count (per API server) and KV usage.
    observes_engines: bool
    # How many API servers route (each with its own view); 1 for the simple routers.
    api_servers: int

    def route(self, request: Routed, counts: Sequence[tuple[int, int]] | None = None) -> int:
        """The rank of ``request`` (its own rank when pinned); ``counts``: every rank's
        ``(waiting, running)`` one step old."""

    def observe(self, stats: Sequence, at_us: int) -> None:
        """A lockstep step that started at ``at_us`` (``RankStats`` of every rank)."""

    def server_of(self, request_id: str) -> int:
        """The API server that took the request (0 with one server)."""


@dataclass(frozen=True)
class RouterType:
    """A router of the registry: its ``--router`` name, one line of help, and how a run
    makes it (DP size, API server count, seed)."""

    name: str
    help: str
    make: Callable[[int, int, int], Router]
    # Whether --api-server-count applies (the router models vLLM's API servers).
    has_api_servers: bool = False


def _single(cls) -> Callable[[int, int, int], Router]:
    return lambda dp_size, api_servers, seed: cls(dp_size)


ROUTERS: dict[str, RouterType] = {t.name: t for t in (
    RouterType("round_robin", "round_robin (ranks in turn)", _single(RoundRobinRouter)),
    RouterType("least_loaded", "least_loaded (lowest waiting*4 + running, earlier vLLM "
                               "front ends)", _single(LeastLoadedRouter)),
    RouterType("vllm", "vllm (vLLM 0.27.1's DP load balancer in each API server: its "
                       "in-flight counts and the coordinator's 100 ms stats; "
                       "--api-server-count servers, emu/routers/vllm_dp_lb.py)",
               lambda dp_size, api_servers, seed: (
                   VllmDPLBRouter(dp_size) if api_servers == 1  # one client, no draw
                   else VllmAPIServers(dp_size, api_servers, seed)),
               has_api_servers=True),
)}
DEFAULT_ROUTER = "round_robin"


def router_help() -> str:
    """``--router``'s help, from the registry."""
    return ("how unpinned requests are assigned to ranks: "
            + "; ".join(t.help for t in ROUTERS.values()))


def make_router(name: str, dp_size: int, *, api_servers: int = 1, seed: int = 0) -> Router:
    """The router ``name`` of the registry for ``dp_size`` ranks (``api_servers`` API
    servers, whose choice among them ``seed`` seeds, for a router that has them)."""
    if name not in ROUTERS:
        raise ValueError(f"unknown router {name!r}; expected one of {list(ROUTERS)}")
    check_dp_size(dp_size)
    return ROUTERS[name].make(dp_size, api_servers, seed)
