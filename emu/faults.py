"""The faults an emulated run can be given: a declarative ``FaultPlan`` that
``RunSpec.faults`` carries, checked before any rank starts. Inside a rank,
``emu.rank.fault_injection`` turns the plan into what the engine consults at a few fixed
points.

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
  X ms (at most a minute) more virtual time, as a throttled device would. The lockstep
  clock makes every rank wait for it: the run completes with the same requests, the
  other ranks' bubble grows.
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

A request arriving exactly at a wave boundary is a workload, not a fault:
``emu.workload.wave_boundary_trace`` makes one.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from emu.knobs import is_int, is_number
from emu.sites import COLLECTIVE_SITES, FLAG_SITE
from emu.workload.request import TraceRequest

DEFAULT_KV_TIMEOUT_S = 30.0
# A slowed rank's extra cost per step: at most a forward as a cost profile may price one
# (emu.rank.costs.MAX_FORWARD_S), so the step cost stays within the int64 clock.
MAX_EXTRA_MS = 60_000.0

SYNTAX = "KIND:KEY=VALUE,..."


class RankKilled(BaseException):
    """A ``kill`` fault under the thread transport: the rank's thread ends with this
    (a BaseException, so no ``except Exception`` on the way can swallow it) where a rank
    process would die of SIGKILL."""


class KVTransferTimeout(RuntimeError):
    """A remote-KV load injected with ``kv_never`` outlived its virtual timeout."""


# ----------------------------------------------------------------------- value checks


def _int(name: str, value, minimum: int) -> None:
    if not is_int(value) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _positive(name: str, value) -> None:
    if not is_number(value) or not math.isfinite(value) or value <= 0:
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
        if self.extra_ms > MAX_EXTRA_MS:
            raise ValueError(f"extra_ms must be at most {MAX_EXTRA_MS:g} (a minute per "
                             f"step), got {self.extra_ms!r}")

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
KV_FAULTS = (KVLoadFail, KVLoadNever, KVNotReady)

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
