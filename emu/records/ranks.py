"""A run's step or wall columns of every rank, read the way a reader needs them: one
rank whole (``ranks[r]``), one rank a chunk at a time (``chunks(r)``), or the same rows
of every rank a window at a time (``windows()``). The metrics and plots of a run of
hours (emu.metrics) read chunks and windows, so they hold a part or a window of its
records at a time, never all of them; ``diff`` and ``--split``'s stitch read a rank
whole. ``OnDisk`` reads a run directory's Parquet parts; ``InMemory`` gives columns
already in memory (record dictionaries, a stitched ``--split`` run) the same way."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Generic

import pyarrow as pa

from emu.records.columns import Columns as C
from emu.records.columns import rows
from emu.records.reader import read_parts
from emu.records.schema import SCHEMAS

# Rows of each rank in one window (at dp 16, about 5 MB of step columns).
WINDOW_ROWS = 4096


class RankColumns(Generic[C]):
    """Every rank's columns of one table; ``n_rows`` is rank 0's row count (lockstep
    steps: every rank's)."""

    n_rows: int

    def __len__(self) -> int:
        raise NotImplementedError

    def __getitem__(self, rank: int) -> C:
        """Rank ``rank``'s columns, whole."""
        raise NotImplementedError

    def __iter__(self) -> Iterator[C]:
        for rank in range(len(self)):
            yield self[rank]

    def chunks(self, rank: int) -> Iterator[C]:
        """Rank ``rank``'s columns, a chunk of rows after another, in row order."""
        raise NotImplementedError

    def windows(self) -> Iterator[list[C]]:
        """Rows ``[i, i + WINDOW_ROWS)`` of every rank (a list by rank), window after
        window, up to ``n_rows``."""
        raise NotImplementedError


class InMemory(RankColumns[C]):
    """Columns already in memory, one per rank."""

    def __init__(self, ranks: list[C]):
        self._ranks = ranks
        self.n_rows = len(ranks[0]) if ranks else 0

    def __len__(self) -> int:
        return len(self._ranks)

    def __getitem__(self, rank: int) -> C:
        return self._ranks[rank]

    def chunks(self, rank: int) -> Iterator[C]:
        yield self._ranks[rank]

    def windows(self) -> Iterator[list[C]]:
        for start in range(0, self.n_rows, WINDOW_ROWS):
            yield [rows(rank, start, start + WINDOW_ROWS) for rank in self._ranks]


class OnDisk(RankColumns[C]):
    """Table ``table`` of ranks ``0..dp-1`` in ``run_dir``, its ``columns`` made into
    ``C`` by ``convert``, the first ``n_rows`` rows of each rank (None: all of them); a
    chunk is a Parquet part. Reads the files on every call, and keeps the last rank read
    whole (``diff`` and the stitch read one rank several times in a row)."""

    def __init__(self, run_dir: Path, table: str, dp: int, columns: list[str],
                 convert: Callable[[pa.Table], C], *, partial: bool, n_rows: int | None):
        self._run_dir, self._table, self._dp = Path(run_dir), table, dp
        self._columns, self._convert, self._partial = columns, convert, partial
        self._empty = SCHEMAS[table].empty_table().select(columns)
        self._last: tuple[int, C] | None = None
        self._limit = n_rows

    @property
    def n_rows(self) -> int:
        if self._limit is None:  # counted once, from the first column
            self._limit = sum(len(t) for t in self.tables(0, self._columns[:1])) \
                if self._dp else 0
        return self._limit

    def __len__(self) -> int:
        return self._dp

    def __getitem__(self, rank: int) -> C:
        if not 0 <= rank < self._dp:
            raise IndexError(rank)
        if self._last is None or self._last[0] != rank:
            self._last = None  # the rank held before is let go first
            self._last = (rank, self._convert(pa.concat_tables([self._empty,
                                                                *self.tables(rank)])))
        return self._last[1]

    def tables(self, rank: int, columns: list[str] | None = None) -> Iterator[pa.Table]:
        """Rank ``rank``'s parts (``columns``, or the table's), up to ``n_rows``."""
        left = self._limit
        for part in read_parts(self._run_dir, rank, self._table, columns or self._columns,
                               partial=self._partial):
            if left is not None:
                part = part.slice(0, left)
                left -= len(part)
            if len(part):
                yield part
            if left == 0:
                return

    def chunks(self, rank: int) -> Iterator[C]:
        for part in self.tables(rank):
            yield self._convert(part)

    def table_windows(self, columns: list[str] | None = None) -> Iterator[list[pa.Table]]:
        """The same ``WINDOW_ROWS`` rows of every rank's parts (``columns``, or the
        table's), window after window, as long as some rank has rows left (a rank that
        has none left gives an empty table)."""
        empty = SCHEMAS[self._table].empty_table().select(columns or self._columns)
        streams = [_Rows(self.tables(rank, columns), empty) for rank in range(self._dp)]
        while True:
            window = [stream.take(WINDOW_ROWS) for stream in streams]
            if not any(len(table) for table in window):
                return
            yield window

    def windows(self) -> Iterator[list[C]]:
        for window in self.table_windows():
            yield [self._convert(table) for table in window]


class _Rows:
    """A stream of tables taken ``n`` rows at a time, across the tables' ends."""

    def __init__(self, tables: Iterator[pa.Table], empty: pa.Table):
        self._tables, self._empty = tables, empty
        self._held = empty

    def take(self, n: int) -> pa.Table:
        pieces, have = [], 0
        while have < n:
            if not len(self._held):
                self._held = next(self._tables, None)
                if self._held is None:
                    self._held = self._empty
                    break
                continue
            piece = self._held.slice(0, n - have)
            self._held = self._held.slice(len(piece))
            pieces.append(piece)
            have += len(piece)
        return pa.concat_tables([self._empty, *pieces])
