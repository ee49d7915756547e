"""Fault injection for the emulated cluster: a declarative ``FaultPlan`` that
``RunSpec.faults`` carries, checked before any rank starts, and the per-rank
``FaultInjector`` the engine consults at a few fixed points.

A plan is a tuple of faults, each a small frozen dataclass (picklable, so it travels to
the spawned ranks with the spec). On the command line a fault is one ``--fault`` value,
``KIND:KEY=VALUE,...``; ``parse_fault`` reads it and ``Fault.spec()`` writes it back.

- ``kill:rank=R,step=S`` (``KillRank``): rank R dies with SIGKILL at the start of its
  iteration S (the ``iter`` of the step records: non-idle iterations, counted from 0
  over the whole run) — no traceback, no flushed files, as a crashed process. Outcome:
  the launcher names rank R ("killed by signal SIGKILL") and stops every other rank.
  Under the thread transport the rank's thread raises ``RankKilled`` instead ("killed by
  fault kill:rank=R,step=S at step S"), with the same outcome.
- ``slow:rank=R,extra_ms=X`` (``SlowRank``): every step of rank R (real or dummy) costs
  X ms more virtual time, as a throttled device would. The lockstep clock makes every
  rank wait for it: the run completes with the same requests, the other ranks' bubble
  grows.
- ``kv_fail:request=ID`` (``KVLoadFail``): the request's remote-KV load completes at its
  modelled time but every block of it is reported invalid. The emulator follows vLLM's
  ``kv_load_failure_policy="recompute"``: ``num_computed_tokens`` is truncated at the
  first invalid block (block 0, so to 0) and, no valid token being left, the request's
  blocks are released; it becomes WAITING again when the scheduler promotes it, and the
  connector, having handed its prompt over once, answers "nothing remote" — so the
  decode rank allocates again and prefills the prompt locally (chunked by the token
  budget), then decodes as usual. Nothing is lost; the request finishes later. The
  blocks go back when the failure is reported, vLLM releases them when it promotes the
  request (at most one scheduling pass later). vLLM's other policy, "fail" (its
  default: the request ends with FINISHED_ERROR), is not emulated: the stub scheduler
  has no error finish.
- ``kv_never:request=ID[,timeout_s=T]`` (``KVLoadNever``): the load never completes
  (``RemoteKVConnector.set_completion_time(ID, inf)``). In vLLM the request would stay
  WAITING_FOR_REMOTE_KVS for ever, holding its blocks, and keep the DP group in its wave:
  every rank runs (dummy) steps and the 32-step sync never ends the wave — a livelock,
  not a hang, so no collective timeout fires. The emulator bounds it: T virtual seconds
  (default 30) after the transfer started, the rank holding the request raises
  ``KVTransferTimeout`` naming the request, and the run fails with that rank named.
- ``not_ready:request=ID,lookups=N`` (``KVNotReady``): the connector's next N lookups of
  the request answer "not ready, ask again" (``set_not_ready(ID, queries=N)``). A lookup
  happens in each step whose waiting loop (or DyntraLB's KV prefetch) reaches the
  request; the request is parked in ``skipped_waiting`` meanwhile and runs afterwards.
- ``delay:rank=R,site=SITE,step=S,seconds=X`` (``DelayCollective``): rank R sleeps X
  wall-clock seconds right before it enters the first collective at SITE of an
  iteration >= S (once); the other ranks wait inside that collective. Virtual time is
  untouched, so with X below the collective timeout the event logs are byte-identical
  to the undelayed run; above it the waiting ranks time out and the run fails named.

A request arriving exactly at a wave boundary is a workload, not an engine hook:
``wave_ends`` finds the boundaries in a run's step records and
``wave_boundary_trace`` adds a request at one of them.
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
from dataclasses import dataclass
from typing import Any, ClassVar

from emu.kv import RemoteKVConnector
from emu.workload import TraceRequest

# The collective sites of the event log. Spelled out here because the modules that
# define them (emu.clock, emu.engine, dyntra_lb.coordinator) import torch and this one
# is imported by the CLI at parse time; a unit test checks that the names agree.
LOCKSTEP_SITE = "engine.lockstep"
DP_SYNC_SITE = "engine.dp_sync"
FLAG_SITE = "dyntra_lb.flag"
ALLGATHER_SITE = "dyntra_lb.allgather"
COLLECTIVE_SITES = (LOCKSTEP_SITE, DP_SYNC_SITE, FLAG_SITE, ALLGATHER_SITE)

DEFAULT_KV_TIMEOUT_S = 30.0

SYNTAX = "KIND:KEY=VALUE,..."


class RankKilled(BaseException):
    """A ``kill`` fault under the thread transport: the rank's thread ends with this
    (a BaseException, so no ``except Exception`` on the way can swallow it) where a rank
    process would die of SIGKILL."""


class KVTransferTimeout(RuntimeError):
    """A remote-KV load injected with ``kv_never`` outlived its virtual timeout."""


# ----------------------------------------------------------------------- value checks


def _int(name: str, value, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _positive(name: str, value) -> None:
    if (not isinstance(value, (int, float)) or isinstance(value, bool)
            or not math.isfinite(value) or value <= 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


def _request_id(value) -> None:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"request must be a non-empty request id, got {value!r}")


def _num(value) -> str:
    """A number as the CLI syntax writes it (5.0 -> "5")."""
    return f"{value:g}" if isinstance(value, float) else str(value)


# ----------------------------------------------------------------------------- faults


@dataclass(frozen=True)
class KillRank:
    """Rank ``rank`` dies (SIGKILL) at the start of its iteration ``step``."""

    rank: int
    step: int
    kind: ClassVar[str] = "kill"

    def __post_init__(self) -> None:
        _int("rank", self.rank, 0)
        _int("step", self.step, 0)

    def spec(self) -> str:
        return f"kill:rank={self.rank},step={self.step}"


@dataclass(frozen=True)
class SlowRank:
    """Every step of rank ``rank`` costs ``extra_ms`` more virtual milliseconds."""

    rank: int
    extra_ms: float
    kind: ClassVar[str] = "slow"

    def __post_init__(self) -> None:
        _int("rank", self.rank, 0)
        _positive("extra_ms", self.extra_ms)

    def spec(self) -> str:
        return f"slow:rank={self.rank},extra_ms={_num(self.extra_ms)}"


@dataclass(frozen=True)
class KVLoadFail:
    """The request's remote-KV load completes with every block invalid (recompute)."""

    request: str
    kind: ClassVar[str] = "kv_fail"

    def __post_init__(self) -> None:
        _request_id(self.request)

    def spec(self) -> str:
        return f"kv_fail:request={self.request}"


