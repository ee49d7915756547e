"""BurstGPT (HPMLL/BurstGPT): CSV with ``Timestamp`` (seconds from 0:00 of the trace's
first day), ``Model``, ``Request tokens``, ``Response tokens``, ``Total tokens`` and
``Log Type``. The dataset's README calls a row whose ``Response tokens`` is 0 a failure,
and ships each file again without them (``BurstGPT_without_fails_*.csv``): such a row
produced no token, so it never decoded, and a decode node's replay skips it, which
replays a file with failures as its ``without_fails`` twin."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from emu.traces.base import ReadOptions, TraceFormat
from emu.traces.csv_rows import csv_records, seconds_column, token_column
from emu.workload import Row, TraceRequest

COLUMNS = ("Timestamp", "Request tokens", "Response tokens")
FAILED = "failed request (Response tokens 0)"


def _rows(path: Path, raw: bytes, options: ReadOptions) -> Iterator[Row]:
    for line, record, problem in csv_records(path, raw, COLUMNS):
        if record is None:
            yield Row(line, problems=(problem,))
            continue
        if record["Response tokens"].strip() == "0":
            yield Row(line, skipped=FAILED)
            continue
        where = f"{path}:{line}"
        timestamp, time_problem = seconds_column(record, "Timestamp", where)
        request, request_problem = token_column(record, "Request tokens", where)
        response, response_problem = token_column(record, "Response tokens", where)
        problems = tuple(p for p in (time_problem, request_problem, response_problem)
                         if p is not None)
        if problems:
            yield Row(line, problems=problems)
            continue
        yield Row(line, TraceRequest(f"burstgpt-{line}", timestamp, request, response))


FORMAT = TraceFormat(
    name="burstgpt",
    about="BurstGPT, CSV: Timestamp, Request tokens, Response tokens (failed rows, "
          "Response tokens 0, are skipped)",
    rows=_rows,
    looks_like=lambda head: bool(head.columns & {"Request tokens", "Response tokens"}),
    ordered=False,
    rebase=True,
)
