"""``emu.cluster.rank_start.RankStarter.starting``: while a rank starts, multiprocessing
asks the launch's own fork server for it, also when another thread of the process starts
a rank of another launch at the same moment (``tests/integration/test_launcher.py``
starts two launches at once on real ranks; this holds the window open)."""

from __future__ import annotations

import threading
import types
from multiprocessing import forkserver

from emu.cluster.rank_start import RankStarter


def _starter() -> RankStarter:
    server = types.SimpleNamespace(connect_to_new_process=lambda fds: None)
    return RankStarter(context=None, parent_pid=0, server=server)


def test_a_rank_starting_in_one_thread_keeps_its_server_while_another_thread_is_done():
    original = forkserver.connect_to_new_process
    starters = _starter(), _starter()
    first_in, second_waiting = threading.Event(), threading.Event()
    asked = []

    def first():
        with starters[0].starting():
            first_in.set()
            second_waiting.wait(5)

    def second():
        first_in.wait(5)
        second_waiting.set()
        with starters[1].starting():
            first_thread.join(5)  # the first start is over: its block has put back
            asked.append(forkserver.connect_to_new_process)  # what a rank would ask

    first_thread = threading.Thread(target=first)
    second_thread = threading.Thread(target=second)
    first_thread.start()
    second_thread.start()
    second_thread.join(10)
    assert asked == [starters[1]._server.connect_to_new_process]
    assert forkserver.connect_to_new_process is original
