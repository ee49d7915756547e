"""What a launch (``emu.cluster.launcher.launch``) holds while its ranks run and gives
back when it ends, as two context managers: ``StopSignals`` catches SIGINT and SIGTERM
so that a stopped launcher still stops its ranks, reports and cleans up, and
``LaunchFiles`` owns the launcher's scratch files so that none outlives the launch, not
even a SIGKILL of the launcher."""

from __future__ import annotations

import os
import signal
import tempfile
import threading
from contextlib import contextmanager
from multiprocessing import resource_tracker


class LaunchFiles:
    """The launcher's scratch files (the guard's shared record, each rank's stack dump),
    removed when the launch ends. On Linux they live in /dev/shm and are registered with
    multiprocessing's resource tracker as shared memory: should this process die
    without cleaning up (SIGKILL), the tracker, which outlives it, unlinks them once the
    ranks are gone too. Elsewhere: a temporary directory (mode 0700). Either way each
    file has mode 0600: the guard records and the stack dumps are this user's only."""

    _SHM = "/dev/shm"

    def __init__(self):
        self._names: list[str] = []
        self._tmp: tempfile.TemporaryDirectory | None = None
        self._prefix = ""

    def __enter__(self) -> LaunchFiles:
        if os.path.isdir(self._SHM) and os.access(self._SHM, os.W_OK):
            self._prefix = f"dyntra-emu-launch-{os.getpid()}-{os.urandom(4).hex()}-"
        else:
            self._tmp = tempfile.TemporaryDirectory(prefix="dyntra-emu-launch-")
        return self

    def path(self, name: str) -> str:
        """Create the empty file `name` (so that the tracker always finds what it was
        told about) and return its path; the same path for the same name. The file is
        readable and writable by this user only, and new (O_EXCL: never a file another
        user made in the shared /dev/shm)."""
        if self._prefix + name in self._names:
            return os.path.join(self._SHM, self._prefix + name)
        if self._tmp is not None:
            path = os.path.join(self._tmp.name, name)
        else:
            shm_name = self._prefix + name
            resource_tracker.register(f"/{shm_name}", "shared_memory")
            self._names.append(shm_name)
            path = os.path.join(self._SHM, shm_name)
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        return path

    def __exit__(self, *exc) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()
        for name in self._names:
            try:
                os.unlink(os.path.join(self._SHM, name))
            except FileNotFoundError:
                pass
            resource_tracker.unregister(f"/{name}", "shared_memory")


class Signalled(Exception):
    """Internal: SIGINT or SIGTERM arrived; turned into Interrupted once every rank is
    stopped."""

    def __init__(self, signum: int):
        self.signum = signum


class StopSignals:
    """While `launch` runs (in the main thread) SIGINT and SIGTERM are caught, so that a
    terminated launcher stops its ranks, reports and removes its temporary directory
    exactly as after Ctrl-C. Inside `armed()` (starting and supervising the ranks) the
    first signal raises Signalled, except inside `deferred()` (a rank being started:
    it must land in the rank list first), where the raise waits until the block ends.
    Only the first signal counts, so a second Ctrl-C cannot cut the cleanup short. A
    signal that arrived outside `armed()` (during cleanup) is delivered again once the
    previous handlers are back."""

    _SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.received: int | None = None
        self._raised = False
        self._armed = False
        self._defer = False
        self._previous: dict = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in self._SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        if self.received is not None and not self._raised:
            signal.raise_signal(self.received)

    def _handle(self, signum, frame) -> None:
        if self.received is not None:
            return
        self.received = signum
        if self._armed and not self._defer:
            self._raise()

    def _raise(self) -> None:
        self._raised = True
        raise Signalled(self.received)

    @contextmanager
    def armed(self):
        self._armed = True
        if self.received is not None:  # arrived while the launch was being set up
            self._raise()
        try:
            yield
        finally:
            self._armed = False

    @contextmanager
    def deferred(self):
        """Around starting a rank. SIGINT is blocked in this thread meanwhile, and a new
        process inherits that through exec: a Ctrl-C in its first moments stays pending
        until the rank ignores it (``emu.cluster.rank_boot``), so it cannot interrupt it.
        It is blocked, not ignored: dispositions are process-wide, and a SIGINT taken by
        another thread of this process (the caller's own, or torch's when it imported
        torch; they do not block it) was discarded while ignored, so Ctrl-C during a
        rank's start was lost and the run went on. Now the handler records it and it is
        raised once the block ends. The caller has started multiprocessing's resource
        tracker already: starting it unblocks SIGINT."""
        self._defer = True
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
            self._defer = False
        if self.received is not None and self._armed:
            self._raise()
