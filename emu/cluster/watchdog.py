"""The launcher's collective watchdog: what every rank is doing collectively, checked
across ranks.

Every rank's ``emu.rank.recorder.CollectiveRecorder`` publishes each collective it
enters and leaves in its ``GuardSlot`` of one shared file; the ``Watchdog`` (in the
launching process, or the launching thread of a thread run) creates that file and reads
every rank's slot ten times a second:

* agreement: every collective that all ranks have completed is compared across ranks
  row by row — descriptor, ``step_counter`` and ``current_wave`` must be equal at the
  same ``seq``. Rows are read only once every rank has left that collective, so they
  were written long before; the ring holds the last 8192 collectives, so a rank would
  have to issue more than that between two polls for rows to go unchecked;
* stuck disagreement: when every live rank is inside a collective and nothing changed
  for ``min(2 s, timeout / 2)``, ranks waiting at different ``seq`` or descriptors (say,
  one in DyntraLB's all-gather on the DP group, one in the lockstep all-reduce on the
  device group), or a rank that finished its run while another waits in a collective
  it never entered, are a mismatch: they can never complete;
* hang: a rank is inside a collective and no rank completed any collective for the
  collective timeout.

The supervision (``emu.cluster.supervision``) turns a finding into ``ClusterError``: it
stops every rank and the report shows, for every rank, its last entered and last
completed collective with where it was called.
"""

from __future__ import annotations

import json
import mmap
import re
from collections.abc import Collection

import numpy as np

from emu.rank.recorder import (
    COMPLETED,
    ENTERED,
    HEADER_BYTES,
    NAMES_BYTES,
    RING,
    RING_MASK,
    RING_START,
    ROW_WORDS,
    SLOT_BYTES,
)

_COMPARED = [1, 3, 4]  # crc, step_counter, wave: must agree across ranks at each seq
# The watchdog leaves the oldest rows of a ring alone: a rank that moves on while they
# are copied may be overwriting them.
_RING_MARGIN = 256
_SHAPE = re.compile(r"\[(?:\d+(?:,\d+)*)?\]")


