"""The thread transport's collectives: the in-memory groups every rank of a thread run
(``emu.cluster.threads``) joins, and the plans they share.

``ThreadGroup`` is a ``torch.distributed.ProcessGroup`` subclass whose ``allreduce`` and
``allgather`` meet their peers in memory (``Hub``, one per group: a rank that is not
the last to arrive parks in the run's ``emu.cluster.rank_scheduler.RankScheduler``
until the last one wakes it). ``dist.all_reduce(t, op=..., group=g)`` and
``dist.all_gather(list, t, group=g)`` dispatch to a group's own methods, so the engine,
the lockstep clock and the DyntraLB coordinator run unchanged, on the same tensors and
dtypes (SUM, PRODUCT, MIN and MAX, as gloo offers them; the hub reduces and copies
through numpy views of the CPU tensors, a fraction of a torch op's cost, and gathers
into one array, copied with one call into output tensors that are the rows of one
buffer, as the coordinator's are). The groups are made directly, not through
``init_process_group`` / ``Backend.register_backend``: those keep one default group per
process, and here one process holds every rank. A collective whose peers do not all
arrive within the collective timeout raises ``CollectiveTimeout``; once the run has
failed (``RankScheduler.abort``) every waiting and later collective raises
``CollectiveAborted``: how a rank thread sees a dead peer, as a gloo rank sees a closed
connection.

Each rank's groups get a ``GroupCarrier`` (``emu.rank.collective_hooks.attach``): a
``dist.all_reduce`` / ``dist.all_gather`` on a ``ThreadGroup`` (the same call of the
engine, clock and coordinator code, and of vLLM's and vllm-ascend's) goes straight to
its hub, since torch's wrappers check and dispatch at a cost larger than the in-memory
collective itself.

What the ranks share beyond the collectives: the plans. DyntraLB's planner is a pure
function of the gathered snapshot and the config, and after an all-gather every rank
holds the same snapshot, so each rank's ``DyntraLBCoordinator`` would compute the same
plans (N planner runs per step, each over all N ranks' payloads). The DP group's hub
holds a ``PlanMemo``, which each rank's context offers it (``emu.cluster.threads.ThreadHost``):
the first rank to plan a snapshot runs the
planner, the others take its result, keyed on the planner, its arguments and the
gathered bytes — an identical key is an identical input, so the plans are the ones the
rank would have computed, and nothing a rank writes changes except the planner's wall
time in its wall log. The plans are only read after planning (each rank applies its
own row, rank 0 logs them), so sharing the objects is safe.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import greenlet
import numpy as np
import torch
import torch.distributed as dist

from emu.cluster.rank_scheduler import CollectiveAborted, RankScheduler


class CollectiveTimeout(RuntimeError):
    """A rank waited longer than the collective timeout for its peers."""


# The reductions, on the numpy views of the tensors (numpy's elementwise ufuncs give
# torch's results for these ops, integer wrap-around and NaN propagation included).
_REDUCE = {dist.ReduceOp.SUM: np.add, dist.ReduceOp.PRODUCT: np.multiply,
           dist.ReduceOp.MIN: np.minimum, dist.ReduceOp.MAX: np.maximum}
# The same by the id of torch's op objects (``dist.ReduceOp.MAX`` is one object): hashing
# or comparing a ReduceOp costs about a microsecond, an int look-up a tenth of that.
_REDUCE_BY_ID = {id(op): (op, ufunc) for op, ufunc in _REDUCE.items()}


def _reduction(op) -> Any:
    """The numpy ufunc of a torch ``ReduceOp``, or None when the hub does not have it."""
    entry = _REDUCE_BY_ID.get(id(op))
    if entry is not None and entry[0] is op:
        return entry[1]
    return _REDUCE.get(op)  # an equal op that is another object


# A group keeps the numpy views of at most this many tensors (the engine's collective
# buffers are a handful, allocated once; a caller with fresh tensors per call refills it).
_MAX_VIEWS = 256
_data_ptr = torch.Tensor.data_ptr


class Hub:
    """Where the ranks of one group meet. In a collective each rank adds its part; the
    last one to arrive publishes the result and wakes the others, which had parked
    (``RankScheduler.park``). The result stays until the next collective completes, and
    every rank reads it before that, since every rank must arrive at the next one. No
    lock: every rank runs in the scheduler's one OS thread, and a rank only gives way to
    another when it parks.

    A rank that arrives with another collective than the one under way (kind, op,
    shape, dtype) never joins it: it waits until its timeout or the abort, as
    mismatched gloo ranks would, and the watchdog reports the disagreement."""

    def __init__(self, name: str, size: int, timeout_s: float, scheduler: RankScheduler):
        self.name = name
        self.size = size
        self.timeout_s = timeout_s
        self.scheduler = scheduler
        self.arrived = 0
        self.desc: tuple | None = None
        self.acc: Any = None
        self.result: Any = None
        self.waiters: list = []  # the parked ranks' greenlets
        self.plan_memo = PlanMemo()

    def all_reduce(self, rank: int, array: np.ndarray, reduce) -> None:
        """``array``: the numpy view of the rank's tensor, reduced in place with
        ``reduce`` (the op's ufunc, ``_reduction``)."""
        self._enter(rank, ("all_reduce", reduce, array.dtype, array.shape))
        if self.arrived == 0:
            self.acc = array.copy()
        else:
            reduce(self.acc, array, out=self.acc)
        self._arrive(rank)
        array[...] = self.result

    def all_gather(self, rank: int, outputs: np.ndarray | list[np.ndarray],
                   array: np.ndarray) -> None:
        """``array``: the numpy view of the rank's input tensor; ``outputs``: views of its
        output tensors, or one ``(size, ...)`` array over all of them (``ThreadGroup``
        finds one when the outputs are consecutive in memory), filled with one copy."""
        if len(outputs) != self.size:
            raise ValueError(f"all_gather on the {self.name} group needs {self.size} output "
                             f"tensors, got {len(outputs)}")
        self._enter(rank, ("all_gather", array.dtype, array.shape))
        if self.arrived == 0:
            self.acc = np.empty((self.size, *array.shape), array.dtype)
        self.acc[rank] = array  # a copy: the sender may reuse its buffer at once
        self._arrive(rank)
        gathered = self.result
        if isinstance(outputs, np.ndarray):
            outputs[...] = gathered
        else:
            for out, part in zip(outputs, gathered, strict=True):
                out[...] = part

    def _enter(self, rank: int, desc: tuple) -> None:
        """Before this rank adds its part. A rank that arrives with another collective
        than the one under way is never woken: it waits until it times out or the run
        is aborted."""
        if self.scheduler.reason is not None:
            raise CollectiveAborted(f"rank {rank}: {self.scheduler.reason}")
        if self.arrived and desc != self.desc:
            while True:
                self._wait(rank)
        if not self.arrived:
            self.desc = desc

    def _arrive(self, rank: int) -> None:
        """Once this rank's part is in: complete the collective when it is the last
        (its waiting peers run again after it parks next), else wait for that."""
        self.arrived += 1
        if self.arrived < self.size:
            self.waiters.append(greenlet.getcurrent())
            self._wait(rank)
            return
        self.result = self.acc
        self.acc = None
        self.arrived = 0
        woken, self.waiters = self.waiters, []
        self.scheduler.wake(woken)

    def _wait(self, rank: int) -> None:
        """Park until woken; a timeout raises ``CollectiveTimeout``, the run's abort
        ``CollectiveAborted`` (from ``park``). A rank that timed out has left: its part
        stays in, and the peers that arrive later complete the collective without it."""
        if not self.scheduler.park(self.timeout_s):
            current = greenlet.getcurrent()
            if current in self.waiters:
                self.waiters.remove(current)
            raise CollectiveTimeout(
                f"rank {rank} waited {self.timeout_s:g} s (collective_timeout_s) in a "
                f"collective on the {self.name} group; "
                f"{self.size - self.arrived} peer(s) never arrived")


class PlanMemo:
    """The plans of the last snapshot planned on a group, shared by its ranks: the
    ``plan_memo`` of each rank's host (``emu.rank.context.RankContext.host``), through
    which the kit's engine wraps its coordinator's planner (``emu.impl.kit.engine``) and
    vllm-ascend's ranks their ``_balance_load`` (``emu.impl.vllm_ascend.engine``). Called
    by each rank right after its all-gather: the first rank with a new key computes, the others
    find the key. One entry is enough: no rank can plan the next snapshot before every
    rank has joined its all-gather, i.e. finished planning this one. No lock: a rank
    does not give way to another while it plans (it parks only in collectives)."""

    def __init__(self) -> None:
        self._key: Any = None
        self._plans: Any = None

    def __call__(self, key: Any, compute: Callable[[], Any]) -> Any:
        if self._key is None or key != self._key:
            self._plans = compute()  # a planner error leaves the memo as it was
            self._key = key
        return self._plans


class ThreadGroup(dist.ProcessGroup):
    """One rank's handle on a group of the thread transport: the ``group=`` argument of
    ``dist.all_reduce`` / ``dist.all_gather``, which call ``allreduce`` / ``allgather``."""

    def __init__(self, hub: Hub, rank: int):
        super().__init__(rank, hub.size)
        self._hub = hub
        self._rank = rank
        self._views: dict[int, tuple[torch.Tensor, int, np.ndarray, bool]] = {}
        self._outputs: dict[int, tuple] = {}

    def allreduce(self, tensors, opts=None):
        """``dist.all_reduce``: one tensor, reduced in place over every rank."""
        op = dist.ReduceOp.SUM if opts is None else opts.reduceOp.op
        reduce = _reduction(op)
        if reduce is None:
            raise ValueError(f"the thread transport's all_reduce supports SUM, PRODUCT, "
                             f"MIN and MAX, got {op}")
        for tensor in tensors:
            self._hub.all_reduce(self._rank, self._view(tensor), reduce)
        return None  # completed synchronously; dist.all_reduce has nothing to wait for

    def allgather(self, output_lists, input_tensors, opts=None):
        """``dist.all_gather``: every rank's tensor into every rank's output list."""
        for outputs, tensor in zip(output_lists, input_tensors, strict=True):
            self._hub.all_gather(self._rank, [self._view(out) for out in outputs],
                                 self._view(tensor))
        return None

    def _view(self, tensor: torch.Tensor) -> np.ndarray:
        """The numpy array over ``tensor``'s memory (a CPU tensor of a numpy dtype, as
        every tensor of the engine is). The hub works on these: a numpy copy or ufunc
        costs a fraction of a torch op's dispatch."""
        return self._entry(tensor)[2]

    def _plain_view(self, tensor: torch.Tensor) -> np.ndarray | None:
        """``_view`` of a tensor torch's wrappers pass on unchanged (not complex), else
        None: our ``dist`` functions then leave the call to torch's."""
        entry = self._views.get(id(tensor))  # _entry's check, inline: every collective
        if entry is None or entry[0] is not tensor or entry[1] != tensor.data_ptr() \
                or entry[2].shape != tensor.shape:
            entry = self._entry(tensor)
        return entry[2] if entry[3] else None

    def _entry(self, tensor: torch.Tensor) -> tuple[torch.Tensor, int, np.ndarray, bool]:
        """``(tensor, address, view, plain)``, kept per tensor since ``.numpy()`` costs
        more than the copy; a tensor whose storage moved or whose shape changed gets a
        new one."""
        entry = self._views.get(id(tensor))
        if entry is None or entry[0] is not tensor or entry[1] != tensor.data_ptr() \
                or entry[2].shape != tensor.shape:
            if len(self._views) >= _MAX_VIEWS:
                self._views.clear()
            entry = (tensor, tensor.data_ptr(), tensor.numpy(), not tensor.is_complex())
            self._views[id(tensor)] = entry
        return entry

    def _gather_outputs(self, tensors: list) -> np.ndarray | list[np.ndarray] | None:
        """What the hub fills for ``dist.all_gather``'s output list ``tensors``: one
        ``(size, ...)`` array when the tensors are consecutive rows of one buffer (the
        coordinator's are), else their views; None when they are not plain tensors of
        one dtype (the call is then torch's). Kept per list and checked on every call
        against the list's tensors and their addresses (the engine's lists never
        change; 8 ``_view`` look-ups would cost more than the copy)."""
        ids = list(map(id, tensors))
        try:
            addresses = list(map(_data_ptr, tensors))
        except TypeError:  # not a tensor: torch's all_gather reports it
            return None
        entry = self._outputs.get(id(tensors))
        if entry is not None and entry[0] is tensors and entry[1] == ids \
                and entry[2] == addresses:
            return entry[4]
        if len(self._outputs) >= _MAX_VIEWS:
            self._outputs.clear()
        outputs = None
        if all(type(t) is torch.Tensor for t in tensors):
            views = [self._plain_view(t) for t in tensors]
            if all(v is not None and v.dtype == views[0].dtype for v in views):
                outputs = _as_rows(views)
        # The entry holds the tensors, so that their ids are not reused while it exists.
        self._outputs[id(tensors)] = (tensors, ids, addresses, list(tensors), outputs)
        return outputs


def _as_rows(views: list[np.ndarray]) -> np.ndarray | list[np.ndarray]:
    """One ``(len(views), ...)`` array over ``views`` (of one dtype) when they are
    C-contiguous arrays of one shape laid out one right after the other, else ``views``."""
    first = views[0] if views else None
    if first is None or any(
            v.shape != first.shape or not v.flags.c_contiguous
            or v.ctypes.data != first.ctypes.data + i * first.nbytes
            for i, v in enumerate(views)):
        return views
    return np.lib.stride_tricks.as_strided(first, (len(views), *first.shape),
                                           (first.nbytes, *first.strides), writeable=True)


class GroupCarrier:
    """Carries the ``dist.all_reduce`` / ``dist.all_gather`` calls on one ``ThreadGroup``
    straight to its hub (``emu.rank.collective_hooks``); declines what torch's
    wrappers would treat specially (``async_op``, complex or subclassed tensors, an
    all-gather with mixed dtypes, an op the hub does not have), which then goes to
    torch's own function, unchanged."""

    def __init__(self, group: ThreadGroup):
        self.group = group

    def all_reduce(self, tensor, op, async_op: bool) -> bool:
        if async_op or type(tensor) is not torch.Tensor:
            return False
        reduce = _reduction(op)
        group = self.group
        view = group._plain_view(tensor) if reduce is not None else None
        if view is None:
            return False
        group._hub.all_reduce(group._rank, view, reduce)
        return True

    def all_gather(self, tensor_list, tensor, async_op: bool) -> bool:
        if async_op or type(tensor) is not torch.Tensor:
            return False
        group = self.group
        view = group._plain_view(tensor)
        outputs = group._gather_outputs(tensor_list) if view is not None else None
        if outputs is None or (len(outputs) and outputs[0].dtype != view.dtype):
            return False
        group._hub.all_gather(group._rank, outputs, view)
        return True