@dataclass(frozen=True)
class KVLoadNever:
    """The request's remote-KV load never completes; the run fails ``timeout_s`` virtual
    seconds after the transfer started."""

    request: str
    timeout_s: float = DEFAULT_KV_TIMEOUT_S
    kind: ClassVar[str] = "kv_never"

    def __post_init__(self) -> None:
        _request_id(self.request)
        _positive("timeout_s", self.timeout_s)

    def spec(self) -> str:
        text = f"kv_never:request={self.request}"
        if self.timeout_s != DEFAULT_KV_TIMEOUT_S:
            text += f",timeout_s={_num(self.timeout_s)}"
        return text


@dataclass(frozen=True)
class KVNotReady:
    """The connector answers "not ready" to the request's next ``lookups`` lookups."""

    request: str
    lookups: int
    kind: ClassVar[str] = "not_ready"

    def __post_init__(self) -> None:
        _request_id(self.request)
        _int("lookups", self.lookups, 1)

    def spec(self) -> str:
        return f"not_ready:request={self.request},lookups={self.lookups}"


@dataclass(frozen=True)
class DelayCollective:
    """Rank ``rank`` sleeps ``seconds`` (wall clock) before the first collective at
    ``site`` in an iteration >= ``step``."""

    rank: int
    site: str
    step: int
    seconds: float
    kind: ClassVar[str] = "delay"

    def __post_init__(self) -> None:
        _int("rank", self.rank, 0)
        if self.site not in COLLECTIVE_SITES:
            raise ValueError(f"site must be one of {list(COLLECTIVE_SITES)}, got {self.site!r}")
        _int("step", self.step, 0)
        _positive("seconds", self.seconds)

    def spec(self) -> str:
        return (f"delay:rank={self.rank},site={self.site},step={self.step},"
                f"seconds={_num(self.seconds)}")


