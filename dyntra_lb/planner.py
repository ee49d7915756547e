"""DyntraLB planner (spec D): the gathered snapshot -> one plan per DP rank.

Every rank calls :func:`balance_load` on the decoded all-gather payload after each active
decode step and keeps its own row. It sits on the decode critical path, so it has to be
fast, and all ranks must agree, so it has to be exact: the output equals the reference
algorithm of spec D (transcribed literally in ``tests/literal_planner.py``) for every
input, quirks included (spec H.4, H.7, H.8).

Two implementations, one entry point
------------------------------------
This module is the Python planner (:func:`balance_load_python`). With numba installed
(the ``fast`` extra; the ``test`` extra includes it) ``dyntra_lb/planner_native.py``
compiles the same decisions into one loop, and :func:`balance_load` sends every call
without an observer there (``IMPLEMENTATION`` says which one was picked at import).
The compiled loop emits no observer events, so calls with an observer run the Python
planner, as do inputs of types a payload never has (float sizes, say), where the Python
planner's own conversions and errors apply. Both give identical plans; the tests check
both against the literal oracle. :func:`warm_up` moves numba's compile (or disk-cache
load) to rank start-up.

How it is fast while giving identical plans
-------------------------------------------
The reference scans every (running R, waiting W) pair of a card twice per round, for up
to 1000 rounds. Here a swap search costs O(1) bigint operations plus a short scan:

* Distances. With ``n`` ranks, total ``T`` and the card's ``tot``, the reference's
  ``|(tot + d) - (target + d/n)|`` for ``d = W - R`` equals ``|(n-1)d - (T - n*tot)|/n``
  exactly: V-shaped in ``d`` with its vertex at ``x* = (T - n*tot)/(n-1)``, and the
  distances of two different integers ``d`` on the same side of the vertex differ by at
  least ``(n-1)/n >= 1/2``. The float rounding of that expression (a few ulps of the
  totals) stays below 1/8 while all block counts sum to less than 2**48 (checked at
  parse time; a real payload is orders of magnitude below), so in
  floats too the best ``d`` is the achievable difference nearest to ``x*`` from below or
  from above (inside the mode's sign region: ``d > 0`` increase, ``d < 0`` decrease),
  and no other ``d`` can tie with it. We find those two differences and evaluate them
  with the reference's own float expression, so ties (``==``) are decided on identical
  numbers. ``floor(x*)`` is computed exactly with integer division.
* Achievable differences. Each card keeps its distinct running and waiting sizes as
  bitsets (Python ints). ``d >= 0`` is achievable iff ``(wait_bits >> d) & run_bits``
  (``d < 0``: ``(run_bits >> -d) & wait_bits``); we walk ``d`` outward from
  ``floor(x*)`` inside ``[min W - max R, max W - min R]`` (far from balance, the usual
  case, the extreme difference wins in one step). A walk longer than ``_MAX_WALK``
  steps, or a card with sizes beyond ``_BITSET_LIMIT``, uses an exact vectorised search
  instead (numpy ``searchsorted`` per distinct running size).
* Which pair. For one R the reference keeps the first W (waiting order) reaching its
  minimum; across R its accept rule (strict ``<``, or ``==`` when R is newly added and the
  current best is not) reduces to: with ``M`` the best distance, if ``M < baseline`` take
  the first newly added R reaching ``M``, else the first R reaching ``M``; if
  ``M == baseline`` only a newly added R reaching ``M`` qualifies; otherwise nothing.
  "R reaches M" means ``R + d`` is a waiting size for a winning ``d``; the sizes that do
  are ``run_bits & (wait_bits >> d)``. When only a few sizes qualify (always so far from
  balance) ``list.index`` finds their first items; otherwise one scan of the running
  list in order picks R. ``list.index`` picks W.
* ``list.remove`` by value. The reference removes the first item *equal* to the chosen
  one (same size and same newly flag). The chosen R is the first running item with its
  (size, newly) pair, because an earlier equal item would have the same distance and the
  same flag and would have been chosen instead; likewise the chosen W is the first
  waiting item with its size. So removing by position removes the same item.
* Drop heuristic. ``tp' = (N-1)/(20000 + 19.2*M')`` is strictly decreasing in
  ``M' = max(M - R, S)`` (distinct integers give distinct floats), so the best ``M'`` comes
  from the largest running size; the same tie reduction picks the item.
* Cancellation uses counts per value (the first ``min(#in, #out)`` occurrences of each
  value cancel on both sides), O(n) instead of O(n^2).
Items are ints ``2*blocks + newly_added`` in plain lists, so order and flags survive
every move exactly as the reference's dicts do. One rank (``dp_size == 1``) makes every
distance 0.0 and takes a direct path.

Observer events
---------------
``observer`` is None (no cost) or a callable receiving one dict per decision point, in
this order. Sizes are block counts; ``round`` is the reference's round counter (it only
advances on productive rounds).

* ``{"kind": "parsed", "cards": [{"rank", "running": [...], "waiting": [...],
  "tot_blk"}]}`` — after parsing (D.2), per rank in rank order.
* ``{"kind": "fill", "rank", "blk", "tot_blk"}`` — one per waiting item pulled into a
  free slot (D.4); ``tot_blk`` is the rank's total after the pull.
* ``{"kind": "round", "round", "order": [ranks, most loaded first], "tot_blk": [per rank,
  indexed by rank], "avg", "bubble"}`` — start of each round, after the sort (D.7 step 1).
* ``{"kind": "swap", "round", "rank", "mode": "increase" | "decrease", "out_blk",
  "in_blk", "newly_added" (of the swapped-out item), "dist_before", "dist_after",
  "tie_rule", "tot_blk"}`` — one per performed swap. ``tie_rule`` is true when the
  newly-added tie rule decided it (a zero-gain swap, or a newly added item preferred over
  an earlier equally good one).
* ``{"kind": "drop", "round", "rank", "blk", "newly_added", "throughput_before",
  "throughput_after", "tie_rule", "tot_blk"}`` — the throughput heuristic paused a
  running item (D.6); ``tie_rule`` as for swaps (equal throughput, newly added wins).
* ``{"kind": "no_drop", "round", "rank", "throughput"}`` — the heuristic was tried and
  found nothing (``throughput`` is None when at most one request runs in total).
* ``{"kind": "stop", "reason": "bubble_below_threshold" | "no_progress" | "max_iters",
  "round", "bubble"}`` — why the loop ended (``bubble`` is the last value computed).
* ``{"kind": "cancel", "rank", "cancelled": [...], "out_blk", "in_blk"}`` — per rank with
  at least one cancelled pair (D.8): the cancelled values, and the lists that survive.
* ``{"kind": "plans", "plans": [plan dicts, by rank]}`` — the result.
"""

