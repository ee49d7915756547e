"""The thread transport's in-memory collectives against gloo's: the same calls
(``dist.all_reduce`` with every op the engine could use, ``dist.all_gather``) on the
same tensors give the same results and dtypes; ranks that disagree on a collective are
named by the watchdog; a peer that never arrives times out."""

from __future__ import annotations

import gc

import pytest
import torch
import torch.distributed as dist

from emu.cluster.launcher import launch
from emu.cluster.supervision import ClusterError
from emu.cluster.threads import run_in_threads
from emu.rank.recorder import CollectiveRecorder

pytestmark = pytest.mark.integration

OPS = ("SUM", "PRODUCT", "MIN", "MAX")
DTYPES = (torch.int32, torch.int64, torch.float32, torch.float64)


def collectives_target(ctx, _):
    """Every op and dtype on both groups, then an all-gather; returns what came back."""
    results = []
    for group in (ctx.dp_group, ctx.device_group):
        for dtype in DTYPES:
            for op in OPS:
                t = (torch.arange(5, dtype=dtype) * (ctx.rank + 1) - 2 * ctx.rank + 1)
                dist.all_reduce(t, op=getattr(dist.ReduceOp, op), group=group)
                results.append((op, str(t.dtype), t.tolist()))
    # A tensor reduced again after its storage was replaced (the thread transport keeps
    # a numpy view per tensor: it must follow the new storage and shape).
    t = torch.full((3,), ctx.rank, dtype=torch.int64)
    dist.all_reduce(t, group=ctx.dp_group)
    for shape in (3, 5):
        t.set_(torch.full((shape,), ctx.rank + shape, dtype=torch.int64))
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=ctx.dp_group)
        results.append(("new storage", t.tolist()))
    # Calls the thread transport leaves to torch's own functions: a complex tensor, an
    # all-gather with mixed dtypes (torch refuses it before any collective).
    c = torch.tensor([1 + 2j * ctx.rank, -ctx.rank], dtype=torch.complex64)
    dist.all_reduce(c, group=ctx.dp_group)
    results.append(("complex", c.tolist()))
    try:
        dist.all_gather([torch.zeros(2, dtype=torch.int64) for _ in range(ctx.dp_size)],
                        torch.zeros(2, dtype=torch.int32), group=ctx.dp_group)
    except ValueError as exc:
        results.append(("mixed dtypes", str(exc)))
    send = torch.tensor([ctx.rank, 10 * ctx.rank, -ctx.rank], dtype=torch.int32)
    outs = [torch.full((3,), -99, dtype=torch.int32) for _ in range(ctx.dp_size)]
    dist.all_gather(outs, send, group=ctx.dp_group)
    send.fill_(1234)  # the sender reusing its buffer changes nothing gathered
    results.append(("all_gather", [o.tolist() for o in outs]))
    # One output list gathered into again and again (the thread transport keeps what it
    # fills per list): outputs that are the rows of one buffer (the coordinator's, filled
    # with one copy), then that list with an element replaced and with an element's
    # storage replaced; each time every output must hold the new gather.
    block = torch.full((ctx.dp_size, 3), -99, dtype=torch.int32)
    rows = list(block)
    for i in range(3):
        if i == 1:
            rows[-1] = torch.full((3,), -98, dtype=torch.int32)
        if i == 2:
            rows[0].set_(torch.full((3,), -97, dtype=torch.int32))
        send = torch.tensor([ctx.rank, i, -ctx.rank], dtype=torch.int32)
        dist.all_gather(rows, send, group=ctx.dp_group)
        results.append((f"rows {i}", [o.tolist() for o in rows], block.tolist()))
    return results


torch_functions = {"all_reduce": dist.all_reduce, "all_gather": dist.all_gather}


