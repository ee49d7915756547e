"""What every trace format's reader is: a ``TraceFormat``, the registry's entry
(``emu.traces.FORMATS``), and what it is handed."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from emu.workload import Row


@dataclass(frozen=True)
class ReadOptions:
    """What a reader may need besides the file: the DP size that pinned ranks must fit
    (our own format), the tokenizer that counts a prompt's tokens (vLLM's custom
    dataset holds prompt text)."""

    dp_size: int | None = None
    tokenizer: str | None = None


@dataclass(frozen=True)
class Head:
    """The first non-blank line of a trace file, as detection looks at it: the keys of
    a JSON object, or else the fields of a CSV header; ``broken_json``: the line opens
    like JSON (``{`` or ``[``) but is not a JSON object."""

    line: int
    keys: frozenset[str]
    columns: frozenset[str]
    broken_json: bool = False


@dataclass(frozen=True)
class TraceFormat:
    """One trace format.

    - ``rows(path, raw, options)``: the file's rows (``emu.workload.Row``), each request
      on the format's own clock in seconds, every problem named by ``file:line`` and the
      field or column as the format calls it.
    - ``looks_like(head)``: whether a file whose first line is ``head`` is in this
      format (detection by content asks every format; exactly one must say yes).
    - ``ordered``: the format promises arrival order, and its reader refuses a time
      that goes back; the rows of any other format are replayed sorted by time.
    - ``rebase``: the format's clock is the trace's own, so the replay starts at its
      first request; False for our format, whose clock is the emulator's.
    """

    name: str
    about: str
    rows: Callable[[Path, bytes, ReadOptions], Iterator[Row]]
    looks_like: Callable[[Head], bool]
    ordered: bool
    rebase: bool
