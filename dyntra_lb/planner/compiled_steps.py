"""The compiled planner's steps (docs/planner.md): swap search, throughput drop and fill,
on the index of ``dyntra_lb/planner/compiled_card.py``. ``_balance`` in
``dyntra_lb/planner/compiled.py`` runs them in the reference's order; docstrings start with
the docs/planner.md heading that describes the step."""

from __future__ import annotations

from dyntra_lb.planner.compiled_card import (
    _ITEMS,
    _MAXR,
    _MAXW,
    _MINR,
    _MINW,
    _NIN,
    _NNEW,
    _NONE,
    _NOUT,
    _NRUN,
    _NUM_RUN,
    _NWAIT,
    _RUN_NEW,
    _RUN_OLD,
    _TOT,
    _TOTAL,
    _earlier,
    _first_reaching,
    _first_waiting,
    _inline,
    _jit,
    _largest_at_most,
    _pop,
    _push,
    _size_index,
    _smallest_at_least,
)


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
