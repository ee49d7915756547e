"""``emu.cluster.launch_scope.StopSignals``: SIGINT while a rank is being started is held
back, not lost, whichever thread of the launching process the kernel hands it to."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from emu.cluster.launch_scope import Signalled, StopSignals


def test_a_sigint_another_thread_takes_while_a_rank_starts_is_raised_after():
    # The launcher may have threads that do not block SIGINT (its caller's, or torch's
    # once imported); a process-directed SIGINT may land on any of them. It
    # was discarded while a rank started (SIGINT was ignored process-wide meanwhile), so
    # a Ctrl-C then left the run going on.
    other = threading.Thread(target=time.sleep, args=(0.5,))
    other.start()  # before the block, as those threads are: SIGINT is not blocked in it
    with StopSignals() as signals, pytest.raises(Signalled) as info:
        with signals.armed():
            with signals.deferred():
                signal.pthread_kill(other.ident, signal.SIGINT)
                other.join()
                time.sleep(0.05)  # the main thread runs Python handlers between bytecodes
                assert signals.received == signal.SIGINT  # held back inside the block
    assert info.value.signum == signal.SIGINT
