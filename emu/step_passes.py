"""The two passes emu.metrics makes over a run's steps, each holding a chunk or a window
of them at a time (emu.records.ranks), so that the metrics of a run of hours need no
more memory than those of minutes:

- ``rank_pass``: rank after rank, each rank's steps in order: what metrics.json adds up
  in record order (the bubble's sums, each rank's utilisation), counts per rank, rank
  0's control plane and waves;
- ``window_pass``: the same steps of every rank, window after window: what is figured
  per step across ranks (bubble, balance, headroom's balance ratio, the steps in which
  some rank planned or applied a plan) and the lines the plots draw (emu.lines).

Sums run in record order, as a Python loop over the records would add them
(``ordered_sum``), so chunks and windows give the same floats as whole columns. A
run's steps carry DyntraLB's control plane on every step or on none (the cost profile
decides), so a chunk tells for the run."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from emu.lines import Envelope, RollingMean, Spans
from emu.records.columns import StepColumns
from emu.records.ranks import RankColumns

# Values turned into Python floats at a time by `ordered_sum`.
_SUM_CHUNK = 1 << 16


def ordered_sum(values: np.ndarray, start: float = 0) -> float:
    """``start`` plus the sum of ``values`` added in order (numpy's pairwise sum rounds
    differently), a chunk of Python floats at a time (a run of hours has millions)."""
    total = start
    for i in range(0, len(values), _SUM_CHUNK):
        total = sum(values[i:i + _SUM_CHUNK].tolist(), total)
    return total


def step_ends_s(steps: StepColumns) -> np.ndarray:
    """When each step ended: its clock, its step time, and what DyntraLB's control plane
    charged after it."""
    charged = steps.charged_s if steps.charged_s is not None else 0.0
    return steps.clock_s + steps.step_time_s + charged


@dataclass
class RankSteps:
    """One rank's sums and counts over its steps."""

    own_cost_s: float = 0
    step_time_s: float = 0
    dummy: int = 0
    running_blocks: int = 0
    max_running_blocks: int = 0
    steps: int = 0


@dataclass
class ControlSums:
    """Rank 0's control-plane charges (the same on every rank), summed in step order."""

    charged_s: float = 0
    collectives_s: float = 0
    planner_s: float = 0
    active_steps: int = 0
    active_charged_s: float = 0
    measured: bool = False


@dataclass
class RankFigures:
    """What ``rank_pass`` found."""

    ranks: list[RankSteps]
    end_s: float  # when the last step of any rank ended (0.0: no steps)
    busy_time_s: float  # rank 0's step times added
    waiting_s: float  # (step time - own cost), every rank's steps, rank after rank
    total_s: float  # step time, likewise
    control: ControlSums | None
    waves: int
    longest_wave_steps: int
    preempted: int = 0
    plan_outs: int = 0
    plan_ins: int = 0
    freeze_rank_steps: int = 0
    paused: int = 0
    resumed: int = 0


def rank_pass(steps: RankColumns[StepColumns]) -> RankFigures:
    """The sums and counts of ``steps`` taken rank after rank, chunk after chunk."""
    figures = RankFigures(ranks=[], end_s=0.0, busy_time_s=0, waiting_s=0, total_s=0,
                          control=None, waves=0, longest_wave_steps=0)
    waves = np.zeros(0, np.int64)
    for rank in range(len(steps)):
        mine = RankSteps()
        for chunk in steps.chunks(rank):
            if not len(chunk):
                continue
            figures.end_s = max(figures.end_s, float(np.max(step_ends_s(chunk))))
            mine.own_cost_s = ordered_sum(chunk.own_cost_s, mine.own_cost_s)
            mine.step_time_s = ordered_sum(chunk.step_time_s, mine.step_time_s)
            mine.dummy += int(chunk.dummy.sum())
            mine.running_blocks += int(chunk.running_blocks.sum())
            mine.max_running_blocks = max(mine.max_running_blocks,
                                          int(chunk.running_blocks.max()))
            mine.steps += len(chunk)
            figures.waiting_s = ordered_sum(chunk.step_time_s - chunk.own_cost_s,
                                            figures.waiting_s)
            figures.total_s = ordered_sum(chunk.step_time_s, figures.total_s)
            figures.preempted += int(chunk.preempted.sum())
            figures.plan_outs += int(chunk.plan_out.sum())
            figures.plan_ins += int(chunk.plan_in.sum())
            figures.freeze_rank_steps += int((chunk.plan_freeze & chunk.plan_applied).sum())
            figures.paused += int(chunk.paused.sum())
            figures.resumed += int(chunk.resumed.sum())
            if rank == 0:
                figures.busy_time_s = ordered_sum(chunk.step_time_s, figures.busy_time_s)
                waves = np.union1d(waves, chunk.wave)
                figures.longest_wave_steps = max(figures.longest_wave_steps,
                                                 int(chunk.step_counter.max()))
                if chunk.charged_s is not None:
                    figures.control = _add_control(figures.control or ControlSums(), chunk)
        figures.ranks.append(mine)
    figures.waves = len(waves)
    return figures


