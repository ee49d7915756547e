"""The prefill node's KV as it reaches a decode rank: when each request's remote KV
load completes, in virtual time.

Both engines use this one arrival model: the kit's scheduler calls it directly, vLLM's
through the emulated connector (``emu.impl.vllm_ascend.connector``). Faults of the KV
path extend it (``emu.rank.fault_injection.FaultyKVConnector``).
"""

from __future__ import annotations

import heapq
import math
from typing import Any


class RemoteKVConnector:
    """Scheduler side of a ``kv_consumer`` connector: each request arrives with its
    prompt already computed on a prefill node and loads that KV asynchronously.

    A transfer starts when the scheduler has allocated blocks for it
    (``update_state_after_alloc``) and completes ``latency_fixed_s +
    latency_per_block_s * blocks`` virtual seconds later; the scheduler collects
    completions with ``finished_recving(now_s)``. The scheduler keeps ``now_s`` current
    with ``set_virtual_time`` before anything that may start a transfer.

    Fault hooks: ``set_not_ready`` makes lookups answer "ask again later";
    ``set_completion_time`` pins a request's transfer completion (``math.inf`` = the
    transfer never completes).
    """

    def __init__(self, latency_fixed_s: float = 0.002, latency_per_block_s: float = 20e-6):
        if latency_fixed_s < 0 or latency_per_block_s < 0:
            raise ValueError("remote KV latencies must be >= 0")
        self.latency_fixed_s = latency_fixed_s
        self.latency_per_block_s = latency_per_block_s
        self.now_s = 0.0
        self._loaded: set[str] = set()
        self._not_ready: dict[str, list[float]] = {}
        self._completion_override: dict[str, float] = {}
        self._transfers: list[tuple[float, int, str]] = []
        self._seq = 0

    def set_virtual_time(self, now_s: float) -> None:
        self.now_s = now_s

    def set_not_ready(self, request_id: str, *, queries: int = 0,
                      until_s: float = -math.inf) -> None:
        """Answer "not ready" for this request's next ``queries`` lookups and for every
        lookup before virtual time ``until_s``."""
        self._not_ready[request_id] = [queries, until_s]

    def set_completion_time(self, request_id: str, done_s: float) -> None:
        """Make the request's (next) transfer complete at ``done_s`` instead of after
        the modelled latency; ``math.inf`` = never."""
        self._completion_override[request_id] = done_s

    def get_num_new_matched_tokens(self, request: Any,
                                   num_computed_tokens: int) -> tuple[int | None, bool]:
        """Tokens the prefill node can provide beyond the local hit, and whether they
        load asynchronously. ``(None, False)`` = not ready, ask again later; ``(0,
        False)`` once the remote prompt has been claimed (e.g. after a preemption the
        request recomputes locally)."""
        request_id = request.request_id
        window = self._not_ready.get(request_id)
        if window is not None:
            if window[0] > 0:
                window[0] -= 1
                return None, False
            if self.now_s < window[1]:
                return None, False
            del self._not_ready[request_id]
        if request_id in self._loaded:
            return 0, False
        num_external = request.prompt_tokens - num_computed_tokens
        if num_external <= 0:
            return 0, False
        return num_external, True

    def update_state_after_alloc(self, request: Any, blocks: Any,
                                 num_external_tokens: int) -> None:
        """Blocks are allocated: start the remote load (if any) at ``now_s``."""
        if num_external_tokens == 0:
            return
        request_id = request.request_id
        self._loaded.add(request_id)
        done_s = self._completion_override.pop(request_id, None)
        if done_s is None:
            done_s = self.now_s + self.latency_fixed_s + self.latency_per_block_s * len(blocks)
        heapq.heappush(self._transfers, (done_s, self._seq, request_id))
        self._seq += 1

    def finished_recving(self, now_s: float) -> set[str]:
        """Ids whose transfer completed by ``now_s`` (each reported once)."""
        transfers = self._transfers
        done: set[str] = set()
        while transfers and transfers[0][0] <= now_s:
            done.add(heapq.heappop(transfers)[2])
        return done

    def take_failed(self) -> dict[str, list[int]]:
        """Loads reported by ``finished_recving`` whose every block arrived invalid, since
        the last call: request id -> its block ids. None fail here; ``kv_fail`` faults
        (``emu.rank.fault_injection.FaultyKVConnector``) make some fail."""
        return {}

    def request_finished(self, request: Any) -> None:
        """The scheduler freed the request: forget its per-request state."""
        request_id = request.request_id
        self._loaded.discard(request_id)
        self._not_ready.pop(request_id, None)
        self._completion_override.pop(request_id, None)
