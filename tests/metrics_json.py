"""The metrics as main computed them from the JSON Lines event logs before the records
were Parquet (emu/metrics.py at that commit, its reading and gc parts left out): the
oracle of tests/integration/test_metrics_parquet_json.py, which holds the column metrics
to it, float for float. Not to be changed with emu/metrics.py: it is what they must
keep equal to."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain

import numpy as np

SCHEMA_VERSION = 1


@dataclass
class Run:
    """The event logs of one run. `steps[r]` are rank r's step records in iteration
    order; `requests` are the request records of all ranks; `wall[r]` are rank r's
    wall-clock records, or `wall` is None when the run wrote none."""

    dp_size: int
    steps: list[list[dict]]
    requests: list[dict]
    wall: list[list[dict]] | None = None
    # run.json's state ("complete", "interrupted", ...; None: no run.json). A partial
    # run's request records include those of requests still in flight (`unfinished`).
    state: str | None = None
    # step_series(self), made by its first caller
    _series: StepSeries | None = field(default=None, init=False, repr=False, compare=False)


@dataclass
class StepSeries:
    """One entry per lockstep step, in iteration order (for plots)."""

    iters: list[int]
    clock_s: list[float]
    step_time_s: list[float]
    running_blocks: list[list[int]]  # [rank][step]
    bubble: list[float]  # sum over ranks of (step - own) / (dp * step)
    balance: list[float | None]  # mean / max running blocks; None when max is 0
    lb_active: list[bool]  # a plan was applied on some rank in this step


# How many `frozen_runs` scopes are open that freeze what `load_run` reads.
_freezing = 0


def compute_metrics(run: Run, *, config=None, seed=None) -> dict:
    """The metrics.json dictionary of `run`. `config` (JSON-ready, e.g. the additional
    config and engine settings) and `seed` are recorded as given by the caller."""
    dp = run.dp_size
    n_steps = len(run.steps[0]) if run.steps else 0
    virtual_time_s = max((s["clock_s"] + s["step_time_s"] + _charged_s(s)
                          for rank in run.steps for s in rank), default=0.0)
    busy_time_s = sum(s["step_time_s"] for s in run.steps[0]) if n_steps else 0.0

    series = step_series(run)
    balances = [b for b in series.balance if b is not None]

    token_counts = [len(r["token_times_s"]) for r in run.requests]
    output_tokens = sum(token_counts)
    finished = [r for r in run.requests if r["finish_s"] is not None]

    ttft = [(r["token_times_s"][0] - r["arrival_s"]) * 1e3
            for r in run.requests if r["token_times_s"]]
    queue = [(r["first_scheduled_s"] - r["arrival_s"]) * 1e3
             for r in run.requests if r.get("first_scheduled_s") is not None]
    itl = _itl_ms(run.requests)
    e2e = [(r["finish_s"] - r["arrival_s"]) * 1e3 for r in finished]

    per_rank = []
    for rank in range(dp):
        rank_steps = run.steps[rank]
        step_total = sum(s["step_time_s"] for s in rank_steps)
        rank_requests = [r for r in run.requests if r["rank"] == rank]
        per_rank.append({
            "rank": rank,
            "utilisation": _ratio(sum(s["own_cost_s"] for s in rank_steps), step_total),
            "output_tokens": sum(len(r["token_times_s"]) for r in rank_requests),
            "requests_finished": sum(r["finish_s"] is not None for r in rank_requests),
            "dummy_steps": sum(bool(s["dummy"]) for s in rank_steps),
            "mean_running_blocks": _mean([s["running_blocks"] for s in rank_steps]),
            "max_running_blocks": max((s["running_blocks"] for s in rank_steps), default=0),
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
        "requests_total": len(run.requests),
        "requests_finished": len(finished),
        "requests_unfinished": len(run.requests) - len(finished),
        "output_tokens": output_tokens,
        "throughput_tok_s": _ratio(output_tokens, virtual_time_s),
        "bubble_ratio": bubble_ratio(run),
        "balance_ratio": _mean(balances),
        "balance_steps": len(balances),
        "ttft_ms": distribution(ttft),
        "queue_ms": distribution(queue),
        "tpot_ms": distribution(tpot_values_ms(run)),
        "itl_ms": distribution(itl),
        "e2e_ms": distribution(e2e),
        "pauses": _pauses(run.requests, virtual_time_s),
        "preemptions": sum(len(s.get("preempted", ())) for rank in run.steps for s in rank),
        "plan_churn": _plan_churn(run),
        "lb_activity": _lb_activity(run),
        "headroom": headroom(run, output_tokens, virtual_time_s, busy_time_s),
        "per_rank": per_rank,
        "wall": _wall(run.wall),
    }


def _itl_ms(requests: list[dict]) -> np.ndarray:
    """Inter-token latencies: each request's gaps between consecutive token times, in
    milliseconds, request after request. With speculative decoding a step emits several
    tokens at once; vLLM's serving benchmark receives them as one streamed chunk and
    counts one ITL per chunk, so a zero gap (same step) is no inter-token latency.
    Without it every gap is > 0. (A run holds about a million token times: the gaps are
    taken over all of them at once, and those across two requests dropped.)"""
    times = [r["token_times_s"] for r in requests]
    lengths = np.fromiter(map(len, times), dtype=np.int64, count=len(times))
    flat = np.fromiter(chain.from_iterable(times), dtype=float, count=int(lengths.sum()))
    before, after = flat[:-1], flat[1:]
    keep = after != before
    # the gap from a request's last token to the next request's first
    across = np.cumsum(lengths)[:-1] - 1
    keep[across[(across >= 0) & (across < keep.size)]] = False
    return (after[keep] - before[keep]) * 1e3


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
    waiting = sum(s["step_time_s"] - s["own_cost_s"] for rank in run.steps for s in rank)
    total = sum(s["step_time_s"] for rank in run.steps for s in rank)
    return _ratio(waiting, total)


def _charged_s(step: dict) -> float:
    """What DyntraLB's control plane charged after this step (0 when not recorded)."""
    control = step.get("control_plane")
    return control["charged_s"] if control is not None else 0.0


