"""Reading a run's records back: which ranks wrote them, a table's columns (what the
metrics read), and the records as the event log's dictionaries and JSON Lines (what
``dyntra-emu events``, ``diff`` and ``timeline`` read), part by part.

A run directory written before the records were Parquet holds JSON Lines logs instead
(``rank<r>.events.jsonl``): reading it raises ``LegacyRunError``, whose message names
the command that converts it (``dyntra-emu convert``)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from emu.records.schema import COMPLETE, REQUESTS, SCHEMAS, STEPS, VERSION_KEY, WALL, path

_dumps = json.JSONEncoder(sort_keys=True, separators=(",", ":")).encode
_STEPS_DIR = re.compile(r"^rank(\d+)\.steps$")
_PART = re.compile(r"^part-(\d+)\.parquet$")
_LEGACY_FILE = re.compile(r"^rank(\d+)\.events\.jsonl$")
# Rows turned into dictionaries at a time.
_CHUNK_ROWS = 4096


class RecordsError(ValueError):
    """A run directory without readable records."""


class LegacyRunError(RecordsError):
    """A run directory of JSON Lines event logs (written before the Parquet records)."""


def record_ranks(run_dir: Path) -> list[int]:
    """The ranks that wrote records in ``run_dir``, sorted; [] when none did. Raises
    LegacyRunError for a directory of JSON Lines event logs."""
    run_dir = Path(run_dir)
    names = [p.name for p in run_dir.iterdir()]
    ranks = sorted(int(m.group(1)) for name in names
                   if (m := _STEPS_DIR.match(name)) and (run_dir / name).is_dir())
    if not ranks and any(_LEGACY_FILE.match(name) for name in names):
        raise LegacyRunError(
            f"{run_dir}: its records are JSON Lines event logs (rank<r>.events.jsonl) from "
            f"an earlier dyntra-emu; convert them with: dyntra-emu convert {run_dir}")
    return ranks


def read_table(run_dir: Path, rank: int, table: str, columns: list[str] | None = None, *,
               partial: bool = False) -> pa.Table:
    """Rank ``rank``'s ``table`` (only ``columns``, if given): its parts in order. A table
    its rank never closed (the rank was killed: no ``_complete`` marker) reads, with
    ``partial``, as the parts the rank wrote (its unwritten buffer is lost), else raises
    RecordsError; so does a part that is not readable Parquet."""
    return pa.concat_tables([SCHEMAS[table].empty_table().select(columns or SCHEMAS[table].names),
                             *read_parts(run_dir, rank, table, columns, partial=partial)])


def read_parts(run_dir: Path, rank: int, table: str, columns: list[str] | None = None, *,
               partial: bool = False) -> Iterator[pa.Table]:
    """Rank ``rank``'s ``table`` part after part (as ``read_table`` reads it), for a
    reader that keeps less than the whole table: one part is in memory at a time."""
    directory = path(run_dir, rank, table)
    if not (directory / COMPLETE).is_file() and not partial:
        raise RecordsError(f"{directory}: rank {rank} never closed its {table} records "
                           f"(no {COMPLETE} marker: the rank was killed); they are partial")
    parts = sorted((int(m.group(1)), p) for p in (directory.iterdir() if directory.is_dir()
                                                  else ()) if (m := _PART.match(p.name)))
    for _, part in parts:
        try:
            parquet = pq.ParquetFile(part)
        except (OSError, pa.ArrowInvalid) as exc:
            raise RecordsError(f"{part}: not a readable Parquet file ({exc})") from None
        _check_version(part, parquet.schema_arrow)
        yield parquet.read(columns=columns)


def has_table(run_dir: Path, rank: int, table: str) -> bool:
    """Whether rank ``rank`` wrote ``table`` (a run reads without its wall tables)."""
    return path(run_dir, rank, table).exists()


def _check_version(file: Path, schema: pa.Schema) -> None:
    version = (schema.metadata or {}).get(VERSION_KEY)
    expected = SCHEMAS[STEPS].metadata[VERSION_KEY]
    if version != expected:
        raise RecordsError(f"{file}: records of schema version "
                           f"{version.decode() if version else 'none'}; this dyntra-emu "
                           f"reads version {expected.decode()}")


def _rows(run_dir: Path, rank: int, table: str, partial: bool) -> Iterator[dict]:
    """The rows of a table as dictionaries, a chunk at a time."""
    for batch in read_table(run_dir, rank, table, partial=partial).to_batches(_CHUNK_ROWS):
        yield from batch.to_pylist()


def step_record(row: dict) -> dict:
    """A steps-table row as the event log's step record (``kind`` "step")."""
    row["kind"] = "step"
    control = row["control_plane"]
    if control is None:
        del row["control_plane"]
    elif not control["planner_measured"]:
        del control["planner_measured"]
    row["paused_kv_blocks"] = dict(row["paused_kv_blocks"])
    return row


def request_record(row: dict) -> dict:
    """A requests-table row as the event log's request record (``kind`` "request")."""
    del row["logged_after_iter"]
    row["kind"] = "request"
    row["pauses"] = [[p["start_s"], p["end_s"]] for p in row["pauses"]]
    return row


def step_records(run_dir: Path, rank: int, *, partial: bool = False) -> Iterator[dict]:
    """Rank ``rank``'s step records, in iteration order."""
    for row in _rows(run_dir, rank, STEPS, partial):
        yield step_record(row)


def request_records(run_dir: Path, rank: int, *, partial: bool = False) -> Iterator[dict]:
    """Rank ``rank``'s request records, in the order it wrote them."""
    for row in _rows(run_dir, rank, REQUESTS, partial):
        yield request_record(row)


def event_records(run_dir: Path, rank: int, *, partial: bool = False) -> Iterator[dict]:
    """Rank ``rank``'s step and request records in event-log order: each step record,
    then the records of the requests it finished, then those of the requests still in
    flight when the run ended."""
    requests = _rows(run_dir, rank, REQUESTS, partial)
    pending = next(requests, None)
    for row in _rows(run_dir, rank, STEPS, partial):
        step = row["iter"]
        yield step_record(row)
        while pending is not None and pending["logged_after_iter"] == step:
            yield request_record(pending)
            pending = next(requests, None)
    while pending is not None:
        yield request_record(pending)
        pending = next(requests, None)


def event_lines(run_dir: Path, rank: int) -> Iterator[str]:
    """Rank ``rank``'s event log as JSON Lines (keys sorted, no spaces), without the
    newlines."""
    for record in event_records(run_dir, rank):
        yield _dumps(record)


def request_lines(run_dir: Path, rank: int) -> Iterator[str]:
    """Rank ``rank``'s request records as JSON Lines (see ``event_lines``)."""
    for record in request_records(run_dir, rank):
        yield _dumps(record)


def wall_records(run_dir: Path, rank: int, *, partial: bool = False) -> Iterator[dict]:
    """Rank ``rank``'s wall-clock records as the wall log held them: ``iter`` and
    ``step_wall_s``, with ``planner_s`` and ``dyntra_lb_collectives_s`` when DyntraLB
    ran."""
    for row in _rows(run_dir, rank, WALL, partial):
        del row["rank"]
        if row["planner_s"] is None:
            del row["planner_s"], row["dyntra_lb_collectives_s"]
        yield row


def wall_lines(run_dir: Path, rank: int) -> Iterator[str]:
    """Rank ``rank``'s wall log as JSON Lines (see ``event_lines``)."""
    for record in wall_records(run_dir, rank):
        yield _dumps(record)