def _add_control(sums: ControlSums, chunk: StepColumns) -> ControlSums:
    sums.charged_s = ordered_sum(chunk.charged_s, sums.charged_s)
    sums.collectives_s = ordered_sum(chunk.collectives_s, sums.collectives_s)
    sums.planner_s = ordered_sum(chunk.planner_s, sums.planner_s)
    active = chunk.charged_s[chunk.lb_active]
    sums.active_steps += len(active)
    sums.active_charged_s = ordered_sum(active, sums.active_charged_s)
    sums.measured = sums.measured or bool(chunk.planner_measured.any())
    return sums


@dataclass
class StepSeries:
    """A run's per-step lines as the plots draw them (x, y; emu.lines): each rank's
    running KV blocks and the spread between the most and the least loaded rank, by
    iteration; the DP bubble in % of the step time, raw and smoothed, by virtual time;
    the spans of iterations in which some rank applied a plan."""

    loads: list[tuple[np.ndarray, np.ndarray]]
    imbalance: tuple[np.ndarray, np.ndarray]
    bubble: tuple[np.ndarray, np.ndarray]
    bubble_smooth: tuple[np.ndarray, np.ndarray]
    plan_spans: list[tuple[int, int]]
    max_running_blocks: int


@dataclass
class WindowFigures:
    """What ``window_pass`` found: per-step figures across ranks, summed in step order."""

    balance_sum: float = 0  # mean over max running blocks, steps with some load
    balance_steps: int = 0
    cost_balance_sum: float = 0  # mean over max own cost, steps with some work
    cost_balance_steps: int = 0
    sol_busy_s: float = 0.0  # step times scaled by that ratio
    planner_steps: int = 0  # steps in which some rank ran the planner
    plan_steps: int = 0  # steps in which some rank applied a plan
    series: StepSeries | None = field(default=None, repr=False)


def window_pass(steps: RankColumns[StepColumns]) -> WindowFigures:
    """The per-step figures and lines of ``steps``, window after window."""
    dp, n = len(steps), steps.n_rows
    figures = WindowFigures()
    loads = [Envelope(n) for _ in range(dp)]
    imbalance, bubble, smooth = Envelope(n), Envelope(n), Envelope(n)
    rolling, spans, top = RollingMean(n), Spans(), 0
    for window in steps.windows():
        first = window[0]
        if not len(first):
            continue
        own = [rank.own_cost_s for rank in window]
        peak = np.zeros(len(first))
        for values in own:
            peak = np.maximum(peak, values)
        busy = peak > 0
        ratios = _rank_sum([values[busy] for values in own]) / dp / peak[busy]
        figures.sol_busy_s = ordered_sum(first.step_time_s[busy] * ratios, figures.sol_busy_s)
        figures.cost_balance_sum = ordered_sum(ratios, figures.cost_balance_sum)
        figures.cost_balance_steps += len(ratios)

        blocks = np.array([rank.running_blocks for rank in window]).reshape(dp, len(first))
        most = blocks.max(axis=0, initial=0)
        balance = np.full(len(first), np.nan)
        some = most > 0
        balance[some] = blocks.sum(axis=0)[some] / dp / most[some]
        balance = balance[~np.isnan(balance)]
        figures.balance_sum = ordered_sum(balance, figures.balance_sum)
        figures.balance_steps += len(balance)

        figures.planner_steps += int(np.any([r.lb_active for r in window], axis=0).sum())
        applied = np.any([r.plan_applied for r in window], axis=0)
        figures.plan_steps += int(applied.sum())

        waiting = _rank_sum([r.step_time_s - r.own_cost_s for r in window])
        total = _rank_sum([r.step_time_s for r in window])
        per_step = np.divide(waiting, total, out=np.zeros_like(waiting), where=total != 0)
        for line, rank_blocks in zip(loads, blocks, strict=True):
            line.add(first.iter, rank_blocks)
        imbalance.add(first.iter, blocks.max(axis=0) - blocks.min(axis=0))
        bubble.add(first.clock_s, per_step * 100)
        smooth.add(*rolling.add(first.clock_s, per_step * 100))
        spans.add(first.iter, applied)
        top = max(top, int(most.max()))
    figures.series = StepSeries(
        loads=[line.finish() for line in loads], imbalance=imbalance.finish(),
        bubble=bubble.finish(), bubble_smooth=smooth.finish(), plan_spans=spans.finish(),
        max_running_blocks=top)
    return figures


def _rank_sum(rows: list[np.ndarray]) -> np.ndarray:
    """Per step, the sum over ranks of their ``rows``, added rank after rank (as ``sum``
    over a step's records adds them)."""
    total = None
    for values in rows:
        total = (np.zeros(values.shape, values.dtype) if total is None else total) + values
    return total if total is not None else np.zeros(0)

