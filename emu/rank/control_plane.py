"""DyntraLB's control plane in virtual time: what DyntraLB's part of an iteration adds on
the critical path between the forward whose outputs it gathered and the next forward.

After every non-idle iteration's wave sync, a DyntraLB rank may join the dynamic-mode
flag all-reduce (MAX), join the snapshot all-gather, and run the planner on the gathered
snapshot (``dyntra_lb.coordinator``, vllm-ascend's ``run_balance_load``). None of it is a
forward, so the step-cost profile (``emu.rank.costs``) does not price it; this module
does, with the profile's ``control_plane`` terms (``ControlPlaneCost``; None turns the
charge off and leaves the event logs as they were before it existed):

- each DyntraLB collective: a latency in the DP size and the bytes each rank receives;
- the planner: a model of its work on the gathered snapshot (``planner_work``: how many
  requests it parsed, how many (running, waiting) pairs its swap searches examined, how
  many rounds it ran), fitted to the measured time of production's ``_balance_load``
  (docs/cost-models.md says where every default comes from).

Both are functions of what every rank has in common (the collectives it joined, the
snapshot all ranks gathered, the config), so every rank charges the same, the ranks stay
in lockstep, and the kit and vllm-ascend runs of one spec stay identical. The harness
(``emu.rank.harness``) asks ``ControlPlane.charge`` once per non-idle iteration and
advances the rank's clock by the result, which the step record carries.

``--planner-cost measured`` (``RunSpec.planner_cost``) charges the planner's measured
wall time instead of the model: the slowest rank's, shared by one more MAX all-reduce
on the DP group (the emulator's own, recorded as ``emu.planner_cost``), so the clocks stay
equal. Such a run is not deterministic.

Under vLLM's async scheduling the forward submitted in an iteration runs on the device
while the host joins the collectives and plans: the control plane overlaps that forward
and delays the next one only by the part that outlasts it, ``max(0, control - step)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.distributed as dist

from dyntra_lb.planner import registry as planners
from emu.rank.control_costs import ControlCharge, ControlPlaneCost, PlannerWork
from emu.sites import ALLGATHER_SITE, FLAG_SITE, PLANNER_COST_SITE

# The collectives charged: DyntraLB's own (vLLM's wave sync every 32nd step and the
# lockstep stand-in for the forward's collectives are not DyntraLB's work).
CHARGED_SITES = frozenset((FLAG_SITE, ALLGATHER_SITE))


# ------------------------------------------------------------------------ planner work


class _WorkCounter:
    """An observer of ``dyntra_lb.planner.front`` (its "Observer events") that counts the
    planner's work on one snapshot: every round the reference algorithm
    (docs/planner.md, ``find_best_swap``) scans the least loaded rank's running x waiting
    pairs and then the most loaded rank's, unless the round starts balanced within
    ``threshold``; a rank's list sizes change by the fill and the throughput drop (a swap
    exchanges one for one). Counted on the ranks in the order the round starts with.
    The ``stop`` event, the last one counted, ends the planner's call (``_Counted``)."""

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold
        self.requests = self.pairs = self.rounds = 0
        self._sizes: dict[int, list[int]] = {}

    def __call__(self, event: dict) -> None:
        kind = event["kind"]
        if kind == "round":
            self.rounds += 1
            if event["bubble"] >= self.threshold:
                order = event["order"]
                for rank in {order[-1], order[0]}:
                    running, waiting = self._sizes[rank]
                    self.pairs += running * waiting
        elif kind == "parsed":
            for card in event["cards"]:
                self._sizes[card["rank"]] = [len(card["running"]), len(card["waiting"])]
                self.requests += len(card["running"]) + len(card["waiting"])
        elif kind in ("fill", "drop"):
            sizes = self._sizes[event["rank"]]
            moved = 1 if kind == "fill" else -1
            sizes[0] += moved
            sizes[1] -= moved
        elif kind == "stop":
            # The main loop is over and nothing after it is counted: skip the rest of
            # the call (the cancellation pass, the plans), about half its time.
            raise _Counted


class _Counted(Exception):
    """Raised by a ``_WorkCounter`` at the planner's ``stop`` event, ending the call."""


# The last snapshot counted: (key, work). Rank threads of one process plan the same
# snapshot one after the other, so the first counts and the others find it; in a rank
# process it is that rank's own. The key is all the count depends on.
_last_count: list = [None, None]


