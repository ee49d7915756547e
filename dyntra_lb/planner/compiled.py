"""The planner of docs/planner.md compiled with numba: the same plans as the Python planner
in ``dyntra_lb/planner/python.py``, for the calls that need no observer. Docstrings of the
planner's steps start with the docs/planner.md heading that describes the step.

``dyntra_lb.planner.front`` imports this module once, at its own import, when numba is
installed (the ``fast`` extra), and sends every ``balance_load`` call without an
observer to :func:`plan`; calls with an observer (this loop emits no events), and
inputs :func:`plan` declines, run the Python planner. Nothing else calls it.

The decisions are the Python planner's (its module docstring has the argument): the
best swap difference ``d`` is the achievable difference nearest to the vertex ``x*``
from below or from above, evaluated with the reference's own float expression; the tie
rule takes the first newly added running item that reaches the best distance, else the
first one; the reference's ``list.remove`` by value removes the first item with the
chosen (size, newly_added) pair.
What differs is the index, built for compiled loops (``dyntra_lb/planner/compiled_card.py``
describes it, with the helpers on it; the swap search, the throughput drop and the fill
are in ``dyntra_lb/planner/compiled_steps.py``). This module holds the Python side
(:func:`plan`: the rows flattened into arrays, the result split back into lists) and the
one kernel it calls, ``_balance``: parsing, the fill, the main loop and cancellation.

Compile time: the first call compiles ``_balance`` and all it calls (its CPU time:
benchmarks/RESULTS.md, "Planner speed"; later processes load numba's disk cache).
Two habits keep it from growing: the kernels copy into slices element by element (a
slice assignment brings numba's shape check and its error message formatting into the
compile), and the swap search's direction is a runtime value (numba compiles a function
once per argument type, and a literal ``True`` is a type of its own: ``_swap`` called
with ``True`` and with ``False`` would be compiled twice).
"""

from __future__ import annotations

import hashlib
import operator
import os
import sys

import numba
import numpy as np
from numba import njit

from dyntra_lb.planner import compiled_card, compiled_steps
from dyntra_lb.planner.compiled_card import (
    _DOM,
    _FIELDS,
    _ITEMS,
    _MAXR,
    _MAXW,
    _MINR,
    _MINW,
    _NDOM,
    _NIN,
    _NONE,
    _NOUT,
    _NRUN,
    _NUM_RUN,
    _NWAIT,
    _RUN_OLD,
    _SEQ,
    _TOT,
    _TOTAL,
    _WAIT_OLD,
    _inline,
    _jit,
)
from dyntra_lb.planner.compiled_steps import _drop, _fill, _swap

# The files whose code ``_balance`` compiles in.
_KERNEL_FILES = (__file__, compiled_card.__file__, compiled_steps.__file__)


def _cached_jit(fn, files=_KERNEL_FILES):
    """The kernel entry point: compiled on first call (its callees with it) and cached
    on disk where numba finds a writable place (``NUMBA_CACHE_DIR``, the package's
    ``__pycache__``, else the user's cache directory); without one (read-only install
    and home) every process compiles it again.

    numba reuses a cached kernel while the file defining it is unchanged, without
    looking at the files of the callees it compiled in (a limit its caching notes
    state). So the cache index is stamped with ``files`` as well (by default the kernel
    modules): an edit to any of them compiles anew instead of loading a kernel built
    from the old code.

    numba also keeps one index per source file and drops it when another numba version
    wrote it, so two environments over one checkout (the README's ``.venv`` and
    ``.venv-upstream``, whose vLLM pins another numba) threw each other's kernel away
    at every switch. Each environment therefore has its own index and data files, named
    with :func:`environment_tag`."""
    try:
        kernel = njit(cache=True)(fn)
    except RuntimeError:  # numba: "cannot cache function ...: no locator available"
        return njit(fn)
    index = getattr(kernel._cache, "_cache_file", None)
    if not all(hasattr(index, name) for name in _INDEX_FIELDS):
        return njit(fn)  # a numba laid out otherwise: no disk cache rather than a stale one
    index._source_stamp = (index._source_stamp, *map(_stamp, files))
    base = index._index_name.removesuffix(".nbi")
    tag = environment_tag()
    index._index_name = f"{base}.{tag}.nbi"
    index._index_path = os.path.join(index._cache_path, index._index_name)
    index._data_name_pattern = f"{base}.{tag}.{{number:d}}.nbc"
    return kernel


# What _cached_jit changes on numba's index of a kernel's cache files.
_INDEX_FIELDS = ("_source_stamp", "_cache_path", "_index_name", "_index_path",
                 "_data_name_pattern")


def environment_tag() -> str:
    """The environment a cached kernel was compiled in, as a part of its cache file
    names: the interpreter's prefix (its virtualenv) and numba's version, hashed."""
    key = f"{sys.prefix}\0{numba.__version__}".encode()
    return "env" + hashlib.sha256(key).hexdigest()[:12]


