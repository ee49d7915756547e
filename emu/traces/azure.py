"""Azure's LLM inference traces (Azure/AzurePublicDataset, 2023 and 2024): CSV with
``TIMESTAMP`` (the invocation time, e.g. ``2023-11-16 18:15:46.6805900``),
``ContextTokens`` and ``GeneratedTokens``. The clock is seconds since the first row."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

from emu.traces.base import ReadOptions, TraceFormat
from emu.traces.csv_rows import csv_records, token_column
from emu.workload import Row, TraceRequest

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def _rows(path: Path, raw: bytes, options: ReadOptions) -> Iterator[Row]:
    first: datetime | None = None  # the first row's time: the clock's zero
    for line, record, problem in csv_records(path, raw, COLUMNS):
        if record is None:
            yield Row(line, problems=(problem,))
            continue
        where = f"{path}:{line}"
        when, problems = _time(record["TIMESTAMP"].strip(), first, where)
        context, context_problem = token_column(record, "ContextTokens", where)
        generated, generated_problem = token_column(record, "GeneratedTokens", where)
        problems += [p for p in (context_problem, generated_problem) if p is not None]
        if problems:
            yield Row(line, problems=tuple(problems))
            continue
        first = first or when
        yield Row(line, TraceRequest(f"azure-{line}", (when - first).total_seconds(),
                                     context, generated))


def _time(text: str, first: datetime | None, where: str) -> tuple[datetime | None, list[str]]:
    """The row's TIMESTAMP, or the problem with it."""
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        return None, [f"{where}: column 'TIMESTAMP': expected a date and time such as "
                      f"'2023-11-16 18:15:46.6805900', got {text!r}"]
    if first is not None and (when.tzinfo is None) != (first.tzinfo is None):
        return None, [f"{where}: column 'TIMESTAMP': {text!r} and the first row's time "
                      "do not both carry a UTC offset"]
    return when, []


FORMAT = TraceFormat(
    name="azure",
    about="Azure's LLM inference traces, CSV: TIMESTAMP, ContextTokens, GeneratedTokens",
    rows=_rows,
    looks_like=lambda head: bool(head.columns & {"ContextTokens", "GeneratedTokens"}),
    ordered=False,
    rebase=True,
)
