"""DyntraLB configuration: the ``dyntra_lb_config`` block, the surrounding
``scheduler_config`` switches and the startup (deployment) checks (docs/config.md).

Read once at startup: the engine builds ``load_additional_config(...)`` from the
``--additional-config`` value, runs ``check_deployment`` before starting any rank, and
hands ``AdditionalConfig.dyntra_lb`` to the coordinator and the scheduler policy. Every
rejection is a ``ValueError``. The DyntraLB messages (in docs/config.md: the validation
order, the scheduler_config message, the DyntraLB startup checks) are the reference's
text character for character; the generic
balance-scheduling, short-request-first and recompute rejections, the batch-job rejection
(docs/protocol.md, quirk Q10), the JSON errors and the type checks of the sibling
switches are worded by us.
"""

from __future__ import annotations

import difflib
import json
import logging
import os
from dataclasses import dataclass, field, fields
from typing import Any

logger = logging.getLogger(__name__)

_VALID_MODES = ("dynamic", "static")  # sorted: the error message prints this list
_INT_KEYS = ("start_step", "end_step", "long_req_block_threshold", "dynamic_max_step")
_BALANCE_ENV = "VLLM_ASCEND_BALANCE_SCHEDULING"
_warned_deprecated: set[str] = set()


def _type_name(value: Any) -> str:
    return type(value).__name__


@dataclass(frozen=True)
class DyntraLBConfig:
    """``additional_config["scheduler_config"]["dyntra_lb_config"]`` (docs/config.md).

    Constructing it validates in vllm-ascend's order (docs/config.md, "Validation
    order"); ``bubble_threshold`` is stored as a float. NaN and +inf thresholds pass, as
    in the reference (docs/protocol.md, quirk Q10).
    """

    enabled: bool = False
    enable_diagnostics: bool = False
    mode: str = "dynamic"
    start_step: int = 250
    end_step: int = -1
    bubble_threshold: float = 5.0
    long_req_block_threshold: int = 700
    dynamic_max_step: int = 256

    def __post_init__(self) -> None:
        for key in ("enabled", "enable_diagnostics"):
            value = getattr(self, key)
            if not isinstance(value, bool):
                raise ValueError(f"dyntra_lb_config.{key} must be a bool, got {_type_name(value)}.")
        if not isinstance(self.mode, str) or self.mode not in _VALID_MODES:
            raise ValueError(
                f"dyntra_lb_config.mode must be one of {list(_VALID_MODES)}, got {self.mode!r}."
            )
        for key in _INT_KEYS:
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"dyntra_lb_config.{key} must be an int, got {_type_name(value)}.")
        threshold = self.bubble_threshold
        if not isinstance(threshold, (int, float)) or isinstance(threshold, bool):
            raise ValueError(
                f"dyntra_lb_config.bubble_threshold must be a number, got {_type_name(threshold)}."
            )
        try:
            threshold = float(threshold)
        except OverflowError:
            raise ValueError(
                "dyntra_lb_config.bubble_threshold must be a number, got an int too large "
                "for a float."
            ) from None
        object.__setattr__(self, "bubble_threshold", threshold)

        if self.start_step < 0:
            raise ValueError(f"dyntra_lb_config.start_step must be >= 0, got {self.start_step}.")
        if self.end_step < -1:
            raise ValueError(f"dyntra_lb_config.end_step must be -1 or >= 0, got {self.end_step}.")
        if self.end_step != -1 and self.end_step <= self.start_step:
            raise ValueError(
                "dyntra_lb_config.end_step must be greater than start_step when it is set, "
                f"got start_step={self.start_step}, end_step={self.end_step}."
            )
        if threshold <= 0:  # NaN compares False: accepted, as in the reference
            raise ValueError(f"dyntra_lb_config.bubble_threshold must be > 0, got {threshold}.")
        if self.long_req_block_threshold <= 0:
            raise ValueError(
                "dyntra_lb_config.long_req_block_threshold must be > 0, "
                f"got {self.long_req_block_threshold}."
            )
        if self.dynamic_max_step <= 0:
            raise ValueError(
                f"dyntra_lb_config.dynamic_max_step must be > 0, got {self.dynamic_max_step}."
            )

    @classmethod
    def from_dict(cls, d: Any) -> DyntraLBConfig:
        """Build from the user's ``dyntra_lb_config`` value (docs/config.md, "Validation
        order"): None means all
        defaults; anything but a dict, or a dict with unknown keys, is rejected."""
        if d is None:
            d = {}
        if not isinstance(d, dict):
            raise ValueError(f"dyntra_lb_config must be a dict, got {_type_name(d)}.")
        known = {f.name for f in fields(cls)}
        unknown = [key for key in d if key not in known]
        if unknown:
            raise ValueError(f"Unknown dyntra_lb_config keys: {_sorted_keys(unknown)}")
        return cls(**d)