def planner_work(requests_by_rank, dp_size: int, *, max_num_seqs: int, threshold: float,
                 planner: str) -> PlannerWork:
    """The work of ``planner`` (a ``dyntra_lb.planner.registry`` name; production's
    ``_balance_load`` is the reference algorithm) on the gathered snapshot, as
    ``_WorkCounter`` counts it. A function of its arguments alone, so every rank and both
    impls (the kit's int32 rows, vllm-ascend's lists) get the same count."""
    key = (planner, dp_size, max_num_seqs, float(threshold), _snapshot_key(requests_by_rank))
    if _last_count[0] != key:
        counter = _WorkCounter(threshold)
        try:
            planners.get(planner)(requests_by_rank, dp_size, max_num_seqs=max_num_seqs,
                                  threshold=threshold, observer=counter)
        except _Counted:
            pass
        _last_count[:] = [key, PlannerWork(counter.requests, counter.pairs, counter.rounds)]
    return _last_count[1]


def _snapshot_key(requests_by_rank) -> tuple:
    """The gathered snapshot as a key, made at the least cost for each impl's rows (every
    rank makes it every planned step): the kit's int32 arrays, of one dtype, as their
    bytes, vllm-ascend's lists of ints as tuples; and every rank's split."""
    blocks = [blks for blks, _ in requests_by_rank]
    splits = tuple([int(split) for _, split in requests_by_rank])
    first = blocks[0] if blocks else None
    if type(first) is np.ndarray:
        dtype = first.dtype
        if all(type(blks) is np.ndarray and blks.dtype == dtype for blks in blocks):
            return dtype.str, tuple([blks.tobytes() for blks in blocks]), splits
    return "rows", tuple(map(_row_key, blocks)), splits


def _row_key(blks) -> tuple:
    """One rank's block counts as a key: an array as its dtype and bytes, a list of ints
    as a tuple."""
    if type(blks) is np.ndarray:
        return blks.dtype.str, blks.tobytes()
    return "list", tuple(blks)


# ------------------------------------------------------------------------ the charge


class PlannerCall(NamedTuple):
    """The planner's arguments in one iteration, as the rank's engine saw them."""

    requests_by_rank: Any
    max_num_seqs: int
    threshold: float


class ControlPlane:
    """One rank's pricing of DyntraLB's control plane (see the module docstring).

    ``planner``: the planner whose work is modelled (a ``dyntra_lb.planner.registry`` name;
    "vllm-ascend", production's ``_balance_load``, counts as the reference algorithm it
    is). ``measured``: charge the planner's measured wall time (``exchange`` is then
    the MAX all-reduce over the DP group that makes it the slowest rank's). ``overlap``:
    async scheduling (the control plane overlaps the iteration's forward).
    """

    def __init__(self, cost: ControlPlaneCost, *, dp_size: int, planner: str,
                 overlap: bool, exchange: Callable[[int], int] | None = None):
        self.cost = cost
        self.dp_size = dp_size
        self.planner = planners.REFERENCE if planner == "vllm-ascend" else planner
        self.overlap = overlap
        self.exchange = exchange
        # Each collective's latency by (op, dtype, *shape): a rank joins the same few
        # collectives on every step.
        self._latencies: dict[tuple, int] = {}

    def charge(self, collectives: list[dict], planner_call: PlannerCall | None,
               step_us: int, planner_wall_s: float) -> ControlCharge:
        """The control plane of the iteration that joined ``collectives`` (its recorded
        collectives), planned ``planner_call`` (None: no all-gather) in
        ``planner_wall_s`` of wall time, and ran a forward of ``step_us``."""
        cost, dp = self.cost, self.dp_size
        collectives_us = 0
        latencies = self._latencies
        for c in collectives:
            if c["site"] in CHARGED_SITES:
                key = (c["op"], c["dtype"], *c["shape"])
                latency = latencies.get(key)
                if latency is None:
                    latency = latencies[key] = cost.collective_us(c["op"], c["shape"],
                                                                  c["dtype"], dp)
                collectives_us += latency
        planner_us = 0
        if planner_call is not None and self.exchange is None:
            planner_us = cost.planner_us(planner_work(
                planner_call.requests_by_rank, dp, max_num_seqs=planner_call.max_num_seqs,
                threshold=planner_call.threshold, planner=self.planner))
        elif planner_call is not None:
            planner_us = self.exchange(round(planner_wall_s * 1e6))
        total = collectives_us + planner_us
        charged = max(0, total - step_us) if self.overlap else total
        return ControlCharge(collectives_us, planner_us, charged, self.exchange is not None)


def max_over_ranks(dp_group: Any, recorder: Callable) -> Callable[[int], int]:
    """The ``exchange`` of ``--planner-cost measured``: a MAX all-reduce of one int64
    over the DP group, through the rank's collective recorder."""
    buffer = torch.zeros(1, dtype=torch.int64)

    def exchange(value_us: int) -> int:
        buffer[0] = value_us
        recorder(PLANNER_COST_SITE, "all_reduce_max", buffer,
                 lambda: dist.all_reduce(buffer, op=dist.ReduceOp.MAX, group=dp_group))
        return int(buffer[0])

    return exchange
