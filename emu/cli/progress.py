"""What a command shows on stderr while ranks run: a progress bar (one run's, or a
sweep's over all its runs) and status lines.

Both are quiet with --quiet; the bar also needs a terminal.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path


class Progress:
    """A progress bar on stderr while a cluster runs, fed by polling the ranks' event
    logs for finished-request records (the engine writes them with ordinary buffered
    writes, so the count advances in chunks of a few kB of log).

    The cluster runs in the calling thread (Ctrl-C then stops its ranks); the poller is
    a daemon thread. Without a terminal (or with --quiet) there is no bar."""

    _REQUEST = b'"kind":"request"'
    _STEP = b'"kind":"step"'
    INTERVAL_S = 0.25

    def __init__(self, out_dir: Path, dp: int, total: int, desc: str, enabled: bool):
        self.paths = [out_dir / f"rank{r}.progress.jsonl" for r in range(dp)]
        self.offsets = [0] * dp
        self.done = 0
        self.clock_s = 0.0
        self.total = total
        self.desc = desc
        self.enabled = enabled
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bar = None

    def __enter__(self) -> Progress:
        if self.enabled:
            from tqdm import tqdm

            self._bar = tqdm(total=self.total, desc=self.desc, unit="req", file=sys.stderr,
                             dynamic_ncols=True, leave=True)
            self._thread = threading.Thread(target=self._loop, daemon=True,
                                            name="dyntra-emu-progress")
            self._thread.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            if exc_type is None:
                self.poll()
            self._bar.close()

    def _loop(self) -> None:
        while not self._stop.wait(self.INTERVAL_S):
            self.poll()

    def poll(self) -> None:
        """Read what the ranks appended since the last poll (complete lines only)."""
        for rank, path in enumerate(self.paths):
            try:
                with open(path, "rb") as f:
                    f.seek(self.offsets[rank])
                    chunk = f.read()
            except OSError:  # the rank has not opened its log yet
                continue
            end = chunk.rfind(b"\n")
            if end < 0:
                continue
            chunk = chunk[:end + 1]
            self.offsets[rank] += len(chunk)
            self.done += chunk.count(self._REQUEST)
            if rank == 0:
                self._read_clock(chunk)
        if self._bar is not None:
            self._bar.n = min(self.done, self.total)
            self._bar.set_postfix_str(f"virtual time {self.clock_s:.1f} s", refresh=False)
            self._bar.refresh()

    def _read_clock(self, chunk: bytes) -> None:
        start = chunk.rfind(self._STEP)
        if start < 0:
            return
        line_start = chunk.rfind(b"\n", 0, start) + 1
        line_end = chunk.find(b"\n", start)
        try:
            record = json.loads(chunk[line_start:line_end])
            self.clock_s = record["clock_s"] + record["step_time_s"]
        except (ValueError, KeyError, TypeError):
            pass


class SweepProgress:
    """One bar over every request of every run of a sweep, fed by polling the runs'
    event logs (a ``Progress`` without its own bar per run); ``run_done`` counts the
    runs finished."""

    def __init__(self, dirs: list[Path], dp: int, requests: int, enabled: bool):
        self.runs = [Progress(d, dp, requests, "", False) for d in dirs]
        self.total = requests * len(dirs)
        self.enabled = enabled
        self.done_runs = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bar = None

    def __enter__(self) -> SweepProgress:
        if self.enabled:
            from tqdm import tqdm

            self._bar = tqdm(total=self.total, desc="sweep", unit="req", file=sys.stderr,
                             dynamic_ncols=True)
            self._thread = threading.Thread(target=self._loop, daemon=True,
                                            name="dyntra-emu-sweep-progress")
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._poll()
            self._bar.close()

    def run_done(self) -> None:
        self.done_runs += 1

    def _loop(self) -> None:
        while not self._stop.wait(Progress.INTERVAL_S):
            self._poll()

    def _poll(self) -> None:
        for run in self.runs:
            run.poll()
        self._bar.n = min(sum(r.done for r in self.runs), self.total)
        self._bar.set_postfix_str(f"runs done {self.done_runs}/{len(self.runs)}",
                                  refresh=False)
        self._bar.refresh()


def note(args, text: str) -> None:
    """A status line on stderr (suppressed by --quiet)."""
    if not args.quiet:
        print(text, file=sys.stderr, flush=True)