Fault = KillRank | SlowRank | KVLoadFail | KVLoadNever | KVNotReady | DelayCollective
FAULT_TYPES = (KillRank, SlowRank, KVLoadFail, KVLoadNever, KVNotReady, DelayCollective)
_BY_KIND = {cls.kind: cls for cls in FAULT_TYPES}
_KV_FAULTS = (KVLoadFail, KVLoadNever, KVNotReady)

# Per kind: CLI key (= field name) -> how its value is read; a field without a default
# is required.
_KEYS: dict[str, dict[str, str]] = {
    "kill": {"rank": "int0", "step": "int0"},
    "slow": {"rank": "int0", "extra_ms": "positive"},
    "kv_fail": {"request": "str"},
    "kv_never": {"request": "str", "timeout_s": "positive"},
    "not_ready": {"request": "str", "lookups": "int1"},
    "delay": {"rank": "int0", "site": "site", "step": "int0", "seconds": "positive"},
}


def _parse_value(how: str, text: str):
    if how in ("int0", "int1"):
        minimum = 0 if how == "int0" else 1
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum or not text.strip().lstrip("+-").isdigit():
            raise ValueError(f"expected an integer >= {minimum}")
        return value
    if how == "positive":
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value <= 0:
            raise ValueError("expected a number > 0")
        return value
    if how == "site":
        if text not in COLLECTIVE_SITES:
            raise ValueError(f"expected one of {', '.join(COLLECTIVE_SITES)}")
        return text
    if not text.strip():
        raise ValueError("expected a non-empty request id")
    return text


def parse_fault(text: str) -> Fault:
    """One ``--fault`` value -> its fault. Raises ValueError naming the bad part."""
    kinds = ", ".join(_BY_KIND)
    kind, sep, rest = text.partition(":")
    kind = kind.strip()
    if not kind:
        raise ValueError(f"{text!r}: expected {SYNTAX} with KIND one of {kinds}")
    if kind not in _BY_KIND:
        raise ValueError(f"{text!r}: unknown fault kind {kind!r}; expected one of {kinds}")
    keys = _KEYS[kind]
    cls = _BY_KIND[kind]
    required = [f.name for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING and f.name in keys]
    if not sep or not rest.strip():
        raise ValueError(f"{text!r}: {kind} needs {', '.join(k + '=' for k in required)} "
                         f"(syntax {SYNTAX})")
    values: dict[str, Any] = {}
    for part in rest.split(","):
        key, eq, value = part.partition("=")
        key = key.strip()
        if not eq or not key:
            raise ValueError(f"{text!r}: {part!r}: expected KEY=VALUE")
        if key not in keys:
            raise ValueError(f"{text!r}: unknown key {key!r} for {kind}; expected "
                             f"{', '.join(keys)}")
        if key in values:
            raise ValueError(f"{text!r}: key {key!r} given twice")
        try:
            values[key] = _parse_value(keys[key], value)
        except ValueError as exc:
            raise ValueError(f"{text!r}: {part!r}: {exc}") from None
    missing = [k for k in required if k not in values]
    if missing:
        raise ValueError(f"{text!r}: {kind} needs {', '.join(k + '=' for k in missing)}")
    return cls(**values)


# ------------------------------------------------------------------------------- plan


@dataclass(frozen=True)
class FaultPlan:
    """The faults of one run (``RunSpec.faults``). ``FaultPlan.of(...)`` accepts faults,
    ``--fault`` strings or a plan."""

    faults: tuple = ()

    def __post_init__(self) -> None:
        if isinstance(self.faults, (str, bytes)) or not isinstance(self.faults, Iterable):
            raise ValueError(f"FaultPlan.faults must be a sequence of faults, "
                             f"got {self.faults!r}")
        faults = tuple(self.faults)
        for i, fault in enumerate(faults):
            if not isinstance(fault, FAULT_TYPES):
                raise ValueError(
                    f"FaultPlan.faults[{i}] must be one of "
                    f"{', '.join(c.__name__ for c in FAULT_TYPES)} (or a --fault string "
                    f"through FaultPlan.of), got {fault!r}")
        object.__setattr__(self, "faults", faults)

    @classmethod
    def of(cls, items) -> FaultPlan:
        """A plan from a plan, one fault, one ``--fault`` string, or a sequence of
        faults and strings."""
        if isinstance(items, FaultPlan):
            return items
        if isinstance(items, (str, *FAULT_TYPES)):
            items = [items]
        if not isinstance(items, Iterable):
            raise ValueError(f"faults must be a list of faults or --fault strings, "
                             f"got {items!r}")
        return cls(tuple(parse_fault(f) if isinstance(f, str) else f for f in items))

    def for_rank(self, rank: int) -> FaultInjector | None:
        """The injector of ``rank``; None when no fault can affect it (then the engine
        does no fault work at all)."""
        mine = [f for f in self.faults
                if isinstance(f, _KV_FAULTS) or getattr(f, "rank", None) == rank]
        return FaultInjector(mine, rank) if mine else None


