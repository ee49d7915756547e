"""Run metrics, computed after a run from the per-rank event logs it left in its output
directory (`rank<r>.events.jsonl`, plus the optional wall-clock `rank<r>.wall.jsonl`).

`load_run` reads a directory into a `Run`; `compute_metrics` turns a `Run` into the
`metrics.json` dictionary (schema: docs/metrics.md); `step_series` and `tpot_values_ms`
give the per-step and per-request series the plots in emu/report.py draw. Everything
here is computed from virtual time, so it is deterministic for a given event log, except
the `wall` section, which reports measured wall-clock seconds.
"""

from __future__ import annotations

import contextlib
import gc
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path

import numpy as np
import orjson

from emu.run_status import describe_unfinished, read_status

SCHEMA_VERSION = 1

_EVENTS_FILE = re.compile(r"^rank(\d+)\.events\.jsonl$")


class RunError(ValueError):
    """The output directory does not hold a readable, consistent set of event logs."""


class PartialRunError(RunError):
    """The directory holds a run that did not finish (its run.json is not "complete");
    `load_run(dir, allow_partial=True)` reads what it wrote."""


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
    # step_series(self), made by its first caller, once: the metrics and three of the
    # plots read it. The records are not changed after loading.
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


@contextlib.contextmanager
def frozen_runs() -> Iterator[None]:
    """The scope of a process's owner, a `dyntra-emu` command or a batch's run
    (``emu.executors.base.run_spec``): each run `load_run` reads within it is frozen
    (gc.freeze) once read, out of every later collection's sight and freed by reference
    counting as before; when the scope ends, everything frozen is thawed. Left in sight,
    the records cost the metrics and plots that follow full collections that went
    through all of them (their share of `dyntra-emu run`: benchmarks/RESULTS.md,
    "Speed"). Freezing takes every object alive at that moment, so outside such a scope
    (the pytest fixture, a library caller) nothing is frozen, and a process that already
    holds frozen objects, its owner's, is left as it is."""
    global _freezing
    if gc.get_freeze_count():
        yield
        return
    _freezing += 1
    try:
        yield
    finally:
        _freezing -= 1
        if not _freezing:
            gc.unfreeze()


