"""KV cache of one emulated rank: the block pool, a vLLM-like KV cache manager, and the
remote-KV connector of a ``kv_consumer`` (decode) node.

The scheduler allocates blocks as requests are admitted and as decoding appends tokens,
frees them when a request finishes or is preempted, and asks the connector whether a
new request's prompt can be loaded from the prefill node. No tensor is ever moved: a
block is an id, a transfer is a completion time. Virtual time is always given by the
caller; nothing here reads a clock.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from typing import Any


class BlockPool:
    """A fixed number of KV blocks (``num_gpu_blocks``), handed out by id."""

    def __init__(self, num_gpu_blocks: int):
        if num_gpu_blocks <= 0:
            raise ValueError(f"num_gpu_blocks must be > 0, got {num_gpu_blocks}")
        self.num_gpu_blocks = num_gpu_blocks
        self._free: deque[int] = deque(range(num_gpu_blocks))

    def get_num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_gpu_blocks - len(self._free)

    def get_new_blocks(self, num_blocks: int) -> list[int]:
        """Take ``num_blocks`` free blocks; the caller has checked there are enough."""
        free = self._free
        return [free.popleft() for _ in range(num_blocks)]

    def free_blocks(self, block_ids: list[int]) -> None:
        self._free.extend(block_ids)


class KVCacheManager:
    """Per-request block lists over a ``BlockPool``, with vLLM's method names.

    The emulator has no prefix caching: ``get_computed_blocks`` never hits, and
    ``delay_cache_blocks`` / ``new_computed_blocks`` have nothing to act on.
    """

    def __init__(self, pool: BlockPool, block_size: int):
        if block_size <= 0:
            raise ValueError(f"block_size must be > 0, got {block_size}")
        self.pool = pool
        self.block_size = block_size
        self._blocks: dict[str, list[int]] = {}

    def get_computed_blocks(self, request: Any) -> tuple[tuple, int]:
        """Local prefix-cache hit of a new request: always ``((), 0)`` here."""
        return (), 0

    def allocate_slots(self, request: Any, num_new_tokens: int, *,
                       num_new_computed_tokens: int = 0, new_computed_blocks: Any = None,
                       num_lookahead_tokens: int = 0, num_external_computed_tokens: int = 0,
                       delay_cache_blocks: bool = False,
                       full_sequence_must_fit: bool = False) -> list[int] | tuple | None:
        """Grow the request's blocks to cover its computed tokens plus the tokens about
        to be computed (or loaded remotely). Returns the newly taken block ids (empty
        when none are needed), or ``None`` when the pool lacks them (nothing taken).

        ``full_sequence_must_fit`` additionally requires room for the whole current
        sequence (``request.num_tokens``) before anything is allocated.
        """
        bs = self.block_size
        held = self._blocks.get(request.request_id)
        num_held = len(held) if held is not None else 0
        num_needed = (request.num_computed_tokens + num_new_computed_tokens
                      + num_external_computed_tokens + num_new_tokens
                      + num_lookahead_tokens + bs - 1) // bs
        num_new_blocks = num_needed - num_held
        if full_sequence_must_fit:
            full = (request.num_tokens + bs - 1) // bs - num_held
            if full > self.pool.get_num_free_blocks():
                return None
        if num_new_blocks <= 0:
            return ()
        if num_new_blocks > self.pool.get_num_free_blocks():
            return None
        new_blocks = self.pool.get_new_blocks(num_new_blocks)
        if held is None:
            self._blocks[request.request_id] = new_blocks
        else:
            held.extend(new_blocks)
        return new_blocks

    def get_blocks(self, request_id: str) -> list[int]:
        """The block ids the request holds (a copy)."""
        return list(self._blocks.get(request_id, ()))

    def num_blocks_of(self, request: Any) -> int:
        blocks = self._blocks.get(request.request_id)
        return len(blocks) if blocks is not None else 0

    def free(self, request: Any) -> None:
        """Return all of the request's blocks to the pool (finish or preemption)."""
        blocks = self._blocks.pop(request.request_id, None)
        if blocks:
            self.pool.free_blocks(blocks)

    @property
    def num_held_blocks(self) -> int:
        """Blocks held by all requests together (equals the pool's used blocks)."""
        return sum(map(len, self._blocks.values()))

    def holders(self) -> set[str]:
        """Ids of the requests holding blocks (strict mode's conservation check)."""
        return set(self._blocks)


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
        (``emu.cluster.fault_injection.FaultyKVConnector``) make some fail."""
        return {}

    def request_finished(self, request: Any) -> None:
        """The scheduler freed the request: forget its per-request state."""
        request_id = request.request_id
        self._loaded.discard(request_id)
        self._not_ready.pop(request_id, None)
        self._completion_override.pop(request_id, None)
