"""The load unit of DyntraLB: a request's KV-block count (docs/protocol.md, "The payload").

Everything DyntraLB measures, publishes and plans is in blocks: the engine counts a
newly added request to arm dynamic mode, the policy counts running requests and
admission candidates for the all-gather and matches plan values against them, and the
diagnostics summary sums them. The block size is the scheduler's
``cache_config.block_size`` (not ``scheduler.block_size``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def num_blocks(num_tokens: int, block_size: int) -> int:
    """KV blocks needed for ``num_tokens`` tokens: ``ceil(num_tokens / block_size)``."""
    if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size <= 0:
        raise RuntimeError(f"Invalid DyntraLB block size: {block_size}")
    return (num_tokens + block_size - 1) // block_size


def block_counts(requests: Iterable[Any], block_size: int) -> list[int]:
    """Block counts of many requests, in order. The policy and the scheduler count every
    running request and candidate on every active step, so the size is checked once."""
    num_blocks(0, block_size)
    return [(r.num_tokens + block_size - 1) // block_size for r in requests]

