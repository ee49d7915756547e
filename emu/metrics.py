"""Run metrics, computed after a run from the records its ranks left in its output
directory (emu/records: ``rank<r>.steps/``, ``rank<r>.requests/``, and the
wall-clock ``rank<r>.wall/``).

`load_run` reads a directory into a `Run` of numpy columns (no Python object per record:
a run of hours holds millions of steps; token times are reduced per request and to a
tally of inter-token gaps as they are read, emu/records/columns.py); `compute_metrics`
turns a `Run`
into the `metrics.json` dictionary (schema: docs/metrics.md); `step_series` and
`tpot_values_ms` give the per-step and per-request series the plots in emu/plots.py draw.
Everything here is computed from virtual time, so it is deterministic for given records,
except the `wall` section, which reports measured wall-clock seconds. Sums run in record
order, as a Python loop over the records would add them, so the figures are the same
float for float as when the records were dictionaries.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path

import numpy as np
import pyarrow as pa

from emu.records.columns import (
    PARTIAL_STEP_COLUMNS,
    STEP_COLUMNS,
    RequestColumns,
    StepColumns,
    WallColumns,
    from_requests_parts,
    from_requests_table,
    from_steps_table,
    from_wall_table,
    records_table,
)
from emu.records.reader import (
    RecordsError,
    has_table,
    read_parts,
    read_table,
    record_ranks,
    request_records,
    step_records,
)
from emu.records.schema import REQUESTS, SCHEMAS, STEPS, WALL
from emu.run_status import describe_unfinished, read_status

SCHEMA_VERSION = 1
# Values turned into Python floats at a time by `_sum`.
_SUM_CHUNK = 1 << 16


class RunError(ValueError):
    """The output directory does not hold a readable, consistent set of records."""


class PartialRunError(RunError):
    """The directory holds a run that did not finish (its run.json is not "complete");
    `load_run(dir, allow_partial=True)` reads what it wrote."""


@dataclass
class Run:
    """The records of one run as columns. `steps[r]` are rank r's steps in iteration
    order; `requests` are the requests of all ranks; `wall[r]` are rank r's wall-clock
    times, or `wall` is None when the run wrote none."""

    dp_size: int
    steps: list[StepColumns]
    requests: RequestColumns
    wall: list[WallColumns] | None = None
    # run.json's state ("complete", "interrupted", ...; None: no run.json). A partial
    # run's requests include those still in flight (`unfinished`).
    state: str | None = None
    # Where the records are (None: made from dictionaries): `step_records` and
    # `request_records` read them back as the event log's dictionaries.
    out_dir: Path | None = None
    # step_series(self), made by its first caller: the metrics and three of the plots
    # read it.
    _series: StepSeries | None = field(default=None, init=False, repr=False, compare=False)
    _records: tuple | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_records(cls, dp_size: int, steps: list[list[dict]], requests: list[dict],
                     wall: list[list[dict]] | None = None, state: str | None = None) -> Run:
        """A run of record dictionaries as the event and wall logs hold them."""
        run = cls(dp_size, [from_steps_table(records_table(rank, STEPS)) for rank in steps],
                  from_requests_table(records_table(requests, REQUESTS)),
                  None if wall is None
                  else [from_wall_table(records_table(rank, WALL)) for rank in wall], state)
        run._records = (steps, requests)
        return run

    def step_records(self, rank: int) -> list[dict]:
        """Rank ``rank``'s step records (the event log's dictionaries), read again."""
        if self._records is not None:
            return self._records[0][rank]
        partial = self.state not in (None, "complete")
        return list(step_records(self.out_dir, rank, partial=partial))[:len(self.steps[rank])]

    def request_parts(self) -> Iterator[pa.Table]:
        """Every rank's requests table with its token times, part after part, rank after
        rank, in ``requests``' order (a finished run's): for a reader of token times,
        which ``requests`` holds only reduced (the stitch of ``--split``'s windows)."""
        if self._records is not None:
            yield records_table(self._records[1], REQUESTS)
            return
        for rank in range(self.dp_size):
            yield from read_parts(self.out_dir, rank, REQUESTS)

    def request_records(self) -> list[dict]:
        """Every rank's request records (the event log's dictionaries), read again; a
        partial run's unfinished requests with ``"unfinished": true``."""
        if self._records is not None:
            return self._records[1]
        partial = self.state not in (None, "complete")
        records = [r for rank in range(self.dp_size)
                   for r in request_records(self.out_dir, rank, partial=partial)]
        table = self.requests.table
        for i in range(len(records), len(table)):
            records.append({"kind": "request", "rank": table["rank"][i].as_py(),
                            "request_id": table["request_id"][i].as_py(),
                            "first_scheduled_s": None, "arrival_s": None,
                            "prompt_tokens": None, "output_tokens": None,
                            "token_times_s": [], "finish_s": None, "pauses": [],
                            "unfinished": True})
        return records


@dataclass
class StepSeries:
    """One entry per lockstep step, in iteration order (for plots)."""

    iters: np.ndarray
    clock_s: np.ndarray
    step_time_s: np.ndarray
    running_blocks: np.ndarray  # [rank, step]
    bubble: np.ndarray  # sum over ranks of (step - own) / (dp * step)
    balance: np.ndarray  # mean / max running blocks; NaN when max is 0
    lb_active: np.ndarray  # a plan was applied on some rank in this step


def load_run(out_dir, *, allow_partial: bool = False) -> Run:
    """Read every rank's records under `out_dir`. Ranks must be 0..dp-1 with identical
    iteration sequences (lockstep).

    A run whose run.json (emu.run_status) is not "complete" raises PartialRunError,
    unless `allow_partial`: then the records are read as far as every rank got (a rank
    killed before it closed its tables has none; the iterations not every rank recorded
    are left out), and each request seen in a step record without a request record (the
    engine writes those when a request finishes or the run ends) gets an unfinished
    request (NaN times, no tokens). `Run.state` tells which. A directory of JSON Lines
    event logs (written before the records were Parquet) raises RunError naming the
    command that converts it."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        raise RunError(f"{out_dir}: not a directory with a run's records")
    status = read_status(out_dir)
    state = status["state"] if status is not None else None
    partial = state not in (None, "complete")
    if partial and not allow_partial:
        raise PartialRunError(f"{describe_unfinished(out_dir, status)}; its records are "
                              "partial (load_run(..., allow_partial=True) reads them)")
    try:
        ranks = record_ranks(out_dir)
        if not ranks:
            raise RunError(f"{out_dir}: no records (rank<r>.steps/)")
        if ranks != list(range(len(ranks))):
            raise RunError(f"{out_dir}: records of ranks {ranks}; expected ranks "
                           f"0..{len(ranks) - 1} without gaps")
        columns = STEP_COLUMNS + (PARTIAL_STEP_COLUMNS if partial else [])
        steps = []
        for r in ranks:
            steps.append(from_steps_table(read_table(out_dir, r, STEPS, columns,
                                                     partial=partial)))
            _share_lockstep_columns(steps[r], steps[0])
        unfinished = []
        if partial:
            common = min(len(rank_steps) for rank_steps in steps)
            steps = [rank_steps.head(common) for rank_steps in steps]
            recorded = pa.concat_tables([read_table(out_dir, r, REQUESTS,
                                                    ["rank", "request_id"], partial=True)
                                         for r in ranks])
            unfinished = [_unfinished_requests(steps, recorded)]
        requests = from_requests_parts(lambda: chain(
            (part for r in ranks for part in read_parts(out_dir, r, REQUESTS, partial=partial)),
            unfinished))
        wall = None
        if any(has_table(out_dir, r, WALL) for r in ranks):
            wall = [from_wall_table(read_table(out_dir, r, WALL, partial=True))
                    for r in ranks]
    except RecordsError as exc:
        raise RunError(str(exc)) from None
    for rank in ranks[1:]:
        if not np.array_equal(steps[rank].iter, steps[0].iter):
            raise RunError(
                f"{out_dir}: rank {rank} logged {len(steps[rank])} steps and rank 0 logged "
                f"{len(steps[0])} (first difference at position "
                f"{_first_difference(steps[rank].iter, steps[0].iter)}); lockstep ranks "
                "must log the same iterations — did the run stop early?"
            )
    return Run(dp_size=len(ranks), steps=steps, requests=requests,
               wall=wall, state=state, out_dir=out_dir)


# Step columns every rank logs alike in lockstep (the DP step, its clock, the wave, the
# control plane's charge): a rank whose column equals rank 0's shares rank 0's array, so
# a run of hours holds them once, not DP times.
_LOCKSTEP_COLUMNS = ("iter", "wave", "step_counter", "clock_s", "step_time_s", "lb_active",
                     "plan_applied", "preempted", "charged_s", "collectives_s", "planner_s",
                     "planner_measured")


def _share_lockstep_columns(steps: StepColumns, first: StepColumns) -> None:
    """Make ``steps`` (a rank's) use ``first``'s (rank 0's) array for each lockstep column
    the two hold equal; called as each rank's steps are read."""
    for name in _LOCKSTEP_COLUMNS:
        mine, theirs = getattr(steps, name), getattr(first, name)
        if mine is not None and theirs is not None and mine is not theirs and \
                np.array_equal(mine, theirs, equal_nan=mine.dtype.kind == "f"):
            setattr(steps, name, theirs)


def _unfinished_requests(steps: list[StepColumns], requests: pa.Table) -> pa.Table:
    """Rows for the requests a partial run's step records show (admitted, resumed,
    paused, preempted) but whose request record was never written."""
    recorded = set(zip(requests["rank"].to_pylist(), requests["request_id"].to_pylist(),
                       strict=True))
    rows = []
    for rank, rank_steps in enumerate(steps):
        seen: dict[str, None] = {}
        ids = [column.to_pylist() for column in rank_steps.shown_ids]
        for per_step in zip(*ids, strict=True):
            for shown in per_step:
                for rid in shown or ():
                    if (rank, rid) not in recorded and rid not in seen:
                        seen[rid] = None
        rows += [{"rank": rank, "request_id": rid, "token_times_s": [], "pauses": []}
                 for rid in seen]
    return pa.Table.from_pylist(rows, schema=SCHEMAS[REQUESTS])


def compute_metrics(run: Run, *, config=None, seed=None) -> dict:
    """The metrics.json dictionary of `run`. `config` (JSON-ready, e.g. the additional
    config and engine settings) and `seed` are recorded as given by the caller."""
    dp = run.dp_size
    steps, req = run.steps, run.requests
    n_steps = len(steps[0]) if steps else 0
    virtual_time_s = max((float(np.max(step_ends_s(rank))) for rank in steps if len(rank)),
                         default=0.0)
    busy_time_s = _sum(steps[0].step_time_s) if n_steps else 0.0

    series = step_series(run)
    balances = series.balance[~np.isnan(series.balance)]

    counts = req.token_counts
    output_tokens = int(counts.sum())
    finished = ~np.isnan(req.finish_s)
    with_tokens = counts > 0
    ttft = (req.first_token_s[with_tokens] - req.arrival_s[with_tokens]) * 1e3
    scheduled = ~np.isnan(req.first_scheduled_s)
    queue = (req.first_scheduled_s[scheduled] - req.arrival_s[scheduled]) * 1e3
    e2e = (req.finish_s[finished] - req.arrival_s[finished]) * 1e3

    per_rank = []
    for rank in range(dp):
        rank_steps = steps[rank]
        mine = req.rank == rank
        per_rank.append({
            "rank": rank,
            "utilisation": _ratio(_sum(rank_steps.own_cost_s), _sum(rank_steps.step_time_s)),
            "output_tokens": int(counts[mine].sum()),
            "requests_finished": int(finished[mine].sum()),
            "dummy_steps": int(rank_steps.dummy.sum()),
            "mean_running_blocks": _mean_int(rank_steps.running_blocks),
            "max_running_blocks": int(rank_steps.running_blocks.max(initial=0)),
        })

    control = control_plane(run, busy_time_s)
    return {
        **({} if control is None else {"control_plane": control}),
        "schema_version": SCHEMA_VERSION,
        "config": config,
        "seed": seed,
        "dp_size": dp,
        "steps": n_steps,
        "virtual_time_s": virtual_time_s,
        "busy_time_s": busy_time_s,
        "run_state": run.state,
        "requests_total": len(req),
        "requests_finished": int(finished.sum()),
        "requests_unfinished": len(req) - int(finished.sum()),
        "output_tokens": output_tokens,
        "throughput_tok_s": _ratio(output_tokens, virtual_time_s),
        "bubble_ratio": bubble_ratio(run),
        "balance_ratio": _mean(balances),
        "balance_steps": len(balances),
        "ttft_ms": distribution(ttft),
        "queue_ms": distribution(queue),
        "tpot_ms": distribution(tpot_values_ms(run)),
        "itl_ms": req.itl_ms.distribution(),
        "e2e_ms": distribution(e2e),
        "pauses": _pauses(req, virtual_time_s),
        "preemptions": sum(int(rank.preempted.sum()) for rank in steps),
        "plan_churn": _plan_churn(run),
        "lb_activity": _lb_activity(run),
        "headroom": headroom(run, output_tokens, virtual_time_s, busy_time_s),
        "per_rank": per_rank,
        "wall": _wall(run.wall),
    }


def step_ends_s(steps: StepColumns) -> np.ndarray:
    """When each step ended: its clock, its step time, and what DyntraLB's control plane
    charged after it."""
    charged = steps.charged_s if steps.charged_s is not None else 0.0
    return steps.clock_s + steps.step_time_s + charged


def write_metrics(metrics: dict, path) -> None:
    """Write metrics.json: sorted keys, two-space indent, trailing newline."""
    Path(path).write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")


def distribution(values) -> dict:
    """`count`, `mean`, `p50`, `p90`, `p99` and `max` of `values`, a list or an array
    (percentiles by linear interpolation, numpy's default); statistics are null when
    there are no values."""
    arr = np.asarray(values, dtype=float)
    if arr.size == 0:
        return {"count": 0, "mean": None, "p50": None, "p90": None, "p99": None, "max": None}
    p50, p90, p99 = np.percentile(arr, [50, 90, 99])
    return {"count": int(arr.size), "mean": float(arr.mean()), "p50": float(p50),
            "p90": float(p90), "p99": float(p99), "max": float(arr.max())}


def bubble_ratio(run: Run) -> float | None:
    """Sum over ranks and steps of (step time - own cost), over dp x total step time:
    the share of rank time spent waiting for the slowest rank."""
    waiting = total = 0
    for rank in run.steps:  # rank after rank, each in step order
        waiting = _sum(rank.step_time_s - rank.own_cost_s, waiting)
        total = _sum(rank.step_time_s, total)
    return _ratio(waiting, total)


def control_plane(run: Run, busy_time_s: float) -> dict | None:
    """DyntraLB's control plane in virtual time (the step records' ``control_plane``,
    the same on every rank; None when the run's profile did not charge it): the total
    charged, its collectives and planner parts (before any overlap with the forward
    under async scheduling), the steps that planned and the mean charge of such a step,
    and the share of the busy time (forwards plus control plane) it took.
    ``planner_cost`` "measured" (``--planner-cost measured``): the planner was charged
    its measured wall time, so the run is not deterministic."""
    steps = run.steps[0] if run.steps else None
    if steps is None or not len(steps) or steps.charged_s is None:
        return None
    total = _sum(steps.charged_s)
    active = steps.charged_s[steps.lb_active]
    measured = bool(steps.planner_measured.any())
    return {
        "total_s": total,
        "collectives_s": _sum(steps.collectives_s),
        "planner_s": _sum(steps.planner_s),
        "active_steps": len(active),
        "per_active_step_ms": _ratio(_sum(active) * 1e3, len(active)),
        "busy_share": _ratio(total, busy_time_s + total),
        "planner_cost": "measured" if measured else "model",
        "deterministic": not measured,
    }


def _over_ranks(run: Run, column: str) -> np.ndarray:
    """``column`` of every rank's steps, [rank, step]."""
    return np.array([getattr(rank, column) for rank in run.steps]).reshape(
        len(run.steps), len(run.steps[0]) if run.steps else 0)


def _rank_sum(run: Run, row: Callable[[StepColumns], np.ndarray]) -> np.ndarray:
    """Per step, the sum over ranks of ``row(rank's steps)``, added rank after rank (as
    ``sum`` over a step's records adds them); one rank's row made at a time."""
    total = None
    for rank in run.steps:
        values = row(rank)
        total = (np.zeros(values.shape, values.dtype) if total is None else total) + values
    return total if total is not None else np.zeros(0)


def headroom(run: Run, output_tokens: int, virtual_time_s: float,
             busy_time_s: float) -> dict:
    """How much a perfect balancer could gain on these steps, after TensorRT-LLM's
    attention-DP "balance ratio" and "speed-of-light throughput" (its ADP Balance
    Strategy blog): per step, the balance ratio is mean over max of the ranks' work (here
    their own step cost), and a perfectly balanced step would take max x ratio = the mean
    own cost. Idle gaps between waves and DyntraLB's control plane between steps stay as
    they are."""
    peak = np.zeros(len(run.steps[0]) if run.steps else 0)
    for rank in run.steps:
        peak = np.maximum(peak, rank.own_cost_s)
    busy = peak > 0
    ratios = _rank_sum(run, lambda rank: rank.own_cost_s[busy]) / len(run.steps) / peak[busy]
    sol_busy_s = _sum(run.steps[0].step_time_s[busy] * ratios, 0.0) if run.steps else 0.0
    sol_time_s = virtual_time_s - busy_time_s + sol_busy_s
    actual = _ratio(output_tokens, virtual_time_s)
    sol = _ratio(output_tokens, sol_time_s)
    return {
        "cost_balance_ratio": _mean(ratios),
        "sol_busy_time_s": sol_busy_s,
        "sol_virtual_time_s": sol_time_s,
        "sol_throughput_tok_s": sol,
        "max_gain": sol / actual - 1 if sol is not None and actual else None,
    }


def _lb_activity(run: Run) -> dict:
    """What DyntraLB's activation depends on (read by emu/no_effect.py): steps in which
    the planner ran on some rank, the waves and the highest step_counter any wave
    reached (start_step compares with it), and the largest prompt (dynamic mode arms on
    a prompt longer than long_req_block_threshold blocks)."""
    prompts = run.requests.prompt_tokens
    prompts = prompts[~np.isnan(prompts)]  # partial runs
    first = run.steps[0] if run.steps else None
    return {
        "planner_steps": int(_over_ranks(run, "lb_active").any(axis=0).sum()),
        "waves": len(np.unique(first.wave)) if first is not None else 0,
        "longest_wave_steps": int(first.step_counter.max(initial=0))
        if first is not None else 0,
        "largest_prompt_tokens": int(prompts.max()) if prompts.size else None,
    }


def tpot_values_ms(run: Run) -> np.ndarray:
    """Per-request time per output token after the first, `(last - first) / (n - 1)`,
    for requests with at least two tokens."""
    req = run.requests
    two = req.token_counts >= 2
    return ((req.last_token_s[two] - req.first_token_s[two]) * 1e3
            / (req.token_counts[two] - 1))


def step_series(run: Run) -> StepSeries:
    """Per-step load, bubble and balance across ranks (ranks log the same iterations);
    computed once per run."""
    if run._series is None:
        run._series = _step_series(run)
    return run._series


def _step_series(run: Run) -> StepSeries:
    dp = run.dp_size
    waiting = _rank_sum(run, lambda rank: rank.step_time_s - rank.own_cost_s)
    total = _rank_sum(run, lambda rank: rank.step_time_s)
    bubble = np.divide(waiting, total, out=np.zeros_like(waiting), where=total != 0)
    loads = _over_ranks(run, "running_blocks")
    peak = loads.max(axis=0, initial=0)
    balance = np.full(loads.shape[1], np.nan)
    busy = peak > 0
    balance[busy] = loads.sum(axis=0)[busy] / dp / peak[busy]
    first = run.steps[0] if run.steps else None
    empty = np.zeros(0)
    return StepSeries(
        iters=first.iter if first is not None else empty,
        clock_s=first.clock_s if first is not None else empty,
        step_time_s=first.step_time_s if first is not None else empty,
        running_blocks=loads, bubble=bubble, balance=balance,
        lb_active=_over_ranks(run, "plan_applied").any(axis=0),
    )


def _pauses(req: RequestColumns, end_s: float) -> dict:
    """Pauses per request and their durations; a pause still open at the end of the run
    lasts until the request finished or, if it did not, until the end of the run.

    ``requests_paused_pct`` is the share of requests paused at least once, the figure
    vllm-ascend PR #12292 published for its GPQA run (161 of 198); ``longest_paused_ms``
    the most time one request spent paused over all its pauses, what starving it cost."""
    counts = np.diff(req.pause_offsets)
    owner = np.repeat(np.arange(len(counts)), counts)
    open_ = np.isnan(req.pause_end_s)
    finish = req.finish_s[owner]
    stop = np.where(open_, np.where(np.isnan(finish), end_s, finish), req.pause_end_s)
    durations = (stop - req.pause_start_s) * 1e3
    # each request's total, its pauses added in order
    paused_ms = [sum(durations[a:b].tolist(), 0.0)
                 for a, b in zip(req.pause_offsets[:-1][counts > 0].tolist(),
                                 req.pause_offsets[1:][counts > 0].tolist(), strict=True)]
    requests_paused = int((counts > 0).sum())
    return {
        "total": int(counts.sum()),
        "requests_paused": requests_paused,
        "requests_paused_pct": _ratio(requests_paused * 100, len(counts)),
        "per_request_mean": _mean_int(counts),
        "per_request_max": int(counts.max(initial=0)),
        "open_at_end": int(open_.sum()),
        "duration_ms": distribution(durations),
        "longest_paused_ms": max(paused_ms, default=0.0),
    }


def _plan_churn(run: Run) -> dict:
    """Requests moved by applied plans: outs + ins summed over ranks, per step in which
    some rank applied a plan (an "active step")."""
    applied = _over_ranks(run, "plan_applied")
    active = int(applied.any(axis=0).sum())
    outs = sum(int(rank.plan_out.sum()) for rank in run.steps)
    ins = sum(int(rank.plan_in.sum()) for rank in run.steps)
    return {
        "active_steps": active,
        "outs": outs,
        "ins": ins,
        "per_active_step": _ratio(outs + ins, active),
        "freeze_rank_steps": sum(int((rank.plan_freeze & rank.plan_applied).sum())
                                 for rank in run.steps),
        "paused": sum(int(rank.paused.sum()) for rank in run.steps),
        "resumed": sum(int(rank.resumed.sum()) for rank in run.steps),
    }


# Wall-clock columns -> metrics names.
_WALL_FIELDS = (
    ("planner_ms", "planner_s"),
    ("lb_comm_ms", "collectives_s"),
    ("step_wall_ms", "step_wall_s"),
)


def _wall(wall: list[WallColumns] | None) -> dict | None:
    """Wall-clock milliseconds per step spent in the planner, in DyntraLB collectives and
    in the whole engine iteration, over every (rank, step) record that has the field;
    None when the run wrote no wall-clock records."""
    if wall is None:
        return None
    out: dict = {"records": sum(len(rank.step_wall_s) for rank in wall)}
    for name, column in _WALL_FIELDS:
        values = np.concatenate([v[~np.isnan(v)] for v in (getattr(rank, column)
                                                           for rank in wall)])
        out[name.replace("_ms", "_total_s")] = _sum(values)
        values *= 1e3  # in place: a run of hours has millions
        out[name] = distribution(values)
    return out


def _first_difference(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.size else n


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def _sum(values: np.ndarray, start: float = 0) -> float:
    """``start`` plus the sum of ``values`` added in order (numpy's pairwise sum rounds
    differently), a chunk of Python floats at a time (a run of hours has millions)."""
    total = start
    for i in range(0, len(values), _SUM_CHUNK):
        total = sum(values[i:i + _SUM_CHUNK].tolist(), total)
    return total


def _mean(values: np.ndarray) -> float | None:
    return _sum(values) / len(values) if len(values) else None


def _mean_int(values: np.ndarray) -> float | None:
    return int(values.sum()) / len(values) if len(values) else None