from __future__ import annotations

import operator
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

try:  # the compiled planner (the "fast" extra); without numba the Python one runs
    from dyntra_lb import planner_native as _native
except ImportError:
    _native = None

# Which planner serves balance_load calls without an observer.
IMPLEMENTATION = "python" if _native is None else "numba"

THROUGHPUT_FIXED = 20000
THROUGHPUT_PER_BLOCK = 19.2

# Block counts arrive as int32 (spec C). The float argument of the module docstring
# needs rounding errors far below 1/4: true while the sum of all |block counts| stays
# below _MAX_TOTAL_BLOCKS (a real payload is far below).
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_MAX_TOTAL_BLOCKS = 2**48
# Cards whose sizes all lie in [1, _BITSET_LIMIT] get bitsets; larger sizes take the
# vectorised search (bitsets of that many bits would cost more than they save).
_BITSET_LIMIT = 1 << 16
# Longest outward walk over candidate differences before the vectorised search.
_MAX_WALK = 48

# Up to this many qualifying running sizes, a swap finds its item with list.index.
_FEW_SIZES = 4

_STOP_BUBBLE = "bubble_below_threshold"


@dataclass
class Plan:
    """One rank's row of the planner output: pause running requests of the ``out_blk``
    sizes, admit waiting requests of the ``in_blk`` sizes, admit nothing else."""

    out_blk: list[int] = field(default_factory=list)
    in_blk: list[int] = field(default_factory=list)
    freeze: bool = False

    def to_dict(self) -> dict:
        return {"out_blk": list(self.out_blk), "in_blk": list(self.in_blk),
                "freeze": self.freeze}


