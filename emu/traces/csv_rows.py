"""CSV trace files (Azure's and BurstGPT's): their data rows as text, and the values
in them read as numbers, each problem naming ``file:line`` and the column."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterator
from pathlib import Path

from emu.workload import tokens_problem


def csv_records(path: Path, raw: bytes, columns: tuple[str, ...]
                ) -> Iterator[tuple[int, dict[str, str] | None, str | None]]:
    """Each data row of a CSV file with a header line: its line number and its values
    by column, or None and the problem. A header without every one of ``columns`` is
    one problem, and no row follows it."""
    try:
        text = raw.decode("utf-8-sig")  # a byte-order mark, as spreadsheets write
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        yield line, None, f"{path}:{line}: not valid UTF-8 ({exc.reason})"
        return
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = [name.strip() for name in next(reader, [])]
        missing = [c for c in columns if c not in header]
        if missing:
            names = ", ".join(repr(c) for c in missing)
            yield 1, None, (f"{path}:1: missing column(s) {names}; the header has: "
                            f"{', '.join(header) or 'nothing'}")
            return
        for fields in reader:
            if not fields:  # a blank line
                continue
            if len(fields) != len(header):
                yield reader.line_num, None, (f"{path}:{reader.line_num}: expected "
                                              f"{len(header)} fields as in the header, got "
                                              f"{len(fields)}")
                continue
            yield reader.line_num, dict(zip(header, fields, strict=True)), None
    except csv.Error as exc:
        yield reader.line_num, None, f"{path}:{reader.line_num}: not valid CSV: {exc}"


def token_column(record: dict[str, str], column: str, where: str
                 ) -> tuple[int | None, str | None]:
    """The token count in ``column``, or None and the problem."""
    text = record[column].strip()
    try:
        value = int(text)
    except ValueError:
        value = None
    problem = tokens_problem(value, repr(text))
    if problem is not None:
        return None, f"{where}: column {column!r}: {problem}"
    return value, None


def seconds_column(record: dict[str, str], column: str, where: str
                   ) -> tuple[float | None, str | None]:
    """A time in seconds (a finite number >= 0) in ``column``, or None and the problem."""
    text = record[column].strip()
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        return None, (f"{where}: column {column!r}: expected a finite number of seconds "
                      f">= 0, got {text!r}")
    return value, None
