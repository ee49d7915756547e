"""The control-plane terms of a cost profile: what DyntraLB's collectives and planner cost
in virtual time (``emu.rank.control_plane`` charges them; docs/cost-models.md,
"DyntraLB's control plane", says where every default comes from).

Kept apart from the charging code, which imports torch and the planner, so that the
profiles (``emu.rank.costs``) and the command line's parser load without either.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import NamedTuple

from emu.knobs import is_number

_DTYPE_BYTES = {"int32": 4, "int64": 8, "float32": 4, "float64": 8, "int16": 2, "int8": 1,
                "uint8": 1, "bool": 1}
# What a profile may say: a fixed latency of at most a minute, at most a second per unit.
_MAX_FIXED_S = 60.0
_MAX_PER_UNIT_S = 1.0
# How the planner is charged (RunSpec.planner_cost, --planner-cost): by the model of
# ControlPlaneCost, or by its measured wall time (not deterministic).
PLANNER_COSTS = ("model", "measured")


class PlannerWork(NamedTuple):
    """What the planner did on one snapshot (``emu.rank.control_plane.planner_work``):
    ``requests`` parsed, (running, waiting) ``pairs`` its swap searches examined, and
    ``rounds`` of its main loop."""

    requests: int
    pairs: int
    rounds: int


@dataclass(frozen=True)
class ControlPlaneCost:
    """The control-plane terms of a cost profile, in seconds.

    A DyntraLB collective costs ``collective_fixed_s + collective_per_peer_s * (dp - 1)
    + collective_per_byte_s * bytes``, where ``bytes`` is what each rank receives: the
    other ranks' payloads for the all-gather, the one payload for the all-reduce.

    The planner costs ``planner_fixed_s + planner_per_request_s * requests +
    planner_per_pair_s * pairs + planner_per_round_s * rounds`` for the work
    ``planner_work`` counts on the gathered snapshot.

    The defaults are the bundled profiles' (docs/cost-models.md, "DyntraLB's control
    plane"): a collective is gloo's, 362.7 us at DP 2 as vllm-ascend#12317 measured a
    DP sync on an Ascend 910B2 host, plus one loopback hop per further peer as
    ``benchmarks/collective_bench.py`` measures it; the planner is production's
    ``_balance_load`` as ``benchmarks/planner_cost_fit.py`` fits it.
    """

    collective_fixed_s: float = 354e-6
    collective_per_peer_s: float = 9e-6
    collective_per_byte_s: float = 0.0
    planner_fixed_s: float = 6.1e-6
    planner_per_request_s: float = 0.18e-6
    planner_per_pair_s: float = 0.082e-6
    planner_per_round_s: float = 8.7e-6

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            limit = _MAX_FIXED_S if f.name.endswith("fixed_s") else _MAX_PER_UNIT_S
            if not is_number(value) or not math.isfinite(value) or not 0 <= value <= limit:
                raise ValueError(f"control_plane.{f.name} must be a number from 0 to "
                                 f"{limit:g} (seconds), got {value!r}")

    def collective_us(self, op: str, shape: list, dtype: str, dp_size: int) -> int:
        """One collective's latency in whole microseconds."""
        payload = math.prod(shape) * _DTYPE_BYTES.get(dtype, 4)
        received = payload * (dp_size - 1) if op == "all_gather" else payload
        return round((self.collective_fixed_s + self.collective_per_peer_s * (dp_size - 1)
                      + self.collective_per_byte_s * received) * 1e6)

    def planner_us(self, work: PlannerWork) -> int:
        """The modelled planner time of ``work``, in whole microseconds."""
        return round((self.planner_fixed_s + self.planner_per_request_s * work.requests
                      + self.planner_per_pair_s * work.pairs
                      + self.planner_per_round_s * work.rounds) * 1e6)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data, source: str) -> ControlPlaneCost:
        """The terms of a profile file's ``control_plane`` object (missing terms keep
        their defaults); ValueError naming ``source`` and the key."""
        if not isinstance(data, dict):
            raise ValueError(f"{source}: key 'control_plane' must be an object with the "
                             f"control-plane terms or null (off), got "
                             f"{type(data).__name__}")
        known = [f.name for f in fields(cls)]
        for key in data:
            if key not in known:
                raise ValueError(f"{source}: unknown key 'control_plane.{key}'; the "
                                 f"control plane has {', '.join(known)}")
        try:
            return cls(**data)
        except ValueError as exc:
            raise ValueError(f"{source}: {exc}") from None

    def formula(self) -> str:
        """The terms in microseconds, for summaries and ``costs list``."""
        return (f"collective {self.collective_fixed_s * 1e6:g} us + "
                f"{self.collective_per_peer_s * 1e6:g} us/peer"
                + (f" + {self.collective_per_byte_s * 1e9:g} ns/byte"
                   if self.collective_per_byte_s else "")
                + f"; planner {self.planner_fixed_s * 1e6:g} us + "
                  f"{self.planner_per_request_s * 1e6:g} us/request + "
                  f"{self.planner_per_pair_s * 1e9:g} ns/pair + "
                  f"{self.planner_per_round_s * 1e6:g} us/round")


@dataclass(frozen=True, slots=True)
class ControlCharge:
    """One iteration's control plane: the modelled (or measured) time of DyntraLB's
    collectives and of its planner, and what the rank's clock was charged (less than
    their sum under async scheduling). Integer microseconds."""

    collectives_us: int
    planner_us: int
    charged_us: int
    measured: bool = False

    def json(self) -> str:
        """The step record's ``control_plane`` object, keys sorted."""
        measured = ',"planner_measured":true' if self.measured else ""
        return (f'{{"charged_s":{self.charged_us / 1e6!r},'
                f'"collectives_s":{self.collectives_us / 1e6!r}{measured},'
                f'"planner_s":{self.planner_us / 1e6!r}}}')

    def to_dict(self) -> dict:
        data = {"charged_s": self.charged_us / 1e6, "collectives_s": self.collectives_us / 1e6,
                "planner_s": self.planner_us / 1e6}
        if self.measured:
            data["planner_measured"] = True
        return data
