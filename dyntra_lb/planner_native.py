"""The planner of docs/planner.md compiled with numba: the same plans as the Python planner
in ``dyntra_lb/planner_python.py``, for the calls that need no observer. Docstrings of the
planner's steps start with the docs/planner.md heading that describes the step.

``dyntra_lb.planner`` imports this module once, at its own import, when numba is
installed (the ``fast`` extra), and sends every ``balance_load`` call without an
observer to :func:`plan`; calls with an observer (this loop emits no events), and
inputs :func:`plan` declines, run the Python planner. Nothing else calls it.

The decisions are the Python planner's (its module docstring has the argument): the
best swap difference ``d`` is the achievable difference nearest to the vertex ``x*``
from below or from above, evaluated with the reference's own float expression; the tie
rule takes the first newly added running item that reaches the best distance, else the
first one; the reference's ``list.remove`` by value removes the first item with the
chosen (size, newly_added) pair. What differs is the index, built for compiled loops:

* A card's items never leave it (they move between its running and waiting lists), so
  each card gets its sorted distinct sizes once; per size it counts its running and
  waiting items and it tracks its smallest and largest running and waiting size.
* Every item a list removes is the first of its (size, newly_added) class in that list
  (the argument above; the fill takes the head of the waiting list, which is the first
  of its class too). So each list is kept as one FIFO queue per (size, newly_added),
  with a sequence number stamped on every append: the list order is the order of the
  sequence numbers, "the first item of these sizes in the list" is the queue head with
  the smallest number, and a move costs O(1).
* The nearest achievable difference at or below ``a`` (or at or above ``b``) is one
  two-pointer pass over the card's distinct sizes. Far from balance (nearly every
  swap) the extreme difference of the mode wins at no cost: ``max W - min R`` is always
  achievable and only ``min R`` reaches it (``min W - max R``: only ``max R``).

State lives in flat int64 arrays: a table ``cs`` with one row per card, arrays over all
cards' distinct sizes (``g`` = a global size index) and over all items. Swaps, drops and
fills append global size indices to an out log and an in log; cancellation runs on those logs.
"""

from __future__ import annotations

import operator

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


def _cached_jit(fn):
    """The kernel entry point: compiled on first call (its callees with it) and cached
    on disk where numba finds a writable place (``NUMBA_CACHE_DIR``, the package's
    ``__pycache__``, else the user's cache directory); without one (read-only install
    and home) every process compiles it again."""
    try:
        return njit(cache=True)(fn)
    except RuntimeError:  # numba: "cannot cache function ...: no locator available"
        return njit(fn)


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


@_inline
def _perform_swap(cs, gs, dv, rc, wc, head, tail, nxt, seq, ig, flag, out_log, in_log, c,
                  r_item, w_item):
    """Swap search, performing a swap on card c: log, update the totals, exchange the
    two items."""
    _pop(cs, rc, wc, head, tail, nxt, ig, flag, c, r_item, False)
    _pop(cs, rc, wc, head, tail, nxt, ig, flag, c, w_item, True)
    out_log[gs[_NOUT]] = ig[r_item]
    gs[_NOUT] += 1
    in_log[gs[_NIN]] = ig[w_item]
    gs[_NIN] += 1
    delta = dv[ig[w_item]] - dv[ig[r_item]]
    cs[c, _TOT] += delta
    gs[_TOTAL] += delta
    _push(cs, gs, rc, wc, head, tail, nxt, seq, ig, flag, c, w_item, False)
    _push(cs, gs, rc, wc, head, tail, nxt, seq, ig, flag, c, r_item, True)


@_jit
def _swap_one_rank(cs, gs, dv, rc, wc, head, tail, nxt, seq, ig, flag, out_log, in_log, c,
                   increase):
    """Swap search with one rank: every distance is 0.0, so only the tie rule picks: the first
    newly added running item with a waiting item on the mode's side, and the first such
    waiting item."""
    if cs[c, _NNEW] == 0:
        return False
    min_w, max_w = dv[cs[c, _MINW]], dv[cs[c, _MAXW]]
    r_item = _NONE
    for g in range(cs[c, _MINR], cs[c, _MAXR] + 1):
        if (max_w > dv[g]) if increase else (min_w < dv[g]):
            r_item = _earlier(seq, r_item, head[4 * g + _RUN_NEW])
    if r_item == _NONE:
        return False
    v = dv[ig[r_item]]
    w_item = _NONE
    for g in range(cs[c, _MINW], cs[c, _MAXW] + 1):
        if (dv[g] > v) if increase else (dv[g] < v):
            w_item = _first_waiting(head, seq, g, w_item)
    _perform_swap(cs, gs, dv, rc, wc, head, tail, nxt, seq, ig, flag, out_log, in_log, c,
                  r_item, w_item)
    return True


