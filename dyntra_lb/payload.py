"""The DyntraLB all-gather wire format (docs/protocol.md, "The payload").

Each rank packs its snapshot into one int32 buffer of ``2 * max_num_seqs + 2`` slots
right before the all-gather of an active step, and every rank unpacks all gathered
buffers into the planner's ``requests_by_rank``. Layout of one buffer (``max_slots =
2 * max_num_seqs``):

    [0, run_cnt)                 block counts of running requests, in running order
    [run_cnt, run_cnt+wait_cnt)  block counts of admission candidates, in candidate order
    [.., max_slots)              zero padding (a zero ends the planner's parse)
    max_slots                    run_cnt, the running/waiting split index
    max_slots + 1                1 if a long request arrived since the last gather

Both functions run on every active decode step, so they stay in numpy slicing. This
module holds no torch: the coordinator wraps the same numpy arrays with
``torch.from_numpy`` for the collective.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def payload_len(max_num_seqs: int) -> int:
    """Buffer length for one rank: ``2 * max_num_seqs`` block slots, split, long flag."""
    return 2 * max_num_seqs + 2


def pack(
    out: np.ndarray,
    running_blks: Sequence[int],
    waiting_blks: Sequence[int],
    pending_long: bool,
) -> None:
    """Fill the send buffer ``out`` (int32, length ``payload_len``) in place.

    Running counts come first and are truncated to ``max_slots``; waiting counts fill
    what is left and the excess is dropped silently, as in the reference.
    """
    if out.dtype != np.int32 or out.ndim != 1 or out.shape[0] < 2:
        raise ValueError(
            f"DyntraLB payload buffer must be a 1-D int32 array of length >= 2, "
            f"got dtype={out.dtype}, shape={out.shape}."
        )
    max_slots = out.shape[0] - 2
    out.fill(0)
    run_cnt = min(len(running_blks), max_slots)
    wait_cnt = min(len(waiting_blks), max_slots - run_cnt)
    if run_cnt:
        out[:run_cnt] = running_blks[:run_cnt]
    if wait_cnt:
        out[run_cnt : run_cnt + wait_cnt] = waiting_blks[:wait_cnt]
    out[max_slots] = run_cnt
    out[max_slots + 1] = 1 if pending_long else 0


def block_slots(block: np.ndarray) -> list[np.ndarray]:
    """The block-slot views of each row of ``block``, a 2-D array whose rows are the
    gathered buffers: made once with the buffers, for ``unpack``."""
    return list(block[:, : block.shape[1] - 2])


def unpack(block: np.ndarray, slots: list[np.ndarray]) -> tuple[
        list[tuple[np.ndarray, int]], bool]:
    """Decode the gathered buffers, the rows of ``block`` (indexed by DP rank; ``slots``
    is its ``block_slots``), into ``requests_by_rank`` — one ``(blocks, split)`` pair
    per rank — and ``has_new_long``, the OR of every rank's long-request flag.

    ``blocks`` is a view of the row's block slots (int32, trailing zeros included), not
    a copy: the compiled planner reads the rows as arrays, with no Python list in
    between. The views are only valid until the next all-gather overwrites the block,
    so they are planned (and logged) right away. ``split`` is a Python int. The views
    are made once and the splits and flags read in one numpy call, since the
    coordinator unpacks on every active step."""
    splits, flags = block[:, block.shape[1] - 2:].T.tolist()
    return list(zip(slots, splits, strict=True)), any(flags)
