"""The Python planner of docs/planner.md: the decisions of ``dyntra_lb.planner.front.balance_load``
in plain Python, for every call with an observer, for the inputs the compiled planner
declines, and wherever numba is missing (``dyntra_lb/planner/front.py`` says which calls come
here). The docstrings of the planner's steps start with the docs/planner.md heading that
describes the step. Each rank is a card (``dyntra_lb/planner/python_card.py``: the card
with its search index, and the nearest-difference searches).

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
"""

from __future__ import annotations

import operator
from collections import Counter

import numpy as np

from dyntra_lb.planner.python_card import _Card, _nearest_by_search, _nearest_by_walk

# Block counts arrive as int32 (docs/protocol.md, "The payload").
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1

_STOP_BUBBLE = "bubble_below_threshold"


def _parse(requests_by_rank, rank: int) -> tuple[_Card, int]:
    """Input and parsing: running = entries before ``split``, waiting = the rest, up to the first 0.
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


class _Planner:
    """State of one ``balance_load`` call (the reference's closures, made explicit)."""

    def __init__(self, cards, threshold, observer, protect_fill, tp_fixed, tp_per_block):
        self.cards = cards
        # Per rank, the sizes taken out of / put into running, in the reference's order.
        self.outs: list[list[int]] = [[] for _ in cards]
        self.ins: list[list[int]] = [[] for _ in cards]
        self.n = len(cards)
        self.total = sum(c.tot for c in cards)
        self.num_running = sum(len(c.run) for c in cards)
        self.threshold = threshold
        self.ratio = threshold < 1
        self.observer = observer
        self.protect_fill = protect_fill
        self.tp_fixed = tp_fixed
        self.tp_per_block = tp_per_block

    def bubble(self, max_blk: int) -> float:
        """Bubble metric, given the current maximum ``tot_blk``."""
        avg = self.total / self.n
        if self.ratio:
            if max_blk <= 0:
                return 0.0
            return (max_blk - avg) / max_blk
        return max_blk - avg

    def fill(self, max_num_seqs: int) -> None:
        """Fill step: admit the head of each rank's waiting list into its free slots."""
        observer = self.observer
        for card in self.cards:
            k = min(max_num_seqs - len(card.run), len(card.wait))
            if k <= 0:
                continue
            values = [code >> 1 for code in card.wait[:k]]
            del card.wait[:k]
            card.run.extend([v << 1 | 1 for v in values])
            card.nnew += k
            self.ins[card.rank].extend(values)
            self.total += sum(values)
            self.num_running += k
            for v in values:
                card.tot += v
                if observer is not None:
                    observer({"kind": "fill", "rank": card.rank, "blk": v,
                              "tot_blk": card.tot})

    def swap(self, card: _Card, increase: bool, rnd: int) -> bool:
        """Swap search: find and perform the best swap on ``card``; True if one was made."""
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
        """Swap search with one rank: target == tot, so every distance (and the baseline) is
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
        self.outs[card.rank].append(r_code >> 1)
        self.ins[card.rank].append(w_code >> 1)
        delta = (w_code >> 1) - (r_code >> 1)
        card.tot += delta
        self.total += delta
        card.put_running(w_code)
        card.put_waiting(r_code)

    def drop(self, rnd: int) -> bool:
        """Throughput-drop heuristic on the most loaded card (``cards[0]``; the cards are
        sorted whenever this runs, so ``cards[1]`` holds the largest other total)."""
        card = self.cards[0]
        observer = self.observer
        num = self.num_running
        fixed, per_block = self.tp_fixed, self.tp_per_block
        if num <= 1:
            if observer is not None:
                observer({"kind": "no_drop", "round": rnd, "rank": card.rank,
                          "throughput": None})
            return False
        m = card.tot
        s = max(self.cards[1].tot, 0) if self.n > 1 else 0
        tp = num / (fixed + per_block * m)
        chosen = first_hit = None
        tie_rule = False
        if self.protect_fill:
            # Only requests that ran before this plan may be dropped; without a newly
            # added candidate an equal throughput never wins, so the first strictly best
            # item (running order) is the choice.
            tp_best = tp
            for i, code in enumerate(card.run):
                if not code & 1:
                    tp_i = (num - 1) / (fixed + per_block * max(m - (code >> 1), s))
                    if tp_i > tp_best:
                        chosen, tp_best = i, tp_i
        elif card.run:
            if card.rcode is None:
                card.build_index()
            m_best = max(m - card.max_running(), s)
            tp_best = (num - 1) / (fixed + per_block * m_best)
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
        self.outs[card.rank].append(v)
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
        """Main loop."""
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


def _cancel(out_blk: list[int], in_blk: list[int]) -> tuple[list[int], list[int], list[int]]:
    """Cancellation: each ``in`` value cancels the first not yet cancelled equal ``out``
    value, so per value the first ``min(#in, #out)`` occurrences go on both sides. Returns
    the surviving ``out`` and ``in`` values and the cancelled values (``in`` order)."""
    common = Counter(in_blk) & Counter(out_blk)
    if not common:
        return out_blk, in_blk, []
    left = dict(common)
    kept_in, cancelled = [], []
    for v in in_blk:
        if left.get(v):
            left[v] -= 1
            cancelled.append(v)
        else:
            kept_in.append(v)
    left = dict(common)
    kept_out = []
    for v in out_blk:
        if left.get(v):
            left[v] -= 1
        else:
            kept_out.append(v)
    return kept_out, kept_in, cancelled


def plan(requests_by_rank, dp_size: int, max_num_seqs, threshold, max_iters,
         tp_fixed: float, tp_per_block: float, max_total: int, observer=None,
         protect_fill: bool = False) -> list[tuple[list[int], list[int]]]:
    """``dyntra_lb.planner.front.balance_load_python`` for ``dp_size >= 1``: per rank the (out
    sizes, in sizes) lists after cancellation, with the reference's throughput constants
    and exactness bound passed in by ``dyntra_lb.planner.front``. ``observer`` receives every
    event of that module's docstring except the last (``plans``), which the caller sends
    once it has made the plans."""
    parsed = [_parse(requests_by_rank, r) for r in range(dp_size)]
    bound = sum(b for _, b in parsed)
    if bound >= max_total:
        raise ValueError("block counts too large: the planner is exact only while the sum "
                         f"of all block counts stays below 2**{max_total.bit_length() - 1} "
                         f"(got up to {bound})")
    cards = [card for card, _ in parsed]
    if observer is not None:
        observer({"kind": "parsed", "cards": [
            {"rank": c.rank, "running": [x >> 1 for x in c.run],
             "waiting": [x >> 1 for x in c.wait], "tot_blk": c.tot} for c in cards]})
    planner = _Planner(cards, threshold, observer, protect_fill, tp_fixed, tp_per_block)
    if max_num_seqs is not None:
        planner.fill(max_num_seqs)
    planner.run(max_iters)
    rows = []
    for rank in range(dp_size):
        out_blk, in_blk, cancelled = _cancel(planner.outs[rank], planner.ins[rank])
        if cancelled and observer is not None:
            observer({"kind": "cancel", "rank": rank, "cancelled": cancelled,
                      "out_blk": list(out_blk), "in_blk": list(in_blk)})
        rows.append((out_blk, in_blk))
    return rows
