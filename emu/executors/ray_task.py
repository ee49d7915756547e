"""What runs on a Ray worker for the ``ray`` executor: one run of the batch, its files
sent back to the driver, and the batch's stop board that tells a run under way to stop.

A run writes into a temporary directory on its worker's node and returns its files
(compressed) with its outcome, so the driver needs no filesystem shared with the
workers. A worker serves task after task, and each run is a job process of its own
forked from the worker's fork server (``emu.run_apart``), as a local batch's runs are:
no state of one run reaches the next, and a worker pays its imports (Ray, torch, the
fork server's) once rather than at every run.

Stopping: the driver calls ``StopBoard.stop``; a run under way learns it from
``StopBoard.wait_stop`` in a watcher thread, which sends its own process SIGTERM; the
task then terminates the run's job, which stops its ranks exactly as a local job does
when it is terminated (every rank stopped, ``run.json`` "interrupted"), and the task
still returns the partial run's files. A run that had not begun is refused by
``StopBoard.begin``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import tempfile
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from emu.executors.base import run_spec
from emu.spec import CheckedRun


class StopBoard:
    """A Ray actor (async, no CPU) shared by the batch's tasks: which runs began, and
    whether the batch stopped. Every method is a coroutine, so all of them run on the
    actor's event loop (the one the stop event belongs to)."""

    def __init__(self):
        self._stopped = asyncio.Event()
        self._began: set[int] = set()

    async def begin(self, index: int) -> bool:
        """Called by run ``index``'s task before it starts the run: False once the batch
        stopped (the task then returns without running)."""
        if self._stopped.is_set():
            return False
        self._began.add(index)
        return True

    async def stop(self) -> list[int]:
        """Called by the driver to stop the batch; returns the runs that began. Every
        ``begin`` after it returns False."""
        self._stopped.set()
        return sorted(self._began)

    async def wait_stop(self) -> None:
        """Returns once the batch stopped (a run's watcher waits on it)."""
        await self._stopped.wait()


def run_task(index: int, checked: CheckedRun, board) -> dict:
    """The Ray task of run ``index``: ``checked``, as the driver checked it, run into a
    temporary directory of this node; returns its outcome (``emu.executors.base.run_spec``'s
    metrics or error, or {"interrupted": report} when the batch stopped it, or {"stopped":
    True} when the batch stopped before it began) and, unless stopped before it began,
    ``files``: the run directory's files by name, zlib-compressed."""
    if not _may_begin(board, index):
        return {"stopped": True}
    with tempfile.TemporaryDirectory(prefix="dyntra-emu-ray-") as tmp:
        run_dir = Path(tmp) / "run"
        try:
            with _stopped_by(board):
                outcome = run_spec(checked.at(run_dir), apart=True)
        except KeyboardInterrupt as exc:  # emu.cluster.supervision.Interrupted among them
            report = str(exc) or "interrupted by SIGTERM: the batch was stopped"
            if run_dir.is_dir():
                (run_dir / "error.txt").write_text(report + "\n")
            outcome = {"interrupted": report}
        outcome["files"] = _pack(run_dir)
    return outcome


def _may_begin(board, index: int) -> bool:
    """``StopBoard.begin``, awaited on a thread of its own: while a task's own thread
    blocks in a Ray call, Ray lends the task's CPU to the next queued task and takes it
    back after, so a board still starting (the batch's first tasks wait for it) would let
    one run more than the CPUs start at once."""
    import ray

    with ThreadPoolExecutor(max_workers=1) as asker:
        return asker.submit(ray.get, board.begin.remote(index)).result()


def _pack(run_dir: Path) -> dict[str, bytes]:
    if not run_dir.is_dir():
        return {}
    files = sorted(p for p in run_dir.iterdir() if p.is_file())
    files += sorted(p for d in run_dir.iterdir() if d.is_dir() for p in d.iterdir()
                    if p.is_file())  # a record table's parts: rank<r>.<table>/part-<n>
    return {p.relative_to(run_dir).as_posix(): zlib.compress(p.read_bytes()) for p in files}


def unpack(files: dict[str, bytes], out_dir: Path) -> None:
    """On the driver: write a task's ``files`` into the run's ``out_dir``. A name is a
    plain file name or one in a directory of the run (``rank<r>.<table>/part-<n>``);
    anything else is refused."""
    for name, data in files.items():
        parts = name.split("/")
        if len(parts) > 2 or any(part in ("", ".", "..") or os.sep in part
                                 or (os.altsep and os.altsep in part) for part in parts):
            raise ValueError(f"a Ray task sent back a file named {name!r}")
        if len(parts) == 2:
            (out_dir / parts[0]).mkdir(exist_ok=True)
        (out_dir / name).write_bytes(zlib.decompress(data))


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"interrupted by {signal.Signals(signum).name}")


@contextlib.contextmanager
def _stopped_by(board):
    """While the run is under way: SIGINT and SIGTERM raise KeyboardInterrupt (inside the
    launch, its own handlers take over and stop the ranks first), and a watcher thread
    sends this process SIGTERM, once, when the board says the batch stopped. Ray's own
    handlers are back when the block ends; the watcher never signals after that."""
    import ray

    previous = {s: signal.signal(s, _raise_interrupt) for s in (signal.SIGINT, signal.SIGTERM)}
    done = threading.Event()
    lock = threading.Lock()

    def watch() -> None:
        stopped = board.wait_stop.remote()
        while not done.is_set():
            ready, _ = ray.wait([stopped], timeout=0.5)
            if ready:
                with lock:
                    if not done.is_set():
                        os.kill(os.getpid(), signal.SIGTERM)
                return

    watcher = threading.Thread(target=watch, name="dyntra-emu-stop-watch", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        try:
            with lock:
                done.set()
            watcher.join()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
