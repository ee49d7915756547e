"""The study's search space: the knobs it may search, their ranges, how a trial's
values are asked of Optuna and split into a config and RunSpec fields, and how a config
is labelled."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence

from dyntra_lb.blocks import num_blocks
from dyntra_lb.config import DyntraLBConfig

KNOBS = ("mode", "start_step", "bubble_threshold", "long_req_block_threshold",
         "dynamic_max_step")
# Knobs searched only when --knobs names them: the kit's opt-ins, not production's config
# (a RunSpec field each, split off the trial's values by ``spec_fields``).
OPT_IN_KNOBS = ("pause_limit_ms",)
PAUSE_LIMITS_MS = (0, 500, 1000, 2000, 5000)  # 0: no limit; the benchmark's (assumed)

# The search ranges. Assumed, around production's defaults (start_step 250,
# bubble_threshold 5 blocks, dynamic_max_step 256); long_req_block_threshold's range
# comes from the workload (Space.for_traces).
START_STEP = (0, 1000, 50)  # low, high, step
BUBBLE_BLOCKS = (1, 64)  # absolute form: a block imbalance, log scale
BUBBLE_RATIO = (0.05, 0.95, 0.05)  # ratio form, (max - avg) / max: low, high, step
DYNAMIC_MAX_STEP = (16, 2048)  # log scale


@dataclasses.dataclass(frozen=True)
class Space:
    """Which knobs the study searches, and the range of ``long_req_block_threshold``:
    from 1 to one block below the largest prompt (a threshold at or above it never arms
    dynamic mode). ``base_mode`` decides whether the dynamic-mode knobs matter when
    ``mode`` is not searched."""

    knobs: tuple[str, ...]
    long_req_blocks: tuple[int, int]
    base_mode: str

    @classmethod
    def for_traces(cls, knobs: Sequence[str], traces: Sequence, block_size: int,
                   base_mode: str) -> Space:
        largest = max((num_blocks(r.prompt_tokens, block_size) for t in traces for r in t),
                      default=1)
        return cls(tuple(knobs), (1, max(1, largest - 1)), base_mode)

    def describe(self) -> dict:
        """The ranges, as the fingerprint records them."""
        return {"knobs": list(self.knobs), "start_step": list(START_STEP),
                **({"pause_limit_ms": list(PAUSE_LIMITS_MS)}
                   if "pause_limit_ms" in self.knobs else {}),
                "bubble_threshold_blocks": list(BUBBLE_BLOCKS),
                "bubble_threshold_ratio": list(BUBBLE_RATIO),
                "long_req_block_threshold": list(self.long_req_blocks),
                "dynamic_max_step": list(DYNAMIC_MAX_STEP), "base_mode": self.base_mode}

    def start_params(self, base: dict) -> dict | None:
        """The Optuna parameters of the base config's own values (its dyntra_lb_config,
        production's defaults for what it leaves out), so that the study tries the
        user's starting point first; None when one of them lies outside the ranges."""
        config = {**dataclasses.asdict(DyntraLBConfig()), **base}
        params: dict = {}
        if "mode" in self.knobs:
            params["mode"] = config["mode"]
        if "start_step" in self.knobs:
            params["start_step"] = config["start_step"]
            if not _on_grid(config["start_step"], *START_STEP):
                return None
        if "bubble_threshold" in self.knobs:
            value = config["bubble_threshold"]
            if value >= 1 and float(value).is_integer() and _on_grid(value, *BUBBLE_BLOCKS):
                params.update(bubble_form="blocks", bubble_threshold_blocks=int(value))
            elif value < 1 and _on_grid(value, *BUBBLE_RATIO):
                params.update(bubble_form="ratio", bubble_threshold_ratio=float(value))
            else:
                return None
        if "pause_limit_ms" in self.knobs:
            params["pause_limit_ms"] = 0  # production: no limit
        if config["mode"] == "dynamic":
            for knob, (low, high) in (("long_req_block_threshold", self.long_req_blocks),
                                      ("dynamic_max_step", DYNAMIC_MAX_STEP)):
                if knob in self.knobs:
                    if not _on_grid(config[knob], low, high):
                        return None
                    params[knob] = config[knob]
        return params

    def suggest(self, trial) -> dict:
        """The trial's dyntra_lb_config keys, asked of the Optuna trial. The dynamic-mode
        knobs are asked only of a dynamic-mode trial (static mode never reads them), and
        ``bubble_threshold`` first picks its form: blocks (>= 1) or a ratio (< 1)."""
        values: dict = {}
        if "mode" in self.knobs:
            values["mode"] = trial.suggest_categorical("mode", ["static", "dynamic"])
        if "start_step" in self.knobs:
            low, high, step = START_STEP
            values["start_step"] = trial.suggest_int("start_step", low, high, step=step)
        if "bubble_threshold" in self.knobs:
            form = trial.suggest_categorical("bubble_form", ["blocks", "ratio"])
            if form == "blocks":
                values["bubble_threshold"] = trial.suggest_int(
                    "bubble_threshold_blocks", *BUBBLE_BLOCKS, log=True)
            else:
                low, high, step = BUBBLE_RATIO
                ratio = trial.suggest_float("bubble_threshold_ratio", low, high, step=step)
                values["bubble_threshold"] = round(ratio, 2)
        if "pause_limit_ms" in self.knobs:
            values["pause_limit_ms"] = trial.suggest_categorical("pause_limit_ms",
                                                                 list(PAUSE_LIMITS_MS))
        if values.get("mode", self.base_mode) == "dynamic":
            if "long_req_block_threshold" in self.knobs:
                values["long_req_block_threshold"] = trial.suggest_int(
                    "long_req_block_threshold", *self.long_req_blocks, log=True)
            if "dynamic_max_step" in self.knobs:
                values["dynamic_max_step"] = trial.suggest_int(
                    "dynamic_max_step", *DYNAMIC_MAX_STEP, log=True)
        return values


def _on_grid(value, low, high, step=None) -> bool:
    """Whether ``value`` is in [low, high] (and on the step's grid from ``low``)."""
    if not low <= value <= high:
        return False
    return step is None or math.isclose((value - low) / step, round((value - low) / step),
                                        abs_tol=1e-9)


def spec_fields(values: dict) -> tuple[dict, dict]:
    """A trial's values split into its dyntra_lb_config keys and the RunSpec fields of
    the opt-in knobs (``pause_limit_ms`` 0 is no limit)."""
    keys = {k: v for k, v in values.items() if k not in OPT_IN_KNOBS}
    fields = {}
    if "pause_limit_ms" in values:
        fields["pause_limit_ms"] = values["pause_limit_ms"] or None
    return keys, fields


def config_label(values: dict) -> str:
    return " ".join(f"{k}={json.dumps(v)}" for k, v in values.items()) or "(the base config)"

