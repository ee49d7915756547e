"""The old import path of ``--router vllm``'s balancer, which moved to
``emu.routers.vllm_dp_lb`` with the router registry (``emu.routers``)."""

from emu.routers.vllm_dp_lb import (  # noqa: F401
    KV_PENALTY_FROM,
    PUBLISH_INTERVAL_US,
    UNCHANGED_PUBLISH_INTERVAL_US,
    WAITING_KV_PENALTY,
    VllmAPIServers,
    VllmDPLBRouter,
)