class _Card:
    """One rank during planning. ``run``/``wait`` hold items ``2*blocks + newly_added``
    in the reference's list order. The search index (item counts ``rcode``/``wcode`` and
    size bitsets ``rbits``/``wbits``, bit ``v`` set iff an item of size ``v`` is there) is
    built when the card is first searched and kept in step by the move methods."""

    __slots__ = ("rank", "run", "wait", "tot", "nnew", "rcode", "wcode", "bits", "rbits",
                 "wbits")

    def __init__(self, rank: int, running: list[int], waiting: list[int]):
        self.rank = rank
        self.run = [v << 1 for v in running]
        self.wait = [v << 1 for v in waiting]
        self.tot = sum(running)
        self.nnew = 0                         # newly added items in running
        self.rcode = None

    def build_index(self) -> None:
        self.rcode = rcode = dict(Counter(self.run))
        self.wcode = wcode = dict(Counter(self.wait))
        codes = rcode.keys() | wcode.keys()
        self.bits = not codes or (min(codes) >= 2 and max(codes) >> 1 <= _BITSET_LIMIT)
        self.rbits = self.wbits = 0
        if self.bits:
            rb = wb = 0
            for code in rcode:
                rb |= 1 << (code >> 1)
            for code in wcode:
                wb |= 1 << (code >> 1)
            self.rbits, self.wbits = rb, wb

    # Moves between the two lists keep the index in step (a size leaves a bitset when
    # neither of its two items is left).
    def take_running(self, i: int) -> int:
        code = self.run.pop(i)
        self.nnew -= code & 1
        rcode = self.rcode
        c = rcode[code]
        if c == 1:
            del rcode[code]
            if self.bits and code ^ 1 not in rcode:
                self.rbits ^= 1 << (code >> 1)
        else:
            rcode[code] = c - 1
        return code

    def take_waiting(self, i: int) -> int:
        code = self.wait.pop(i)
        wcode = self.wcode
        c = wcode[code]
        if c == 1:
            del wcode[code]
            if self.bits and code ^ 1 not in wcode:
                self.wbits ^= 1 << (code >> 1)
        else:
            wcode[code] = c - 1
        return code

    def put_running(self, code: int) -> None:
        self.run.append(code)
        self.nnew += code & 1
        rcode = self.rcode
        if code in rcode:
            rcode[code] += 1
        else:
            rcode[code] = 1
            if self.bits:
                self.rbits |= 1 << (code >> 1)

    def put_waiting(self, code: int) -> None:
        self.wait.append(code)
        wcode = self.wcode
        if code in wcode:
            wcode[code] += 1
        else:
            wcode[code] = 1
            if self.bits:
                self.wbits |= 1 << (code >> 1)

    def first_waiting(self, v: int) -> int | None:
        """Position of the first waiting item of size ``v`` (either flag), or None."""
        wcode, code = self.wcode, v << 1
        if code in wcode:
            i = self.wait.index(code)
            return min(i, self.wait.index(code | 1)) if code | 1 in wcode else i
        return self.wait.index(code | 1) if code | 1 in wcode else None

    def max_running(self) -> int:
        if self.bits:
            return self.rbits.bit_length() - 1
        return max(self.rcode) >> 1

    def value_range(self) -> tuple[int, int, int, int]:
        """(min running, max running, min waiting, max waiting) sizes."""
        if self.bits:
            rb, wb = self.rbits, self.wbits
            return ((rb & -rb).bit_length() - 1, rb.bit_length() - 1,
                    (wb & -wb).bit_length() - 1, wb.bit_length() - 1)
        return (min(self.rcode) >> 1, max(self.rcode) >> 1,
                min(self.wcode) >> 1, max(self.wcode) >> 1)

    def pick_running(self, deltas: tuple[int, ...]) -> tuple[int | None, int | None]:
        """Positions of the first newly added running item and of the first running item
        whose size ``v`` has a waiting size ``v + d`` for some ``d`` in ``deltas``."""
        rcode = self.rcode
        if self.bits:
            rb, wb = self.rbits, self.wbits
            mask = 0
            for d in deltas:
                mask |= rb & ((wb >> d) if d >= 0 else (wb << -d))
            if mask.bit_count() <= _FEW_SIZES:
                # Few sizes qualify (always so far from balance): list.index in C.
                run = self.run
                first_new = first_any = None
                while mask:
                    low = mask & -mask
                    mask ^= low
                    code = (low.bit_length() - 1) << 1
                    if code in rcode:
                        i = run.index(code)
                        if first_any is None or i < first_any:
                            first_any = i
                    if code | 1 in rcode:
                        i = run.index(code | 1)
                        if first_new is None or i < first_new:
                            first_new = i
                        if first_any is None or i < first_any:
                            first_any = i
                return first_new, first_any
        wcode = self.wcode
        first_any = None
        stop_at_any = self.nnew == 0
        for i, code in enumerate(self.run):
            v = code >> 1
            for d in deltas:
                w = (v + d) << 1
                if w in wcode or w | 1 in wcode:
                    if code & 1:
                        return i, (i if first_any is None else first_any)
                    if first_any is None:
                        first_any = i
                        if stop_at_any:
                            return None, i
                    break
        return None, first_any