def _sorted_keys(keys: list) -> list:
    try:
        return sorted(keys)
    except TypeError:  # mixed key types in a Python-built dict
        return sorted(keys, key=repr)


@dataclass(frozen=True)
class AdditionalConfig:
    """The parts of vllm-ascend's ``additional_config`` that matter to DyntraLB
    (docs/config.md, "The surrounding scheduler_config").

    ``raw`` is the user's dict as given; ``diagnostics_enabled`` and the scheduler-side
    diagnostics flag read it directly (docs/config.md, "How the engine resolves the config").
    """

    dyntra_lb: DyntraLBConfig
    enable_balance_scheduling: bool = False
    recompute_scheduler_enable: bool = False
    profiling_chunk_enabled: bool = False
    batch_job_sched_enabled: bool = False
    short_request_first_enabled: bool = False
    raw: dict = field(default_factory=dict)


def _parse_json(text: str) -> Any:
    """json.loads, except that a key given twice in one object (at any depth) is an
    error naming it: json.loads would keep the last value without a word."""
    duplicated: dict[int, str] = {}
    built: list[dict] = []  # alive until the end, so that no id() is reused meanwhile

    def build(pairs: list[tuple[str, Any]]) -> dict:
        obj: dict = {}
        built.append(obj)
        for key, value in pairs:
            if key in obj and id(obj) not in duplicated:
                duplicated[id(obj)] = key
            obj[key] = value
        return obj

    try:
        value = json.loads(text, object_pairs_hook=build)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"additional_config is not valid JSON: {exc.msg} "
            f"(line {exc.lineno}, column {exc.colno})."
        ) from None
    except ValueError as exc:  # e.g. an integer literal beyond Python's digit limit
        raise ValueError(f"additional_config is not valid JSON: {exc}") from None
    except RecursionError:
        raise ValueError("additional_config is not valid JSON: nested too deeply.") from None
    if duplicated:
        path = _duplicate_path(value, duplicated)
        raise ValueError(f"additional_config has the key {path} twice; JSON would keep only "
                         "the last value. Give each key once.")
    return value


def _duplicate_path(value: Any, duplicated: dict[int, str], prefix: str = "") -> str | None:
    """Dotted path of the first duplicated key, in document order."""
    if isinstance(value, dict):
        if id(value) in duplicated:
            return f"{prefix}{duplicated[id(value)]}"
        for key, child in value.items():
            found = _duplicate_path(child, duplicated, f"{prefix}{key}.")
            if found is not None:
                return found
    elif isinstance(value, list):
        for i, child in enumerate(value):
            found = _duplicate_path(child, duplicated, f"{prefix.rstrip('.')}[{i}].")
            if found is not None:
                return found
    return None


# What vllm-ascend (ascend_config.py, platform.py, the balance-scheduling patch) reads:
# the top level of additional_config, including the scheduler switches it still accepts
# there (deprecated), and scheduler_config. It ignores every other key without a word.
ADDITIONAL_CONFIG_KEYS = frozenset({
    "ascend_compilation_config", "ascend_fusion_config", "ascend_log_path",
    "batch_job_sched_config", "c8_enable_reshape_optim", "draft_window_size", "dump_config",
    "dump_config_path", "dynamic_spec_config", "enable_balance_scheduling",
    "enable_cpu_binding", "enable_dsa_cp", "enable_fused_mc2", "enable_kv_nz",
    "enable_mc2_hierarchy_comm", "enable_mlapo", "enable_prefill_mc2",
    "enable_reduce_sample", "enable_shared_expert_dp", "enable_sparse_li_c8",
    "enable_sparse_sfa_c8", "enable_transpose_kv_cache_by_block", "eplb_config",
    "finegrained_tp_config", "mega_moe_max_tokens", "mix_placement", "msmonitor_use_daemon",
    "multistream_dsv4_dsa_overlap", "multistream_overlap_shared_expert", "pa_shape_list",
    "profiling_chunk_config", "recompute_scheduler_enable", "refresh",
    "rejection_sampler_config", "rl_config", "scheduler_config", "short_request_first_config",
    "sparse_kv_offload_config", "weight_nz_mode", "xlite_graph_config",
})
SCHEDULER_CONFIG_KEYS = frozenset({
    "batch_job_sched_config", "dyntra_lb_config", "enable_balance_scheduling",
    "profiling_chunk_config", "recompute_scheduler_enable", "short_request_first_config",
})


