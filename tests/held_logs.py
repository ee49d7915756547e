"""Which rank step records (``rank<N>.steps``) a run's processes are writing,
seen from outside through their open files: the way a test finds a rank under way, and
the process it runs in, when the run writes where the test cannot look (a Ray worker's
own directory)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from pathlib import Path

import psutil


def event_logs_held(processes: Iterable[psutil.Process]) -> dict[psutil.Process, list[Path]]:
    """The rank step records (``rank<N>.steps``: the directory of the part a rank holds
    open) of each process, sorted; processes holding none, or gone, are left out."""
    logs = {}
    for process in processes:
        with contextlib.suppress(psutil.Error, OSError):
            paths = sorted(Path(f.path).parent for f in process.open_files()
                           if Path(f.path).parent.name.endswith(".steps"))
            if paths:
                logs[process] = paths
    return logs


def holds_a_step(path: Path) -> bool:
    """Whether the rank has begun its records (its first part's magic number is written
    when the rank starts its loop; False once the directory is gone)."""
    with contextlib.suppress(OSError):
        return any(part.stat().st_size > 0 for part in path.iterdir())
    return False
