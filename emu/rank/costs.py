"""Step-cost profiles: what one forward costs a rank, in virtual time.

No model runs in the emulator, so every rank prices its own step with a
``StepCostModel`` just before the lockstep collective (emu/rank/clock.py); the slowest rank
sets the DP step time. A profile is a named, documented set of linear coefficients
(docs/cost-models.md says where each bundled profile's numbers come from):

- ``fixed_s``: every step, dummy steps included (weights, MoE dispatch, launch);
- ``per_kv_token_s``: per KV token held by the running requests, which attention reads
  in full each step; it does not depend on the KV block size;
- ``per_scheduled_token_s``: per token scheduled this step (token-proportional compute);
- ``per_running_request_s``: per running request (sampling, per-sequence bookkeeping);
- ``per_kv_block_s``: per KV *block* of the running requests. Only the
  ``planner-heuristic`` profile uses it: it is DyntraLB's own latency heuristic
  (docs/planner.md, "Throughput-drop heuristic": ``20000 + 19.2 * M`` microseconds), kept
  to compare against; as physics it
  makes attention over the same tokens 16x cheaper at block size 2048 than at 128.

Profiles are picked by name (``PROFILES``) or read from a JSON file
(``load_profile``); ``fit`` estimates one from step times measured on a real node, and
``dyntra-emu fit-cost CSV`` (``emu.cli.fit_cost``) does that from a CSV file.
Speculative decoding (MTP) is three more fields, all 0 by default (plain decode, one
token per running request per step):

- ``num_speculative_tokens``: k, the draft tokens verified per decode step (vLLM's
  ``speculative_config.num_speculative_tokens``); the scheduler then schedules 1 + k
  tokens per decoding request (priced by ``per_scheduled_token_s``);
- ``draft_acceptance_rate``: the chance that a draft token is accepted given that the
  drafts before it were; a step emits the accepted prefix plus one token
  (``emu.rank.spec_decode``);
- ``draft_step_s``: one forward of the draft model (the MTP layer); the drafter runs k of
  them in every step that runs tokens.

A profile with k = 0 writes no MTP keys (``to_dict``), so its metrics and files are
those of a profile without them.

``control_plane`` prices what DyntraLB adds between two forwards (its collectives and
its planner, ``emu.rank.control_costs.ControlPlaneCost``, charged by
``emu.rank.control_plane``); every bundled profile has the default terms. ``None``
(``"control_plane": null`` in a profile file) turns the charge off: the event logs are
then byte for byte those of the emulator before it existed.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np

from emu.knobs import is_number
from emu.limits import MAX_SMALL_FILE_BYTES, FileTooLarge, read_limited
from emu.rank.control_costs import ControlPlaneCost

# The coefficient fields of a profile, in the order of the cost formula.
TERMS = ("fixed_s", "per_kv_token_s", "per_scheduled_token_s", "per_running_request_s",
         "per_kv_block_s")
# The columns a measured CSV must have (one row per step), and the term each one prices.
# vLLM accepts more, but past this a draft chain is not a decode-node setting.
MAX_SPEC_TOKENS = 16
# What a profile file may say (``profile_from_dict``): a forward (``fixed_s``, and
# ``draft_step_s``) of at most a minute, at most a second per token, request or block.
# Within these, the costliest step the run limits allow (emu.limits, workload.MAX_TOKENS)
# stays below 2**63 microseconds, the lockstep collective's int64.
MAX_FORWARD_S = 60.0
MAX_PER_UNIT_S = 1.0
FIT_COLUMNS = ("running_requests", "kv_tokens", "scheduled_tokens", "step_ms")
# The speculative-decoding fields (all 0: plain decode), after the coefficients.
MTP_FIELDS = ("num_speculative_tokens", "draft_acceptance_rate", "draft_step_s")
FIT_TERMS = {"fixed_s": None, "per_kv_token_s": "kv_tokens",
             "per_scheduled_token_s": "scheduled_tokens",
             "per_running_request_s": "running_requests"}


@dataclass(frozen=True)
class StepCostModel:
    """One cost profile. The cost of a step, in seconds, is

    ``fixed_s + per_kv_token_s * kv_tokens + per_scheduled_token_s * scheduled_tokens
    + per_running_request_s * running_requests + per_kv_block_s * running_blocks``;

    plus ``num_speculative_tokens * draft_step_s`` with speculative decoding (the drafter's
    forwards; the 1 + k tokens per decoding request are in ``scheduled_tokens``);
    a dummy step (no real tokens) costs ``fixed_s`` only. The default is the ``kv-token``
    profile. ``name`` and ``description`` say what it is in metrics and summaries.
    """

    name: str = "kv-token"
    fixed_s: float = 0.020
    per_kv_token_s: float = 0.15e-6
    per_scheduled_token_s: float = 5e-6
    per_running_request_s: float = 0.0
    per_kv_block_s: float = 0.0
    description: str = ""
    num_speculative_tokens: int = 0
    draft_acceptance_rate: float = 0.0
    draft_step_s: float = 0.0
    control_plane: ControlPlaneCost | None = ControlPlaneCost()

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"cost model name must be a non-empty string, got {self.name!r}")
        if not isinstance(self.description, str):
            raise ValueError(f"cost model description must be a string, "
                             f"got {self.description!r}")
        for name in TERMS:
            value = getattr(self, name)
            if not is_number(value) or not value >= 0 or value == float("inf"):
                raise ValueError(
                    f"cost model {name} must be a finite number >= 0 (seconds), got {value!r}")
        if round(self.fixed_s * 1e6) < 1:
            raise ValueError(
                f"cost model fixed_s must be at least 1 microsecond, got {self.fixed_s!r}")
        self._check_mtp()
        if self.control_plane is not None and not isinstance(self.control_plane,
                                                             ControlPlaneCost):
            raise ValueError(f"cost model control_plane must be a ControlPlaneCost or None "
                             f"(off), got {type(self.control_plane).__name__}")

    def _check_mtp(self) -> None:
        k, rate, draft = (self.num_speculative_tokens, self.draft_acceptance_rate,
                          self.draft_step_s)
        if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k <= MAX_SPEC_TOKENS:
            raise ValueError(f"cost model num_speculative_tokens must be an integer from 0 "
                             f"to {MAX_SPEC_TOKENS} (draft tokens per step), got {k!r}")
        if not is_number(rate) or not 0 <= rate <= 1:
            raise ValueError(f"cost model draft_acceptance_rate must be a number from 0 to 1 "
                             f"(the chance a draft token is accepted), got {rate!r}")
        if not is_number(draft) or not draft >= 0 or draft == float("inf"):
            raise ValueError(f"cost model draft_step_s must be a finite number >= 0 "
                             f"(seconds per draft forward), got {draft!r}")
        if k == 0 and (rate or draft):
            which = "draft_acceptance_rate" if rate else "draft_step_s"
            raise ValueError(f"cost model {which} is set but num_speculative_tokens is 0 "
                             "(no drafts); set num_speculative_tokens or remove it")

    def cost(self, running_blocks: int, kv_tokens: int, running_requests: int,
             scheduled_tokens: int, dummy: bool) -> int:
        """This rank's cost of the step it is about to run, in integer microseconds;
        called by the engine once per step, right before the lockstep collective."""
        if dummy:
            return round(self.fixed_s * 1e6)
        return round((self.fixed_s + self.num_speculative_tokens * self.draft_step_s
                      + self.per_kv_token_s * kv_tokens
                      + self.per_scheduled_token_s * scheduled_tokens
                      + self.per_running_request_s * running_requests
                      + self.per_kv_block_s * running_blocks) * 1e6)

    def to_dict(self) -> dict:
        """The profile as the JSON object ``profile_from_dict`` reads back; without
        speculative decoding (k = 0) the MTP keys are left out, so metrics.json and
        profile files stay as they were before the keys existed."""
        data = asdict(self)  # control_plane: its terms as an object, or None (off)
        if not self.num_speculative_tokens:
            for key in MTP_FIELDS:
                del data[key]
        return data

    def formula(self) -> str:
        """The non-zero terms in microseconds, for summaries and --help."""
        parts = [f"{self.fixed_s * 1e6:g} us"]
        for name, unit in (("per_kv_token_s", "KV token"),
                           ("per_scheduled_token_s", "scheduled token"),
                           ("per_running_request_s", "running request"),
                           ("per_kv_block_s", "KV block")):
            value = getattr(self, name)
            if value:
                parts.append(f"{value * 1e6:.4g} us/{unit}")
        k = self.num_speculative_tokens
        if k:
            parts.append(f"{k} x {self.draft_step_s * 1e6:g} us/draft forward "
                         f"(MTP: {k} draft tokens, acceptance {self.draft_acceptance_rate:g})")
        return " + ".join(parts)


PROFILES = {
    "kv-token": StepCostModel(
        description="the default: 20 ms per step + 0.15 us per KV token read (19.2 us per "
                    "128-token block, today's numbers, now per token) + 5 us per "
                    "scheduled token"),
    "planner-heuristic": StepCostModel(
        name="planner-heuristic", per_kv_token_s=0.0, per_kv_block_s=19.2e-6,
        description="DyntraLB's own latency heuristic as physics (docs/planner.md, "
                    "Throughput-drop heuristic): 20 ms + 19.2 us per KV block (+ 5 us per "
                    "scheduled token); depends on the block size, kept for comparison"),
    "ascend-qwen3-30b-a3b": StepCostModel(
        name="ascend-qwen3-30b-a3b", fixed_s=0.0194947, per_kv_token_s=0.10128e-6,
        per_scheduled_token_s=0.0,
        description="fitted to published decode ITL of Qwen3-30B-A3B on Ascend at 1, 4 "
                    "and 6 concurrent ~14.9k-token requests (vllm-ascend issue #3773); "
                    "see docs/cost-models.md"),
    "kv-token-mtp3": StepCostModel(
        name="kv-token-mtp3", num_speculative_tokens=3, draft_acceptance_rate=0.7,
        draft_step_s=0.002,
        description="kv-token with MTP as in PR #12292: 3 draft tokens per step, each "
                    "accepted with probability 0.7 given the ones before it (about 2.5 "
                    "tokens per step), 2 ms per draft forward; the rate and the draft cost "
                    "are assumptions from published MTP figures, see docs/cost-models.md"),
}
DEFAULT_PROFILE = "kv-token"


class CostProfileError(ValueError):
    """A profile name, file or value that cannot be used; the message names it."""


def profile_from_dict(data, source: str) -> StepCostModel:
    """A profile from its JSON object; ``source`` names the file in messages. Every key
    must be known; ``name`` is required, missing coefficients are 0."""
    if not isinstance(data, dict):
        raise CostProfileError(f"{source}: expected a JSON object with the profile's "
                               f"fields, got {type(data).__name__}")
    known = [f.name for f in fields(StepCostModel)]
    for key in data:
        if key not in known:
            raise CostProfileError(f"{source}: unknown key {key!r}; a profile has "
                                   f"{', '.join(known)}")
    if "name" not in data:
        raise CostProfileError(f"{source}: key 'name' is missing (the profile's name)")
    values = {name: 0.0 for name in TERMS}
    values.update(data)
    if "control_plane" in data and data["control_plane"] is not None:
        try:
            values["control_plane"] = ControlPlaneCost.from_dict(data["control_plane"], source)
        except ValueError as exc:
            raise CostProfileError(str(exc)) from None
    for key in TERMS:
        value = values[key]
        if not is_number(value) or not math.isfinite(value) or value < 0:
            raise CostProfileError(f"{source}: key {key!r} must be a finite number >= 0 "
                                   f"(seconds), got {value!r}")
    for key in (*TERMS, "draft_step_s"):
        limit = MAX_FORWARD_S if key in ("fixed_s", "draft_step_s") else MAX_PER_UNIT_S
        value = values.get(key, 0.0)
        if is_number(value) and value > limit:
            raise CostProfileError(f"{source}: key {key!r} must be at most {limit:g} "
                                   f"seconds, got {value!r}")
    try:
        return StepCostModel(**values)
    except ValueError as exc:
        raise CostProfileError(f"{source}: {exc}") from None


def load_profile(value: str) -> StepCostModel:
    """``--cost-model NAME|FILE.json``: a bundled profile by name, or a profile file."""
    if value in PROFILES:
        return PROFILES[value]
    path = Path(value)
    if path.suffix != ".json" and not path.exists():
        raise CostProfileError(f"{value!r}: not a bundled profile ({', '.join(PROFILES)}) "
                               "and not a .json file")
    try:
        text = read_limited(path, MAX_SMALL_FILE_BYTES).decode("utf-8")
    except (OSError, UnicodeDecodeError, FileTooLarge) as exc:
        reason = getattr(exc, "strerror", None) or exc
        raise CostProfileError(f"{value}: cannot read the profile file: {reason}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CostProfileError(f"{value}:{exc.lineno}: invalid JSON: {exc.msg}") from None
    return profile_from_dict(data, value)


def write_profile(profile: StepCostModel, path) -> None:
    """Write a profile file (sorted keys, trailing newline)."""
    Path(path).write_text(json.dumps(profile.to_dict(), indent=2, sort_keys=True) + "\n")


# ------------------------------------------------------------------------ fitting


@dataclass(frozen=True)
class Fit:
    """What ``fit`` found: the profile, its error on the rows, and the rows used."""

    profile: StepCostModel
    rmse_ms: float
    r2: float | None
    rows: int


def read_measurements(path) -> np.ndarray:
    """The rows of a measurement CSV as an array with the columns of ``FIT_COLUMNS``
    (header required, any column order, other columns ignored)."""
    path = Path(path)
    try:
        f = open(path, newline="", encoding="utf-8")
    except OSError as exc:
        raise CostProfileError(f"{path}: cannot read: {exc.strerror or exc}") from None
    with f:
        reader = csv.DictReader(f)
        missing = [c for c in FIT_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise CostProfileError(f"{path}:1: missing column(s) {', '.join(missing)}; "
                                   f"the header must name {', '.join(FIT_COLUMNS)}")
        rows = []
        for lineno, row in enumerate(reader, start=2):
            values = []
            for column in FIT_COLUMNS:
                try:
                    value = float(row[column])
                except (TypeError, ValueError):
                    value = math.nan
                if not math.isfinite(value) or value < 0:
                    raise CostProfileError(f"{path}:{lineno}: column {column!r}: expected "
                                           f"a number >= 0, got {row[column]!r}")
                values.append(value)
            rows.append(values)
    if not rows:
        raise CostProfileError(f"{path}: no data rows")
    return np.asarray(rows, dtype=float)


def fit(data: np.ndarray, name: str, terms=tuple(FIT_TERMS), description: str = "") -> Fit:
    """Least-squares fit of step time (ms) on the chosen terms; the others are 0.
    ``data`` has the columns of ``FIT_COLUMNS``. Refuses a fit with fewer rows than
    terms, or one that gives a negative coefficient (drop that term)."""
    terms = list(terms)
    unknown = [t for t in terms if t not in FIT_TERMS]
    if unknown:
        raise CostProfileError(f"unknown term(s) {', '.join(unknown)}; choose from "
                               f"{', '.join(FIT_TERMS)}")
    if "fixed_s" not in terms:
        raise CostProfileError("the fit needs the fixed_s term (every step pays it)")
    if len(data) < len(terms):
        raise CostProfileError(f"{len(data)} row(s) cannot determine {len(terms)} terms; "
                               "measure more steps or fit fewer terms")
    column = {c: i for i, c in enumerate(FIT_COLUMNS)}
    design = np.column_stack([np.ones(len(data)) if FIT_TERMS[t] is None
                              else data[:, column[FIT_TERMS[t]]] for t in terms])
    target_ms = data[:, column["step_ms"]]
    coef, _, rank, _ = np.linalg.lstsq(design, target_ms, rcond=None)
    if rank < len(terms):
        raise CostProfileError(f"the terms {', '.join(terms)} cannot be told apart in this "
                               "data (collinear columns, e.g. scheduled tokens always equal "
                               "running requests); fit fewer terms")
    negative = [t for t, c in zip(terms, coef, strict=True) if c < 0]
    if negative:
        raise CostProfileError(f"the fit gives a negative {', '.join(negative)}; drop that "
                               "term (--terms) or measure a wider range")
    residual = target_ms - design @ coef
    rmse = float(np.sqrt(np.mean(residual ** 2)))
    total = float(np.sum((target_ms - target_ms.mean()) ** 2))
    r2 = 1.0 - float(np.sum(residual ** 2)) / total if total > 0 else None
    values = {t: 0.0 for t in TERMS}
    values.update({t: float(c) / 1e3 for t, c in zip(terms, coef, strict=True)})
    profile = StepCostModel(name=name, description=description, **values)
    return Fit(profile=profile, rmse_ms=rmse, r2=r2, rows=len(data))


def fit_report(result: Fit) -> str:
    """The fit as printed by ``fit-cost``."""
    p = result.profile
    lines = [f"fitted profile {p.name!r} on {result.rows} steps:"]
    for name in TERMS:
        lines.append(f"  {name:<22} {getattr(p, name) * 1e6:12.6g} us")
    r2 = "-" if result.r2 is None else f"{result.r2:.4f}"
    lines.append(f"  RMSE {result.rmse_ms:.4g} ms, R^2 {r2}")
    lines.append(f"  step cost = {p.formula()}")
    return "\n".join(lines)
