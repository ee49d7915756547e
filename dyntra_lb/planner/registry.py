"""The planner registry: which planner a DyntraLB run uses, by name.

Every place that runs a planner by name (the coordinator of each rank, ``dyntra-emu
replay`` and ``explain``, the vllm-ascend planner swap) looks it up here with :func:`get`
and calls it like :func:`dyntra_lb.planner.front.balance_load`:
``planner(requests_by_rank, dp_size, *, max_num_seqs=None, threshold=5.0, max_iters=1000,
observer=None) -> list[Plan]``. A planner is a pure function of the gathered snapshot:
every rank calls it on the same input and must get the same plans.

- ``reference`` (the default): today's planner, the one production runs
  (``dyntra_lb.planner.front.balance_load``: compiled with numba when installed, else Python).
  It is the only one that must match vllm-ascend's ``_balance_load``, quirks included.
- ``fill-protect`` (opt-in): :func:`fill_protect`.

An improvement is added here under a new name, with tests showing what it changes; the
default never changes.
"""

from __future__ import annotations

from collections.abc import Callable

from dyntra_lb.planner.front import Plan, balance_load, balance_load_python

Planner = Callable[..., list[Plan]]

REFERENCE = "reference"


def fill_protect(requests_by_rank, dp_size: int, *, max_num_seqs: int | None = None,
                 threshold: float = 5.0, max_iters: int = 1000,
                 observer=None) -> list[Plan]:
    """The reference planner, except that the throughput drop (docs/planner.md) never takes a
    request the fill step admitted into a free slot in the same plan.

    Why: in the reference a paused request sits at the head of its rank's waiting list,
    so on the next step the fill admits it into the slot its pause freed; when it is
    long, the drop then finds it the best request to take out again, and cancellation
    (docs/planner.md) turns "admit it, pause it" into nothing. That repeats every step
    while the other ranks are lightly loaded (docs/protocol.md, quirk Q5), so a long
    request can stay paused for most of a run. Here the drop chooses only among requests
    that ran before this plan, so a request the fill admits runs at least one step.
    Everything else (fill, swaps with their tie rule, cancellation, freeze) is the
    reference's. It runs on the Python planner (no compiled path); benchmarks/RESULTS.md
    ("Planners") has its ``ab`` numbers against the reference, the bundled ``default``
    workload's starved request among them.
    """
    return balance_load_python(requests_by_rank, dp_size, max_num_seqs=max_num_seqs,
                               threshold=threshold, max_iters=max_iters, observer=observer,
                               protect_fill=True)


PLANNERS: dict[str, Planner] = {REFERENCE: balance_load, "fill-protect": fill_protect}
NAMES = tuple(PLANNERS)


def get(name: str) -> Planner:
    """The planner registered as ``name``; ValueError naming the choices otherwise."""
    try:
        return PLANNERS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown planner {name!r}; choose one of {list(NAMES)}") from None