def _parse(requests_by_rank, rank: int) -> tuple[_Card, int]:
    """D.2: running = entries before ``split``, waiting = the rest, up to the first 0.
    Also returns a bound on the sum of the rank's |block counts|."""
    if rank >= len(requests_by_rank):
        return _Card(rank, [], []), 0
    blks, split = requests_by_rank[rank]
    if isinstance(blks, np.ndarray):
        blks = blks.tolist()
    values = list(map(int, blks))
    if 0 in values:
        del values[values.index(0):]
    if not values:
        bound = 0
    else:
        low, high = min(values), max(values)
        if low < _INT32_MIN or high > _INT32_MAX:
            raise ValueError(f"block counts of rank {rank} must fit in int32 (the payload "
                             f"type), got {low if low < _INT32_MIN else high}")
        bound = len(values) * max(-low, high)
    split = max(operator.index(split), 0)
    return _Card(rank, values[:split], values[split:]), bound


def _nearest_by_walk(card: _Card, lo: int, hi: int, t0: int):
    """Largest achievable difference in [lo, min(t0, hi)] and smallest in
    [max(t0 + 1, lo), hi] (None where there is none), by walking outward from ``t0``
    over the bitsets: ``d`` is achievable iff some running size ``v`` has a waiting size
    ``v + d``. Returns None instead when a walk would exceed ``_MAX_WALK`` steps."""
    rb, wb = card.rbits, card.wbits
    below = above = None
    t = min(t0, hi)
    steps = 0
    while t >= lo:
        if ((wb >> t) & rb) if t >= 0 else ((rb >> -t) & wb):
            below = t
            break
        steps += 1
        if steps > _MAX_WALK:
            return None
        t -= 1
    t = max(t0 + 1, lo)
    steps = 0
    while t <= hi:
        if ((wb >> t) & rb) if t >= 0 else ((rb >> -t) & wb):
            above = t
            break
        steps += 1
        if steps > _MAX_WALK:
            return None
        t += 1
    return below, above