def _check_fault(fault: Fault, *, dp_size: int, request_ids: set[str],
                 lb_mode: str | None) -> None:
    rank = getattr(fault, "rank", None)
    if rank is not None and rank >= dp_size:
        raise ValueError(f"rank {rank} is not a rank of this cluster (dp_size={dp_size})")
    request = getattr(fault, "request", None)
    if request is not None and request not in request_ids:
        raise ValueError(f"request {request!r} is not in the trace")
    if isinstance(fault, DelayCollective) and fault.site.startswith("dyntra_lb."):
        if lb_mode is None:
            raise ValueError(f"site {fault.site} is never entered: DyntraLB is disabled")
        if fault.site == FLAG_SITE and lb_mode != "dynamic":
            raise ValueError(f"site {fault.site} is never entered: only DyntraLB's dynamic "
                             f"mode issues the flag all-reduce (mode is {lb_mode!r})")


def plan_problems(faults: Sequence[Fault], *, dp_size: int, trace: Sequence[TraceRequest],
                  lb_mode: str | None) -> list[tuple[int, str]]:
    """What the faults need from the run they are planned for: ranks that exist,
    request ids in the trace, collective sites the config enters, at most one failing
    or hanging load per request. Returns (index of the fault, problem) pairs.
    ``lb_mode``: DyntraLB's mode, None when DyntraLB is disabled."""
    request_ids = {r.request_id for r in trace}
    problems = []
    load_fault: dict[str, int] = {}  # request id -> index of its kv_fail/kv_never
    for i, fault in enumerate(faults):
        try:
            _check_fault(fault, dp_size=dp_size, request_ids=request_ids, lb_mode=lb_mode)
        except ValueError as exc:
            problems.append((i, str(exc)))
            continue
        if isinstance(fault, (KVLoadFail, KVLoadNever)):
            first = load_fault.setdefault(fault.request, i)
            if first != i:
                problems.append((i, f"request {fault.request!r} already has the fault "
                                    f"{faults[first].spec()}; its load fails or hangs "
                                    "only once"))
    return problems


def check_plan(plan, *, dp_size: int, trace: Sequence[TraceRequest],
               lb_mode: str | None) -> None:
    """``RunSpec.faults`` against the rest of the spec (see ``plan_problems``); raises
    ValueError naming the first bad fault."""
    if not isinstance(plan, FaultPlan):
        raise ValueError(f"RunSpec.faults must be a FaultPlan or None (FaultPlan.of(...) "
                         f"builds one from faults or --fault strings), got {plan!r}")
    problems = plan_problems(plan.faults, dp_size=dp_size, trace=trace, lb_mode=lb_mode)
    if problems:
        i, problem = problems[0]
        raise ValueError(f"RunSpec.faults[{i}] ({plan.faults[i].spec()}): {problem}")


# -------------------------------------------------------------------- inside a rank