def unknown_keys(raw: Any) -> list[str]:
    """One message per key of ``additional_config`` (top level) or of its
    ``scheduler_config`` that vllm-ascend does not read, with the closest known key when
    one is close: vllm-ascend ignores such keys, so a typo such as ``scheduler_confg``
    silently runs plain DP. Unknown keys inside ``dyntra_lb_config`` are rejected by
    ``DyntraLBConfig.from_dict`` instead. Called by the emulator's CLI to warn."""
    if isinstance(raw, AdditionalConfig):
        raw = raw.raw
    if not isinstance(raw, dict):
        return []
    found = [(f"additional_config.{key}", key, ADDITIONAL_CONFIG_KEYS)
             for key in raw if key not in ADDITIONAL_CONFIG_KEYS]
    scheduler = raw.get("scheduler_config")
    if isinstance(scheduler, dict):
        found += [(f"additional_config.scheduler_config.{key}", key, SCHEDULER_CONFIG_KEYS)
                  for key in scheduler if key not in SCHEDULER_CONFIG_KEYS]
    messages = []
    for path, key, known in found:
        close = difflib.get_close_matches(str(key), sorted(known), n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        if known is ADDITIONAL_CONFIG_KEYS and key in SCHEDULER_CONFIG_KEYS:
            hint = f" (it belongs in additional_config.scheduler_config.{key})"
        messages.append(f"{path}: unknown key, which vllm-ascend ignores{hint}")
    return messages


def _bool_switch(value: Any, path: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{path} must be a bool, got {_type_name(value)}.")
    return value


def _warn_deprecated_once(key: str) -> None:
    if key in _warned_deprecated:
        return
    _warned_deprecated.add(key)
    logger.warning(
        "additional_config.%s at the top level is deprecated; "
        "set additional_config.scheduler_config.%s instead.",
        key,
        key,
    )


def _nested_or_top_level(additional: dict, scheduler: dict, key: str) -> Any:
    """Nested value if present, else the deprecated top-level value (warned once),
    else ``None`` (the caller supplies the default)."""
    if key in scheduler:
        return scheduler[key]
    if key in additional:
        _warn_deprecated_once(key)
        return additional[key]
    return None


def _balance_env_default() -> bool:
    return os.environ.get(_BALANCE_ENV, "0").strip().lower() in ("1", "true")


def _sub_config_enabled(scheduler: dict, key: str) -> bool:
    sub = scheduler.get(key)
    if sub is None:
        return False
    if not isinstance(sub, dict):
        raise ValueError(
            f"additional_config.scheduler_config.{key} must be a dict, got {_type_name(sub)}."
        )
    enabled = sub.get("enabled", False)
    return _bool_switch(enabled, f"additional_config.scheduler_config.{key}.enabled")


def load_additional_config(value: dict | str | None) -> AdditionalConfig:
    """Parse ``--additional-config`` (a dict, its JSON text, or None) into the switches
    DyntraLB depends on. Called once at startup, before ``check_deployment``."""
    if isinstance(value, str):
        value = _parse_json(value)
        if not isinstance(value, dict):
            raise ValueError(f"additional_config must be a JSON object, got {_type_name(value)}.")
    elif value is None:
        value = {}
    elif not isinstance(value, dict):
        raise ValueError(
            f"additional_config must be a dict or a JSON string, got {_type_name(value)}."
        )

    scheduler = value.get("scheduler_config")
    if scheduler is None:
        scheduler = {}
    elif not isinstance(scheduler, dict):
        raise ValueError(
            f"additional_config.scheduler_config must be a dict, got {_type_name(scheduler)}."
        )

    dyntra_lb = DyntraLBConfig.from_dict(scheduler.get("dyntra_lb_config"))

    balance = _nested_or_top_level(value, scheduler, "enable_balance_scheduling")
    balance = (
        _balance_env_default()
        if balance is None
        else _bool_switch(balance, "additional_config.scheduler_config.enable_balance_scheduling")
    )
    recompute = _nested_or_top_level(value, scheduler, "recompute_scheduler_enable")
    recompute = (
        False
        if recompute is None
        else _bool_switch(
            recompute, "additional_config.scheduler_config.recompute_scheduler_enable"
        )
    )
    return AdditionalConfig(
        dyntra_lb=dyntra_lb,
        enable_balance_scheduling=balance,
        recompute_scheduler_enable=recompute,
        profiling_chunk_enabled=_sub_config_enabled(scheduler, "profiling_chunk_config"),
        batch_job_sched_enabled=_sub_config_enabled(scheduler, "batch_job_sched_config"),
        short_request_first_enabled=_sub_config_enabled(scheduler, "short_request_first_config"),
        raw=value,
    )


def check_deployment(
    additional_config: AdditionalConfig | dict | str | None,
    *,
    kv_role: str | None,
    data_parallel_size: int,
    nnodes_within_dp: int = 1,
    async_scheduling: bool = False,
) -> str:
    """Startup checks (docs/config.md, "Decode-node startup checks"), in the reference's
    order; returns the scheduler
    variant that applies: ``"plain"``, ``"async"``, ``"recompute"`` or
    ``"async_recompute"`` (combined with DyntraLB when ``dyntra_lb.enabled``).

    ``kv_role`` is the node's ``kv_transfer_config.kv_role``, or None when the node has
    no KV transfer config.
    """
    if not isinstance(additional_config, AdditionalConfig):
        additional_config = load_additional_config(additional_config)
    cfg = additional_config

    if cfg.enable_balance_scheduling and kv_role is not None and kv_role != "kv_both":
        raise ValueError(
            "enable_balance_scheduling only supports PD-mixed mode (kv_role='kv_both'), "
            f"but got kv_role={kv_role!r}."
        )
    if cfg.short_request_first_enabled and kv_role == "kv_consumer":
        raise ValueError(
            "short_request_first_config is not supported on PD-disaggregated D nodes "
            "(kv_role='kv_consumer')."
        )
    if cfg.dyntra_lb.enabled:
        if cfg.enable_balance_scheduling:
            raise ValueError("DyntraLB cannot be used with enable_balance_scheduling.")
        if kv_role != "kv_consumer":
            raise ValueError(
                "DyntraLB is only supported on PD-disaggregated D nodes "
                f"(kv_role='kv_consumer', but got kv_role={kv_role!r})."
            )
        if data_parallel_size <= 1:
            raise ValueError("DyntraLB requires data_parallel_size > 1.")
        if nnodes_within_dp > 1:
            raise ValueError(
                "DyntraLB only supports decoder instances that run on a single node; "
                f"got nnodes_within_dp={nnodes_within_dp}."
            )
        if cfg.profiling_chunk_enabled:
            raise ValueError("DyntraLB cannot be used with profiling_chunk_config.")
        if cfg.batch_job_sched_enabled:
            raise ValueError(
                "DyntraLB cannot be used with batch_job_sched_config: the batch-job scheduler "
                "replaces the DyntraLB scheduler, and the reference then fails at run time "
                "when the DyntraLB engine core calls prepare_dyntra_lb_step on it."
            )

    recompute = cfg.recompute_scheduler_enable
    if recompute:
        if kv_role == "kv_producer":
            logger.warning(
                "recompute_scheduler_enable has no effect on kv_producer nodes; turning it off."
            )
            recompute = False
        elif kv_role != "kv_consumer":
            raise ValueError(
                "recompute_scheduler_enable is only supported on PD-disaggregated D nodes "
                f"(kv_role='kv_consumer', but got kv_role={kv_role!r})."
            )
    if recompute:
        return "async_recompute" if async_scheduling else "recompute"
    return "async" if async_scheduling else "plain"


def diagnostics_enabled(additional_config_raw: Any) -> bool:
    """Raw-config diagnostics switch (docs/config.md, "How the engine resolves the
    config"): True only when
    ``scheduler_config.dyntra_lb_config.enable_diagnostics is True`` in a chain of dicts.
    Ignores ``enabled`` and does not validate; the step-counter line and the recompute
    scheduler's summary are gated by it (docs/protocol.md, quirk Q11)."""
    if isinstance(additional_config_raw, AdditionalConfig):
        additional_config_raw = additional_config_raw.raw
    if not isinstance(additional_config_raw, dict):
        return False
    scheduler = additional_config_raw.get("scheduler_config")
    if not isinstance(scheduler, dict):
        return False
    dyntra_lb = scheduler.get("dyntra_lb_config")
    if not isinstance(dyntra_lb, dict):
        return False
    return dyntra_lb.get("enable_diagnostics") is True
