"""ClusterError's report text and its survival through pickle (it may cross processes)."""

import pickle

from emu.cluster.supervision import ClusterError


def test_report_puts_the_failing_rank_first():
    err = ClusterError(2, "ValueError: boom", {0: "stopped", 1: "stopped", 2: "Traceback"},
                       [2])
    assert str(err) == ("rank 2 failed: ValueError: boom\n--- rank 2 ---\nTraceback\n"
                        "--- rank 0 ---\nstopped\n--- rank 1 ---\nstopped")
    assert (err.rank, err.message, err.failed_ranks) == (2, "ValueError: boom", [2])


def test_report_without_a_failing_rank_starts_with_the_message():
    err = ClusterError(None, "run exceeded run_timeout_s=3.0 and was stopped", {0: "stopped"})
    assert str(err).startswith("run exceeded run_timeout_s=3.0 and was stopped\n--- rank 0")
    assert err.failed_ranks == []


def test_pickle_round_trip_keeps_every_field():
    err = ClusterError(1, "exited with code 3", {0: "a", 1: "b"}, [1, 0])
    copy = pickle.loads(pickle.dumps(err))
    assert (copy.rank, copy.message, copy.details, copy.failed_ranks, str(copy)) == (
        err.rank, err.message, err.details, err.failed_ranks, str(err))
