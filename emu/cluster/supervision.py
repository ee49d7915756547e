"""One failure policy for the ranks of a run, whichever transport hosts them.

A transport (rank processes: ``emu.cluster.launcher``; rank threads:
``emu.cluster.threads``) starts its ranks and hands this module a ``Ranks``: one
``RankHandle`` per rank (what the launching side knows of it), a way to wait for news,
and a way to stop every rank. ``supervise`` then runs the run to its end:

- the first rank that fails on its own fails the run (a rank process that raises sends
  its traceback, one that dies is seen through its exit; a rank thread that raises);
- an error raised inside a collective (``RankHandle.failure`` says it is an *echo*: how
  a rank sees a peer die or a collective time out) gives way to another rank's own
  failure or a watchdog finding arriving within ``ECHO_GRACE_S``;
- the collective watchdog (``emu.cluster.watchdog``) reads what every rank publishes
  about its collectives and fails a run that hangs or whose ranks disagree;
- a run that exceeds ``run_timeout_s`` is stopped;
- SIGINT and SIGTERM to the launching process stop the run (``StopSignals``).

When a rank failed on its own, its peers usually see it go within milliseconds (a rank
process's collectives fail once the peer's sockets close) and report where they were
themselves: they get up to ``SETTLE_S`` to do so before the rest are stopped, so the
report holds their own account rather than a stack cut short mid-report. On any of
these, what every rank was doing (the watchdog's view) is taken, every rank is
stopped, and ``ClusterError`` (or ``Interrupted``) reports each rank: its last entered
and completed collective and how it ended (its traceback, exit status or the Python
stack it had when stopped).
"""

from __future__ import annotations

import signal
import time
from typing import Any, Protocol

from emu.cluster.launch_scope import LaunchFiles, Signalled, StopSignals
from emu.cluster.watchdog import Watchdog

# An error raised inside a collective is usually the echo of another rank's failure;
# wait this long for the root cause before reporting the echo.
ECHO_GRACE_S = 2.0
# After a rank failed on its own: how long its peers get to end on their own first.
SETTLE_S = 1.0


class ClusterError(RuntimeError):
    """A run failed: `rank` is the first rank that failed on its own (None when the run
    timed out, hung or its ranks disagreed on a collective, with no rank failing),
    `message` one line about it, `details` a text per rank (its last entered and
    completed collective when it recorded any, then its traceback, exit status, or the
    Python stack it had when stopped) and `failed_ranks` every rank that failed before
    the launcher stopped it, `rank` first. `collectives` holds, per rank that recorded
    any, `emu.cluster.watchdog.Watchdog.records` (last entered / completed collective)."""

    def __init__(self, rank: int | None, message: str, details: dict[int, str],
                 failed_ranks: list[int] | None = None,
                 collectives: dict[int, dict] | None = None):
        self.rank = rank
        self.message = message
        self.details = details
        self.failed_ranks = failed_ranks if failed_ranks is not None else []
        self.collectives = collectives if collectives is not None else {}
        head = message if rank is None else f"rank {rank} failed: {message}"
        order = sorted(details, key=lambda r: (r != rank, r))
        body = "\n".join(f"--- rank {r} ---\n{details[r].rstrip()}" for r in order)
        super().__init__(f"{head}\n{body}" if body else head)

    def __reduce__(self):
        return type(self), (self.rank, self.message, self.details, self.failed_ranks,
                            self.collectives)


class Interrupted(KeyboardInterrupt):
    """The launching process got SIGINT (Ctrl-C) or SIGTERM (a CI runner, `timeout`)
    while its ranks ran: every rank was stopped and the launch's scratch files are gone.
    A KeyboardInterrupt, so code that handles Ctrl-C keeps working; `signal_name` says
    which signal, `details` is a text per rank (its last collective and the stack it had
    when stopped)."""

    def __init__(self, signal_name: str, details: dict[int, str]):
        self.signal_name = signal_name
        self.details = details
        body = "\n".join(f"--- rank {r} ---\n{details[r].rstrip()}" for r in sorted(details))
        if not details:
            super().__init__(f"interrupted by {signal_name} before any rank had started")
            return
        super().__init__(f"interrupted by {signal_name}: every rank was stopped\n{body}")

    @property
    def exit_code(self) -> int:
        """The shell's exit status of a process killed by that signal (130, 143)."""
        return 128 + signal.Signals[self.signal_name].value

    def __reduce__(self):
        return type(self), (self.signal_name, self.details)


class RankHandle(Protocol):
    """What the launching side knows of one rank."""

    rank: int
    returned: bool  # its result arrived
    result: Any

    def failure(self) -> tuple[str, bool] | None:
        """(one line, whether it is an echo) once the rank has failed, else None."""

    def failed_on_its_own(self) -> bool:
        """After the run stopped: whether the rank failed before the launcher stopped it."""

    def report(self) -> str:
        """How the rank ended, for the report: its traceback, exit status or stack."""


