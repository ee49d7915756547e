"""The runs of a ``--split`` (one per window, emu/split/windows.py) stitched into one
answer: called once every window's run has finished, by ``run --split`` for its
metrics.json, summary and plots, and by ``ab --split`` for each window's gain.

What is measured of window k's run (docs/split.md):

- its steps in the window's measured span, [start, end) of virtual time (window 0 from
  the run's start, the last window until its run ends): the steps before are the
  warm-up, those after replay the next window's time without its traffic;
- its owned requests, every request of the trace in exactly one window: their
  latencies, tokens, pauses.

``stitch`` concatenates those into one ``emu.metrics.Run``, from which
``emu.metrics.compute_metrics`` computes every per-step and per-request figure as for a
whole run; ``measured_metrics`` then restates what depends on time: the virtual time is
the sum of the measured spans, and the throughput counts the tokens emitted inside them
(by every request the window replayed, warm-up ones included, as the whole run emits them
at that time).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from emu.metrics import Run, compute_metrics, headroom
from emu.records.columns import StepColumns, from_requests_parts
from emu.split.windows import Window
from emu.step_passes import step_ends_s


class StitchError(ValueError):
    """The windows' runs do not fit their windows (a run of another DP size, an owned
    request missing from its window's records); the message names the window."""


@dataclass(frozen=True)
class Measured:
    """The measured parts of some windows' runs: ``run`` (their measured steps and owned
    requests, stitched), the tokens emitted inside the measured spans and the spans'
    total length in virtual seconds."""

    run: Run
    tokens: int
    span_s: float


def span(window: Window, run: Run, last: bool) -> tuple[float, float]:
    """Window ``window``'s measured span in its run's virtual time: from its start (0 for
    the first window) to its end, or for the ``last`` window to its run's end."""
    start = 0.0 if window.index == 0 else window.start_s
    if not last:
        return start, window.end_s
    ends = [float(np.max(step_ends_s(rank))) for rank in run.steps if len(rank)]
    return start, max(ends, default=start)


def stitch(parts: Sequence[tuple[Window, Run]], last: int) -> Measured:
    """The measured parts of ``parts`` (windows with their runs, in window order),
    stitched; ``last`` is the index of the split's last window (its span runs to its run's
    end). Steps are numbered again from 0 in the stitched order."""
    dp = parts[0][1].dp_size
    steps: list[list[StepColumns]] = [[] for _ in range(dp)]
    owned: list[tuple[Run, pa.Array]] = []
    tokens, span_s = 0, 0.0
    for window, run in parts:
        if run.dp_size != dp:
            raise StitchError(f"{window.describe()}: {run.dp_size} ranks, the others {dp}")
        start, end = span(window, run, window.index == last)
        upto = math.inf if window.index == last else end
        clock = run.steps[0].clock_s
        inside = (clock >= start) & (clock < upto)
        for rank in range(dp):
            steps[rank].append(_take(run.steps[rank], inside))
        tokens += _tokens_inside(run, start, upto)
        span_s += end - start
        owned.append((run, _owned_ids(window, run)))
    requests = from_requests_parts(lambda: (
        part.filter(pc.is_in(part["request_id"], value_set=ids))
        for run, ids in owned for part in run.request_parts()))
    stitched = [_concat(rank_steps) for rank_steps in steps]
    for rank_steps in stitched:
        rank_steps.iter = np.arange(len(rank_steps), dtype=np.int64)
    return Measured(Run(dp_size=dp, steps=stitched, requests=requests, state="complete"),
                    tokens, span_s)


def measured_metrics(parts: Sequence[tuple[Window, Run]], last: int, *,
                     config=None, seed=None) -> tuple[dict, Run]:
    """metrics.json's dictionary of the measured parts of ``parts`` (as ``stitch``), and
    the stitched run (for the plots): ``compute_metrics`` of the stitched run with the
    virtual time, throughput and headroom restated over the measured spans. Its ``wall``
    is None: wall-clock times are each window's, in its own metrics.json."""
    measured = stitch(parts, last)
    metrics = compute_metrics(measured.run, config=config, seed=seed)
    busy = metrics["busy_time_s"]
    metrics["virtual_time_s"] = measured.span_s
    metrics["throughput_tok_s"] = (measured.tokens / measured.span_s
                                   if measured.span_s else None)
    metrics["headroom"] = headroom(measured.run, measured.tokens, measured.span_s, busy)
    return metrics, measured.run


def _take(steps: StepColumns, mask: np.ndarray) -> StepColumns:
    """The steps of ``steps`` where ``mask`` holds (a finished run's: no shown ids)."""
    return StepColumns(**{f.name: (value[mask] if isinstance(value, np.ndarray) else value)
                          for f in fields(StepColumns)
                          for value in (getattr(steps, f.name),)})


def _concat(parts: list[StepColumns]) -> StepColumns:
    """One rank's measured steps, window after window."""
    out = {}
    for f in fields(StepColumns):
        values = [getattr(p, f.name) for p in parts]
        out[f.name] = (None if any(v is None for v in values)
                       else np.concatenate(values))
    return StepColumns(**out)


def _tokens_inside(run: Run, start: float, upto: float) -> int:
    """How many tokens ``run``'s requests emitted in [start, upto) of virtual time, read
    part by part (the run holds no token times)."""
    count = 0
    for part in run.request_parts():
        times = part["token_times_s"].combine_chunks().flatten()
        count += pc.sum(pc.and_(pc.greater_equal(times, start), pc.less(times, upto)),
                        min_count=0).as_py() or 0
    return count


def _owned_ids(window: Window, run: Run) -> pa.Array:
    """The ids of ``window``'s owned requests; StitchError when its run is missing one
    of them or recorded one twice."""
    ids = pa.array([r.request_id for r in window.owned], pa.string())
    recorded = run.requests.table["request_id"]
    found = pc.sum(pc.is_in(recorded, value_set=ids), min_count=0).as_py() or 0
    if found != len(ids):
        raise StitchError(f"{window.describe()}: its run recorded {found} of its "
                          f"{len(ids)} requests")
    return ids
