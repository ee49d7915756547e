"""First code of a spawned rank process, before anything heavy is imported.

`emu.launcher.launch` starts each rank with the spawn method and this module's `main`
as the target. Spawn unpickles the target and its arguments before calling it, so this
module and `RankSpec` import only the standard library: a rank is tied to its launcher
(Linux PR_SET_PDEATHSIG) and deaf to Ctrl-C within a few milliseconds of existing, not
after `import torch` (3-7 s later). Only then does it import the launcher (and torch)
and run `emu.launcher._rank_main`.

Ctrl-C in a terminal reaches the whole process group, ranks included; the launcher
handles it and stops every rank, so a rank ignores SIGINT instead of printing a
traceback from wherever the interrupt found it.
"""

from __future__ import annotations

import ctypes
import os
import pathlib
import signal
from dataclasses import dataclass

_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class RankSpec:
    """What a rank needs from its launcher (picklable without importing torch)."""

    rank: int
    dp_size: int
    store_port: int
    device_kind: str
    out_dir: pathlib.Path | None
    collective_timeout_s: float
    parent_pid: int
    stack_path: str
    guard_path: str


def die_with_parent(parent_pid: int) -> None:
    """Ask Linux to SIGKILL this process when its parent goes away; exit at once if the
    parent is already gone (it died before prctl took effect). Best effort: systems
    without PR_SET_PDEATHSIG rely on the launcher's own cleanup."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:
        os._exit(1)


def main(spec: RankSpec, payload: bytes, conn) -> None:
    """The spawn target of every rank launched by `emu.launcher.launch`."""
    die_with_parent(spec.parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from emu.launcher import _rank_main

    _rank_main(spec, payload, conn)