def _nearest_by_search(card: _Card, lo: int, hi: int, t0: int):
    """Same answer as :func:`_nearest_by_walk`, by one ``searchsorted`` per distinct
    running size (for long walks and for cards without bitsets)."""
    r = np.unique(np.fromiter(card.rcode, dtype=np.int64, count=len(card.rcode)) >> 1)
    w = np.unique(np.fromiter(card.wcode, dtype=np.int64, count=len(card.wcode)) >> 1)
    below = above = None
    a = min(t0, hi)
    if a >= lo:
        idx = np.searchsorted(w, r + a, side="right") - 1
        ok = idx >= 0
        d = w[idx[ok]] - r[ok]
        d = d[d >= lo]
        if d.size:
            below = int(d.max())
    b = max(t0 + 1, lo)
    if b <= hi:
        idx = np.searchsorted(w, r + b, side="left")
        ok = idx < w.size
        d = w[idx[ok]] - r[ok]
        d = d[d <= hi]
        if d.size:
            above = int(d.min())
    return below, above


class _Planner:
    """State of one ``balance_load`` call (the reference's closures, made explicit)."""

    def __init__(self, cards, plans, threshold, observer, protect_fill=False):
        self.cards = cards
        self.plans = plans
        self.n = len(cards)
        self.total = sum(c.tot for c in cards)
        self.num_running = sum(len(c.run) for c in cards)
        self.threshold = threshold
        self.ratio = threshold < 1
        self.observer = observer
        self.protect_fill = protect_fill

    def bubble(self, max_blk: int) -> float:
        """D.3, given the current maximum ``tot_blk``."""
        avg = self.total / self.n
        if self.ratio:
            if max_blk <= 0:
                return 0.0
            return (max_blk - avg) / max_blk
        return max_blk - avg

    def fill(self, max_num_seqs: int) -> None:
        """D.4: admit the head of each rank's waiting list into its free slots."""
        observer = self.observer
        for card in self.cards:
            k = min(max_num_seqs - len(card.run), len(card.wait))
            if k <= 0:
                continue
            values = [code >> 1 for code in card.wait[:k]]
            del card.wait[:k]
            card.run.extend([v << 1 | 1 for v in values])
            card.nnew += k
            self.plans[card.rank].in_blk.extend(values)
            self.total += sum(values)
            self.num_running += k
            for v in values:
                card.tot += v
                if observer is not None:
                    observer({"kind": "fill", "rank": card.rank, "blk": v,
                              "tot_blk": card.tot})

    def swap(self, card: _Card, increase: bool, rnd: int) -> bool:
        """D.5: find and perform the best swap on ``card``; True if one was made."""
        if not card.run or not card.wait:
            return False
        if card.rcode is None:
            card.build_index()
        n = self.n
        tot = card.tot
        target = self.total / n
        base = abs(tot - target)
        if n == 1:
            return self._swap_one_rank(card, increase, rnd, base)
        if card.bits:
            rb, wb = card.rbits, card.wbits
            min_r, max_r = (rb & -rb).bit_length() - 1, rb.bit_length() - 1
            min_w, max_w = (wb & -wb).bit_length() - 1, wb.bit_length() - 1
        else:
            min_r, max_r, min_w, max_w = card.value_range()
        if increase:
            lo = min_w - max_r
            if lo < 1:
                lo = 1
            hi = max_w - min_r
        else:
            lo = min_w - max_r
            hi = max_w - min_r
            if hi > -1:
                hi = -1
        if lo > hi:
            return False
        t0 = (self.total - n * tot) // (n - 1)    # floor of the vertex x*
        found = _nearest_by_walk(card, lo, hi, t0) if card.bits else None
        below, above = found or _nearest_by_search(card, lo, hi, t0)
        # The reference's distance expression, verbatim, on the two candidates (at least
        # one exists: the extreme difference of the mode is achievable and in [lo, hi]).
        if below is None:
            best, deltas = abs((tot + above) - (target + above / n)), (above,)
        else:
            best, deltas = abs((tot + below) - (target + below / n)), (below,)
            if above is not None:
                dist = abs((tot + above) - (target + above / n))
                if dist < best:
                    best, deltas = dist, (above,)
                elif dist == best:
                    deltas = (below, above)
        if best > base:
            return False
        first_new, first_any = card.pick_running(deltas)
        if best == base:
            # Zero gain: only the tie rule (newly added item) can accept it.
            if first_new is None:
                return False
            chosen, tie_rule = first_new, True
        elif first_new is not None:
            chosen, tie_rule = first_new, first_any < first_new
        else:
            chosen, tie_rule = first_any, False
        r_code = card.run[chosen]
        rv = r_code >> 1
        if len(deltas) == 1:
            wi = card.first_waiting(rv + deltas[0])
        else:
            wi = min(i for i in map(card.first_waiting, [rv + d for d in deltas])
                     if i is not None)
        w_code = card.wait[wi]
        self._perform_swap(card, chosen, wi)
        if self.observer is not None:
            self.observer({"kind": "swap", "round": rnd, "rank": card.rank,
                           "mode": "increase" if increase else "decrease",
                           "out_blk": rv, "in_blk": w_code >> 1,
                           "newly_added": bool(r_code & 1), "dist_before": base,
                           "dist_after": best, "tie_rule": tie_rule, "tot_blk": card.tot})
        return True

    def _swap_one_rank(self, card: _Card, increase: bool, rnd: int, base: float) -> bool:
        """D.5 with one rank: target == tot, so every distance (and the baseline) is
        exactly 0.0 and only the tie rule can pick: the first newly added running item
        that has a waiting item on the right side, paired with the first such item."""
        if card.nnew == 0:
            return False
        min_r, max_r, min_w, max_w = card.value_range()
        i = next((i for i, code in enumerate(card.run) if code & 1 and (
            max_w > code >> 1 if increase else min_w < code >> 1)), None)
        if i is None:
            return False
        v = card.run[i] >> 1
        wi = next(j for j, code in enumerate(card.wait) if (
            code >> 1 > v if increase else code >> 1 < v))
        w_code = card.wait[wi]
        self._perform_swap(card, i, wi)
        if self.observer is not None:
            self.observer({"kind": "swap", "round": rnd, "rank": card.rank,
                           "mode": "increase" if increase else "decrease",
                           "out_blk": v, "in_blk": w_code >> 1, "newly_added": True,
                           "dist_before": base, "dist_after": base, "tie_rule": True,
                           "tot_blk": card.tot})
        return True

    def _perform_swap(self, card: _Card, ri: int, wi: int) -> None:
        r_code = card.take_running(ri)
        w_code = card.take_waiting(wi)
        plan = self.plans[card.rank]
        plan.out_blk.append(r_code >> 1)
        plan.in_blk.append(w_code >> 1)
        delta = (w_code >> 1) - (r_code >> 1)
        card.tot += delta
        self.total += delta
        card.put_running(w_code)
        card.put_waiting(r_code)

    def drop(self, rnd: int) -> bool:
        """D.6 on the most loaded card (``cards[0]``; the cards are sorted whenever this
        runs, so ``cards[1]`` holds the largest other total)."""
        card = self.cards[0]
        observer = self.observer
        num = self.num_running
        if num <= 1:
            if observer is not None:
                observer({"kind": "no_drop", "round": rnd, "rank": card.rank,
                          "throughput": None})
            return False
        m = card.tot
        s = max(self.cards[1].tot, 0) if self.n > 1 else 0
        tp = num / (THROUGHPUT_FIXED + THROUGHPUT_PER_BLOCK * m)
        chosen = first_hit = None
        tie_rule = False
        if self.protect_fill:
            # Only requests that ran before this plan may be dropped; without a newly
            # added candidate an equal throughput never wins, so the first strictly best
            # item (running order) is the choice.
            tp_best = tp
            for i, code in enumerate(card.run):
                if not code & 1:
                    tp_i = (num - 1) / (THROUGHPUT_FIXED
                                        + THROUGHPUT_PER_BLOCK * max(m - (code >> 1), s))
                    if tp_i > tp_best:
                        chosen, tp_best = i, tp_i
        elif card.run:
            if card.rcode is None:
                card.build_index()
            m_best = max(m - card.max_running(), s)
            tp_best = (num - 1) / (THROUGHPUT_FIXED + THROUGHPUT_PER_BLOCK * m_best)
            if tp_best >= tp:
                need_newly = tp_best == tp
                for i, code in enumerate(card.run):
                    if max(m - (code >> 1), s) == m_best:
                        if code & 1:
                            chosen = i
                            break
                        if first_hit is None:
                            first_hit = i
                            if card.nnew == 0:
                                break
                tie_rule = need_newly or (chosen is not None and first_hit is not None)
                if chosen is None and not need_newly:
                    chosen = first_hit
        if chosen is None:
            if observer is not None:
                observer({"kind": "no_drop", "round": rnd, "rank": card.rank,
                          "throughput": tp})
            return False
        if card.rcode is None:
            card.build_index()
        code = card.take_running(chosen)
        v = code >> 1
        self.plans[card.rank].out_blk.append(v)
        card.tot -= v
        self.total -= v
        self.num_running -= 1
        card.put_waiting(code)
        if observer is not None:
            observer({"kind": "drop", "round": rnd, "rank": card.rank, "blk": v,
                      "newly_added": bool(code & 1), "throughput_before": tp,
                      "throughput_after": tp_best,
                      "tie_rule": tie_rule, "tot_blk": card.tot})
        return True

    def run(self, max_iters: int) -> None:
        """D.7: the main loop."""
        cards = self.cards
        threshold = self.threshold
        observer = self.observer
        key = operator.attrgetter("tot")
        rnd = 0
        reason = "max_iters"
        bubble = None
        while rnd < max_iters:
            cards.sort(key=key, reverse=True)
            bubble = self.bubble(cards[0].tot)
            if observer is not None:
                observer({"kind": "round", "round": rnd,
                          "order": [c.rank for c in cards],
                          "tot_blk": [c.tot for c in sorted(cards, key=_rank_of)],
                          "avg": self.total / self.n, "bubble": bubble})
            if bubble < threshold:
                reason = _STOP_BUBBLE
                break
            swapped = False
            low = cards[-1]
            if self.swap(low, True, rnd):
                swapped = True
                # Only the least loaded card changed (it grew).
                bubble = self.bubble(max(cards[0].tot, low.tot))
                if bubble < threshold:
                    reason = _STOP_BUBBLE
                    break
                cards.sort(key=key, reverse=True)
            if self.swap(cards[0], False, rnd):
                swapped = True
            dropped = False if swapped else self.drop(rnd)
            # Only cards[0] changed (it shrank); the others are still sorted.
            bubble = self.bubble(cards[0].tot if self.n == 1
                                 else max(cards[0].tot, cards[1].tot))
            if bubble < threshold:
                reason = _STOP_BUBBLE
                break
            if not (swapped or dropped):
                reason = "no_progress"
                break
            rnd += 1
        if observer is not None:
            observer({"kind": "stop", "reason": reason, "round": rnd, "bubble": bubble})