def _stamp(path: str) -> tuple[float, int]:
    """What numba stamps a source file with: its modification time and size."""
    status = os.stat(path)
    return status.st_mtime, status.st_size


@_inline
def _bubble(max_blk, total, n, ratio):
    """Bubble metric, given the current maximum tot_blk."""
    avg = total / n
    if ratio:
        if max_blk <= 0:
            return 0.0
        return (max_blk - avg) / max_blk
    return max_blk - avg


@_inline
def _sort_cards(order, cs):
    """Stable sort of ``order`` by tot_blk, largest first (an insertion sort: the order
    of the previous sort is nearly right)."""
    for i in range(1, order.shape[0]):
        c = order[i]
        t = cs[c, _TOT]
        j = i - 1
        while j >= 0 and cs[order[j], _TOT] < t:
            order[j + 1] = order[j]
            j -= 1
        order[j + 1] = c


@_jit
def _grow(log, used, need):
    """``log``, or a copy with more room, holding ``need`` more entries after ``used``."""
    if used + need <= log.shape[0]:
        return log
    bigger = np.empty(2 * (used + need), np.int64)
    for i in range(used):
        bigger[i] = log[i]
    return bigger


@_jit
def _row_lengths(flat, row_start, row_len, n, max_total):
    """Input and parsing, the truncation: each row's length up to its first 0. Also checks
    the exactness bounds of the Python planner (int32 sizes; the sum over rows of length x largest
    |size| below ``max_total``) and returns (False, lengths) when one fails."""
    lengths = np.zeros(n, np.int64)
    bound = 0
    for c in range(n):
        start = row_start[c]
        length = 0
        low = high = 0
        while length < row_len[c] and flat[start + length] != 0:
            v = flat[start + length]
            low = min(low, v)
            high = max(high, v)
            length += 1
        if low < -(2**31) or high > 2**31 - 1:
            return False, lengths
        bound += length * max(-low, high)
        if bound >= max_total:
            return False, lengths
        lengths[c] = length
    return True, lengths


@_jit
def _size_indices(values, dv, dom, ig, first):
    """Write the sorted distinct ``values`` to ``dv[dom:]`` and each value's size index
    to ``ig[first:]``; return their count. A table over the value span when it is small,
    else a sort."""
    low, high = values.min(), values.max()
    span = high - low + 1
    if span > 8 * values.shape[0] + 1024:
        distinct = np.unique(values)
        index = np.searchsorted(distinct, values)
        for k in range(distinct.shape[0]):
            dv[dom + k] = distinct[k]
        for i in range(values.shape[0]):
            ig[first + i] = dom + index[i]
        return distinct.shape[0]
    table = np.zeros(span, np.int64)
    for v in values:
        table[v - low] = 1
    m = 0
    for k in range(span):
        if table[k]:
            dv[dom + m] = low + k
            table[k] = dom + m
            m += 1
    for i in range(values.shape[0]):
        ig[first + i] = table[values[i] - low]
    return m


@_jit
def _build_lists(cs, dv, rc, wc, head, tail, nxt, seq, ig, lengths, split, n):
    """Each card's running list (the first ``split`` items of its row) and waiting list
    (the rest) as queues, with the per-size counts and extremes. Written as one loop
    (not one ``_push`` per item) because it touches every item of the snapshot."""
    for c in range(n):
        dom, first = cs[c, _DOM], cs[c, _ITEMS]
        running = min(split[c], lengths[c])
        cs[c, _NRUN] = running
        cs[c, _NWAIT] = lengths[c] - running
        cs[c, _MINR] = cs[c, _MINW] = dom + cs[c, _NDOM]
        cs[c, _MAXR] = cs[c, _MAXW] = dom - 1
        tot = 0
        for item in range(first, first + lengths[c]):
            g = ig[item]
            seq[item] = item
            nxt[item] = _NONE
            if item < first + running:
                q = 4 * g + _RUN_OLD
                rc[g] += 1
                tot += dv[g]
                cs[c, _MINR] = min(cs[c, _MINR], g)
                cs[c, _MAXR] = max(cs[c, _MAXR], g)
            else:
                q = 4 * g + _WAIT_OLD
                wc[g] += 1
                cs[c, _MINW] = min(cs[c, _MINW], g)
                cs[c, _MAXW] = max(cs[c, _MAXW], g)
            if tail[q] == _NONE:
                head[q] = item
            else:
                nxt[tail[q]] = item
            tail[q] = item
        cs[c, _TOT] = tot


