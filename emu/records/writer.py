"""Writing one record table of one rank: rows are kept in a buffer of at most
``batch_rows`` and, each time it fills, written as a complete Parquet file of its own (a
part, one row group) in the table's directory, so a rank holds a bounded number of
records whatever the length of its run, and a rank killed by a signal (SIGTERM, SIGKILL)
loses only its buffered rows: every part already written has its footer. Called by the
rank's event log (emu/rank/eventlog.py) on every step and by ``emu.records.convert``."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from emu.records.schema import COMPLETE, SCHEMAS, part_name

# Rows per part (and so the most rows a rank's buffer holds) of each table. A request
# row holds a float per output token (thousands), a step row its collectives: at dp 16
# the buffers then hold about 20 MB and 65 MB when full.
BATCH_ROWS = {"steps": 2048, "requests": 32, "wall": 8192}
# Integer columns that grow by small steps, delta-encoded (a third of a steps table's
# bytes otherwise); every other column is dictionary-encoded.
DELTA_COLUMNS = {"steps": ("iter", "wave", "step_counter", "collectives.list.element.seq"),
                 "requests": (), "wall": ("iter",)}


class TableWriter:
    """``directory``'s parts of ``table`` (emu.records.schema), ``batch_rows`` rows each
    (the last one shorter), in place of any table written there before. The part being
    filled is open under a hidden name (``.part-<n>.parquet.tmp``, which readers skip)
    and renamed into place once its footer is written; ``close`` writes the
    ``_complete`` marker."""

    def __init__(self, directory: Path, table: str, batch_rows: int | None = None):
        self.schema = SCHEMAS[table]
        self.batch_rows = batch_rows or BATCH_ROWS[table]
        self.directory = Path(directory)
        self.rows: list[tuple] = []
        self.written = 0
        self.parts = 0
        delta = DELTA_COLUMNS[table]
        self._options = dict(
            compression="zstd", compression_level=3,
            use_dictionary=[name for name in self.schema.names if name not in delta],
            column_encoding=dict.fromkeys(delta, "DELTA_BINARY_PACKED"))
        if self.directory.is_dir() and not self.directory.is_symlink():
            shutil.rmtree(self.directory)  # the table written before (a run converted again)
        self.directory.mkdir()
        self._open()

    def _open(self) -> None:
        self._tmp = self.directory / f".{part_name(self.parts)}.tmp"
        self._file = pq.ParquetWriter(self._tmp, self.schema, **self._options)

    def _seal(self) -> None:
        """Write the open part's footer and rename it into place (atomic)."""
        self._file.close()
        os.replace(self._tmp, self.directory / part_name(self.parts))
        self.parts += 1

    def append(self, row: tuple) -> None:
        """One row, its values in the schema's column order."""
        self.rows.append(row)
        if len(self.rows) >= self.batch_rows:
            self.flush()

    def flush(self) -> None:
        """Write the buffered rows as one part."""
        if not self.rows:
            return
        columns = list(zip(*self.rows, strict=True))
        batch = pa.record_batch([pa.array(values, type=field.type)
                                 for values, field in zip(columns, self.schema, strict=True)],
                                schema=self.schema)
        self._file.write_batch(batch, row_group_size=len(self.rows))
        self.written += len(self.rows)
        self.rows = []
        self._seal()
        self._open()

    def close(self) -> None:
        """Write what is buffered, then the ``_complete`` marker. A table of no rows keeps
        one empty part (its schema)."""
        self.flush()
        if self.parts:
            self._file.close()
            self._tmp.unlink()
        else:
            self._seal()
        (self.directory / COMPLETE).touch()
