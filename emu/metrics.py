"""Run metrics, computed after a run from the records its ranks left in its output
directory (emu/records: ``rank<r>.steps/``, ``rank<r>.requests/``, and the
wall-clock ``rank<r>.wall/``).

`load_run` reads a directory into a `Run`: its requests as numpy columns (token times
reduced per request and to a tally of inter-token gaps as they are read,
emu/records/columns.py), its steps and wall-clock times left on disk, read a chunk or a
window at a time when asked (emu/records/ranks.py): a run of hours holds millions of
steps, and its metrics and plots hold a window of them. `compute_metrics` turns a `Run`
into the `metrics.json` dictionary (schema: docs/metrics.md) from two passes over the
steps (emu/step_passes.py); `step_series` and `tpot_values_ms` give the per-step lines
and per-request values the plots in emu/plots.py draw. Everything here is computed from
virtual time, so it is deterministic for given records, except the `wall` section,
which reports measured wall-clock seconds. Sums run in record order, as a Python loop
over the records would add them, so the figures are the same float for float as when
the records were dictionaries.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path

import numpy as np
import pyarrow as pa

from emu.records import selection
from emu.records.columns import (
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
from emu.records.ranks import InMemory, OnDisk, RankColumns
from emu.records.reader import (
    RecordsError,
    has_table,
    read_parts,
    record_ranks,
    request_records,
    step_records,
)
from emu.records.schema import REQUESTS, SCHEMAS, STEPS, WALL
from emu.run_status import describe_unfinished, read_status
from emu.step_passes import (
    RankFigures,
    StepSeries,
    WindowFigures,
    rank_pass,
    window_pass,
)
from emu.step_passes import ordered_sum as _sum

SCHEMA_VERSION = 1
# The wall-clock columns emu.records.schema.WALL holds, as WallColumns reads them.
_WALL_COLUMNS = ["step_wall_s", "planner_s", "dyntra_lb_collectives_s"]


class RunError(ValueError):
    """The output directory does not hold a readable, consistent set of records."""


class PartialRunError(RunError):
    """The directory holds a run that did not finish (its run.json is not "complete");
    `load_run(dir, allow_partial=True)` reads what it wrote."""


@dataclass
class Run:
    """The records of one run. `steps[r]` are rank r's steps in iteration order (read
    from the run directory whole when indexed, or by chunk and window:
    emu.records.ranks); `requests` are the requests of all ranks; `wall[r]` are rank r's
    wall-clock times, or `wall` is None when the run wrote none. Lists of columns given
    for `steps` and `wall` are held as they are."""

    dp_size: int
    steps: RankColumns[StepColumns]
    requests: RequestColumns
    wall: RankColumns[WallColumns] | None = None
    # run.json's state ("complete", "interrupted", ...; None: no run.json). A partial
    # run's requests include those still in flight (`unfinished`).
    state: str | None = None
    # Where the records are (None: made from dictionaries): `step_records` and
    # `request_records` read them back as the event log's dictionaries.
    out_dir: Path | None = None
    # The two passes over the steps (emu.step_passes), made by their first caller: the
    # metrics and the plots read them.
    _rank_figures: RankFigures | None = field(default=None, init=False, repr=False,
                                              compare=False)
    _window_figures: WindowFigures | None = field(default=None, init=False, repr=False,
                                                  compare=False)
    _records: tuple | None = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        if isinstance(self.steps, list):
            self.steps = InMemory(self.steps)
        if isinstance(self.wall, list):
            self.wall = InMemory(self.wall)

    @property
    def n_steps(self) -> int:
        """Steps of each rank (lockstep: every rank's)."""
        return self.steps.n_rows

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
        return list(step_records(self.out_dir, rank, partial=partial))[:self.n_steps]

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
        dp = len(ranks)

        def steps_read(n_rows: int | None) -> OnDisk:
            return OnDisk(out_dir, STEPS, dp, STEP_COLUMNS, from_steps_table,
                          partial=partial, n_rows=n_rows)

        lengths, differ = _lockstep_scan(steps_read(None))
        n_steps = min(lengths) if partial else lengths[0]
        for rank in ranks[1:]:
            mine, first = (n_steps, n_steps) if partial else (lengths[rank], lengths[0])
            if mine != first or (differ[rank] is not None and differ[rank] < n_steps):
                where = differ[rank] if differ[rank] is not None else min(mine, first)
                raise RunError(
                    f"{out_dir}: rank {rank} logged {mine} steps and rank 0 logged {first} "
                    f"(first difference at position {where}); lockstep ranks must log the "
                    "same iterations — did the run stop early?")
        steps = steps_read(n_steps)
        unfinished = []
        if partial:
            recorded = pa.concat_tables([
                SCHEMAS[REQUESTS].empty_table().select(["rank", "request_id"]),
                *(part for r in ranks for part in read_parts(out_dir, r, REQUESTS,
                                                              ["rank", "request_id"],
                                                              partial=True))])
            unfinished = [_unfinished_requests(steps, recorded)]
        requests = from_requests_parts(lambda: chain(
            (part for r in ranks for part in read_parts(out_dir, r, REQUESTS, partial=partial)),
            unfinished))
        wall = None
        if any(has_table(out_dir, r, WALL) for r in ranks):
            wall = OnDisk(out_dir, WALL, dp, _WALL_COLUMNS, from_wall_table, partial=True,
                          n_rows=None)
            for r in ranks:  # every part readable, as the steps' and requests' are
                for _ in wall.tables(r, ["iter"]):
                    pass
    except RecordsError as exc:
        raise RunError(str(exc)) from None
    return Run(dp_size=len(ranks), steps=steps, requests=requests,
               wall=wall, state=state, out_dir=out_dir)


def _lockstep_scan(steps: OnDisk) -> tuple[list[int], list[int | None]]:
    """Each rank's step count, and where its iterations first differ from rank 0's
    (None: nowhere in the steps both logged), read a window of iterations at a time."""
    lengths, differ = [0] * len(steps), [None] * len(steps)
    for window in steps.table_windows(["iter"]):
        first = window[0]["iter"].to_numpy()
        for rank, table in enumerate(window):
            iters = table["iter"].to_numpy()
            common = min(len(iters), len(first))
            if differ[rank] is None and common:
                where = np.flatnonzero(iters[:common] != first[:common])
                if where.size:
                    differ[rank] = lengths[rank] + int(where[0])
            lengths[rank] += len(iters)
    return lengths, differ


def _unfinished_requests(steps: OnDisk, requests: pa.Table) -> pa.Table:
    """Rows for the requests a partial run's step records show (admitted, resumed,
    paused, preempted) but whose request record was never written."""
    recorded = set(zip(requests["rank"].to_pylist(), requests["request_id"].to_pylist(),
                       strict=True))
    rows = []
    for rank in range(len(steps)):
        seen: dict[str, None] = {}
        for part in steps.tables(rank, ["admitted", "resumed", "paused", "preempted"]):
            for shown in part.to_pylist():
                for rid in chain.from_iterable(ids or () for ids in shown.values()):
                    if (rank, rid) not in recorded and rid not in seen:
                        seen[rid] = None
        rows += [{"rank": rank, "request_id": rid, "token_times_s": [], "pauses": []}
                 for rid in seen]
    return pa.Table.from_pylist(rows, schema=SCHEMAS[REQUESTS])


def compute_metrics(run: Run, *, config=None, seed=None) -> dict:
    """The metrics.json dictionary of `run`. `config` (JSON-ready, e.g. the additional
    config and engine settings) and `seed` are recorded as given by the caller."""
    dp = run.dp_size
    req = run.requests
    n_steps = run.n_steps
    by_rank, by_step = _rank_figures(run), _window_figures(run)
    virtual_time_s = by_rank.end_s
    busy_time_s = by_rank.busy_time_s if n_steps else 0.0

    counts = req.token_counts
    output_tokens = int(counts.sum())
    finished = ~np.isnan(req.finish_s)
    with_tokens = counts > 0
    ttft = (req.first_token_s[with_tokens] - req.arrival_s[with_tokens]) * 1e3
    scheduled = ~np.isnan(req.first_scheduled_s)
    queue = (req.first_scheduled_s[scheduled] - req.arrival_s[scheduled]) * 1e3
    e2e = (req.finish_s[finished] - req.arrival_s[finished]) * 1e3

    per_rank = []
    for rank, sums in enumerate(by_rank.ranks):
        mine = req.rank == rank
        per_rank.append({
            "rank": rank,
            "utilisation": _ratio(sums.own_cost_s, sums.step_time_s),
            "output_tokens": int(counts[mine].sum()),
            "requests_finished": int(finished[mine].sum()),
            "dummy_steps": sums.dummy,
            "mean_running_blocks": _ratio(sums.running_blocks, sums.steps),
            "max_running_blocks": sums.max_running_blocks,
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
        "balance_ratio": _ratio(by_step.balance_sum, by_step.balance_steps),
        "balance_steps": by_step.balance_steps,
        "ttft_ms": distribution(ttft),
        "queue_ms": distribution(queue),
        "tpot_ms": distribution(tpot_values_ms(run)),
        "itl_ms": req.itl_ms.distribution(),
        "e2e_ms": distribution(e2e),
        "pauses": _pauses(req, virtual_time_s),
        "preemptions": by_rank.preempted,
        "plan_churn": _plan_churn(by_rank, by_step),
        "lb_activity": _lb_activity(run, by_rank, by_step),
        "headroom": headroom(run, output_tokens, virtual_time_s, busy_time_s),
        "per_rank": per_rank,
        "wall": _wall(run.wall),
    }


def _rank_figures(run: Run) -> RankFigures:
    """``rank_pass`` of the run's steps, made once."""
    if run._rank_figures is None:
        run._rank_figures = rank_pass(run.steps)
    return run._rank_figures


def _window_figures(run: Run) -> WindowFigures:
    """``window_pass`` of the run's steps, made once."""
    if run._window_figures is None:
        run._window_figures = window_pass(run.steps)
    return run._window_figures


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
    figures = _rank_figures(run)
    return _ratio(figures.waiting_s, figures.total_s)


def control_plane(run: Run, busy_time_s: float) -> dict | None:
    """DyntraLB's control plane in virtual time (the step records' ``control_plane``,
    the same on every rank; None when the run's profile did not charge it): the total
    charged, its collectives and planner parts (before any overlap with the forward
    under async scheduling), the steps that planned and the mean charge of such a step,
    and the share of the busy time (forwards plus control plane) it took.
    ``planner_cost`` "measured" (``--planner-cost measured``): the planner was charged
    its measured wall time, so the run is not deterministic."""
    sums = _rank_figures(run).control
    if sums is None:
        return None
    total = sums.charged_s
    return {
        "total_s": total,
        "collectives_s": sums.collectives_s,
        "planner_s": sums.planner_s,
        "active_steps": sums.active_steps,
        "per_active_step_ms": _ratio(sums.active_charged_s * 1e3, sums.active_steps),
        "busy_share": _ratio(total, busy_time_s + total),
        "planner_cost": "measured" if sums.measured else "model",
        "deterministic": not sums.measured,
    }


def headroom(run: Run, output_tokens: int, virtual_time_s: float,
             busy_time_s: float) -> dict:
    """How much a perfect balancer could gain on these steps, after TensorRT-LLM's
    attention-DP "balance ratio" and "speed-of-light throughput" (its ADP Balance
    Strategy blog): per step, the balance ratio is mean over max of the ranks' work (here
    their own step cost), and a perfectly balanced step would take max x ratio = the mean
    own cost. Idle gaps between waves and DyntraLB's control plane between steps stay as
    they are."""
    figures = _window_figures(run)
    sol_busy_s = figures.sol_busy_s
    sol_time_s = virtual_time_s - busy_time_s + sol_busy_s
    actual = _ratio(output_tokens, virtual_time_s)
    sol = _ratio(output_tokens, sol_time_s)
    return {
        "cost_balance_ratio": _ratio(figures.cost_balance_sum, figures.cost_balance_steps),
        "sol_busy_time_s": sol_busy_s,
        "sol_virtual_time_s": sol_time_s,
        "sol_throughput_tok_s": sol,
        "max_gain": sol / actual - 1 if sol is not None and actual else None,
    }


def _lb_activity(run: Run, by_rank: RankFigures, by_step: WindowFigures) -> dict:
    """What DyntraLB's activation depends on (read by emu/no_effect.py): steps in which
    the planner ran on some rank, the waves and the highest step_counter any wave
    reached (start_step compares with it), and the largest prompt (dynamic mode arms on
    a prompt longer than long_req_block_threshold blocks)."""
    prompts = run.requests.prompt_tokens
    prompts = prompts[~np.isnan(prompts)]  # partial runs
    return {
        "planner_steps": by_step.planner_steps,
        "waves": by_rank.waves,
        "longest_wave_steps": by_rank.longest_wave_steps,
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
    """The per-step lines the plots draw (emu.step_passes.StepSeries), made with the
    metrics' per-step figures, once per run."""
    return _window_figures(run).series


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


def _plan_churn(by_rank: RankFigures, by_step: WindowFigures) -> dict:
    """Requests moved by applied plans: outs + ins summed over ranks, per step in which
    some rank applied a plan (an "active step")."""
    active = by_step.plan_steps
    return {
        "active_steps": active,
        "outs": by_rank.plan_outs,
        "ins": by_rank.plan_ins,
        "per_active_step": _ratio(by_rank.plan_outs + by_rank.plan_ins, active),
        "freeze_rank_steps": by_rank.freeze_rank_steps,
        "paused": by_rank.paused,
        "resumed": by_rank.resumed,
    }


# Wall-clock columns -> metrics names.
_WALL_FIELDS = (
    ("planner_ms", "planner_s"),
    ("lb_comm_ms", "collectives_s"),
    ("step_wall_ms", "step_wall_s"),
)


def _wall(wall: RankColumns[WallColumns] | None) -> dict | None:
    """Wall-clock milliseconds per step spent in the planner, in DyntraLB collectives and
    in the whole engine iteration, over every (rank, step) record that has the field;
    None when the run wrote no wall-clock records. Read a chunk at a time, a few passes
    per field (emu.records.selection): a run of hours has millions."""
    if wall is None:
        return None
    out: dict = {"records": 0}
    totals = dict.fromkeys(_WALL_FIELDS, 0)
    counts = dict.fromkeys(_WALL_FIELDS, 0)
    tops = dict.fromkeys(_WALL_FIELDS, -np.inf)
    for chunk in _wall_chunks(wall):
        out["records"] += len(chunk)
        for field_ in _WALL_FIELDS:
            values = _measured(chunk, field_[1])
            totals[field_] = _sum(values, totals[field_])
            counts[field_] += len(values)
            if len(values):
                tops[field_] = max(tops[field_], float(values.max() * 1e3))
    for field_ in _WALL_FIELDS:
        name, column = field_
        out[name.replace("_ms", "_total_s")] = totals[field_]
        out[name] = selection.distribution(
            lambda column=column: (_measured(chunk, column) * 1e3
                                   for chunk in _wall_chunks(wall)),
            counts[field_], tops[field_])
    return out


def _wall_chunks(wall: RankColumns[WallColumns]) -> Iterator[WallColumns]:
    for rank in range(len(wall)):
        yield from wall.chunks(rank)


def _measured(chunk: WallColumns, column: str) -> np.ndarray:
    """``column`` of ``chunk`` where it was measured (not NaN)."""
    values = getattr(chunk, column)
    return values[~np.isnan(values)]


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def _mean_int(values: np.ndarray) -> float | None:
    return int(values.sum()) / len(values) if len(values) else None
