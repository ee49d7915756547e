"""A run's records as numpy columns, what the metrics and plots compute from: a rank's
step columns, every rank's request columns (token times and pauses flattened, with
offsets), a rank's wall columns. Made from the Parquet tables (``from_*_table``) or,
for callers holding record dictionaries (unit tests, a converted JSON Lines log), from
those (``records_table``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from emu.records.schema import REQUESTS, SCHEMAS, STEPS, WALL
from emu.records.tally import Tally, TallyBuilder

# The step columns the metrics and plots read.
STEP_COLUMNS = ["iter", "wave", "step_counter", "clock_s", "own_cost_s", "step_time_s",
                "dummy", "running_blocks", "lb_active", "plan_applied", "paused", "resumed",
                "preempted", "control_plane"]


@dataclass
class StepColumns:
    """One rank's steps, in iteration order. ``charged_s`` etc. are None when the run's
    profile did not charge DyntraLB's control plane; ``plan_*`` are 0 / False where no
    plan was applied (``plan_applied`` False)."""

    iter: np.ndarray
    wave: np.ndarray
    step_counter: np.ndarray
    clock_s: np.ndarray
    own_cost_s: np.ndarray
    step_time_s: np.ndarray
    dummy: np.ndarray
    running_blocks: np.ndarray
    lb_active: np.ndarray
    plan_applied: np.ndarray
    plan_in: np.ndarray
    plan_out: np.ndarray
    plan_freeze: np.ndarray
    paused: np.ndarray  # counts per step
    resumed: np.ndarray
    preempted: np.ndarray
    charged_s: np.ndarray | None
    collectives_s: np.ndarray | None
    planner_s: np.ndarray | None
    planner_measured: np.ndarray | None

    def __len__(self) -> int:
        return len(self.iter)



@dataclass
class RequestColumns:
    """Every rank's requests, rank after rank, each rank's in the order it wrote them.
    Missing values (a partial run's unfinished requests) are NaN. Each request's token
    times are kept as what the metrics read of them (first, last, count) and the run's
    inter-token latencies, not one float per token and request."""

    table: pa.Table  # rank, request_id and the rest as written, without the token times
    rank: np.ndarray
    arrival_s: np.ndarray
    first_scheduled_s: np.ndarray
    finish_s: np.ndarray
    prompt_tokens: np.ndarray
    token_counts: np.ndarray
    first_token_s: np.ndarray  # NaN: no token
    last_token_s: np.ndarray
    # The gaps between a request's consecutive token times that are not zero, in ms, of
    # every request (see `inter_token_ms`), tallied.
    itl_ms: Tally
    pause_offsets: np.ndarray
    pause_start_s: np.ndarray
    pause_end_s: np.ndarray  # NaN: still paused when the run ended

    def __len__(self) -> int:
        return len(self.rank)


@dataclass
class WallColumns:
    """One rank's wall-clock seconds per step (NaN: not measured in that step)."""

    step_wall_s: np.ndarray
    planner_s: np.ndarray
    collectives_s: np.ndarray

    def __len__(self) -> int:
        return len(self.step_wall_s)


Columns = TypeVar("Columns", StepColumns, WallColumns)


def rows(columns: Columns, start: int, stop: int) -> Columns:
    """Rows ``[start, stop)`` of ``columns`` (views of its arrays)."""
    fields = {name: (value[start:stop] if isinstance(value, np.ndarray) else value)
              for name, value in vars(columns).items()}
    return type(columns)(**fields)


def _numbers(column: pa.ChunkedArray | pa.Array, dtype=float) -> np.ndarray:
    """A column as numpy; nulls NaN (floats) or 0 (anything else)."""
    if dtype is float:
        return np.asarray(column.to_numpy(zero_copy_only=False), dtype=float)
    fill = False if pa.types.is_boolean(column.type) else 0
    return np.asarray(pc.fill_null(column, fill).to_numpy(zero_copy_only=False), dtype=dtype)


def _lengths(column) -> np.ndarray:
    return _numbers(pc.list_value_length(column), np.int32)


def from_steps_table(table: pa.Table) -> StepColumns:
    """StepColumns of a steps table read with (at least) STEP_COLUMNS."""
    plan = table["plan_applied"].combine_chunks()
    control = table["control_plane"].combine_chunks()
    charged = None if control.null_count == len(control) else control

    def control_field(name, dtype=float):
        return None if charged is None else _numbers(pc.struct_field(charged, name), dtype)

    return StepColumns(
        iter=_numbers(table["iter"], np.int64), wave=_numbers(table["wave"], np.int64),
        step_counter=_numbers(table["step_counter"], np.int64),
        clock_s=_numbers(table["clock_s"]), own_cost_s=_numbers(table["own_cost_s"]),
        step_time_s=_numbers(table["step_time_s"]),
        dummy=_numbers(table["dummy"], bool),
        running_blocks=_numbers(table["running_blocks"], np.int32),
        lb_active=_numbers(table["lb_active"], bool),
        plan_applied=np.asarray(plan.is_valid().to_numpy(zero_copy_only=False), dtype=bool),
        plan_in=_lengths(pc.struct_field(plan, "in_blk")),
        plan_out=_lengths(pc.struct_field(plan, "out_blk")),
        plan_freeze=_numbers(pc.struct_field(plan, "freeze"), bool),
        paused=_lengths(table["paused"]), resumed=_lengths(table["resumed"]),
        preempted=_lengths(table["preempted"]),
        charged_s=control_field("charged_s"), collectives_s=control_field("collectives_s"),
        planner_s=control_field("planner_s"),
        planner_measured=control_field("planner_measured", bool))


def from_requests_table(table: pa.Table) -> RequestColumns:
    """RequestColumns of a requests table (every rank's, concatenated)."""
    return from_requests_parts(lambda: [table])


# Request parts (their token times dropped) joined into one contiguous chunk as they come:
# a part holds a few dozen requests, and each table kept costs far more in Arrow's and
# Python's objects than its rows (benchmarks/RESULTS.md, "Scale").
_JOINED_PARTS = 64


def from_requests_parts(parts: Callable[[], Iterable[pa.Table]]) -> RequestColumns:
    """RequestColumns of a requests table given part after part by ``parts()`` (every
    rank's parts in order; called twice): each part's token times are reduced as it comes,
    so a run's token times are never in memory at once."""
    slim, held, counts, first, last = [], [], [], [], []
    itl = TallyBuilder()
    for part in parts():
        times, offsets = _token_times(part)
        part_counts = np.diff(offsets)
        has = part_counts > 0
        counts.append(part_counts)
        first.append(_at(times, offsets[:-1], has))
        last.append(_at(times, offsets[1:] - 1, has))
        itl.add(inter_token_ms(times, offsets))
        held.append(part.drop_columns(["token_times_s"]))
        if len(held) == _JOINED_PARTS:
            slim.append(pa.concat_tables(held).combine_chunks())
            held = []
    schema = SCHEMAS[REQUESTS]
    table = pa.concat_tables([schema.empty_table().drop_columns(["token_times_s"]), *slim,
                              *held])
    pauses = table["pauses"].combine_chunks()
    pause_values = pauses.flatten()
    return RequestColumns(
        table=table, rank=_numbers(table["rank"], np.int64),
        arrival_s=_numbers(table["arrival_s"]),
        first_scheduled_s=_numbers(table["first_scheduled_s"]),
        finish_s=_numbers(table["finish_s"]), prompt_tokens=_numbers(table["prompt_tokens"]),
        token_counts=np.concatenate([np.zeros(0, np.int64), *counts]),
        first_token_s=np.concatenate([np.zeros(0), *first]),
        last_token_s=np.concatenate([np.zeros(0), *last]),
        itl_ms=itl.finish(inter_token_ms(*_token_times(part)) for part in parts()),
        pause_offsets=_offsets(pauses),
        pause_start_s=_numbers(pc.struct_field(pause_values, "start_s")),
        pause_end_s=_numbers(pc.struct_field(pause_values, "end_s")))


def _token_times(part: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """A requests part's token times, flattened, and where each request's start (and the
    last one's end)."""
    tokens = part["token_times_s"].combine_chunks()
    return _numbers(tokens.flatten()), _offsets(tokens)


def _at(times: np.ndarray, index: np.ndarray, has: np.ndarray) -> np.ndarray:
    """``times[index]`` where ``has``, NaN elsewhere."""
    out = np.full(len(index), np.nan)
    out[has] = times[index[has]]
    return out


def inter_token_ms(times: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Inter-token latencies of requests whose token times are ``times`` (flattened,
    request i's at ``offsets[i]:offsets[i + 1]``): each request's gaps between consecutive
    token times, in milliseconds, request after request. With speculative decoding a step
    emits several tokens at once; vLLM's serving benchmark receives them as one streamed
    chunk and counts one ITL per chunk, so a zero gap (same step) is no inter-token
    latency. Without it every gap is > 0. (The gaps are taken over all token times at
    once, and those across two requests dropped.)"""
    before, after = times[:-1], times[1:]
    keep = after != before
    # the gap from a request's last token to the next request's first
    across = offsets[1:-1] - 1
    keep[across[(across >= 0) & (across < keep.size)]] = False
    return (after[keep] - before[keep]) * 1e3


def _offsets(lists: pa.ListArray) -> np.ndarray:
    """Where each list starts in its flattened values (and where the last ends), from 0."""
    offsets = np.asarray(lists.offsets.to_numpy(), dtype=np.int64)
    return offsets - offsets[0]


def from_wall_table(table: pa.Table) -> WallColumns:
    return WallColumns(step_wall_s=_numbers(table["step_wall_s"]),
                       planner_s=_numbers(table["planner_s"]),
                       collectives_s=_numbers(table["dyntra_lb_collectives_s"]))


def records_table(records: list[dict], table: str) -> pa.Table:
    """The ``table`` (steps, requests or wall) of record dictionaries as the event and
    wall logs hold them (a request's ``pauses`` as [start, end] pairs)."""
    schema = SCHEMAS[table]
    rows = [record_row(record, table) for record in records]
    return pa.Table.from_pylist(rows, schema=schema)


def record_row(record: dict, table: str) -> dict:
    """A record dictionary as a row of ``table`` by column name (missing columns null)."""
    row = dict(record)
    if table == STEPS:
        row.setdefault("control_plane", None)
        row["lb_active"] = row.get("lb_active", row.get("plan_generated") is not None)
    elif table == REQUESTS:
        row["pauses"] = [{"start_s": start, "end_s": end} for start, end in row["pauses"]]
    elif table == WALL:
        row.setdefault("rank", 0)
        # the name docs/interfaces.md gives DyntraLB's collective time
        row.setdefault("dyntra_lb_collectives_s", row.get("lb_comm_s"))
    return row
