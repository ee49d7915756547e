"""Faults inside a rank: what ``emu.faults.FaultPlan`` means to one rank's engine.

``injector_for(plan, rank)`` gives the rank's ``FaultInjector`` (None when no fault can
touch the rank, so the engine does no fault work at all). The engine asks it for the
step-cost model, the collective recorder and the remote-KV connector while it is built,
then calls ``before_step`` at the start of every iteration.
"""

from __future__ import annotations

import dataclasses
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

from emu.faults import (
    KV_FAULTS,
    DelayCollective,
    Fault,
    FaultPlan,
    KillRank,
    KVLoadFail,
    KVLoadNever,
    KVNotReady,
    KVTransferTimeout,
    RankKilled,
    SlowRank,
)
from emu.rank.remote_kv import RemoteKVConnector


def injector_for(plan: FaultPlan | None, rank: int) -> FaultInjector | None:
    """The injector of ``rank`` under ``plan``; None when no fault can affect it."""
    if plan is None:
        return None
    mine = [f for f in plan.faults
            if isinstance(f, KV_FAULTS) or getattr(f, "rank", None) == rank]
    return FaultInjector(mine, rank) if mine else None


class FaultyKVConnector(RemoteKVConnector):
    """The remote-KV connector with the failure side the plain one lacks: loads that
    complete with every block invalid (``kv_fail``; the scheduler learns which through
    ``take_failed``, as vLLM's learns them from the worker's ``invalid_block_ids``) and
    stall bookkeeping for loads that never complete (``kv_never``)."""

    def __init__(self, latency_fixed_s: float, latency_per_block_s: float, *,
                 fail: Iterable[str], never: dict[str, float]):
        super().__init__(latency_fixed_s, latency_per_block_s)
        self._fail = set(fail)
        self._failing: dict[str, list[int]] = {}  # request id -> its blocks, loading
        self._failed: dict[str, list[int]] = {}
        self._never_timeout = dict(never)
        for request_id in self._never_timeout:
            self.set_completion_time(request_id, math.inf)
        # request id -> (virtual start of its never-ending load, deadline), both seconds
        self.stalled: dict[str, tuple[float, float]] = {}

    def update_state_after_alloc(self, request: Any, blocks: Any,
                                 num_external_tokens: int) -> None:
        super().update_state_after_alloc(request, blocks, num_external_tokens)
        if num_external_tokens == 0:
            return
        request_id = request.request_id
        if request_id in self._fail:
            self._fail.discard(request_id)
            self._failing[request_id] = list(blocks)
        timeout = self._never_timeout.pop(request_id, None)
        if timeout is not None:
            self.stalled[request_id] = (self.now_s, self.now_s + timeout)

    def finished_recving(self, now_s: float) -> set[str]:
        done = super().finished_recving(now_s)
        if self._failing and done:
            for request_id in done & self._failing.keys():
                self._failed[request_id] = self._failing.pop(request_id)
        return done

    def take_failed(self) -> dict[str, list[int]]:
        failed, self._failed = self._failed, {}
        return failed

    def request_finished(self, request: Any) -> None:
        super().request_finished(request)
        self._failing.pop(request.request_id, None)
        self._failed.pop(request.request_id, None)
        self.stalled.pop(request.request_id, None)