def control_plane(run: Run, busy_time_s: float) -> dict | None:
    """DyntraLB's control plane in virtual time (the step records' ``control_plane``,
    the same on every rank; None when the run's profile did not charge it): the total
    charged, its collectives and planner parts (before any overlap with the forward
    under async scheduling), the steps that planned and the mean charge of such a step,
    and the share of the busy time (forwards plus control plane) it took.
    ``planner_cost`` "measured" (``--planner-cost measured``): the planner was charged
    its measured wall time, so the run is not deterministic."""
    steps = run.steps[0] if run.steps else []
    if not steps or "control_plane" not in steps[0]:
        return None
    charges = [s["control_plane"] for s in steps]
    total = sum(c["charged_s"] for c in charges)
    active = [c["charged_s"] for s, c in zip(steps, charges, strict=True) if s["lb_active"]]
    measured = any(c.get("planner_measured") for c in charges)
    return {
        "total_s": total,
        "collectives_s": sum(c["collectives_s"] for c in charges),
        "planner_s": sum(c["planner_s"] for c in charges),
        "active_steps": len(active),
        "per_active_step_ms": _ratio(sum(active) * 1e3, len(active)),
        "busy_share": _ratio(total, busy_time_s + total),
        "planner_cost": "measured" if measured else "model",
        "deterministic": not measured,
    }


def headroom(run: Run, output_tokens: int, virtual_time_s: float,
             busy_time_s: float) -> dict:
    """How much a perfect balancer could gain on these steps, after TensorRT-LLM's
    attention-DP "balance ratio" and "speed-of-light throughput" (its ADP Balance
    Strategy blog): per step, the balance ratio is mean over max of the ranks' work (here
    their own step cost), and a perfectly balanced step would take max x ratio = the mean
    own cost. Idle gaps between waves and DyntraLB's control plane between steps stay as
    they are."""
    per_step = list(zip(*run.steps, strict=True)) if run.steps else []
    ratios = []
    sol_busy_s = 0.0
    for recs in per_step:
        costs = [r["own_cost_s"] for r in recs]
        peak = max(costs)
        if peak > 0:
            ratio = sum(costs) / len(costs) / peak
            ratios.append(ratio)
            sol_busy_s += recs[0]["step_time_s"] * ratio
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
    per_step = list(zip(*run.steps, strict=True)) if run.steps else []
    return {
        "planner_steps": sum(any(r.get("lb_active") for r in recs) for recs in per_step),
        "waves": len({s["wave"] for s in run.steps[0]}) if run.steps else 0,
        "longest_wave_steps": max((s["step_counter"] for s in run.steps[0]), default=0)
        if run.steps else 0,
        "largest_prompt_tokens": max((r["prompt_tokens"] for r in run.requests
                                      if r["prompt_tokens"] is not None),  # partial runs
                                     default=None),
    }


def tpot_values_ms(run: Run) -> list[float]:
    """Per-request time per output token after the first, `(last - first) / (n - 1)`,
    for requests with at least two tokens."""
    return [(r["token_times_s"][-1] - r["token_times_s"][0]) * 1e3
            / (len(r["token_times_s"]) - 1)
            for r in run.requests if len(r["token_times_s"]) >= 2]


def step_series(run: Run) -> StepSeries:
    """Per-step load, bubble and balance across ranks (ranks log the same iterations);
    computed once per run."""
    if run._series is None:
        run._series = _step_series(run)
    return run._series