@_jit
def _cancel(log, used, other, other_used, size):
    """Cancellation for one side: per value, its first min(#in, #out) occurrences cancel. Entries
    are global size indices (no two ranks share one), so one pass serves every rank.
    Returns the keep mask of ``log``."""
    theirs = np.zeros(size, np.int64)
    for i in range(other_used):
        theirs[other[i]] += 1
    keep = np.ones(used, np.bool_)
    for i in range(used):
        if theirs[log[i]] > 0:
            theirs[log[i]] -= 1
            keep[i] = False
    return keep


@_jit
def _by_rank(log, used, keep, dv, owner, n):
    """The kept entries of ``log`` as sizes grouped by rank (log order within a rank),
    and the number per rank."""
    counts = np.zeros(n, np.int64)
    for i in range(used):
        if keep[i]:
            counts[owner[log[i]]] += 1
    starts = np.zeros(n, np.int64)
    for c in range(1, n):
        starts[c] = starts[c - 1] + counts[c - 1]
    values = np.empty(used, np.int64)
    for i in range(used):
        if keep[i]:
            c = owner[log[i]]
            values[starts[c]] = dv[log[i]]
            starts[c] += 1
    return values[:counts.sum()], counts


# The swap search's two directions (grow a card, shrink a card) as runtime values, not
# literals (see the module docstring).
_DIRECTIONS = np.array([True, False])


@_cached_jit
def _balance(flat, row_start, row_len, split, n, max_num_seqs, threshold, ratio, max_iters,
             tp_fixed, tp_per_block, max_total):
    """The whole planner (parsing to cancellation) on the flattened rows. Returns (False,
    empty arrays) when the input is outside the exactness bounds, else (True, out sizes, out counts
    per rank, in sizes, in counts per rank)."""
    ok, lengths = _row_lengths(flat, row_start, row_len, n, max_total)
    if not ok:
        empty = np.zeros(0, np.int64)
        return False, empty, empty, empty, empty
    nitems = lengths.sum()
    cs = np.zeros((n, _FIELDS), np.int64)
    gs = np.zeros(5, np.int64)
    dv = np.empty(nitems, np.int64)
    ig = np.empty(nitems, np.int64)
    item = size = 0
    for c in range(n):
        cs[c, _DOM] = size
        cs[c, _ITEMS] = item
        if lengths[c]:
            values = flat[row_start[c]:row_start[c] + lengths[c]]
            m = _size_indices(values, dv, size, ig, item)
            cs[c, _NDOM] = m
            size += m
            item += lengths[c]
    rc = np.zeros(size, np.int64)
    wc = np.zeros(size, np.int64)
    head = np.full(4 * size, _NONE, np.int64)
    tail = np.full(4 * size, _NONE, np.int64)
    nxt = np.empty(nitems, np.int64)
    seq = np.empty(nitems, np.int64)
    flag = np.zeros(nitems, np.int64)
    owner = np.empty(size, np.int64)
    for c in range(n):
        owner[cs[c, _DOM]:cs[c, _DOM] + cs[c, _NDOM]] = c
    _build_lists(cs, dv, rc, wc, head, tail, nxt, seq, ig, lengths, split, n)
    gs[_SEQ] = nitems
    gs[_TOTAL] = cs[:, _TOT].sum()
    gs[_NUM_RUN] = cs[:, _NRUN].sum()
    out_log = np.empty(64, np.int64)
    in_log = np.empty(nitems + 64, np.int64)
    _fill(cs, gs, dv, rc, wc, head, tail, nxt, seq, ig, flag, in_log, n, max_num_seqs)

    order = np.arange(n)
    grow, shrink = _DIRECTIONS[0], _DIRECTIONS[1]
    rnd = 0
    while rnd < max_iters:
        # A round appends at most two outs and two ins.
        out_log = _grow(out_log, gs[_NOUT], 2)
        in_log = _grow(in_log, gs[_NIN], 2)
        _sort_cards(order, cs)
        if _bubble(cs[order[0], _TOT], gs[_TOTAL], n, ratio) < threshold:
            break
        swapped = False
        low = order[n - 1]
        if _swap(cs, gs, dv, rc, wc, head, tail, nxt, seq, ig, flag, out_log, in_log, n, low,
                 grow):
            swapped = True
            # Only the least loaded card changed (it grew).
            top = max(cs[order[0], _TOT], cs[low, _TOT])
            if _bubble(top, gs[_TOTAL], n, ratio) < threshold:
                break
            _sort_cards(order, cs)
        if _swap(cs, gs, dv, rc, wc, head, tail, nxt, seq, ig, flag, out_log, in_log, n,
                 order[0], shrink):
            swapped = True
        dropped = False
        if not swapped:
            dropped = _drop(cs, gs, dv, rc, wc, head, tail, nxt, seq, ig, flag, out_log, order,
                            n, tp_fixed, tp_per_block)
        # Only order[0] changed (it shrank); the others are still sorted.
        top = cs[order[0], _TOT] if n == 1 else max(cs[order[0], _TOT], cs[order[1], _TOT])
        if _bubble(top, gs[_TOTAL], n, ratio) < threshold:
            break
        if not (swapped or dropped):
            break
        rnd += 1

    n_out, n_in = gs[_NOUT], gs[_NIN]
    keep_out = _cancel(out_log, n_out, in_log, n_in, size)
    keep_in = _cancel(in_log, n_in, out_log, n_out, size)
    outs, out_counts = _by_rank(out_log, n_out, keep_out, dv, owner, n)
    ins, in_counts = _by_rank(in_log, n_in, keep_in, dv, owner, n)
    return True, outs, out_counts, ins, in_counts


