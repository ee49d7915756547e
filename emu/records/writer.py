"""Writing one record table of one rank: rows are kept in a buffer of at most
``batch_rows`` and written as one Parquet row group each time it fills, so a rank holds
a bounded number of records whatever the length of its run. Called by the rank's event
log (emu/rank/eventlog.py) on every step and by ``emu.records.convert``."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from emu.records.schema import SCHEMAS

# Rows per row group (and so the most rows a rank's buffer holds) of each table. A
# request row holds a float per output token (thousands), a step row its collectives:
# at dp 16 the buffers then hold about 20 MB and 65 MB when full.
BATCH_ROWS = {"steps": 2048, "requests": 32, "wall": 8192}
# Integer columns that grow by small steps, delta-encoded (a third of a steps table's
# bytes otherwise); every other column is dictionary-encoded.
DELTA_COLUMNS = {"steps": ("iter", "wave", "step_counter", "collectives.list.element.seq"),
                 "requests": (), "wall": ("iter",)}


class TableWriter:
    """``path``'s Parquet file of ``table`` (emu.records.schema), written in row groups
    of ``batch_rows`` rows (the last one shorter)."""

    def __init__(self, path: Path, table: str, batch_rows: int | None = None):
        self.schema = SCHEMAS[table]
        self.batch_rows = batch_rows or BATCH_ROWS[table]
        self.rows: list[tuple] = []
        self.written = 0
        delta = DELTA_COLUMNS[table]
        self._file = pq.ParquetWriter(
            path, self.schema, compression="zstd", compression_level=3,
            use_dictionary=[name for name in self.schema.names if name not in delta],
            column_encoding=dict.fromkeys(delta, "DELTA_BINARY_PACKED"))

    def append(self, row: tuple) -> None:
        """One row, its values in the schema's column order."""
        self.rows.append(row)
        if len(self.rows) >= self.batch_rows:
            self.flush()

    def flush(self) -> None:
        """Write the buffered rows as one row group."""
        if not self.rows:
            return
        columns = list(zip(*self.rows, strict=True))
        batch = pa.record_batch([pa.array(values, type=field.type)
                                 for values, field in zip(columns, self.schema, strict=True)],
                                schema=self.schema)
        self._file.write_batch(batch, row_group_size=len(self.rows))
        self.written += len(self.rows)
        self.rows = []

    def close(self) -> None:
        """Write what is buffered and the file's footer."""
        self.flush()
        self._file.close()
