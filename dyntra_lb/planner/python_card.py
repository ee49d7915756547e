"""The Python planner's card (``dyntra_lb/planner/python.py``): one rank during a
``balance_load`` call, with the search index that makes a swap search cost O(1) bigint
operations plus a short scan, and the two searches for the achievable difference
nearest to the vertex. Why they give the reference's choices is the argument in the
module docstring of ``python.py`` ("Achievable differences", "Which pair").
Only that module uses these."""

from __future__ import annotations

from collections import Counter

import numpy as np

# Cards whose sizes all lie in [1, _BITSET_LIMIT] get bitsets; larger sizes take the
# vectorised search (bitsets of that many bits would cost more than they save).
_BITSET_LIMIT = 1 << 16
# Longest outward walk over candidate differences before the vectorised search.
_MAX_WALK = 48

# Up to this many qualifying running sizes, a swap finds its item with list.index.
_FEW_SIZES = 4


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
