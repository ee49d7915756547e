"""A run directory written before the records were Parquet, converted: each rank's
``rank<r>.events.jsonl`` and ``rank<r>.wall.jsonl`` become its Parquet tables (the JSON
Lines files are kept). ``dyntra-emu convert`` calls it; reading such a directory names
that command (``emu.records.reader.LegacyRunError``)."""

from __future__ import annotations

import json
from pathlib import Path

import orjson

from emu.records.columns import record_row
from emu.records.schema import (
    LEGACY_EVENTS,
    LEGACY_WALL,
    REQUESTS,
    SCHEMAS,
    STEPS,
    WALL,
    path,
)
from emu.records.writer import TableWriter


class ConvertError(ValueError):
    """A JSON Lines log that cannot be converted (its file and line named)."""


def legacy_ranks(run_dir: Path) -> list[int]:
    """The ranks with a JSON Lines event log in ``run_dir``, sorted."""
    ranks = []
    for p in Path(run_dir).glob("rank*.events.jsonl"):
        digits = p.name[len("rank"):-len(".events.jsonl")]
        if digits.isdigit():
            ranks.append(int(digits))
    return sorted(ranks)


def convert_run(run_dir: Path) -> list[int]:
    """Write the Parquet tables of every rank's JSON Lines logs in ``run_dir``; returns
    the ranks converted. A request record belongs after the step before it, except the
    records of requests still in flight at the end (no ``finish_s``), written last."""
    run_dir = Path(run_dir)
    ranks = legacy_ranks(run_dir)
    for rank in ranks:
        _convert_events(run_dir / LEGACY_EVENTS.format(rank=rank), run_dir, rank)
        wall = run_dir / LEGACY_WALL.format(rank=rank)
        if wall.exists():
            _convert_wall(wall, run_dir, rank)
    return ranks


def _records(file: Path):
    with open(file, "rb") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError:
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ConvertError(f"{file}:{lineno}: invalid JSON: {exc.msg}") from None
            if not isinstance(record, dict):
                raise ConvertError(f"{file}:{lineno}: expected a JSON object")
            yield lineno, record


def _row(record: dict, table: str) -> tuple:
    row = record_row(record, table)
    return tuple(row.get(name) for name in SCHEMAS[table].names)


def _convert_events(file: Path, run_dir: Path, rank: int) -> None:
    steps = TableWriter(path(run_dir, rank, STEPS), STEPS)
    requests = TableWriter(path(run_dir, rank, REQUESTS), REQUESTS)
    last_iter = None
    try:
        for lineno, record in _records(file):
            kind = record.get("kind")
            if kind == "step":
                steps.append(_row(record, STEPS))
                last_iter = record["iter"]
            elif kind == "request":
                record = {**record, "logged_after_iter": None if record.get(
                    "finish_s") is None else last_iter}
                requests.append(_row(record, REQUESTS))
            else:
                raise ConvertError(f"{file}:{lineno}: unknown record kind {kind!r}; "
                                   "expected 'step' or 'request'")
    finally:
        steps.close()
        requests.close()


def _convert_wall(file: Path, run_dir: Path, rank: int) -> None:
    wall = TableWriter(path(run_dir, rank, WALL), WALL)
    try:
        for _, record in _records(file):
            collectives = record.get("lb_comm_s")
            if collectives is None:  # the name the ranks write
                collectives = record.get("dyntra_lb_collectives_s")
            wall.append((rank, record.get("iter"), record.get("step_wall_s"),
                         record.get("planner_s"), collectives))
    finally:
        wall.close()
