"""The one owner of ``torch.distributed.all_reduce`` and ``all_gather`` in this process.

Two parts of the emulator act on collectives they do not issue themselves, each on
groups of its own:

- the thread transport carries every collective of its in-memory groups
  (``emu.cluster.thread_collectives``): a call on one of them goes straight to the
  group's hub, since torch's wrappers check and dispatch at a cost larger than the
  in-memory collective itself;
- a vllm-ascend rank records the collectives vLLM's and vllm-ascend's code issue on its
  DP group (``emu.impl.vllm_ascend.collectives``), for the event log and the watchdog.

Each ``attach``es hooks to a group (``GroupHooks``: ``carry`` and ``record``, either or
both). While any group has hooks, ``dist.all_reduce`` and ``dist.all_gather`` are this
module's: a call on a group without hooks goes to torch's own function unchanged, a call
on a group with hooks is recorded (``record``) and then carried by the group's carrier
or, when it declines (``carry`` returns False), by torch. ``detach`` removes a group's
hooks; with the last one, torch's functions are back. Both projects look the functions
up at call time (``dist.all_reduce(...)``), so the change reaches their code.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch.distributed as dist

# record(kind, op, tensor, fn, caller_frame) -> fn()'s result: records the collective
# issued at caller_frame ("all_reduce" / "all_gather"; op is None for a gather) around
# fn(), which carries it.
Record = Callable[[str, Any, Any, Callable[[], Any], Any], Any]


class Carrier(Protocol):
    """Carries the collectives of one group (the thread transport's in-memory groups).
    Each method returns True when it carried the call, False to leave it to torch."""

    def all_reduce(self, tensor: Any, op: Any, async_op: bool) -> bool: ...

    def all_gather(self, tensor_list: list, tensor: Any, async_op: bool) -> bool: ...


@dataclass
class GroupHooks:
    carry: Carrier | None = None
    record: Record | None = None


_hooks: dict[int, GroupHooks] = {}  # by id(group); the group itself is kept in _groups
_groups: dict[int, Any] = {}
_torch: dict[str, Callable] = {}  # torch's functions while ours are installed


def attach(group: Any, *, carry: Carrier | None = None, record: Record | None = None) -> None:
    """Give ``group`` a carrier and/or a recorder (added to what it has already)."""
    if not _hooks:
        _torch.update(all_reduce=dist.all_reduce, all_gather=dist.all_gather)
        dist.all_reduce, dist.all_gather = _all_reduce, _all_gather
    hooks = _hooks.setdefault(id(group), GroupHooks())
    _groups[id(group)] = group
    if carry is not None:
        hooks.carry = carry
    if record is not None:
        hooks.record = record


def detach(group: Any) -> None:
    """Remove ``group``'s hooks; torch's functions are back once no group has any."""
    if _hooks.pop(id(group), None) is None:
        return
    del _groups[id(group)]
    if not _hooks:
        dist.all_reduce, dist.all_gather = _torch["all_reduce"], _torch["all_gather"]
        _torch.clear()


def _all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
    """``dist.all_reduce`` while any group has hooks."""
    hooks = _hooks.get(id(group))
    if hooks is None:
        return _torch["all_reduce"](tensor, op=op, group=group, async_op=async_op)
    carry = hooks.carry
    if hooks.record is None:
        if carry is not None and carry.all_reduce(tensor, op, async_op):
            return None
        return _torch["all_reduce"](tensor, op=op, group=group, async_op=async_op)

    def call():
        if carry is not None and carry.all_reduce(tensor, op, async_op):
            return None
        return _torch["all_reduce"](tensor, op=op, group=group, async_op=async_op)

    return hooks.record("all_reduce", op, tensor, call, sys._getframe(1))


def _all_gather(tensor_list, tensor, group=None, async_op=False):
    """``dist.all_gather`` while any group has hooks."""
    hooks = _hooks.get(id(group))
    if hooks is None:
        return _torch["all_gather"](tensor_list, tensor, group=group, async_op=async_op)
    carry = hooks.carry
    if hooks.record is None:
        if carry is not None and carry.all_gather(tensor_list, tensor, async_op):
            return None
        return _torch["all_gather"](tensor_list, tensor, group=group, async_op=async_op)

    def call():
        if carry is not None and carry.all_gather(tensor_list, tensor, async_op):
            return None
        return _torch["all_gather"](tensor_list, tensor, group=group, async_op=async_op)

    return hooks.record("all_gather", None, tensor, call, sys._getframe(1))