def _rank_of(card: _Card) -> int:
    return card.rank


def _cancel(plan: Plan) -> list[int]:
    """D.8: each ``in`` value cancels the first not yet cancelled equal ``out`` value, so
    per value the first ``min(#in, #out)`` occurrences go on both sides. Returns the
    cancelled values (``in`` order)."""
    common = Counter(plan.in_blk) & Counter(plan.out_blk)
    if not common:
        return []
    left = dict(common)
    kept_in, cancelled = [], []
    for v in plan.in_blk:
        if left.get(v):
            left[v] -= 1
            cancelled.append(v)
        else:
            kept_in.append(v)
    left = dict(common)
    kept_out = []
    for v in plan.out_blk:
        if left.get(v):
            left[v] -= 1
        else:
            kept_out.append(v)
    plan.in_blk = kept_in
    plan.out_blk = kept_out
    return cancelled


def balance_load(requests_by_rank, dp_size: int, *, max_num_seqs: int | None = None,
                 threshold: float = 5.0, max_iters: int = 1000,
                 observer=None) -> list[Plan]:
    """Plan one step for every DP rank (spec D); every rank calls this on the same
    gathered snapshot and keeps ``plans[dp_rank]``.

    ``requests_by_rank[r]`` is ``(blks, split)``: rank r's running block counts followed
    by its admission candidates' counts, ``split`` = number of running entries; parsing
    stops at the first 0 and ranks beyond the sequence are empty. ``max_num_seqs`` None
    skips the fill step. ``observer`` receives the decision events described in the
    module docstring.

    With numba installed (``IMPLEMENTATION == "numba"``) calls without an observer run
    the compiled planner of ``dyntra_lb.planner_native``; calls with an observer (the
    compiled loop emits no events) and inputs it does not take run
    :func:`balance_load_python`. Both give the same plans.
    """
    if observer is None:
        plans = balance_load_native(requests_by_rank, dp_size, max_num_seqs=max_num_seqs,
                                    threshold=threshold, max_iters=max_iters)
        if plans is not None:
            return plans
    return balance_load_python(requests_by_rank, dp_size, max_num_seqs=max_num_seqs,
                               threshold=threshold, max_iters=max_iters, observer=observer)


