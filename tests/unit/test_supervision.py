"""``emu.cluster.supervision.supervise``'s order of events. When a signal lands while
the ranks are being started, the ranks started so far are stopped and reported, and
stopped before the launch's scratch files go (a rank still alive would make its stack
file again); a failed run stops its ranks once.

Found by the fault matrix (a Ctrl-C at start-up, dp 2): the signal was raised inside the
transport's start, before it handed its ranks over, so no rank was named and a rank's
stack file was left in /dev/shm. The ranks here are stand-ins: what is checked is the
policy's order of events, not a transport."""

from __future__ import annotations

import os
import signal

import pytest

from emu.cluster.supervision import SETTLE_S, ClusterError, Interrupted, supervise


class _Rank:
    def __init__(self, rank: int, stack_path: str):
        self.rank = rank
        self.stack_path = stack_path
        self.returned = False
        self.result = None
        self.stopped_with_stack_file = None  # whether its stack file was there at stop

    def failure(self):
        return None

    def failed_on_its_own(self) -> bool:
        return False

    def report(self) -> str:
        return "stopped" if self.stopped_with_stack_file is not None else "never stopped"


class _SignalledWhileStarting:
    """Starts `started` ranks, then a SIGINT arrives before the start returns."""

    def __init__(self, dp: int, started: int):
        self.dp, self.started = dp, started
        self.handles: list[_Rank] = []

    def start(self, files, signals) -> None:
        for rank in range(self.started):
            with signals.deferred():
                self.handles.append(_Rank(rank, files.path(f"rank{rank}.stack")))
                if rank == self.started - 1:
                    signal.raise_signal(signal.SIGINT)  # held until the block ends
        raise AssertionError("the signal should have ended the start")

    def wait(self, timeout_s: float) -> None:
        raise AssertionError("never reached")

    def release(self):
        raise AssertionError("never reached")

    def stop(self, reason: str) -> None:
        for h in self.handles:
            h.stopped_with_stack_file = os.path.exists(h.stack_path)


@pytest.mark.parametrize("started", [1, 2])
def test_a_signal_during_start_stops_and_reports_the_ranks_started(started):
    ranks = _SignalledWhileStarting(dp=2, started=started)
    with pytest.raises(Interrupted) as info:
        supervise(ranks, dp_size=2, collective_timeout_s=5.0, run_timeout_s=None)
    assert sorted(info.value.details) == list(range(started))
    assert all("stopped" == info.value.details[r].splitlines()[-1] for r in range(started))
    # Stopped while their scratch files still existed, and those are gone now.
    assert [h.stopped_with_stack_file for h in ranks.handles] == [True] * started
    assert not any(os.path.exists(h.stack_path) for h in ranks.handles)


def test_a_signal_before_any_rank_started_says_so():
    ranks = _SignalledWhileStarting(dp=2, started=0)

    def start(files, signals):
        signal.raise_signal(signal.SIGINT)

    ranks.start = start
    with pytest.raises(Interrupted) as info:
        supervise(ranks, dp_size=2, collective_timeout_s=5.0, run_timeout_s=None)
    assert info.value.details == {}
    assert str(info.value) == "interrupted by SIGINT before any rank had started"


class _OneFails:
    """Two ranks started; rank 1 has failed on its own. Records the settles and stops."""

    def __init__(self):
        self.handles: list[_Rank] = []
        self.stops: list[str] = []

    def start(self, files, signals) -> None:
        self.handles = [_Rank(0, files.path("rank0.stack")), _Failed(1)]

    def wait(self, timeout_s: float) -> None:
        raise AssertionError("the failure is there from the start")

    def release(self):
        raise AssertionError("a rank failed: nothing to release")

    def settle(self, timeout_s: float) -> None:
        self.stops.append(f"settle {timeout_s:g} s")

    def stop(self, reason: str) -> None:
        self.stops.append(reason)


class _Failed(_Rank):
    def __init__(self, rank: int):
        super().__init__(rank, "")

    def failure(self):
        return "RuntimeError: boom", False

    def failed_on_its_own(self) -> bool:
        return True


def test_a_failed_run_lets_the_peers_settle_then_stops_its_ranks_once():
    # Each stop of rank threads waits up to its grace for a rank stuck outside a
    # collective: stopping twice (once for the failure, once more as "the launcher
    # failed" when the ClusterError passed the generic handler) doubled that wait.
    ranks = _OneFails()
    with pytest.raises(ClusterError) as info:
        supervise(ranks, dp_size=2, collective_timeout_s=5.0, run_timeout_s=None)
    assert info.value.rank == 1
    assert ranks.stops == [f"settle {SETTLE_S:g} s", "another rank failed"]