@_jit
def _swap(cs, gs, dv, rc, wc, head, tail, nxt, seq, ig, flag, out_log, in_log, n, c,
          increase):
    """Swap search: find and perform the best swap on card c; True if one was made."""
    if cs[c, _NRUN] == 0 or cs[c, _NWAIT] == 0:
        return False
    if n == 1:
        return _swap_one_rank(cs, gs, dv, rc, wc, head, tail, nxt, seq, ig, flag, out_log,
                              in_log, c, increase)
    tot = cs[c, _TOT]
    total = gs[_TOTAL]
    target = total / n
    base = abs(tot - target)
    min_r, max_r = dv[cs[c, _MINR]], dv[cs[c, _MAXR]]
    min_w, max_w = dv[cs[c, _MINW]], dv[cs[c, _MAXW]]
    top, bottom = max_w - min_r, min_w - max_r    # the extreme achievable differences
    if increase:
        lo, hi = max(bottom, 1), top
    else:
        lo, hi = bottom, min(top, -1)
    if lo > hi:
        return False
    t0 = (total - n * tot) // (n - 1)             # floor of the vertex x*
    a = min(t0, hi)
    below = lo - 1                                # "none below"
    if a >= lo:
        below = a if a == top else _largest_at_most(cs, dv, rc, wc, c, a, lo)
    b = max(t0 + 1, lo)
    above = hi + 1                                # "none above"
    if b <= hi:
        above = b if b == bottom else _smallest_at_least(cs, dv, rc, wc, c, b, hi)
    # The reference's distance expression on the candidates (at least one exists: the
    # extreme difference of the mode is achievable and in [lo, hi]).
    both = False
    if below < lo:
        d = above
        best = abs((tot + above) - (target + above / n))
    else:
        d = below
        best = abs((tot + below) - (target + below / n))
        if above <= hi:
            dist = abs((tot + above) - (target + above / n))
            if dist < best:
                best, d = dist, above
            elif dist == best:
                both = True
    if best > base:
        return False
    if not both and (d == top or d == bottom):
        # Only min R reaches max W - min R, only max R reaches min W - max R.
        g = cs[c, _MINR] if d == top else cs[c, _MAXR]
        first_new = head[4 * g + _RUN_NEW]
        first_any = _earlier(seq, head[4 * g + _RUN_OLD], first_new)
    else:
        first_new, first_any = _first_reaching(cs, dv, rc, wc, head, seq, c, d, _NONE,
                                               _NONE)
        if both:
            first_new, first_any = _first_reaching(cs, dv, rc, wc, head, seq, c, above,
                                                   first_new, first_any)
    if best == base:
        # Zero gain: only the tie rule (newly added item) can accept it.
        if first_new == _NONE:
            return False
        r_item = first_new
    elif first_new != _NONE:
        r_item = first_new
    else:
        r_item = first_any
    rv = dv[ig[r_item]]
    if not both and d == top:
        w_item = _first_waiting(head, seq, cs[c, _MAXW], _NONE)
    elif not both and d == bottom:
        w_item = _first_waiting(head, seq, cs[c, _MINW], _NONE)
    else:
        w_item = _first_waiting(head, seq, _size_index(cs, dv, c, rv + d), _NONE)
        if both:
            w_item = _first_waiting(head, seq, _size_index(cs, dv, c, rv + above), w_item)
    _perform_swap(cs, gs, dv, rc, wc, head, tail, nxt, seq, ig, flag, out_log, in_log, c,
                  r_item, w_item)
    return True