class FaultInjector:
    """The faults that concern one rank, as the engine uses them: ``cost_model``,
    ``wrap_recorder`` and ``make_connector`` once while the engine is built, then
    ``before_step`` at the start of every iteration (before ``schedule()``)."""

    def __init__(self, faults: Sequence[Fault], rank: int):
        self.rank = rank
        self.faults = tuple(faults)
        kills = [f for f in faults if isinstance(f, KillRank)]
        self.kill = min(kills, key=lambda f: f.step) if kills else None
        self.extra_s = sum(f.extra_ms for f in faults if isinstance(f, SlowRank)) / 1e3
        self._delays = [f for f in faults if isinstance(f, DelayCollective)]
        self.iteration = 0
        self.connector: FaultyKVConnector | None = None

    def cost_model(self, cost_model):
        """The rank's step-cost model: a slowed rank pays ``extra_ms`` more per step,
        dummy steps included (the fixed part of every forward)."""
        if not self.extra_s:
            return cost_model
        return dataclasses.replace(cost_model, fixed_s=cost_model.fixed_s + self.extra_s)

    def make_connector(self, latency_fixed_s: float,
                       latency_per_block_s: float) -> RemoteKVConnector:
        """The rank's remote-KV connector, with the plan's KV faults installed (every
        rank installs all of them: whichever rank the request lands on applies it)."""
        kv = [f for f in self.faults if isinstance(f, KV_FAULTS)]
        if not kv:
            return RemoteKVConnector(latency_fixed_s, latency_per_block_s)
        connector = FaultyKVConnector(
            latency_fixed_s, latency_per_block_s,
            fail=[f.request for f in kv if isinstance(f, KVLoadFail)],
            never={f.request: f.timeout_s for f in kv if isinstance(f, KVLoadNever)})
        for fault in kv:
            if isinstance(fault, KVNotReady):
                connector.set_not_ready(fault.request, queries=fault.lookups)
        self.connector = connector
        return connector

    def wrap_recorder(self, recorder):
        """The collective hook (``observe``) the engine, clock and coordinator call:
        the recorder itself, or a wrapper that delays this rank's planned collectives."""
        if not self._delays:
            return recorder
        return DelayingRecorder(recorder, self, self._delays)

    def before_step(self, iteration: int, clock_us: int) -> None:
        """Start of iteration ``iteration`` at virtual time ``clock_us``: die when a
        kill is due; fail when a never-ending KV load has outlived its timeout.

        A rank process runs its engine in its main thread; an engine in any other thread
        is a rank of the thread transport, whose kill must end that thread only."""
        self.iteration = iteration
        kill = self.kill
        if kill is not None and iteration >= kill.step:
            in_thread = threading.current_thread() is not threading.main_thread()
            how = "ends its thread" if in_thread else "kills itself (SIGKILL)"
            print(f"[dyntra-emu fault {kill.spec()}] rank {self.rank} {how} at step "
                  f"{iteration}", file=sys.stderr, flush=True)
            if in_thread:
                raise RankKilled(f"killed by fault {kill.spec()} at step {iteration}")
            os.kill(os.getpid(), signal.SIGKILL)
        connector = self.connector
        if connector is not None and connector.stalled:
            now_s = clock_us / 1e6
            for request_id, (start_s, deadline_s) in connector.stalled.items():
                if now_s >= deadline_s:
                    raise KVTransferTimeout(
                        f"request {request_id!r} on rank {self.rank} has waited for its "
                        f"remote KV since virtual time {start_s:.6f} s and the load never "
                        f"completes (fault kv_never); stopped after "
                        f"{deadline_s - start_s:g} s of virtual time at step {iteration}. "
                        "In vLLM the request would stay WAITING_FOR_REMOTE_KVS and keep "
                        "every DP rank stepping in this wave indefinitely")


class DelayingRecorder:
    """Wraps the collective recorder of a rank with planned ``delay`` faults: the sleep
    happens before the wrapped recorder sees the collective, so the rank is simply late
    to enter it. Everything else is the wrapped recorder's."""

    def __init__(self, recorder, injector: FaultInjector, delays: list[DelayCollective]):
        self._recorder = recorder
        self._injector = injector
        self._pending = list(delays)

    def __call__(self, site: str, op: str, tensor: Any, fn, origin: str | None = None):
        pending = self._pending
        if pending:
            iteration = self._injector.iteration
            for delay in pending:
                if delay.site == site and iteration >= delay.step:
                    pending.remove(delay)
                    _sleep_before_collective(delay, iteration)
                    break
        return self._recorder(site, op, tensor, fn, origin)

    def __getattr__(self, name: str):
        return getattr(self._recorder, name)


def _sleep_before_collective(delay: DelayCollective, iteration: int) -> None:
    """The injected delay (its own function, so that a stack dump names it)."""
    print(f"[dyntra-emu fault {delay.spec()}] rank {delay.rank} sleeps {delay.seconds:g} s "
          f"before {delay.site} at step {iteration}", file=sys.stderr, flush=True)
    time.sleep(delay.seconds)
