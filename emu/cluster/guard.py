"""Collective guard: what every rank is doing collectively, checked across ranks.

Three parts:

- ``CollectiveRecorder`` (in each rank) wraps every collective the rank issues — the
  engine's wave sync, the lockstep clock, DyntraLB's flag all-reduce and all-gather —
  and numbers them in issue order (``seq``). It keeps the records of each iteration for
  the event log, and publishes every collective it enters and leaves in the rank's
  ``GuardSlot``.
- ``GuardSlot``: one rank's part of a file the launcher creates in its private temp
  directory and every rank maps into memory (``mmap``). Entering a collective writes one
  fixed-size row into a ring (``seq``, a CRC-32 of the descriptor ``group site op shape
  dtype``, and the engine's ``iteration``, ``step_counter`` and ``current_wave``), then
  the "entered" word; leaving it writes the "completed" word. That is three stores into
  shared memory, well under a microsecond, no system call. The descriptor text behind
  each CRC is written once per descriptor into the slot's name area. Outside the
  launcher (under torchrun) the slot is private memory and nobody reads it.
- ``Watchdog`` (in the launching process) reads every rank's slot ten times a second:

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

  The launcher turns a finding into ``ClusterError``: it stops every rank (each dumps its
  Python stack through faulthandler) and the report shows, for every rank, its last
  entered and last completed collective with where it was called.

``InvariantError`` is what strict mode raises inside a rank (see ``emu.engine.core``).
"""

from __future__ import annotations

import json
import mmap
import re
import struct
import zlib
from collections.abc import Callable, Collection
from types import SimpleNamespace
from typing import Any

import numpy as np

from emu.sites import LOCKSTEP_SITE

# Sites whose collective runs on the device group; every other site is on the DP group.
DEVICE_GROUP_SITES = frozenset({LOCKSTEP_SITE})

# One slot per rank: a header (entered seq, completed seq), the name area, the ring.
_HEADER_BYTES = 64
_NAMES_BYTES = 4032
_RING = 8192  # rows; a power of two
_RING_MASK = _RING - 1
_ROW_WORDS = 8  # seq, crc, iteration, step_counter, wave, 3 spare: one 64-byte line
_RING_START = _HEADER_BYTES + _NAMES_BYTES
SLOT_BYTES = _RING_START + _RING * _ROW_WORDS * 8
_ENTERED, _COMPLETED = 0, 1
_COMPARED = [1, 3, 4]  # crc, step_counter, wave: must agree across ranks at each seq
# The watchdog leaves the oldest rows of a ring alone: a rank that moves on while they
# are copied may be overwriting them.
_RING_MARGIN = 256

_SHAPE = re.compile(r"\[(?:\d+(?:,\d+)*)?\]")
_pack_row = struct.Struct("=5q").pack_into
_NOWHERE = SimpleNamespace(iteration=0, step_counter=0, current_wave=0)


class InvariantError(AssertionError):
    """A strict-mode invariant does not hold on this rank (the message names the rank,
    the iteration and the request)."""


class GuardSlot:
    """One rank's view of its slot; ``attach`` maps the launcher's file, ``private``
    makes one in private memory (no watchdog reads it)."""

    def __init__(self, buffer: mmap.mmap, offset: int):
        self.buffer = buffer
        self.offset = offset
        self.heads = memoryview(buffer)[offset:offset + 16].cast("q")
        self._names_end = offset + _HEADER_BYTES
        self._names_limit = offset + _RING_START
        self._named: set[int] = set()

    @classmethod
    def attach(cls, path: str, rank: int) -> GuardSlot:
        with open(path, "r+b") as f:
            buffer = mmap.mmap(f.fileno(), 0)
        return cls(buffer, rank * SLOT_BYTES)

    @classmethod
    def private(cls) -> GuardSlot:
        return cls(mmap.mmap(-1, SLOT_BYTES), 0)

    def add_name(self, crc: int, text: str) -> None:
        """Record a descriptor's text (``group site op shape dtype``) under its CRC, once;
        once the area is full, later descriptors are reported by CRC only."""
        if crc in self._named:
            return
        self._named.add(crc)
        line = f"{crc:08x} {text}\n".encode()
        end = self._names_end + len(line)
        if end <= self._names_limit:
            self.buffer[self._names_end:end] = line
            self._names_end = end


