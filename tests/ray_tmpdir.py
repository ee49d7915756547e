"""A temporary directory of a Ray test's own, as TMPDIR of everything the test starts: a
local Ray (its session directory included) and its workers inherit it, so what a worker
leaves in its TMPDIR is this test's to count, whatever other processes on the machine
leave in /tmp. Short (directly under the system's temporary directory): Ray's and the
fork servers' Unix sockets live in it."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def own_tmpdir(monkeypatch) -> Iterator[Path]:
    """TMPDIR set to a new directory for the block (``monkeypatch``: restored after);
    the directory is removed after, whatever is in it."""
    path = Path(tempfile.mkdtemp(prefix="dyntra-ray-"))
    monkeypatch.setenv("TMPDIR", str(path))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def pymp_left(path: Path, wait_s: float = 30.0) -> list[str]:
    """The ``pymp-*`` directories (multiprocessing's, one per process that started a
    fork server) still in ``path`` after up to ``wait_s``: a Ray worker's fork server
    removes its own as it exits, which it does once its worker has gone."""
    deadline = time.monotonic() + wait_s
    while True:
        left = sorted(p.name for p in path.glob("pymp-*"))
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)
