"""A run's records as the tests read them: each rank's event log, as the JSON Lines
``dyntra-emu events`` prints (emu/records/reader.py)."""

from __future__ import annotations

import pathlib

from emu.records.reader import event_lines, event_records


def events(run_dir: pathlib.Path, rank: int) -> list[dict]:
    """Rank ``rank``'s step and request records, in event-log order."""
    return list(event_records(pathlib.Path(run_dir), rank))


def event_log(run_dir: pathlib.Path, rank: int) -> bytes:
    """Rank ``rank``'s event log, byte for byte."""
    return "".join(line + "\n" for line in event_lines(pathlib.Path(run_dir), rank)).encode()
