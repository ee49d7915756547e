"""The compiled planner's index (``dyntra_lb/planner/compiled.py`` has the overview): the
per-card table, the per-size queues, and the helpers every planner step uses on them.
The decisions they serve are the Python planner's; what differs is the index, built for
compiled loops:

* A card's items never leave it (they move between its running and waiting lists), so
  each card gets its sorted distinct sizes once; per size it counts its running and
  waiting items and it tracks its smallest and largest running and waiting size.
* Every item a list removes is the first of its (size, newly_added) class in that list
  (the ``list.remove`` argument of ``compiled.py``'s docstring; the fill takes
  the head of the waiting list, which is the first of its class too). So each list is
  kept as one FIFO queue per (size, newly_added), with a sequence number stamped on
  every append: the list order is the order of the sequence numbers, "the first item of
  these sizes in the list" is the queue head with the smallest number, and a move costs
  O(1).
* The nearest achievable difference at or below ``a`` (or at or above ``b``) is one
  two-pointer pass over the card's distinct sizes. Far from balance (nearly every
  swap) the extreme difference of the mode wins at no cost: ``max W - min R`` is always
  achievable and only ``min R`` reaches it (``min W - max R``: only ``max R``).

State lives in flat int64 arrays: a table ``cs`` with one row per card, arrays over all
cards' distinct sizes (``g`` = a global size index) and over all items. Swaps, drops and
fills append global size indices to an out log and an in log; cancellation runs on those logs.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# Columns of the per-card table ``cs``. Size indices are global (into ``dv``).
_TOT = 0      # tot_blk
_NRUN = 1     # running items
_NWAIT = 2    # waiting items
_NNEW = 3     # newly added items in running
_MINR = 4     # smallest running size index (DOM + NDOM when running is empty)
_MAXR = 5     # largest running size index (DOM - 1 when empty)
_MINW = 6     # the same for waiting
_MAXW = 7
_DOM = 8      # first size index of the card
_NDOM = 9     # number of distinct sizes of the card
_ITEMS = 10   # first item id of the card (its items are the row's sizes, in row order)
_FIELDS = 11

# Columns of the global state ``gs``.
_TOTAL = 0    # sum of all tot_blk
_NUM_RUN = 1  # running items over all cards
_SEQ = 2      # next sequence number
_NOUT = 3     # entries in the out log
_NIN = 4      # entries in the in log

# Queue of size g for (list, newly_added): head[4 * g + queue], same for tail.
_RUN_OLD, _RUN_NEW, _WAIT_OLD, _WAIT_NEW = 0, 1, 2, 3
_NONE = -1

# The kernels pass these arrays around: cs, gs (above); per size index g: dv (its value),
# rc / wc (running / waiting items of that size), head / tail (4 per size: queue ends,
# item ids or _NONE); per item: nxt (next item in its queue), seq (sequence number of
# its last append), ig (size index), flag (newly_added); out_log / in_log (size indices
# in the order of the reference's appends to out_blk / in_blk).


_jit = njit
# The helpers on the path of every swap, inlined into their callers by numba: a call
# between compiled functions costs more than these bodies.
_inline = njit(inline="always")


@_inline
def _push(cs, gs, rc, wc, head, tail, nxt, seq, ig, flag, c, item, waiting):
    """Append ``item`` to the running (``waiting`` False) or waiting list of card c."""
    g = ig[item]
    q = 4 * g + 2 * waiting + flag[item]
    seq[item] = gs[_SEQ]
    gs[_SEQ] += 1
    nxt[item] = _NONE
    if tail[q] == _NONE:
        head[q] = item
    else:
        nxt[tail[q]] = item
    tail[q] = item
    if waiting:
        wc[g] += 1
        cs[c, _NWAIT] += 1
        cs[c, _MINW] = min(cs[c, _MINW], g)
        cs[c, _MAXW] = max(cs[c, _MAXW], g)
    else:
        rc[g] += 1
        cs[c, _NRUN] += 1
        cs[c, _NNEW] += flag[item]
        cs[c, _MINR] = min(cs[c, _MINR], g)
        cs[c, _MAXR] = max(cs[c, _MAXR], g)


@_inline
def _pop(cs, rc, wc, head, tail, nxt, ig, flag, c, item, waiting):
    """Remove ``item``, the head of its queue, from its list of card c."""
    g = ig[item]
    q = 4 * g + 2 * waiting + flag[item]
    head[q] = nxt[item]
    if head[q] == _NONE:
        tail[q] = _NONE
    cnt = wc if waiting else rc
    fmin, fmax = (_MINW, _MAXW) if waiting else (_MINR, _MAXR)
    cnt[g] -= 1
    if waiting:
        cs[c, _NWAIT] -= 1
    else:
        cs[c, _NRUN] -= 1
        cs[c, _NNEW] -= flag[item]
    if cnt[g] == 0:
        end = cs[c, _DOM] + cs[c, _NDOM]
        if cs[c, fmin] == g:
            j = g + 1
            while j < end and cnt[j] == 0:
                j += 1
            cs[c, fmin] = j
        if cs[c, fmax] == g:
            j = g - 1
            while j >= cs[c, _DOM] and cnt[j] == 0:
                j -= 1
            cs[c, fmax] = j


@_inline
def _earlier(seq, a, b):
    """Of two items (either may be _NONE) the one appended first to its list."""
    if a == _NONE:
        return b
    if b == _NONE or seq[a] < seq[b]:
        return a
    return b


@_jit
def _largest_at_most(cs, dv, rc, wc, c, a, lo):
    """Largest achievable difference ``w - r`` in ``[lo, a]``, or ``lo - 1`` if none:
    for each running size ascending, the largest waiting size ``<= r + a``."""
    best = lo - 1
    maxw = cs[c, _MAXW]
    j = cs[c, _MINW] - 1          # last size index with dv <= r + a (or before MINW)
    last = _NONE                  # last such index holding a waiting item
    for g in range(cs[c, _MINR], cs[c, _MAXR] + 1):
        if rc[g] == 0:
            continue
        r = dv[g]
        while j < maxw and dv[j + 1] <= r + a:
            j += 1
            if wc[j] > 0:
                last = j
        if last != _NONE and dv[last] - r > best:
            best = dv[last] - r
            if best == a:
                break
    return best


@_jit
def _smallest_at_least(cs, dv, rc, wc, c, b, hi):
    """Smallest achievable difference ``w - r`` in ``[b, hi]``, or ``hi + 1`` if none."""
    best = hi + 1
    maxw = cs[c, _MAXW]
    k = cs[c, _MINW]              # first size index with dv >= r + b holding a waiting item
    for g in range(cs[c, _MINR], cs[c, _MAXR] + 1):
        if rc[g] == 0:
            continue
        r = dv[g]
        while k <= maxw and (dv[k] < r + b or wc[k] == 0):
            k += 1
        if k > maxw:
            break
        if dv[k] - r < best:
            best = dv[k] - r
            if best == b:
                break
    return best


@_jit
def _size_index(cs, dv, c, v):
    """Size index of value ``v`` in card c, or _NONE when no item of the card has it."""
    dom, m = cs[c, _DOM], cs[c, _NDOM]
    k = np.searchsorted(dv[dom:dom + m], v)
    return dom + k if k < m and dv[dom + k] == v else _NONE


@_jit
def _first_reaching(cs, dv, rc, wc, head, seq, c, d, first_new, first_any):
    """Fold into (first newly added, first any) the running queue heads of every size
    ``r`` that has a waiting size ``r + d``."""
    maxw = cs[c, _MAXW]
    k = cs[c, _MINW]
    for g in range(cs[c, _MINR], cs[c, _MAXR] + 1):
        if rc[g] == 0:
            continue
        want = dv[g] + d
        while k <= maxw and dv[k] < want:
            k += 1
        if k > maxw:
            break
        if dv[k] == want and wc[k] > 0:
            first_new = _earlier(seq, first_new, head[4 * g + _RUN_NEW])
            first_any = _earlier(seq, first_any, head[4 * g + _RUN_OLD])
    return first_new, _earlier(seq, first_any, first_new)


@_inline
def _first_waiting(head, seq, g, first):
    """Fold the waiting queue heads of size index g (none if _NONE) into ``first``."""
    if g == _NONE:
        return first
    first = _earlier(seq, first, head[4 * g + _WAIT_OLD])
    return _earlier(seq, first, head[4 * g + _WAIT_NEW])