class CollectiveRecorder:
    """``recorder(site, op, tensor, fn)`` records the collective, then runs ``fn()`` and
    returns its result. Passed as the ``observe`` hook to the coordinator and the clock.

    ``origin`` (optional) names the source line that issued the collective when that is
    not the code calling the recorder (vllm-ascend's code, see
    ``emu.impl.vllm_ascend.collectives``); reports show it as ``site@origin``.

    A record is ``{"seq", "site", "op", "shape", "dtype"}``; ``seq`` counts every
    collective of this rank from 0, across groups. It is recorded before ``fn`` runs, so
    ``last`` names the collective a stuck rank is waiting in. ``slot`` is where entering
    and leaving are published (a private one when None); ``where`` is read at each
    collective for its ``iteration``, ``step_counter`` and ``current_wave`` (the engine).

    The descriptor of a site is computed once for the buffer it is called with (reading
    a tensor's shape and dtype costs about as much as the rest of the recording): the
    collective buffers are allocated once and never resized.
    """

    def __init__(self, slot: GuardSlot | None = None, where: Any = None) -> None:
        self.seq = 0
        self._records: list[dict] = []
        self.last: dict | None = None
        slot = slot if slot is not None else GuardSlot.private()
        self._slot = slot
        self._heads = slot.heads
        self._buffer = slot.buffer
        self._ring = slot.offset + _RING_START
        self._heads[_ENTERED] = self._heads[_COMPLETED] = -1
        self._where = where if where is not None else _NOWHERE
        self._descriptors: dict[tuple[str, str], tuple] = {}

    def __call__(self, site: str, op: str, tensor: Any, fn: Callable[[], Any],
                 origin: str | None = None) -> Any:
        seq = self.seq
        desc = self._descriptors.get((site, op, origin))
        if desc is None or desc[0] is not tensor:
            desc = self._describe(site, op, tensor, origin)
        record = {"seq": seq, "site": site, "op": op, "shape": list(desc[1]),
                  "dtype": desc[2]}
        self._records.append(record)
        self.last = record
        self.seq = seq + 1
        where = self._where
        _pack_row(self._buffer, self._ring + (seq & _RING_MASK) * (_ROW_WORDS * 8), seq,
                  desc[3], where.iteration, where.step_counter, where.current_wave)
        heads = self._heads
        heads[_ENTERED] = seq
        result = fn()
        heads[_COMPLETED] = seq
        return result

    def _describe(self, site: str, op: str, tensor: Any, origin: str | None) -> tuple:
        shape = tuple(tensor.shape)
        dtype = str(tensor.dtype).removeprefix("torch.")
        group = "device" if site in DEVICE_GROUP_SITES else "dp"
        where = site if origin is None else f"{site}@{origin}"
        text = f"{group} {where} {op} [{','.join(map(str, shape))}] {dtype}"
        crc = zlib.crc32(text.encode())
        self._slot.add_name(crc, text)
        desc = (tensor, shape, dtype, crc)
        self._descriptors[(site, op, origin)] = desc
        return desc

    def take(self) -> list[dict]:
        """The records since the previous ``take`` (one iteration's collectives)."""
        records = self._records
        self._records = []
        return records


# ---------------------------------------------------------------------------------------
# In the launching process


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
        self._rings = words[:, _RING_START // 8:].reshape(dp_size, _RING, _ROW_WORDS)
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
        entered, completed = heads[:, _ENTERED], heads[:, _COMPLETED]
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
        counts = heads[:, _COMPLETED]
        if (counts != counts[0]).any():
            parts = ", ".join(f"rank {r} completed {int(c) + 1}" for r, c in enumerate(counts))
            return ("collective mismatch: the ranks ended with different collective counts "
                    f"({parts})")
        return None

    def _compare_completed(self, heads: np.ndarray) -> str | None:
        entered, completed = heads[:, _ENTERED], heads[:, _COMPLETED]
        if entered.max() < self._checked:  # every rank started a new recorder
            self._checked = -1
        hi = int(completed.min())
        lo = max(self._checked + 1, int(entered.max()) - _RING + _RING_MARGIN)
        if hi < lo:
            return None
        seqs = np.arange(lo, hi + 1)
        rows = self._rings[:, seqs & _RING_MASK, :5].copy()
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
        entered = heads[:, _ENTERED]
        top = max(int(entered[r]) for r in blocked)
        waiter = next(r for r in blocked if entered[r] == top)
        for r in sorted(finished):
            done = int(heads[r, _COMPLETED])
            if done < top:
                return (f"collective mismatch: rank {r} finished its run after "
                        f"{self._short(r, done)}, while rank {waiter} waits in "
                        f"{self._short(waiter, top)}")
        lowest = min(int(entered[r]) for r in blocked)
        if int(heads[:, _COMPLETED].max()) >= lowest:
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
        return self._rings[rank, seq & _RING_MASK, :5].copy()

    def _names(self, rank: int) -> dict[int, list[str]]:
        start = rank * SLOT_BYTES + _HEADER_BYTES
        text = self._mm[start:start + _NAMES_BYTES].split(b"\0", 1)[0].decode()
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