class FaultyKVConnector(RemoteKVConnector):
    """The remote-KV connector with the failure side the plain one lacks: loads that
    complete with every block invalid (``kv_fail``) and stall bookkeeping for loads
    that never complete (``kv_never``)."""

    def __init__(self, latency_fixed_s: float, latency_per_block_s: float, *,
                 fail: Iterable[str], never: dict[str, float]):
        super().__init__(latency_fixed_s, latency_per_block_s)
        self._fail = set(fail)
        self._failing: dict[str, Any] = {}
        self._never_timeout = dict(never)
        for request_id in self._never_timeout:
            self.set_completion_time(request_id, math.inf)
        # request id -> (virtual start of its never-ending load, deadline), both seconds
        self.stalled: dict[str, tuple[float, float]] = {}
        self.num_failed_loads = 0
        self.kv_cache_manager: Any = None  # the scheduler's; set by FaultInjector.attach

    def update_state_after_alloc(self, request: Any, blocks: Any,
                                 num_external_tokens: int) -> None:
        super().update_state_after_alloc(request, blocks, num_external_tokens)
        if num_external_tokens == 0:
            return
        request_id = request.request_id
        if request_id in self._fail:
            self._fail.discard(request_id)
            self._failing[request_id] = request
        timeout = self._never_timeout.pop(request_id, None)
        if timeout is not None:
            self.stalled[request_id] = (self.now_s, self.now_s + timeout)

    def finished_recving(self, now_s: float) -> set[str]:
        done = super().finished_recving(now_s)
        if self._failing and done:
            for request_id in done & self._failing.keys():
                # What vLLM's scheduler does for an async load whose blocks the worker
                # reported invalid (recompute policy): keep the valid prefix, i.e.
                # truncate at the first invalid block -- here block 0 -- and, with no
                # valid token left, release the blocks (vLLM does that when it promotes
                # the request, at most one scheduling pass later).
                request = self._failing.pop(request_id)
                request.num_computed_tokens = 0
                self.kv_cache_manager.free(request)
                self.num_failed_loads += 1
        return done

    def request_finished(self, request: Any) -> None:
        super().request_finished(request)
        self._failing.pop(request.request_id, None)
        self.stalled.pop(request.request_id, None)


class FaultInjector:
    """The faults that concern one rank, as the engine uses them: ``cost_model``,
    ``wrap_recorder``, ``make_connector`` and ``attach`` once while the engine is built,
    then ``before_step`` at the start of every iteration (before ``schedule()``)."""

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
        kv = [f for f in self.faults if isinstance(f, _KV_FAULTS)]
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

    def attach(self, scheduler) -> None:
        """The rank's scheduler exists: a failing load releases blocks through its KV
        cache manager."""
        if self.connector is not None:
            self.connector.kv_cache_manager = scheduler.kv_cache_manager

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


# ------------------------------------------------------------- wave-boundary arrivals


@dataclass(frozen=True)
class WaveEnd:
    """A wave's last step (from a rank's step records): ``iter`` and ``start_us`` of
    that step, and ``end_us``, the virtual time its sync decided the wave was over —
    where the next iteration (idle, or a new wave) begins."""

    wave: int
    iter: int
    start_us: int
    end_us: int


def wave_ends(steps: Sequence[dict]) -> list[WaveEnd]:
    """Every wave end in one rank's step records (file order), the run's last step
    included (a finished run ends with its last wave)."""
    ends = []
    for i, record in enumerate(steps):
        if record.get("kind", "step") != "step":
            raise ValueError(f"wave_ends expects step records, got kind {record['kind']!r}")
        if i + 1 == len(steps) or steps[i + 1]["wave"] != record["wave"]:
            start_us = round(record["clock_s"] * 1e6)
            ends.append(WaveEnd(record["wave"], record["iter"], start_us,
                                start_us + round(record["step_time_s"] * 1e6)))
    return ends


def insert_request(trace: Sequence[TraceRequest],
                   request: TraceRequest) -> list[TraceRequest]:
    """``trace`` with ``request`` added after every request arriving no later (the
    trace stays sorted; the new id must be unused)."""
    if any(r.request_id == request.request_id for r in trace):
        raise ValueError(f"request id {request.request_id!r} is already in the trace")
    position = sum(1 for r in trace if r.arrival_s <= request.arrival_s)
    return [*trace[:position], request, *trace[position:]]


def wave_boundary_trace(trace: Sequence[TraceRequest], steps: Sequence[dict], *,
                        wave: int, request: TraceRequest,
                        offset_us: int = 0) -> list[TraceRequest]:
    """``trace`` plus ``request`` arriving exactly when ``wave`` ended in the run whose
    step records (of any rank) are ``steps`` (``offset_us`` shifts it, e.g. -1 = during
    the wave's last step). Requests before it are untouched, so a run of the new trace
    is identical to the old one up to that moment (a pinned ``request`` also leaves the
    round-robin rotation of later requests alone)."""
    ends = {end.wave: end for end in wave_ends(steps)}
    if wave not in ends:
        raise ValueError(f"wave {wave} is not in the step records (waves: {sorted(ends)})")
    arrival_us = ends[wave].end_us + offset_us
    if arrival_us < 0:
        raise ValueError(f"offset_us={offset_us} puts the arrival before time 0")
    return insert_request(trace, dataclasses.replace(request, arrival_s=arrival_us / 1e6))