@_jit
def _drop(cs, gs, dv, rc, wc, head, tail, nxt, seq, ig, flag, out_log, order, n, tp_fixed,
          tp_per_block):
    """Throughput-drop heuristic on the most loaded card (``order[0]``; ``order`` is sorted
    whenever this runs, so ``order[1]`` holds the largest other total)."""
    num = gs[_NUM_RUN]
    c = order[0]
    if num <= 1 or cs[c, _NRUN] == 0:
        return False
    m = cs[c, _TOT]
    s = max(cs[order[1], _TOT], 0) if n > 1 else 0
    tp = num / (tp_fixed + tp_per_block * m)
    # tp' falls strictly as M' = max(M - R, S) grows: the largest R gives the best M',
    # reached by the sizes R with M - R == M', or M - R <= S when M' == S.
    m_best = max(m - dv[cs[c, _MAXR]], s)
    tp_best = (num - 1) / (tp_fixed + tp_per_block * m_best)
    if tp_best < tp:
        return False
    first_new = first_any = _NONE
    g = cs[c, _MAXR]
    while g >= cs[c, _MINR] and max(m - dv[g], s) == m_best:
        first_new = _earlier(seq, first_new, head[4 * g + _RUN_NEW])
        first_any = _earlier(seq, first_any, head[4 * g + _RUN_OLD])
        g -= 1
    if first_new != _NONE:
        item = first_new
    elif tp_best == tp:
        return False              # equal throughput: only a newly added item qualifies
    else:
        item = first_any
    _pop(cs, rc, wc, head, tail, nxt, ig, flag, c, item, False)
    out_log[gs[_NOUT]] = ig[item]
    gs[_NOUT] += 1
    v = dv[ig[item]]
    cs[c, _TOT] -= v
    gs[_TOTAL] -= v
    gs[_NUM_RUN] -= 1
    _push(cs, gs, rc, wc, head, tail, nxt, seq, ig, flag, c, item, True)
    return True


@_jit
def _fill(cs, gs, dv, rc, wc, head, tail, nxt, seq, ig, flag, in_log, n, max_num_seqs):
    """Fill step: admit the head of each rank's waiting list into its free slots (before any
    move, so the waiting list is still the row after the split)."""
    for c in range(n):
        first = cs[c, _ITEMS] + cs[c, _NRUN]
        for item in range(first, first + min(max_num_seqs - cs[c, _NRUN], cs[c, _NWAIT])):
            _pop(cs, rc, wc, head, tail, nxt, ig, flag, c, item, True)
            flag[item] = 1
            _push(cs, gs, rc, wc, head, tail, nxt, seq, ig, flag, c, item, False)
            in_log[gs[_NIN]] = ig[item]
            gs[_NIN] += 1
            cs[c, _TOT] += dv[ig[item]]
            gs[_TOTAL] += dv[ig[item]]
            gs[_NUM_RUN] += 1


@_jit
def _grow(log, used, need):
    """``log``, or a copy with more room, holding ``need`` more entries after ``used``."""
    if used + need <= log.shape[0]:
        return log
    bigger = np.empty(2 * (used + need), np.int64)
    bigger[:used] = log[:used]
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
def _size_indices(values, dv, dom):
    """Write the sorted distinct ``values`` to ``dv[dom:]``; return their count and each
    value's size index. A table over the value span when it is small, else a sort."""
    low, high = values.min(), values.max()
    span = high - low + 1
    if span > 8 * values.shape[0] + 1024:
        distinct = np.unique(values)
        dv[dom:dom + distinct.shape[0]] = distinct
        return distinct.shape[0], dom + np.searchsorted(distinct, values)
    table = np.zeros(span, np.int64)
    for v in values:
        table[v - low] = 1
    m = 0
    for k in range(span):
        if table[k]:
            dv[dom + m] = low + k
            table[k] = dom + m
            m += 1
    index = np.empty(values.shape[0], np.int64)
    for i in range(values.shape[0]):
        index[i] = table[values[i] - low]
    return m, index


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
            m, ig[item:item + lengths[c]] = _size_indices(values, dv, size)
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
                 True):
            swapped = True
            # Only the least loaded card changed (it grew).
            top = max(cs[order[0], _TOT], cs[low, _TOT])
            if _bubble(top, gs[_TOTAL], n, ratio) < threshold:
                break
            _sort_cards(order, cs)
        if _swap(cs, gs, dv, rc, wc, head, tail, nxt, seq, ig, flag, out_log, in_log, n,
                 order[0], False):
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
    """``dyntra_lb.planner.balance_load`` without an observer, for ``dp_size >= 1``: per
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
