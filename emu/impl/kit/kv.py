"""KV cache of one kit rank: the block pool and a vLLM-like KV cache manager (the remote
loads of a ``kv_consumer`` node are ``emu.rank.remote_kv``).

The scheduler allocates blocks as requests are admitted and as decoding appends tokens,
frees them when a request finishes or is preempted, and asks the connector whether a
new request's prompt can be loaded from the prefill node. No tensor is ever moved: a
block is an id, a transfer is a completion time. Virtual time is always given by the
caller; nothing here reads a clock.
"""

from __future__ import annotations

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

    def pop_blocks_for_free(self, request: Any) -> list[int]:
        """Forget the request's blocks without returning them to the pool: the caller
        returns them later (``BlockPool.free_blocks``), once no step in flight can
        still write them."""
        return self._blocks.pop(request.request_id, None) or []

    @property
    def num_held_blocks(self) -> int:
        """Blocks held by all requests together (equals the pool's used blocks)."""
        return sum(map(len, self._blocks.values()))

    def holders(self) -> set[str]:
        """Ids of the requests holding blocks (strict mode's conservation check)."""
        return set(self._blocks)
