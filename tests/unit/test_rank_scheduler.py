"""``emu.cluster.rank_scheduler.RankScheduler``, the runner of the thread transport's rank
threads: ranks run in turn, a parked rank runs again when woken, after its timeout
(park returns False) or, aborted, raising ``CollectiveAborted``; another thread can see
where each rank is."""

from __future__ import annotations

import threading
import time
import traceback

import greenlet
import numpy as np
import pytest

from emu.cluster.rank_scheduler import CollectiveAborted, RankScheduler
from emu.cluster.thread_collectives import CollectiveTimeout, Hub


def test_ranks_take_turns_and_a_woken_rank_runs_after_the_ready_ones():
    scheduler = RankScheduler()
    log = []
    waiting = []

    def first():
        log.append("0 parks")
        waiting.append(greenlet.getcurrent())
        assert scheduler.park(60.0) is True
        log.append("0 woken")

    def second():
        log.append("1 runs")
        scheduler.wake(waiting)
        log.append("1 goes on after waking 0")

    def third():
        log.append("2 runs")

    scheduler.run([first, second, third])
    assert log == ["0 parks", "1 runs", "1 goes on after waking 0", "2 runs", "0 woken"]


def test_a_rank_nobody_wakes_times_out_after_its_timeout():
    scheduler = RankScheduler()
    results = []

    def waits():
        start = time.monotonic()
        results.append((scheduler.park(0.2), time.monotonic() - start))

    scheduler.run([waits, lambda: None])
    [(woken, waited)] = results
    assert woken is False and waited >= 0.2


def test_an_abort_from_another_thread_ends_every_wait_and_every_later_park():
    scheduler = RankScheduler()
    errors = {}

    def rank(r):
        def body():
            try:
                scheduler.park(60.0)
            except CollectiveAborted as exc:
                errors[r] = str(exc)
                with pytest.raises(CollectiveAborted):
                    scheduler.park(60.0)
        return body

    runner = threading.Thread(target=scheduler.run, args=([rank(0), rank(1)],))
    runner.start()
    time.sleep(0.2)
    assert runner.is_alive() and not errors  # both parked, the runner asleep
    scheduler.abort("rank 2 failed")
    runner.join(5.0)
    assert not runner.is_alive()
    assert errors == {0: "rank 0: rank 2 failed", 1: "rank 1: rank 2 failed"}


def parked_here(scheduler):
    with pytest.raises(CollectiveAborted):
        scheduler.park(60.0)


def test_another_thread_sees_where_each_rank_waits_or_runs():
    scheduler = RankScheduler()
    release = threading.Event()

    def sleeper():
        release.wait(5.0)

    runner = threading.Thread(target=scheduler.run,
                              args=([lambda: parked_here(scheduler), sleeper],))
    runner.start()
    time.sleep(0.2)
    assert scheduler.running_rank() == 1
    assert "parked_here" in "".join(traceback.format_stack(scheduler.frame(0)))
    assert "sleeper" in "".join(traceback.format_stack(scheduler.frame(1)))
    scheduler.abort("done")
    release.set()
    runner.join(5.0)
    assert not runner.is_alive()
    assert scheduler.frame(0) is None and scheduler.running_rank() is None


def test_a_rank_that_timed_out_has_left_its_collective():
    """In a hub (``emu.cluster.thread_collectives``): rank 0 times out in an all-reduce;
    rank 1, arriving later, completes it without waking rank 0 again."""
    scheduler = RankScheduler()
    hub = Hub("dp", 2, 0.2, scheduler)
    results = {}

    def rank(r):
        def body():
            array = np.full(3, r + 1, dtype=np.int32)
            if r == 1:
                assert scheduler.park(0.6) is False  # away while rank 0 times out
            try:
                hub.all_reduce(r, array, np.add)
                results[r] = array.tolist()
            except CollectiveTimeout as exc:
                results[r] = str(exc)
        return body

    scheduler.run([rank(0), rank(1)])
    assert results == {
        0: "rank 0 waited 0.2 s (collective_timeout_s) in a collective on the dp group; "
           "1 peer(s) never arrived",
        1: [3, 3, 3]}


def test_module_state_a_rank_keeps_is_its_own_whenever_it_runs_and_restored_after():
    """``keep``: two ranks set one module attribute each for themselves; whenever a rank
    runs it finds its own value, whatever the other set meanwhile; afterwards the value
    from before the run is back."""
    import types

    module = types.ModuleType("singleton_holder")
    module.config = "before"
    scheduler = RankScheduler()
    seen = []
    hub = Hub("dp", 2, 60.0, scheduler)

    def rank(r):
        def body():
            scheduler.keep(module, "config")
            module.config = f"rank {r}"
            for _ in range(3):
                hub.all_reduce(r, np.zeros(1), np.add)  # parks: the other rank runs
                seen.append((r, module.config))
        return body

    scheduler.run([rank(0), rank(1)])
    assert sorted(seen) == [(0, "rank 0")] * 3 + [(1, "rank 1")] * 3
    assert module.config == "before"