class Watchdog:
    """Creates the guard file at ``path`` for ``dp_size`` ranks and checks it on every
    ``poll`` (see the module docstring). ``poll`` and ``finish`` return a one-line
    finding, or None; ``records(rank)`` / ``describe(rank)`` give a rank's last entered
    and last completed collective for the report."""

    POLL_S = 0.1
    STABLE_S = 2.0

    def __init__(self, path: str, dp_size: int, timeout_s: float):
        self.dp_size = dp_size
        self.timeout_s = timeout_s
        self._stable_s = min(self.STABLE_S, timeout_s / 2)
        with open(path, "w+b") as f:
            f.truncate(dp_size * SLOT_BYTES)
            self._mm = mmap.mmap(f.fileno(), 0)
        words = np.frombuffer(self._mm, dtype=np.int64).reshape(dp_size, SLOT_BYTES // 8)
        self._heads = words[:, :2]
        self._heads[:] = -1
        self._rings = words[:, RING_START // 8:].reshape(dp_size, RING, ROW_WORDS)
        self._checked = -1  # every seq up to here was compared across ranks
        self._state: tuple | None = None
        self._state_since = 0.0
        self._completed: np.ndarray | None = None
        self._progress_at = 0.0

    def close(self) -> None:
        self._heads = self._rings = None
        try:
            self._mm.close()
        except BufferError:  # a numpy view still exists; the mapping goes with it
            pass

    # -------------------------------------------------------------- checks

    def poll(self, now: float, finished: Collection[int]) -> str | None:
        """``finished``: the ranks that have returned their result."""
        heads = self._heads.copy()
        finding = self._compare_completed(heads)
        if finding is not None:
            return finding
        entered, completed = heads[:, ENTERED], heads[:, COMPLETED]
        state = (heads.tobytes(), frozenset(finished))
        if state != self._state:
            self._state, self._state_since = state, now
        if self._completed is None or (completed != self._completed).any():
            self._completed, self._progress_at = completed, now
        live = [r for r in range(self.dp_size) if r not in finished]
        blocked = [r for r in live if entered[r] > completed[r]]
        if not blocked:
            self._progress_at = now
            return None
        if len(blocked) == len(live) and now - self._state_since >= self._stable_s:
            finding = self._stuck_disagreement(heads, blocked, finished)
            if finding is not None:
                return finding
        if now - self._progress_at >= self.timeout_s:
            waiting = ", ".join(f"rank {r} in {self._short(r, int(entered[r]))}"
                                for r in blocked)
            idle = [r for r in live if r not in blocked]
            tail = (f"; not in a collective: {', '.join(f'rank {r}' for r in idle)}"
                    if idle else "")
            return (f"collective hang: no rank completed a collective for "
                    f"{self.timeout_s:g} s (collective_timeout_s); waiting: {waiting}{tail}")
        return None

    def finish(self) -> str | None:
        """Every rank returned: compare what is left and the final counts."""
        heads = self._heads.copy()
        finding = self._compare_completed(heads)
        if finding is not None:
            return finding
        counts = heads[:, COMPLETED]
        if (counts != counts[0]).any():
            parts = ", ".join(f"rank {r} completed {int(c) + 1}" for r, c in enumerate(counts))
            return ("collective mismatch: the ranks ended with different collective counts "
                    f"({parts})")
        return None

    def _compare_completed(self, heads: np.ndarray) -> str | None:
        entered, completed = heads[:, ENTERED], heads[:, COMPLETED]
        if entered.max() < self._checked:  # every rank started a new recorder
            self._checked = -1
        hi = int(completed.min())
        lo = max(self._checked + 1, int(entered.max()) - RING + _RING_MARGIN)
        if hi < lo:
            return None
        seqs = np.arange(lo, hi + 1)
        rows = self._rings[:, seqs & RING_MASK, :5].copy()
        # A row is compared only if every rank's copy is that seq's (not overwritten).
        valid = (rows[:, :, 0] == seqs).all(axis=0)
        fields = rows[:, :, _COMPARED]
        bad = np.flatnonzero((fields != fields[0]).any(axis=(0, 2)) & valid)
        self._checked = hi
        if bad.size == 0:
            return None
        k = int(bad[0])
        parts = "; ".join(f"rank {r}: {self._format(r, rows[r, k])}"
                          for r in range(self.dp_size))
        return f"collective mismatch at seq {int(seqs[k])}: {parts}"

    def _stuck_disagreement(self, heads, blocked, finished) -> str | None:
        entered = heads[:, ENTERED]
        top = max(int(entered[r]) for r in blocked)
        waiter = next(r for r in blocked if entered[r] == top)
        for r in sorted(finished):
            done = int(heads[r, COMPLETED])
            if done < top:
                return (f"collective mismatch: rank {r} finished its run after "
                        f"{self._short(r, done)}, while rank {waiter} waits in "
                        f"{self._short(waiter, top)}")
        lowest = min(int(entered[r]) for r in blocked)
        if int(heads[:, COMPLETED].max()) >= lowest:
            # A peer already completed the collective the last rank waits in: that rank
            # is only slow to leave it (a starved process on a loaded machine), not stuck.
            return None
        rows = {r: self._row(r, int(entered[r])) for r in blocked}
        if len({(int(row[0]), int(row[1])) for row in rows.values()}) > 1:
            parts = "; ".join(f"rank {r} waits in {self._format(r, row)}"
                              for r, row in rows.items())
            return f"collective mismatch: {parts}"
        if len({(int(row[3]), int(row[4])) for row in rows.values()}) > 1:
            parts = "; ".join(f"rank {r} at step_counter {int(row[3])}, wave {int(row[4])}"
                              for r, row in rows.items())
            return f"collective mismatch at seq {top}: {parts}"
        return None

    # -------------------------------------------------------------- report

    def _row(self, rank: int, seq: int) -> np.ndarray:
        return self._rings[rank, seq & RING_MASK, :5].copy()

    def _names(self, rank: int) -> dict[int, list[str]]:
        start = rank * SLOT_BYTES + HEADER_BYTES
        text = self._mm[start:start + NAMES_BYTES].split(b"\0", 1)[0].decode()
        names = {}
        for line in text.splitlines():
            crc, *fields = line.split(" ")
            try:
                names[int(crc, 16)] = fields  # group, site, op, shape, dtype
            except ValueError:  # a slot attached twice wrote its names over the old ones
                continue
        return names

    def _record(self, rank: int, seq: int) -> dict | None:
        if seq < 0:
            return None
        row = self._row(rank, seq)
        if int(row[0]) != seq:
            return {"seq": seq}
        return self._row_record(rank, row)

    def _row_record(self, rank: int, row: np.ndarray) -> dict:
        fields = self._names(rank).get(int(row[1]))
        record = {"seq": int(row[0])}
        if fields is not None and len(fields) == 5 and _SHAPE.fullmatch(fields[3]):
            group, site, op, shape, dtype = fields
            record.update(group=group, site=site, op=op, shape=json.loads(shape), dtype=dtype)
        else:
            record["descriptor_crc"] = f"{int(row[1]) & 0xFFFFFFFF:08x}"
        record.update(iteration=int(row[2]), step_counter=int(row[3]), wave=int(row[4]))
        return record

    def _format(self, rank: int, row: np.ndarray) -> str:
        return _format_record(self._row_record(rank, row))

    def _short(self, rank: int, seq: int) -> str:
        record = self._record(rank, seq)
        if record is None:
            return "no collective"
        return f"seq {seq} {record.get('site', '?')}"

    def records(self, rank: int) -> dict:
        """``{"entered": record|None, "completed": record|None, "inside": bool}`` of
        ``rank``; a record has seq, group, site, op, shape, dtype, iteration,
        step_counter, wave."""
        entered, completed = (int(v) for v in self._heads[rank])
        return {"entered": self._record(rank, entered),
                "completed": self._record(rank, completed),
                "inside": entered > completed}

    def describe(self, rank: int) -> str:
        """Two report lines for ``rank`` ("" when it recorded no collective)."""
        state = self.records(rank)
        if state["entered"] is None:
            return ""
        entered = _format_record(state["entered"])
        completed = (_format_record(state["completed"]) if state["completed"] is not None
                     else "none")
        inside = " (still inside)" if state["inside"] else ""
        return (f"last entered collective: {entered}{inside}\n"
                f"last completed collective: {completed}")


def _format_record(record: dict) -> str:
    if "site" not in record:
        what = f"descriptor {record['descriptor_crc']}" if "descriptor_crc" in record \
            else "record overwritten"
        return f"seq {record['seq']} ({what})"
    where = ""
    if "iteration" in record:
        where = (f" at iteration {record['iteration']}, step_counter "
                 f"{record['step_counter']}, wave {record['wave']}")
    shape = "[" + ",".join(map(str, record["shape"])) + "]"
    return (f"seq {record['seq']} {record['site']} ({record['group']} group, {record['op']} "
            f"{shape} {record['dtype']}){where}")