def _step_series(run: Run) -> StepSeries:
    dp = run.dp_size
    per_step = list(zip(*run.steps, strict=True)) if run.steps else []
    bubble, balance = [], []
    for recs in per_step:
        bubble.append(_ratio(sum(r["step_time_s"] - r["own_cost_s"] for r in recs),
                             sum(r["step_time_s"] for r in recs)) or 0.0)
        loads = [r["running_blocks"] for r in recs]
        peak = max(loads)
        balance.append(sum(loads) / dp / peak if peak > 0 else None)
    return StepSeries(
        iters=[recs[0]["iter"] for recs in per_step],
        clock_s=[recs[0]["clock_s"] for recs in per_step],
        step_time_s=[recs[0]["step_time_s"] for recs in per_step],
        running_blocks=[[s["running_blocks"] for s in rank] for rank in run.steps],
        bubble=bubble,
        balance=balance,
        lb_active=[any(r["plan_applied"] is not None for r in recs) for recs in per_step],
    )


def _pauses(requests: list[dict], end_s: float) -> dict:
    """Pauses per request and their durations; a pause still open at the end of the run
    lasts until the request finished or, if it did not, until the end of the run.

    ``requests_paused_pct`` is the share of requests paused at least once, the figure
    vllm-ascend PR #12292 published for its GPQA run (161 of 198); ``longest_paused_ms``
    the most time one request spent paused over all its pauses, what starving it cost."""
    durations = []
    open_at_end = 0
    counts = []
    paused_ms = []
    for r in requests:
        pauses = r.get("pauses") or []
        counts.append(len(pauses))
        total_ms = 0.0
        for start, stop in pauses:
            if stop is None:
                open_at_end += 1
                stop = r["finish_s"] if r["finish_s"] is not None else end_s
            durations.append((stop - start) * 1e3)
            total_ms += durations[-1]
        paused_ms.append(total_ms)
    requests_paused = sum(c > 0 for c in counts)
    return {
        "total": sum(counts),
        "requests_paused": requests_paused,
        "requests_paused_pct": _ratio(requests_paused * 100, len(requests)),
        "per_request_mean": _mean(counts),
        "per_request_max": max(counts, default=0),
        "open_at_end": open_at_end,
        "duration_ms": distribution(durations),
        "longest_paused_ms": max(paused_ms, default=0.0),
    }


def _plan_churn(run: Run) -> dict:
    """Requests moved by applied plans: outs + ins summed over ranks, per step in which
    some rank applied a plan (an "active step")."""
    per_step = list(zip(*run.steps, strict=True)) if run.steps else []
    active = 0
    outs = ins = freezes = 0
    for recs in per_step:
        plans = [r["plan_applied"] for r in recs if r["plan_applied"] is not None]
        if not plans:
            continue
        active += 1
        outs += sum(len(p["out_blk"]) for p in plans)
        ins += sum(len(p["in_blk"]) for p in plans)
        freezes += sum(bool(p["freeze"]) for p in plans)
    return {
        "active_steps": active,
        "outs": outs,
        "ins": ins,
        "per_active_step": _ratio(outs + ins, active),
        "freeze_rank_steps": freezes,
        "paused": sum(len(s["paused"]) for rank in run.steps for s in rank),
        "resumed": sum(len(s["resumed"]) for rank in run.steps for s in rank),
    }


# Wall-clock record fields -> metrics names. interfaces.md names the collective time
# `lb_comm_s`; emu/impl/kit/engine.py currently writes `dyntra_lb_collectives_s`: both are read.
_WALL_FIELDS = (
    ("planner_ms", ("planner_s",)),
    ("lb_comm_ms", ("lb_comm_s", "dyntra_lb_collectives_s")),
    ("step_wall_ms", ("step_wall_s",)),
)


def _wall(wall: list[list[dict]] | None) -> dict | None:
    """Wall-clock milliseconds per step spent in the planner, in DyntraLB collectives and
    in the whole engine iteration, over every (rank, step) record that has the field;
    None when the run wrote no wall-clock files."""
    if wall is None:
        return None
    records = [rec for rank in wall for rec in rank]
    out: dict = {"records": len(records)}
    for name, fields in _WALL_FIELDS:
        values = _first_of(records, fields)
        out[name] = distribution(np.asarray(values, dtype=float) * 1e3)
        out[name.replace("_ms", "_total_s")] = sum(values)
    return out


def _first_of(records: list[dict], fields: tuple[str, ...]) -> list[float]:
    """Per record, the first of ``fields`` it holds a value for (records with none are
    left out)."""
    values = []
    for rec in records:
        for name in fields:
            value = rec.get(name)
            if value is not None:
                values.append(value)
                break
    return values


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def _mean(values) -> float | None:
    values = list(values)
    return sum(values) / len(values) if values else None
