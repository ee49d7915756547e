"""The three record tables of a run, one directory of Parquet parts of each per rank
(``rank<r>.<table>/part-<n>.parquet``, then ``_complete`` once the rank closed it), and
their schema (docs/records.md). ``SCHEMA_VERSION`` is written into every file's key-value
metadata (``dyntra.schema_version``) and is raised whenever a column changes meaning,
type or name."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

SCHEMA_VERSION = 1
VERSION_KEY = b"dyntra.schema_version"

STEPS, REQUESTS, WALL = "steps", "requests", "wall"
# Written into a table's directory by the rank once its last part is: a table without it
# is partial (its rank was killed).
COMPLETE = "_complete"
# The legacy JSON Lines logs of a run written before the Parquet records.
LEGACY_EVENTS = "rank{rank}.events.jsonl"
LEGACY_WALL = "rank{rank}.wall.jsonl"

_IDS = pa.list_(pa.string())
_BLOCKS = pa.list_(pa.int64())
PLAN = pa.struct([("freeze", pa.bool_()), ("in_blk", _BLOCKS), ("out_blk", _BLOCKS)])
COLLECTIVE = pa.struct([("dtype", pa.string()), ("op", pa.string()), ("seq", pa.int64()),
                        ("shape", _BLOCKS), ("site", pa.string())])
CONTROL_PLANE = pa.struct([("charged_s", pa.float64()), ("collectives_s", pa.float64()),
                           ("planner_s", pa.float64()), ("planner_measured", pa.bool_())])
PAUSE = pa.struct([("start_s", pa.float64()), ("end_s", pa.float64())])

# One row per non-idle iteration of a rank, in iteration order. Times are virtual
# seconds, exactly the floats of the event log.
STEP_FIELDS = (
    ("rank", pa.int32()), ("iter", pa.int64()), ("wave", pa.int64()),
    ("step_counter", pa.int64()), ("clock_s", pa.float64()), ("own_cost_s", pa.float64()),
    ("step_time_s", pa.float64()), ("dummy", pa.bool_()), ("num_running", pa.int64()),
    ("num_waiting", pa.int64()), ("running_blocks", pa.int64()),
    ("waiting_blocks", pa.int64()), ("scheduled_tokens", pa.int64()),
    ("plan_applied", PLAN), ("paused", _IDS), ("resumed", _IDS), ("admitted", _IDS),
    ("preempted", _IDS), ("finished", _IDS), ("plan_generated", PLAN),
    ("lb_active", pa.bool_()), ("kv_free_blocks", pa.int64()),
    ("kv_held_blocks", pa.int64()), ("paused_kv_blocks", pa.map_(pa.string(), pa.int64())),
    ("collectives", pa.list_(COLLECTIVE)), ("control_plane", CONTROL_PLANE),
)
# One row per request of a rank: when it finished, or at the end of the run for the
# requests still in flight. ``logged_after_iter``: the iteration whose step finished it
# (null: still in flight when the run ended), the place of its line in the event log.
REQUEST_FIELDS = (
    ("rank", pa.int32()), ("request_id", pa.string()), ("arrival_s", pa.float64()),
    ("prompt_tokens", pa.int64()), ("output_tokens", pa.int64()),
    ("first_scheduled_s", pa.float64()), ("finish_s", pa.float64()),
    ("token_times_s", pa.list_(pa.float64())), ("pauses", pa.list_(PAUSE)),
    ("logged_after_iter", pa.int64()),
)
# One row per non-idle iteration: wall-clock seconds (these differ from run to run).
# ``planner_s`` and ``dyntra_lb_collectives_s`` are null when DyntraLB is off.
WALL_FIELDS = (
    ("rank", pa.int32()), ("iter", pa.int64()), ("step_wall_s", pa.float64()),
    ("planner_s", pa.float64()), ("dyntra_lb_collectives_s", pa.float64()),
)


def _schema(fields) -> pa.Schema:
    return pa.schema(fields, metadata={VERSION_KEY: str(SCHEMA_VERSION).encode()})


SCHEMAS = {STEPS: _schema(STEP_FIELDS), REQUESTS: _schema(REQUEST_FIELDS),
           WALL: _schema(WALL_FIELDS)}


def path(run_dir: Path, rank: int, table: str) -> Path:
    """``rank<r>.<table>``, the directory of the table's parts, in ``run_dir``."""
    return Path(run_dir) / f"rank{rank}.{table}"


def part_name(index: int) -> str:
    """The file name of a table's part ``index`` (parts are read in index order)."""
    return f"part-{index:05d}.parquet"