def balance_load_native(requests_by_rank, dp_size: int, *, max_num_seqs: int | None = None,
                        threshold: float = 5.0, max_iters: int = 1000) -> list[Plan] | None:
    """:func:`balance_load` (no observer) on the compiled planner alone, or None when
    numba is not installed or the compiled planner declines the input (see
    ``dyntra_lb.planner_native.plan``)."""
    if dp_size < 1:
        raise ValueError(f"dp_size must be >= 1, got {dp_size}")
    if _native is None:
        return None
    rows = _native.plan(requests_by_rank, dp_size, max_num_seqs, threshold, max_iters,
                        THROUGHPUT_FIXED, THROUGHPUT_PER_BLOCK, _MAX_TOTAL_BLOCKS)
    if rows is None:
        return None
    return [Plan(out_blk, in_blk, not in_blk) for out_blk, in_blk in rows]


def balance_load_python(requests_by_rank, dp_size: int, *, max_num_seqs: int | None = None,
                        threshold: float = 5.0, max_iters: int = 1000,
                        observer=None, protect_fill: bool = False) -> list[Plan]:
    """:func:`balance_load` in pure Python: the fallback without numba, the path of
    every call with an observer, and the second implementation the tests compare.
    ``protect_fill`` True is the opt-in ``fill-protect`` planner of
    ``dyntra_lb.planners`` (the throughput drop never takes a request the fill step
    admitted); False is the reference."""
    if dp_size < 1:
        raise ValueError(f"dp_size must be >= 1, got {dp_size}")
    parsed = [_parse(requests_by_rank, r) for r in range(dp_size)]
    bound = sum(b for _, b in parsed)
    if bound >= _MAX_TOTAL_BLOCKS:
        raise ValueError("block counts too large: the planner is exact only while the sum "
                         f"of all block counts stays below 2**48 (got up to {bound})")
    cards = [card for card, _ in parsed]
    plans = [Plan() for _ in range(dp_size)]
    if observer is not None:
        observer({"kind": "parsed", "cards": [
            {"rank": c.rank, "running": [x >> 1 for x in c.run],
             "waiting": [x >> 1 for x in c.wait], "tot_blk": c.tot} for c in cards]})
    planner = _Planner(cards, plans, threshold, observer, protect_fill)
    if max_num_seqs is not None:
        planner.fill(max_num_seqs)
    planner.run(max_iters)
    for rank, plan in enumerate(plans):
        cancelled = _cancel(plan)
        plan.freeze = not plan.in_blk
        if cancelled and observer is not None:
            observer({"kind": "cancel", "rank": rank, "cancelled": cancelled,
                      "out_blk": list(plan.out_blk), "in_blk": list(plan.in_blk)})
    if observer is not None:
        observer({"kind": "plans", "plans": [p.to_dict() for p in plans]})
    return plans


def warm_up() -> None:
    """Compile the numba planner now (or load it from numba's disk cache), so that the
    first decode step does not pay for it; a no-op on the Python path. Each rank calls
    it once at start-up (``DyntraLBCoordinator.__init__``)."""
    if _native is not None:
        balance_load([([2, 1, 3], 1), ([1], 1)], 2, max_num_seqs=2)
