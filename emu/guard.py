"""Collective bookkeeping of one rank.

``CollectiveRecorder`` wraps every collective the rank issues — the engine's wave sync,
the lockstep clock and DyntraLB's flag all-reduce and all-gather — and numbers them in
issue order. The engine moves the records of each iteration into that step's event-log
record, so the logs of all ranks can be compared collective by collective.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class CollectiveRecorder:
    """``recorder(site, op, tensor, fn)`` records the collective, then runs ``fn()`` and
    returns its result. Passed as the ``observe`` hook to the coordinator and the clock.

    A record is ``{"seq", "site", "op", "shape", "dtype"}``; ``seq`` counts every
    collective of this rank from 0, across groups. It is recorded before ``fn`` runs, so
    the last record names the collective a stuck rank is waiting in.
    """

    def __init__(self) -> None:
        self.seq = 0
        self._records: list[dict] = []
        self.last: dict | None = None

    def __call__(self, site: str, op: str, tensor: Any, fn: Callable[[], Any]) -> Any:
        record = {
            "seq": self.seq,
            "site": site,
            "op": op,
            "shape": list(tensor.shape),
            "dtype": str(tensor.dtype).removeprefix("torch."),
        }
        self.seq += 1
        self._records.append(record)
        self.last = record
        return fn()

    def take(self) -> list[dict]:
        """The records since the previous ``take`` (one iteration's collectives)."""
        records = self._records
        self._records = []
        return records