class Ranks(Protocol):
    """The ranks of one run, as a transport hosts them."""

    handles: list  # RankHandle, by rank: each rank's as soon as it has started

    def start(self, files: LaunchFiles, signals: StopSignals) -> None:
        """Start every rank, with the launch's scratch files; inside
        ``signals.deferred()`` while one is being started, so that a signal lands before
        or after it is in ``handles``, never between."""

    def wait(self, timeout_s: float) -> None:
        """Block until a rank has news (a result, an error, an exit) or ``timeout_s``."""

    def release(self) -> tuple[int | None, str] | None:
        """Every rank returned: let them end; a failure while they did, or None."""

    def settle(self, timeout_s: float) -> None:
        """A rank failed on its own: give the ranks that will end on their own because of
        it (seeing their collectives fail) up to ``timeout_s`` to do so."""

    def stop(self, reason: str) -> None:
        """Stop every rank still running (each leaves its stack for its report)."""


def supervise(ranks: Ranks, *, dp_size: int, collective_timeout_s: float,
              run_timeout_s: float | None) -> list:
    """Start the ranks and supervise them to the end; returns their results by rank.
    Raises ``ClusterError`` or ``Interrupted`` (every rank started so far stopped first,
    and reported); an error of ``ranks.start`` itself propagates once the ranks it had
    started are stopped."""
    deadline = None if run_timeout_s is None else time.monotonic() + run_timeout_s
    with StopSignals() as signals, LaunchFiles() as files:
        watchdog = Watchdog(files.path("guard"), dp_size, collective_timeout_s)
        try:
            with signals.armed():
                ranks.start(files, signals)
                failure = _watch(ranks, watchdog, deadline, run_timeout_s)
                if failure is None:
                    failure = ranks.release()
        except Signalled as exc:
            where = _where(watchdog, dp_size)
            ranks.stop("the launcher was interrupted")
            raise Interrupted(signal.Signals(exc.signum).name,
                              _details(ranks, where)) from None
        except BaseException:
            ranks.stop("the launcher failed")
            raise
        else:  # outside the handlers above: the ranks are stopped once
            if failure is not None:
                if failure[0] is not None:
                    ranks.settle(SETTLE_S)
                where = _where(watchdog, dp_size)
                ranks.stop("another rank failed")
                raise _cluster_error(ranks, failure, where)
        finally:
            watchdog.close()
    return [h.result for h in ranks.handles]


def _watch(ranks: Ranks, watchdog: Watchdog, deadline: float | None,
           run_timeout_s: float | None) -> tuple[int | None, str] | None:
    """Wait until every rank has returned; returns None, or (rank or None, message) of the
    failure (see the module docstring)."""
    handles = ranks.handles
    echo_since: float | None = None
    while True:
        now = time.monotonic()
        failures = [h.failure() for h in handles]  # by rank
        failed = [h.rank for h in handles if failures[h.rank] is not None]
        root = next((r for r in failed if not failures[r][1]), None)
        if root is not None:
            return root, failures[root][0]
        if all(h.returned or failures[h.rank] is not None for h in handles):
            if failed:  # every rank ended, some with an echo only
                return failed[0], failures[failed[0]][0]
            finding = watchdog.finish()
            return None if finding is None else (None, finding)
        if deadline is not None and now >= deadline:
            return None, f"run exceeded run_timeout_s={run_timeout_s} and was stopped"
        finding = watchdog.poll(now, {h.rank for h in handles if h.returned})
        if finding is not None:
            return None, finding
        timeouts = [watchdog.POLL_S]
        if failed:
            echo_since = now if echo_since is None else echo_since
            if now - echo_since >= ECHO_GRACE_S:
                return failed[0], failures[failed[0]][0]
            timeouts.append(echo_since + ECHO_GRACE_S - now)
        if deadline is not None:
            timeouts.append(deadline - now)
        ranks.wait(max(0.0, min(timeouts)))


def _where(watchdog: Watchdog, dp_size: int) -> dict[int, tuple[str, dict]]:
    """What every rank was doing collectively (``Watchdog.describe`` and ``records``),
    taken before the ranks are stopped."""
    return {r: (watchdog.describe(r), watchdog.records(r)) for r in range(dp_size)}


def _details(ranks: Ranks, where: dict[int, tuple[str, dict]]) -> dict[int, str]:
    """Every started rank's report: where the watchdog saw it and how it ended."""
    return {h.rank: f"{where[h.rank][0]}\n{h.report()}" if where[h.rank][0] else h.report()
            for h in ranks.handles}


def _cluster_error(ranks: Ranks, failure: tuple[int | None, str],
                   where: dict[int, tuple[str, dict]]) -> ClusterError:
    rank, message = failure
    failed = [h.rank for h in ranks.handles if h.failed_on_its_own()]
    if rank is not None:
        if rank in failed:
            failed.remove(rank)
        failed.insert(0, rank)
    collectives = {r: records for r, (text, records) in where.items() if text}
    return ClusterError(rank, message, _details(ranks, where), failed, collectives)