def load_run(out_dir, *, allow_partial: bool = False) -> Run:
    """Read every `rank<r>.events.jsonl` (and `rank<r>.wall.jsonl` if present) under
    `out_dir`. Ranks must be 0..dp-1 with identical iteration sequences (lockstep).

    A run whose run.json (emu.run_status) is not "complete" raises PartialRunError,
    unless `allow_partial`: then the logs are read as far as every rank got (the last,
    partly written line of a log and the iterations not every rank logged are left
    out), and each request seen in a step record without a request record (the engine
    writes those when a request finishes or the run ends) gets a synthesized record
    with `"unfinished": true`, no tokens and no finish. `Run.state` tells which."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        raise RunError(f"{out_dir}: not a directory with a run's event logs")
    status = read_status(out_dir)
    state = status["state"] if status is not None else None
    partial = state not in (None, "complete")
    if partial and not allow_partial:
        raise PartialRunError(f"{describe_unfinished(out_dir, status)}; its event logs are "
                              "partial (load_run(..., allow_partial=True) reads them)")
    ranks = sorted(int(m.group(1)) for p in out_dir.iterdir()
                   if (m := _EVENTS_FILE.match(p.name)))
    if not ranks:
        raise RunError(f"{out_dir}: no rank<r>.events.jsonl files found")
    if ranks != list(range(len(ranks))):
        raise RunError(f"{out_dir}: event logs for ranks {ranks}; expected ranks "
                       f"0..{len(ranks) - 1} without gaps")
    # The records hold no cycles: the garbage collector rests while tens of thousands of
    # them are made (a collection every few hundred new dicts would cost more than the
    # parse); within `frozen_runs` they are then frozen.
    with _gc_paused():
        steps, requests, wall = _read_logs(out_dir, ranks, partial)
        if _freezing:
            gc.freeze()
    if partial:
        common = min(len(rank_steps) for rank_steps in steps)
        steps = [rank_steps[:common] for rank_steps in steps]
        requests += _unfinished_requests(steps, requests)
    iters0 = [s["iter"] for s in steps[0]]
    for rank in ranks[1:]:
        iters = [s["iter"] for s in steps[rank]]
        if iters != iters0:
            raise RunError(
                f"{out_dir}: rank {rank} logged {len(iters)} steps and rank 0 logged "
                f"{len(iters0)} (first difference at position "
                f"{_first_difference(iters, iters0)}); lockstep ranks must log the same "
                "iterations — did the run stop early?"
            )
    return Run(dp_size=len(ranks), steps=steps, requests=requests, wall=wall, state=state)


def _read_logs(out_dir: Path, ranks: list[int], partial: bool
               ) -> tuple[list[list[dict]], list[dict], list[list[dict]] | None]:
    """Every rank's step records (in iteration order), every request record, and the
    wall records (None when the run wrote no wall log)."""
    steps: list[list[dict]] = []
    requests: list[dict] = []
    for rank in ranks:
        path = out_dir / f"rank{rank}.events.jsonl"
        rank_steps = []
        for lineno, rec in _read_jsonl(path, partial):
            kind = rec.get("kind")
            if kind == "step":
                rank_steps.append(rec)
            elif kind == "request":
                requests.append(rec)
            else:
                raise RunError(f"{path}:{lineno}: unknown record kind {kind!r}; expected "
                               "'step' or 'request'")
        rank_steps.sort(key=lambda s: s["iter"])
        steps.append(rank_steps)
    wall = None
    wall_paths = [out_dir / f"rank{rank}.wall.jsonl" for rank in ranks]
    if any(p.exists() for p in wall_paths):
        wall = [[rec for _, rec in _read_jsonl(p, partial)] if p.exists() else []
                for p in wall_paths]
    return steps, requests, wall


def read_events(path) -> list[dict]:
    """The records of one event log (steps and requests), in file order."""
    with _gc_paused():
        return [rec for _, rec in _read_jsonl(Path(path))]


def _unfinished_requests(steps: list[list[dict]], requests: list[dict]) -> list[dict]:
    """Records for the requests a partial run's step records show (admitted, paused,
    resumed, preempted) but whose request record was never written."""
    recorded = {(r["rank"], r["request_id"]) for r in requests}
    out = []
    for rank, rank_steps in enumerate(steps):
        seen: dict[str, dict] = {}
        for s in rank_steps:
            for key in ("admitted", "resumed", "paused", "preempted"):
                for rid in s.get(key, ()):
                    if (rank, rid) not in recorded and rid not in seen:
                        seen[rid] = {"kind": "request", "rank": rank, "request_id": rid,
                                     "first_scheduled_s": None, "arrival_s": None,
                                     "prompt_tokens": None, "output_tokens": None,
                                     "token_times_s": [], "finish_s": None, "pauses": [],
                                     "unfinished": True}
        out += seen.values()
    return out


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


def _read_jsonl(path: Path, partial: bool = False):
    """The JSON objects of a JSON Lines file with their line numbers; with `partial`, a
    last line without its newline (cut off when the writer was stopped) is skipped.

    A run's logs hold tens of thousands of records, so each line is parsed by orjson
    (faster than json, to the same objects: benchmarks/RESULTS.md, "Start-up and
    teardown costs"); a line it refuses goes
    through json, which accepts a little more (NaN, a lone surrogate) and words the
    error."""
    with open(path, "rb") as f:
        lines = f.read().splitlines(keepends=True)
    for lineno, line in enumerate(lines, start=1):
        if partial and line[-1:] not in (b"\n", b"\r"):
            return
        try:
            rec = orjson.loads(line)
        except orjson.JSONDecodeError:
            rec = _parse_line(line, f"{path}:{lineno}", partial)
            if rec is None:
                continue
        if not isinstance(rec, dict):
            raise RunError(f"{path}:{lineno}: expected a JSON object")
        yield lineno, rec


def _parse_line(line: bytes, where: str, partial: bool):
    """One line orjson refused, read as json reads it: None for a blank line, else its
    value, or RunError with json's message."""
    text = line.decode("utf-8", errors="replace" if partial else "strict")
    if not text.strip():
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise RunError(f"{where}: invalid JSON: {exc.msg}") from None


@contextlib.contextmanager
def _gc_paused():
    """The garbage collector off for the block (as it was before, afterwards)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _first_difference(a: list, b: list) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def _mean(values) -> float | None:
    values = list(values)
    return sum(values) / len(values) if values else None
