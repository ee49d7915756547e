"""Recording the collectives that vLLM's and vllm-ascend's code issue, unmodified.

The kit's code hands every collective to the rank's ``CollectiveRecorder`` itself.
vLLM's wave sync (``ParallelConfig.sync_dp_state``) and vllm-ascend's DyntraLB
collectives (``run_balance_load``, ``_do_lb_allgather``) call ``torch.distributed``
directly, so a vllm-ascend rank hooks its DP group (``emu.rank.collective_hooks``): each
call on it is recorded under the event-log site of the function that issued it, with its
source line as the origin that hang and mismatch reports show. Calls from the emulator's
own code are recorded by that code and pass straight through.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

import emu
from emu.rank import collective_hooks
from emu.sites import ALLGATHER_SITE, DP_SYNC_SITE, FLAG_SITE

# Which function issues which collective of the event log's vocabulary.
_SITES = {
    "sync_dp_state": DP_SYNC_SITE,       # vLLM ParallelConfig, every 32nd step
    "run_balance_load": FLAG_SITE,       # vllm-ascend, dynamic-mode flag all-reduce
    "_do_lb_allgather": ALLGATHER_SITE,  # vllm-ascend, the snapshot all-gather
}
_OPS = {"all_reduce": {dist.ReduceOp.SUM: "all_reduce_sum", dist.ReduceOp.MAX: "all_reduce_max"}}
_EMU_DIR = os.path.dirname(emu.__file__)


def _origin(filename: str, lineno: int) -> str:
    """``vllm_ascend/...py:N`` or ``vllm/...py:N``: the path from the package on."""
    parts = filename.replace(os.sep, "/").split("/")
    for package in ("vllm_ascend", "vllm"):
        if package in parts:
            i = len(parts) - 1 - parts[::-1].index(package)
            return "/".join(parts[i:]) + f":{lineno}"
    return f"{os.path.basename(filename)}:{lineno}"


def install(group, recorder: Callable[..., Any], timed: Callable[[str, float], None]) -> None:
    """Record every collective vLLM's and vllm-ascend's code issue on ``group`` (the
    rank's DP group) through ``recorder``, for as long as the group lives (the rank's
    process, or its thread run); ``timed(site, seconds)`` gets the wall time of each."""
    sites: dict[tuple[Any, int], tuple[str, str] | None] = {}

    def site_of(frame) -> tuple[str, str] | None:
        key = (frame.f_code, frame.f_lineno)
        found = sites.get(key, False)
        if found is False:
            code = frame.f_code
            if code.co_filename.startswith(_EMU_DIR):
                found = None
            else:
                name = code.co_name
                found = (_SITES.get(name, f"{os.path.basename(code.co_filename)}:{name}"),
                         _origin(code.co_filename, frame.f_lineno))
            sites[key] = found
        return found

    def record(kind: str, op, tensor, fn: Callable[[], Any], frame) -> Any:
        where = site_of(frame)
        if where is None:
            return fn()
        name = _OPS[kind].get(op, kind) if op is not None else kind
        start = time.perf_counter()
        try:
            return recorder(where[0], name, tensor, fn, where[1])
        finally:
            timed(where[0], time.perf_counter() - start)

    collective_hooks.attach(group, record=record)
