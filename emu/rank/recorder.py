"""What a rank publishes about its collectives: the ``CollectiveRecorder`` every collective
goes through, and the ``GuardSlot`` it writes into.

- ``CollectiveRecorder`` wraps every collective the rank issues — the engine's wave
  sync, the lockstep clock, DyntraLB's flag all-reduce and all-gather — and numbers
  them in issue order (``seq``). It keeps the records of each iteration for the event
  log, and publishes every collective it enters and leaves in the rank's slot.
- ``GuardSlot``: one rank's part of a file the launcher creates and every rank maps into
  memory (``mmap``). Entering a collective writes one fixed-size row into a ring
  (``seq``, a CRC-32 of the descriptor ``group site op shape dtype``, and the engine's
  ``iteration``, ``step_counter`` and ``current_wave``), then the "entered" word;
  leaving it writes the "completed" word. That is three stores into shared memory, well
  under a microsecond, no system call. The descriptor text behind each CRC is written
  once per descriptor into the slot's name area. Outside the launcher (under torchrun)
  the slot is private memory and nobody reads it.

The launcher's ``emu.cluster.watchdog.Watchdog`` reads every rank's slot (the layout
below) and checks that the ranks agree and make progress.
"""

from __future__ import annotations

import mmap
import struct
import zlib
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from emu.sites import LOCKSTEP_SITE

# Sites whose collective runs on the device group; every other site is on the DP group.
DEVICE_GROUP_SITES = frozenset({LOCKSTEP_SITE})

# One slot per rank: a header (entered seq, completed seq), the name area, the ring.
HEADER_BYTES = 64
NAMES_BYTES = 4032
RING = 8192  # rows; a power of two
RING_MASK = RING - 1
ROW_WORDS = 8  # seq, crc, iteration, step_counter, wave, 3 spare: one 64-byte line
RING_START = HEADER_BYTES + NAMES_BYTES
SLOT_BYTES = RING_START + RING * ROW_WORDS * 8
ENTERED, COMPLETED = 0, 1  # the header's words

_pack_row = struct.Struct("=5q").pack_into
_NOWHERE = SimpleNamespace(iteration=0, step_counter=0, current_wave=0)


class GuardSlot:
    """One rank's view of its slot; ``attach`` maps the launcher's file, ``private``
    makes one in private memory (no watchdog reads it)."""

    def __init__(self, buffer: mmap.mmap, offset: int):
        self.buffer = buffer
        self.offset = offset
        self.heads = memoryview(buffer)[offset:offset + 16].cast("q")
        self._names_end = offset + HEADER_BYTES
        self._names_limit = offset + RING_START
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
        self._ring = slot.offset + RING_START
        self._heads[ENTERED] = self._heads[COMPLETED] = -1
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
        _pack_row(self._buffer, self._ring + (seq & RING_MASK) * (ROW_WORDS * 8), seq,
                  desc[3], where.iteration, where.step_counter, where.current_wave)
        heads = self._heads
        heads[ENTERED] = seq
        result = fn()
        heads[COMPLETED] = seq
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
