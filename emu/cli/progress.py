"""What a command shows on stderr while ranks run: where one run, or a batch of runs
(sweep, ab --seeds, tune), has got to, and status notes.

On a terminal that is a progress bar; when stderr is not a terminal (CI logs, nohup, a
pipe) a status line at most every ``STATUS_INTERVAL_S`` seconds: virtual time reached,
requests finished of the total, the real-time factor and the time left. ``--quiet``
silences both.
"""

from __future__ import annotations

import enum
import json
import sys
import threading
import time
from pathlib import Path

# The most often a status line is printed when stderr is not a terminal (seconds of wall
# time); a run shorter than this prints none.
STATUS_INTERVAL_S = 30.0


class Show(enum.Enum):
    """How progress is shown: nothing (--quiet, or a rank other than 0 under torchrun), a
    bar (stderr is a terminal) or status lines (it is not)."""

    NOTHING = "nothing"
    BAR = "bar"
    LINES = "lines"


def show_for(args, *, leader: bool = True) -> Show:
    """How this command shows progress; ``leader``: this process reports the run (rank 0
    under torchrun)."""
    if not leader or args.quiet:
        return Show.NOTHING
    return Show.BAR if sys.stderr.isatty() else Show.LINES


class RunLog:
    """Where one run has got to, read from its ranks' progress feeds
    (``rank<r>.progress.jsonl``) as they grow: requests finished (a line each, written
    as the request finishes) and rank 0's virtual clock at the end of its last step with
    a finish (and at its very last step, when its log closes). ``poll`` reads what the
    ranks appended since the last poll (complete lines only)."""

    _REQUEST = b'"kind":"request"'
    _STEP = b'"kind":"step"'

    def __init__(self, out_dir: Path, dp: int):
        self.paths = [out_dir / f"rank{r}.progress.jsonl" for r in range(dp)]
        self.offsets = [0] * dp
        self.done = 0
        self.clock_s = 0.0

    def poll(self) -> None:
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


class Progress:
    """Progress on stderr while runs go: one run (``run``, each side of ``ab``) or a batch
    (``sweep``, ``ab --seeds``, ``tune``; ``run_done`` counts its finished runs), each run
    writing into one of ``out_dirs`` with ``dp`` ranks and ``requests`` requests.

    The runs go in the calling thread (Ctrl-C then stops their ranks); a daemon thread
    polls the progress feeds: every ``POLL_S`` for the bar, every ``STATUS_INTERVAL_S`` for
    status lines. A run that printed status lines ends with one more, at its totals (one
    shorter than the interval reads no log)."""

    POLL_S = 0.25

    def __init__(self, out_dirs: list[Path], dp: int, requests: int, desc: str, show: Show):
        self.runs = [RunLog(d, dp) for d in out_dirs]
        self.total = requests * len(out_dirs)
        self.desc = desc
        self.show = show
        self.done_runs = 0
        self._batch = len(out_dirs) > 1
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bar = None
        self._start = 0.0
        self._lines = 0

    def __enter__(self) -> Progress:
        self._start = time.monotonic()
        if self.show is Show.NOTHING:
            return self
        if self.show is Show.BAR:
            from tqdm import tqdm

            self._bar = tqdm(total=self.total, desc=self.desc, unit="req", file=sys.stderr,
                             dynamic_ncols=True, leave=True)
        self._thread = threading.Thread(target=self._loop, daemon=True,
                                        name="dyntra-emu-progress")
        self._thread.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        if exc_type is None and (self._bar is not None or self._lines):
            self._poll()
            if self._lines:
                self._print_line()
        if self._bar is not None:
            self._bar.close()

    def run_done(self) -> None:
        self.done_runs += 1

    @property
    def done(self) -> int:
        return sum(run.done for run in self.runs)

    @property
    def clock_s(self) -> float:
        """Virtual time reached, summed over the runs of a batch."""
        return sum(run.clock_s for run in self.runs)

    def _loop(self) -> None:
        period = self.POLL_S if self.show is Show.BAR else STATUS_INTERVAL_S
        while not self._stop.wait(period):
            self._poll()
            if self.show is Show.LINES:
                self._print_line()

    def _poll(self) -> None:
        for run in self.runs:
            run.poll()
        if self._bar is None:
            return
        self._bar.n = min(self.done, self.total)
        postfix = (f"runs done {self.done_runs}/{len(self.runs)}" if self._batch
                   else f"virtual time {self.clock_s:.1f} s")
        self._bar.set_postfix_str(postfix, refresh=False)
        self._bar.refresh()

    def _print_line(self) -> None:
        self._lines += 1
        print(self.status_line(time.monotonic() - self._start), file=sys.stderr, flush=True)

    def status_line(self, elapsed_s: float) -> str:
        """The status line after ``elapsed_s`` seconds of wall time."""
        done, total, clock = self.done, self.total, self.clock_s
        factor = clock / elapsed_s if elapsed_s > 0 else 0.0
        if done >= total:
            eta = "0s"
        elif done == 0:
            eta = "unknown"
        else:
            eta = _duration(elapsed_s * (total - done) / done)
        runs = f"{self.done_runs}/{len(self.runs)} runs done, " if self._batch else ""
        over = " (summed over runs)" if self._batch else ""
        return (f"{self.desc}: {runs}virtual time {clock:.1f} s{over}, {done:,}/{total:,} "
                f"requests finished, {factor:.1f}x real time, ETA {eta}")


def _duration(seconds: float) -> str:
    """``3h02m``, ``4m05s`` or ``42s``."""
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def note(args, text: str) -> None:
    """A status line on stderr (suppressed by --quiet)."""
    if not args.quiet:
        print(text, file=sys.stderr, flush=True)
