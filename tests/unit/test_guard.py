"""CollectiveRecorder: numbering, record fields, per-iteration hand-off."""

from __future__ import annotations

import torch

from emu.guard import CollectiveRecorder


def test_records_then_runs_and_numbers_across_takes():
    recorder = CollectiveRecorder()
    order = []

    def fn():
        order.append(recorder.last["seq"])  # recorded before the collective runs
        return "result"

    assert recorder("engine.lockstep", "all_reduce_max", torch.zeros(5, dtype=torch.int32),
                    fn) == "result"
    recorder("dyntra_lb.allgather", "all_gather", torch.zeros(10, dtype=torch.int32), fn)
    assert recorder.take() == [
        {"seq": 0, "site": "engine.lockstep", "op": "all_reduce_max", "shape": [5],
         "dtype": "int32"},
        {"seq": 1, "site": "dyntra_lb.allgather", "op": "all_gather", "shape": [10],
         "dtype": "int32"},
    ]
    assert recorder.take() == []
    recorder("engine.dp_sync", "all_reduce_sum", torch.zeros(2, dtype=torch.int64), fn)
    assert recorder.take()[0]["seq"] == 2 and recorder.last["dtype"] == "int64"
    assert order == [0, 1, 2]
