"""Our own trace format, JSON Lines with ``request_id``, ``arrival_s``, ``prompt_tokens``
and ``output_tokens`` (``emu.workload``, fixtures/README.md), as a ``TraceFormat``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from emu.traces.base import ReadOptions, TraceFormat
from emu.workload import Row, dyntra_rows


def _rows(path: Path, raw: bytes, options: ReadOptions) -> Iterator[Row]:
    return dyntra_rows(path, raw, options.dp_size)


FORMAT = TraceFormat(
    name="dyntra",
    about="our JSON Lines: request_id, arrival_s, prompt_tokens, output_tokens "
          "(fixtures/README.md)",
    rows=_rows,
    # A first line that opens like JSON but is not an object is ours to explain: the
    # line-by-line reader names what is wrong with it.
    looks_like=lambda head: bool(head.keys & {"request_id", "arrival_s"}) or head.broken_json,
    ordered=True,
    rebase=False,
)
