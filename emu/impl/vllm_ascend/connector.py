"""The P/D decode node's KV connector, emulated on vLLM's connector API.

vLLM's scheduler talks to a ``kv_consumer`` connector through ``KVConnectorBase_V1``:
``get_num_new_matched_tokens`` for a new request (every prompt token is on the prefill
node and loads asynchronously), ``update_state_after_alloc`` once blocks are allocated
(the transfer starts), ``build_connector_meta`` every step. Transfers complete in
virtual time with the kit's arrival model (``emu.impl.kit.kv.RemoteKVConnector``: a fixed latency
plus a per-block one, and its fault hooks); the emulated executor reports completions
to the scheduler as the worker would, in ``KVConnectorOutput.finished_recving``, and a
``kv_fail`` load's blocks in ``invalid_block_ids`` (vLLM's scheduler then recomputes
the prompt: the node runs with ``kv_load_failure_policy="recompute"``, as the kit
emulates). No tensor moves, so the worker-side methods are never called.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
)

from emu.rank.remote_kv import RemoteKVConnector

CONNECTOR_NAME = "DyntraEmuRemoteKV"


def register_connector() -> None:
    """Make the connector known to vLLM's factory under ``CONNECTOR_NAME`` (once)."""
    if CONNECTOR_NAME not in KVConnectorFactory._registry:
        KVConnectorFactory.register_connector(CONNECTOR_NAME, __name__,
                                              EmulatedRemoteKVConnector.__name__)


class EmulatedRemoteKVConnector(KVConnectorBase_V1):
    """Scheduler side of the emulated decode-node connector. ``bind`` gives it the
    rank's virtual clock once the engine exists (vLLM builds it inside the scheduler)."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        extra = vllm_config.kv_transfer_config.kv_connector_extra_config
        self.latencies = (extra["latency_fixed_s"], extra["latency_per_block_s"])
        self.transfers = RemoteKVConnector(*self.latencies)
        self._clock: Any = None

    def bind(self, clock, faults=None) -> None:
        """``clock.clock_us`` is read whenever a transfer may start; ``faults`` (the
        rank's ``emu.rank.fault_injection.FaultInjector``) installs the not-ready and
        never-completes
        faults into the arrival model, as in the kit."""
        self._clock = clock
        if faults is not None:
            self.transfers = faults.make_connector(*self.latencies)

    def _now(self) -> None:
        self.transfers.set_virtual_time(self._clock.clock_us / 1e6)

    # ---------------------------------------------------------------- scheduler side

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        self._now()
        view = SimpleNamespace(request_id=request.request_id,
                               prompt_tokens=request.num_prompt_tokens)
        return self.transfers.get_num_new_matched_tokens(view, num_computed_tokens)

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int):
        self._now()
        self.transfers.update_state_after_alloc(request, blocks.get_block_ids()[0],
                                                num_external_tokens)

    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata:
        return KVConnectorMetadata()

    def request_finished(self, request, block_ids):
        self.transfers.request_finished(request)
        return False, None

    def finished_recving(self, now_us: int) -> tuple[set[str], set[int]]:
        """Called by the emulated executor after each forward: the loads done by then,
        and the block ids that arrived invalid (``kv_fail``), as the worker reports
        them in ``KVConnectorOutput``."""
        done = self.transfers.finished_recving(now_us / 1e6)
        invalid = {b for blocks in self.transfers.take_failed().values() for b in blocks}
        return done, invalid

    # ------------------------------------------------------------------- worker side

    def start_load_kv(self, forward_context, **kwargs) -> None:
        raise NotImplementedError("the emulated connector has no worker side")

    def wait_for_layer_load(self, layer_name: str) -> None:
        raise NotImplementedError("the emulated connector has no worker side")

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs) -> None:
        raise NotImplementedError("the emulated connector has no worker side")

    def wait_for_save(self) -> None:
        raise NotImplementedError("the emulated connector has no worker side")
