"""DyntraLB planner (docs/planner.md): the gathered snapshot -> one plan per DP rank.

Every rank calls :func:`balance_load` on the decoded all-gather payload after each active
decode step and keeps its own row. It sits on the decode critical path, so it has to be
fast, and all ranks must agree, so it has to be exact: the output equals the reference
algorithm of docs/planner.md (transcribed literally in ``tests/literal_planner.py``) for
every input, quirks included (docs/protocol.md, quirks Q4, Q7, Q8).

Two implementations, one entry point
------------------------------------
This module is the entry point: :func:`balance_load`, the :class:`Plan` rows it returns
and the reference's constants. Two implementations make the decisions: the Python
planner (``dyntra_lb/planner/python.py``, :func:`balance_load_python`; its docstring
explains how it is fast while giving identical plans) and, with numba installed (the
``fast`` extra; the ``test`` extra includes it), the compiled planner
(``dyntra_lb/planner/compiled.py``, :func:`balance_load_native`), which compiles the same
decisions into one loop. :func:`balance_load` sends every call without an observer to
the compiled planner (``IMPLEMENTATION`` says which one was picked at import). The
compiled loop emits no observer events, so calls with an observer run the Python
planner, as do inputs of types a payload never has (float sizes, say), where the Python
planner's own conversions and errors apply. Both take the constants from here and
return per rank the sizes to pause and to admit after cancellation; this module makes
the plans. Both give identical plans; the tests check both against the literal oracle.
:func:`warm_up` moves numba's compile (or disk-cache load) to rank start-up.

Observer events
---------------
``observer`` is None (no cost) or a callable receiving one dict per decision point, in
this order. Sizes are block counts; ``round`` is the reference's round counter (it only
advances on productive rounds).

* ``{"kind": "parsed", "cards": [{"rank", "running": [...], "waiting": [...],
  "tot_blk"}]}`` — after parsing (docs/planner.md, "Input and parsing"), per rank in rank order.
* ``{"kind": "fill", "rank", "blk", "tot_blk"}`` — one per waiting item pulled into a
  free slot (fill step); ``tot_blk`` is the rank's total after the pull.
* ``{"kind": "round", "round", "order": [ranks, most loaded first], "tot_blk": [per rank,
  indexed by rank], "avg", "bubble"}`` — start of each round, after the sort (main loop,
  step 1).
* ``{"kind": "swap", "round", "rank", "mode": "increase" | "decrease", "out_blk",
  "in_blk", "newly_added" (of the swapped-out item), "dist_before", "dist_after",
  "tie_rule", "tot_blk"}`` — one per performed swap. ``tie_rule`` is true when the
  newly-added tie rule decided it (a zero-gain swap, or a newly added item preferred over
  an earlier equally good one).
* ``{"kind": "drop", "round", "rank", "blk", "newly_added", "throughput_before",
  "throughput_after", "tie_rule", "tot_blk"}`` — the throughput heuristic paused a
  running item (throughput-drop heuristic); ``tie_rule`` as for swaps (equal throughput,
  newly added wins).
* ``{"kind": "no_drop", "round", "rank", "throughput"}`` — the heuristic was tried and
  found nothing (``throughput`` is None when at most one request runs in total).
* ``{"kind": "stop", "reason": "bubble_below_threshold" | "no_progress" | "max_iters",
  "round", "bubble"}`` — why the loop ended (``bubble`` is the last value computed).
* ``{"kind": "cancel", "rank", "cancelled": [...], "out_blk", "in_blk"}`` — per rank with
  at least one cancelled pair (cancellation): the cancelled values, and the lists that survive.
* ``{"kind": "plans", "plans": [plan dicts, by rank]}`` — the result.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dyntra_lb.planner import python as _python

try:  # the compiled planner (the "fast" extra); without numba the Python one runs
    from dyntra_lb.planner import compiled as _native
except ImportError:
    _native = None

# Which planner serves balance_load calls without an observer.
IMPLEMENTATION = "python" if _native is None else "numba"

# The throughput-drop heuristic's constants (docs/planner.md).
THROUGHPUT_FIXED = 20000
THROUGHPUT_PER_BLOCK = 19.2

# The float argument of ``python.py``'s docstring needs rounding errors far below
# 1/4: true while the sum of all |block counts| stays below _MAX_TOTAL_BLOCKS (a real
# payload, int32 block counts, is far below).
_MAX_TOTAL_BLOCKS = 2**48


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


def balance_load(requests_by_rank, dp_size: int, *, max_num_seqs: int | None = None,
                 threshold: float = 5.0, max_iters: int = 1000,
                 observer=None) -> list[Plan]:
    """Plan one step for every DP rank (docs/planner.md); every rank calls this on the same
    gathered snapshot and keeps ``plans[dp_rank]``.

    ``requests_by_rank[r]`` is ``(blks, split)``: rank r's running block counts followed
    by its admission candidates' counts, ``split`` = number of running entries; parsing
    stops at the first 0 and ranks beyond the sequence are empty. ``max_num_seqs`` None
    skips the fill step. ``observer`` receives the decision events described in the
    module docstring.

    With numba installed (``IMPLEMENTATION == "numba"``) calls without an observer run
    the compiled planner of ``dyntra_lb.planner.compiled``; calls with an observer (the
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
    ``dyntra_lb.planner.compiled.plan``)."""
    if dp_size < 1:
        raise ValueError(f"dp_size must be >= 1, got {dp_size}")
    if _native is None:
        return None
    rows = _native.plan(requests_by_rank, dp_size, max_num_seqs, threshold, max_iters,
                        THROUGHPUT_FIXED, THROUGHPUT_PER_BLOCK, _MAX_TOTAL_BLOCKS)
    if rows is None:
        return None
    return _plans(rows)


def balance_load_python(requests_by_rank, dp_size: int, *, max_num_seqs: int | None = None,
                        threshold: float = 5.0, max_iters: int = 1000,
                        observer=None, protect_fill: bool = False) -> list[Plan]:
    """:func:`balance_load` in pure Python: the fallback without numba, the path of
    every call with an observer, and the second implementation the tests compare.
    ``protect_fill`` True is the opt-in ``fill-protect`` planner of
    ``dyntra_lb.planner.registry`` (the throughput drop never takes a request the fill step
    admitted); False is the reference."""
    if dp_size < 1:
        raise ValueError(f"dp_size must be >= 1, got {dp_size}")
    plans = _plans(_python.plan(requests_by_rank, dp_size, max_num_seqs, threshold,
                                max_iters, THROUGHPUT_FIXED, THROUGHPUT_PER_BLOCK,
                                _MAX_TOTAL_BLOCKS, observer, protect_fill))
    if observer is not None:
        observer({"kind": "plans", "plans": [p.to_dict() for p in plans]})
    return plans


def _plans(rows: list[tuple[list[int], list[int]]]) -> list[Plan]:
    """An implementation's (out sizes, in sizes) per rank as plans: a rank that admits
    nothing freezes (docs/planner.md, "Freeze")."""
    return [Plan(out_blk, in_blk, not in_blk) for out_blk, in_blk in rows]


def warm_up() -> None:
    """Compile the numba planner now (or load it from numba's disk cache), so that the
    first decode step does not pay for it; a no-op on the Python path. Each rank calls
    it once at start-up (``DyntraLBCoordinator.__init__``)."""
    if _native is not None:
        balance_load([([2, 1, 3], 1), ([1], 1)], 2, max_num_seqs=2)