@pytest.mark.parametrize("dp_size", [2, 4])
def test_in_memory_collectives_match_gloo(tmp_path, dp_size):
    gloo = launch(collectives_target, None, dp_size=dp_size, device="cpu",
                  out_dir=tmp_path / "gloo", collective_timeout_s=60.0, run_timeout_s=120.0)
    threads = run_in_threads(collectives_target, None, dp_size=dp_size,
                             out_dir=tmp_path / "threads", collective_timeout_s=60.0,
                             run_timeout_s=120.0)
    assert threads == gloo
    assert any(r[0] == "mixed dtypes" and "different dtypes" in r[1] for r in gloo[0])
    # The thread transport's dist.all_reduce / all_gather are torch's again afterwards.
    assert (dist.all_reduce, dist.all_gather) == (torch_functions["all_reduce"],
                                                  torch_functions["all_gather"])
    assert threads[0][-4] == ("all_gather", [[r, 10 * r, -r] for r in range(dp_size)])
    assert threads[0][-1][1] == [[r, 2, -r] for r in range(dp_size)]
    assert all(result == threads[0] for result in threads)


def mismatch_target(ctx, _):
    """Rank 0 all-reduces on the DP group while rank 1 all-gathers on it: never completes."""
    recorder = CollectiveRecorder(ctx.guard)
    t = torch.zeros(4, dtype=torch.int32)
    if ctx.rank == 0:
        recorder("dyntra_lb.flag", "all_reduce_max", t,
                 lambda: dist.all_reduce(t, op=dist.ReduceOp.MAX, group=ctx.dp_group))
    else:
        outs = [torch.zeros(4, dtype=torch.int32) for _ in range(ctx.dp_size)]
        recorder("dyntra_lb.allgather", "all_gather", t,
                 lambda: dist.all_gather(outs, t, group=ctx.dp_group))


def test_ranks_in_different_collectives_are_a_named_mismatch(tmp_path):
    with pytest.raises(ClusterError) as info:
        run_in_threads(mismatch_target, None, dp_size=2, out_dir=tmp_path,
                       collective_timeout_s=10.0, run_timeout_s=60.0)
    err = info.value
    assert err.rank is None
    assert err.message == (
        "collective mismatch: rank 0 waits in seq 0 dyntra_lb.flag (dp group, "
        "all_reduce_max [4] int32) at iteration 0, step_counter 0, wave 0; rank 1 waits in "
        "seq 0 dyntra_lb.allgather (dp group, all_gather [4] int32) at iteration 0, "
        "step_counter 0, wave 0")
    assert all("stopped by the launcher; Python stack:" in err.details[r] for r in (0, 1))
    assert "mismatch_target" in err.details[1]


def absent_peer_target(ctx, _):
    t = torch.zeros(1)
    if ctx.rank == 0:
        dist.all_reduce(t, group=ctx.dp_group)


def test_a_peer_that_finishes_instead_is_named(tmp_path):
    with pytest.raises(ClusterError) as info:
        run_in_threads(absent_peer_target, None, dp_size=2, out_dir=tmp_path,
                       collective_timeout_s=1.0, run_timeout_s=60.0)
    err = info.value
    # No recorder: the watchdog sees nothing; rank 0's own timeout names it.
    assert err.rank == 0
    assert err.message.startswith(
        "emu.cluster.thread_collectives.CollectiveTimeout: rank 0 waited 1 s "
        "(collective_timeout_s) in a collective on the dp group")
    assert err.details[1] == "finished"


def process_state_target(ctx, _):
    return {"threads": torch.get_num_threads(), "frozen": gc.get_freeze_count() > 0,
            "ours": dist.all_reduce is not torch_functions["all_reduce"]}


def test_process_wide_state_holds_while_ranks_run_and_is_restored_after(tmp_path):
    """One intra-op torch thread, the transport's dist functions and the objects of
    before the run frozen out of the garbage collector's full collections, while the
    ranks run; the process as it was afterwards."""
    before = (torch.get_num_threads(), gc.get_freeze_count())
    results = run_in_threads(process_state_target, None, dp_size=2, out_dir=tmp_path,
                             collective_timeout_s=10.0, run_timeout_s=60.0)
    assert results == [{"threads": 1, "frozen": True, "ours": True}] * 2
    assert (torch.get_num_threads(), gc.get_freeze_count()) == before
    assert dist.all_reduce is torch_functions["all_reduce"]