# max_num_seqs and max_iters beyond this behave as unlimited and fit in int64.
_UNLIMITED = 2**62


def _flatten(requests_by_rank, dp_size: int):
    """The rows as one int64 array plus per-rank starts, lengths and splits (clamped to
    [0, length]), or None when a row is not plain integers (floats, bools only, values
    beyond int64, other containers): the Python planner takes those.

    Rows that are all 1-D signed-integer arrays (the coordinator's: views of the
    gathered int32 buffers) are joined with one ``np.concatenate``; any other input goes
    through Python lists, which is the slower part of a small plan."""
    rows = [requests_by_rank[r] for r in range(min(dp_size, len(requests_by_rank)))]
    if all(isinstance(blks, np.ndarray) and blks.ndim == 1 and blks.dtype.kind == "i"
           for blks, _ in rows):
        return _flatten_arrays(rows, dp_size)
    flat: list = []
    starts = np.zeros(dp_size, np.int64)
    lengths = np.zeros(dp_size, np.int64)
    splits = np.zeros(dp_size, np.int64)
    for r in range(min(dp_size, len(requests_by_rank))):
        blks, split = requests_by_rank[r]
        if isinstance(blks, np.ndarray):
            blks = blks.tolist()
        elif not isinstance(blks, (list, tuple)):
            return None
        starts[r] = len(flat)
        lengths[r] = len(blks)
        splits[r] = min(max(operator.index(split), 0), len(blks))
        flat += blks
    array = np.array(flat) if flat else np.zeros(0, np.int64)
    if array.dtype != np.int64:
        return None
    return array, starts, lengths, splits


def _flatten_arrays(rows, dp_size: int):
    """:func:`_flatten` for rows of signed-integer arrays (any width fits int64)."""
    starts = np.zeros(dp_size, np.int64)
    lengths = np.zeros(dp_size, np.int64)
    splits = np.zeros(dp_size, np.int64)
    start = 0
    for r, (blks, split) in enumerate(rows):
        length = blks.shape[0]
        starts[r] = start
        lengths[r] = length
        splits[r] = min(max(operator.index(split), 0), length)
        start += length
    if not rows:
        return np.zeros(0, np.int64), starts, lengths, splits
    flat = np.concatenate([blks for blks, _ in rows]).astype(np.int64, copy=False)
    return flat, starts, lengths, splits


def plan(requests_by_rank, dp_size: int, max_num_seqs, threshold, max_iters,
         tp_fixed: float, tp_per_block: float, max_total: int):
    """``dyntra_lb.planner.front.balance_load`` without an observer, for ``dp_size >= 1``: per
    rank the (out sizes, in sizes) lists after cancellation. Returns None when the call
    must go to the Python planner instead: a row or argument of another type than the
    payload's (see :func:`_flatten`; ``max_num_seqs`` / ``max_iters`` not integers, a
    threshold that is neither int nor float or an int a float cannot hold), or sizes
    outside the exactness bounds (where the Python planner raises its error)."""
    try:
        flattened = _flatten(requests_by_rank, dp_size)
        fill = 0 if max_num_seqs is None else operator.index(max_num_seqs)
        iters = operator.index(max_iters)
    except (TypeError, ValueError, OverflowError):
        return None
    if flattened is None or not isinstance(threshold, (int, float)):
        return None
    if isinstance(threshold, int) and abs(threshold) > 2**53:
        return None
    flat, starts, lengths, splits = flattened
    # No fill (None) and max_num_seqs <= 0 both admit nothing.
    ok, outs, out_counts, ins, in_counts = _balance(
        flat, starts, lengths, splits, dp_size, min(max(fill, 0), _UNLIMITED),
        float(threshold), threshold < 1, min(max(iters, 0), _UNLIMITED), float(tp_fixed),
        float(tp_per_block), max_total)
    if not ok:
        return None
    return list(zip(_split(outs.tolist(), out_counts.tolist()),
                    _split(ins.tolist(), in_counts.tolist()), strict=True))


def _split(values: list[int], counts: list[int]) -> list[list[int]]:
    result, start = [], 0
    for count in counts:
        result.append(values[start:start + count])
        start += count
    return result
