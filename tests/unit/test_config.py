"""Spec A: DyntraLBConfig validation, additional_config parsing, startup checks."""

import logging
import math
import re

import pytest

from dyntra_lb import config as config_mod
from dyntra_lb.config import (
    AdditionalConfig,
    DyntraLBConfig,
    check_deployment,
    diagnostics_enabled,
    load_additional_config,
    unknown_keys,
)


def _raises(d, message):
    with pytest.raises(ValueError) as info:
        DyntraLBConfig.from_dict(d)
    assert str(info.value) == message


def _additional(dyntra=None, **scheduler):
    sched = dict(scheduler)
    if dyntra is not None:
        sched["dyntra_lb_config"] = dyntra
    return {"scheduler_config": sched}


# --- DyntraLBConfig (docs/config.md) -----------------------------------------------------


def test_defaults_for_none_and_empty():
    for d in (None, {}):
        cfg = DyntraLBConfig.from_dict(d)
        assert cfg == DyntraLBConfig()
        assert (
            cfg.enabled,
            cfg.enable_diagnostics,
            cfg.mode,
            cfg.start_step,
            cfg.end_step,
            cfg.bubble_threshold,
            cfg.long_req_block_threshold,
            cfg.dynamic_max_step,
        ) == (False, False, "dynamic", 250, -1, 5.0, 700, 256)
        assert type(cfg.bubble_threshold) is float


def test_all_keys_set():
    cfg = DyntraLBConfig.from_dict(
        {
            "enabled": True,
            "enable_diagnostics": True,
            "mode": "static",
            "start_step": 0,
            "end_step": 1,
            "bubble_threshold": 2,
            "long_req_block_threshold": 1,
            "dynamic_max_step": 1,
        }
    )
    assert cfg.enabled and cfg.enable_diagnostics and cfg.mode == "static"
    assert (cfg.start_step, cfg.end_step) == (0, 1)
    assert cfg.bubble_threshold == 2.0 and type(cfg.bubble_threshold) is float
    assert (cfg.long_req_block_threshold, cfg.dynamic_max_step) == (1, 1)


def test_frozen():
    cfg = DyntraLBConfig()
    with pytest.raises(AttributeError):
        cfg.enabled = True


@pytest.mark.parametrize(
    "value, name", [([], "list"), ("x", "str"), (False, "bool"), (0, "int"), (1.5, "float")]
)
def test_not_a_dict(value, name):
    _raises(value, f"dyntra_lb_config must be a dict, got {name}.")


def test_unknown_keys_sorted():
    _raises(
        {"zeta": 1, "enabled": True, "alpha": 2, "DYNTRA_LB_ENABLE": 1},
        "Unknown dyntra_lb_config keys: ['DYNTRA_LB_ENABLE', 'alpha', 'zeta']",
    )


def test_unknown_keys_checked_before_values():
    _raises({"enabled": "yes", "bogus": 1}, "Unknown dyntra_lb_config keys: ['bogus']")


def test_unknown_keys_of_mixed_types():
    with pytest.raises(ValueError, match=r"^Unknown dyntra_lb_config keys: "):
        DyntraLBConfig.from_dict({1: 2, "x": 3})


@pytest.mark.parametrize("key", ["enabled", "enable_diagnostics"])
@pytest.mark.parametrize("value, name", [(1, "int"), ("true", "str"), (None, "NoneType")])
def test_bool_keys(key, value, name):
    _raises({key: value}, f"dyntra_lb_config.{key} must be a bool, got {name}.")


@pytest.mark.parametrize(
    "value, shown", [("Static", "'Static'"), ("", "''"), (1, "1"), (None, "None"), ([], "[]")]
)
def test_mode(value, shown):
    _raises(
        {"mode": value},
        f"dyntra_lb_config.mode must be one of ['dynamic', 'static'], got {shown}.",
    )


@pytest.mark.parametrize(
    "key", ["start_step", "end_step", "long_req_block_threshold", "dynamic_max_step"]
)
@pytest.mark.parametrize("value, name", [(True, "bool"), (1.0, "float"), ("1", "str")])
def test_int_keys(key, value, name):
    _raises({key: value}, f"dyntra_lb_config.{key} must be an int, got {name}.")


@pytest.mark.parametrize("value, name", [(True, "bool"), ("5", "str"), (None, "NoneType")])
def test_bubble_threshold_type(value, name):
    _raises(
        {"bubble_threshold": value},
        f"dyntra_lb_config.bubble_threshold must be a number, got {name}.",
    )


def test_start_step_negative():
    _raises({"start_step": -1}, "dyntra_lb_config.start_step must be >= 0, got -1.")


def test_end_step_below_minus_one():
    _raises({"end_step": -2}, "dyntra_lb_config.end_step must be -1 or >= 0, got -2.")


@pytest.mark.parametrize("start, end", [(10, 10), (0, 0), (10, 5)])
def test_end_step_not_after_start(start, end):
    _raises(
        {"start_step": start, "end_step": end},
        "dyntra_lb_config.end_step must be greater than start_step when it is set, "
        f"got start_step={start}, end_step={end}.",
    )


def test_end_step_after_start_and_unbounded_ok():
    assert DyntraLBConfig.from_dict({"start_step": 10, "end_step": 11}).end_step == 11
    assert DyntraLBConfig.from_dict({"start_step": 10**6, "end_step": -1}).end_step == -1


@pytest.mark.parametrize("value, shown", [(0, "0.0"), (-1, "-1.0"), (-0.5, "-0.5"), (0.0, "0.0")])
def test_bubble_threshold_not_positive(value, shown):
    _raises(
        {"bubble_threshold": value},
        f"dyntra_lb_config.bubble_threshold must be > 0, got {shown}.",
    )


def test_bubble_threshold_nan_and_inf_accepted():
    assert math.isnan(DyntraLBConfig.from_dict({"bubble_threshold": float("nan")}).bubble_threshold)
    assert DyntraLBConfig.from_dict({"bubble_threshold": float("inf")}).bubble_threshold == math.inf
    _raises(
        {"bubble_threshold": float("-inf")},
        "dyntra_lb_config.bubble_threshold must be > 0, got -inf.",
    )


def test_bubble_threshold_fraction_kept():
    assert DyntraLBConfig.from_dict({"bubble_threshold": 0.25}).bubble_threshold == 0.25


def test_bubble_threshold_int_too_large():
    _raises(
        {"bubble_threshold": 10**400},
        "dyntra_lb_config.bubble_threshold must be a number, got an int too large for a float.",
    )


@pytest.mark.parametrize("value", [0, -3])
def test_long_req_block_threshold_not_positive(value):
    _raises(
        {"long_req_block_threshold": value},
        f"dyntra_lb_config.long_req_block_threshold must be > 0, got {value}.",
    )


@pytest.mark.parametrize("value", [0, -3])
def test_dynamic_max_step_not_positive(value):
    _raises(
        {"dynamic_max_step": value},
        f"dyntra_lb_config.dynamic_max_step must be > 0, got {value}.",
    )


def test_validation_order():
    """Each failing key is reported only once every earlier check passes (docs/config.md,
    "Validation order")."""
    bad = {
        "enabled": 1,
        "enable_diagnostics": 1,
        "mode": "x",
        "start_step": "x",
        "end_step": "x",
        "long_req_block_threshold": "x",
        "dynamic_max_step": "x",
        "bubble_threshold": "x",
    }
    fixes = [
        ("enabled", True, "dyntra_lb_config.enabled must be a bool, got int."),
        (
            "enable_diagnostics",
            False,
            "dyntra_lb_config.enable_diagnostics must be a bool, got int.",
        ),
        ("mode", "static", "dyntra_lb_config.mode must be one of ['dynamic', 'static'], got 'x'."),
        ("start_step", -5, "dyntra_lb_config.start_step must be an int, got str."),
        ("end_step", -7, "dyntra_lb_config.end_step must be an int, got str."),
        (
            "long_req_block_threshold",
            0,
            "dyntra_lb_config.long_req_block_threshold must be an int, got str.",
        ),
        ("dynamic_max_step", 0, "dyntra_lb_config.dynamic_max_step must be an int, got str."),
        ("bubble_threshold", 0, "dyntra_lb_config.bubble_threshold must be a number, got str."),
        ("start_step", 3, "dyntra_lb_config.start_step must be >= 0, got -5."),
        ("end_step", 3, "dyntra_lb_config.end_step must be -1 or >= 0, got -7."),
        (
            "end_step",
            4,
            "dyntra_lb_config.end_step must be greater than start_step when it is set, "
            "got start_step=3, end_step=3.",
        ),
        ("bubble_threshold", 0.5, "dyntra_lb_config.bubble_threshold must be > 0, got 0.0."),
        (
            "long_req_block_threshold",
            1,
            "dyntra_lb_config.long_req_block_threshold must be > 0, got 0.",
        ),
        ("dynamic_max_step", 1, "dyntra_lb_config.dynamic_max_step must be > 0, got 0."),
    ]
    for key, fixed, message in fixes:
        _raises(bad, message)
        bad[key] = fixed
    assert DyntraLBConfig.from_dict(bad).bubble_threshold == 0.5


def test_direct_construction_validates():
    with pytest.raises(ValueError, match=r"mode must be one of"):
        DyntraLBConfig(mode="sometimes")


# --- load_additional_config -----------------------------------------------------------


@pytest.fixture(autouse=True)
def _fresh_env(monkeypatch):
    monkeypatch.delenv("VLLM_ASCEND_BALANCE_SCHEDULING", raising=False)
    monkeypatch.setattr(config_mod, "_warned_deprecated", set())


def test_load_none_and_empty():
    for value in (None, {}, "{}", ' {"scheduler_config": null} '):
        cfg = load_additional_config(value)
        assert isinstance(cfg, AdditionalConfig)
        assert cfg.dyntra_lb == DyntraLBConfig()
        assert not (
            cfg.enable_balance_scheduling
            or cfg.recompute_scheduler_enable
            or cfg.profiling_chunk_enabled
            or cfg.batch_job_sched_enabled
            or cfg.short_request_first_enabled
        )
    assert load_additional_config(None).raw == {}


def test_load_json_string():
    text = '{"scheduler_config": {"dyntra_lb_config": {"enabled": true, "mode": "static"}}}'
    cfg = load_additional_config(text)
    assert cfg.dyntra_lb.enabled and cfg.dyntra_lb.mode == "static"
    assert cfg.raw == {
        "scheduler_config": {"dyntra_lb_config": {"enabled": True, "mode": "static"}}
    }


def test_load_dict_keeps_raw():
    raw = _additional({"enabled": True}, recompute_scheduler_enable=True)
    cfg = load_additional_config(raw)
    assert cfg.raw is raw
    assert cfg.dyntra_lb.enabled and cfg.recompute_scheduler_enable


def test_invalid_json_names_line_and_column():
    with pytest.raises(ValueError) as info:
        load_additional_config('{"scheduler_config":\n  {"dyntra_lb_config": }}')
    assert str(info.value) == (
        "additional_config is not valid JSON: Expecting value (line 2, column 24)."
    )


def test_json_not_an_object():
    with pytest.raises(ValueError) as info:
        load_additional_config("[1, 2]")
    assert str(info.value) == "additional_config must be a JSON object, got list."


def test_value_of_wrong_type():
    with pytest.raises(ValueError) as info:
        load_additional_config(42)
    assert str(info.value) == "additional_config must be a dict or a JSON string, got int."


@pytest.mark.parametrize("value, name", [([], "list"), ("x", "str"), (False, "bool")])
def test_scheduler_config_not_a_dict(value, name):
    with pytest.raises(ValueError) as info:
        load_additional_config({"scheduler_config": value})
    assert str(info.value) == f"additional_config.scheduler_config must be a dict, got {name}."


def test_dyntra_lb_config_only_nested():
    cfg = load_additional_config({"dyntra_lb_config": {"enabled": True}, "DYNTRA_LB_ENABLE": 1})
    assert not cfg.dyntra_lb.enabled


def test_dyntra_lb_config_falsy_non_dict_rejected():
    with pytest.raises(ValueError) as info:
        load_additional_config(_additional(False))
    assert str(info.value) == "dyntra_lb_config must be a dict, got bool."


def test_dyntra_lb_errors_propagate():
    with pytest.raises(ValueError) as info:
        load_additional_config(_additional({"enabled": True, "start_step": -1}))
    assert str(info.value) == "dyntra_lb_config.start_step must be >= 0, got -1."


def test_balance_scheduling_nested_wins(caplog):
    raw = {
        "enable_balance_scheduling": False,
        "scheduler_config": {"enable_balance_scheduling": True},
    }
    with caplog.at_level(logging.WARNING):
        assert load_additional_config(raw).enable_balance_scheduling is True
    assert not caplog.records


def test_balance_scheduling_top_level_warns_once(caplog):
    raw = {"enable_balance_scheduling": True}
    with caplog.at_level(logging.WARNING, logger="dyntra_lb"):
        assert load_additional_config(raw).enable_balance_scheduling is True
        assert load_additional_config(raw).enable_balance_scheduling is True
    warnings = [r for r in caplog.records if "enable_balance_scheduling" in r.getMessage()]
    assert len(warnings) == 1
    assert warnings[0].levelno == logging.WARNING
    assert warnings[0].name == "dyntra_lb.config"
    assert "deprecated" in warnings[0].getMessage()


@pytest.mark.parametrize(
    "env, expected",
    [
        ("1", True),
        ("true", True),
        ("TRUE", True),
        ("True", True),
        ("0", False),
        ("no", False),
        ("", False),
    ],
)
def test_balance_scheduling_env_default(monkeypatch, env, expected):
    monkeypatch.setenv("VLLM_ASCEND_BALANCE_SCHEDULING", env)
    assert load_additional_config({}).enable_balance_scheduling is expected


def test_balance_scheduling_config_beats_env(monkeypatch):
    monkeypatch.setenv("VLLM_ASCEND_BALANCE_SCHEDULING", "1")
    raw = {"scheduler_config": {"enable_balance_scheduling": False}}
    assert load_additional_config(raw).enable_balance_scheduling is False


def test_recompute_nested_top_level_default(caplog):
    assert load_additional_config({}).recompute_scheduler_enable is False
    nested = {
        "recompute_scheduler_enable": False,
        "scheduler_config": {"recompute_scheduler_enable": True},
    }
    assert load_additional_config(nested).recompute_scheduler_enable is True
    with caplog.at_level(logging.WARNING, logger="dyntra_lb"):
        assert load_additional_config(
            {"recompute_scheduler_enable": True}
        ).recompute_scheduler_enable
        load_additional_config({"recompute_scheduler_enable": True})
    warnings = [r for r in caplog.records if "recompute_scheduler_enable" in r.getMessage()]
    assert len(warnings) == 1


@pytest.mark.parametrize(
    "key, attr",
    [
        ("profiling_chunk_config", "profiling_chunk_enabled"),
        ("batch_job_sched_config", "batch_job_sched_enabled"),
        ("short_request_first_config", "short_request_first_enabled"),
    ],
)
def test_sub_config_switches(key, attr):
    assert getattr(load_additional_config(_additional(**{key: {"enabled": True}})), attr) is True
    assert getattr(load_additional_config(_additional(**{key: {"enabled": False}})), attr) is False
    assert getattr(load_additional_config(_additional(**{key: {"other": 1}})), attr) is False
    assert getattr(load_additional_config(_additional(**{key: None})), attr) is False
    # top-level sub-configs are not read (only the nested location)
    assert getattr(load_additional_config({key: {"enabled": True}}), attr) is False
    with pytest.raises(ValueError) as info:
        load_additional_config(_additional(**{key: [1]}))
    assert str(info.value) == f"additional_config.scheduler_config.{key} must be a dict, got list."
    with pytest.raises(ValueError) as info:
        load_additional_config(_additional(**{key: {"enabled": "true"}}))
    assert str(info.value) == (
        f"additional_config.scheduler_config.{key}.enabled must be a bool, got str."
    )


@pytest.mark.parametrize("key", ["enable_balance_scheduling", "recompute_scheduler_enable"])
def test_switch_must_be_bool(key):
    with pytest.raises(ValueError) as info:
        load_additional_config(_additional(**{key: 1}))
    assert str(info.value) == f"additional_config.scheduler_config.{key} must be a bool, got int."
    with pytest.raises(ValueError) as info:
        load_additional_config({key: "yes"})
    assert str(info.value) == f"additional_config.scheduler_config.{key} must be a bool, got str."


# --- check_deployment (quirk Q10) ------------------------------------------------------

ON = {"enabled": True}


def _check(raw, kv_role="kv_consumer", dp=2, **kw):
    return check_deployment(raw, kv_role=kv_role, data_parallel_size=dp, **kw)


def _check_raises(raw, message, **kw):
    with pytest.raises(ValueError) as info:
        _check(raw, **kw)
    assert str(info.value) == message


def test_dyntra_lb_on_decode_node_ok():
    assert _check(_additional(ON)) == "plain"
    assert _check(_additional(ON), async_scheduling=True) == "async"
    assert _check(_additional(ON), dp=16, nnodes_within_dp=1) == "plain"


def test_accepts_loaded_object_dict_and_json():
    assert _check(load_additional_config(_additional(ON))) == "plain"
    assert _check('{"scheduler_config": {"dyntra_lb_config": {"enabled": true}}}') == "plain"
    assert _check(None, kv_role=None, dp=1) == "plain"


@pytest.mark.parametrize("kv_role", ["kv_consumer", "kv_producer"])
def test_balance_generic_check_fires_first(kv_role):
    _check_raises(
        _additional(ON, enable_balance_scheduling=True),
        "enable_balance_scheduling only supports PD-mixed mode (kv_role='kv_both'), "
        f"but got kv_role={kv_role!r}.",
        kv_role=kv_role,
    )


def test_balance_generic_check_without_dyntra_lb():
    _check_raises(
        _additional(enable_balance_scheduling=True),
        "enable_balance_scheduling only supports PD-mixed mode (kv_role='kv_both'), "
        "but got kv_role='kv_consumer'.",
    )
    assert _check(_additional(enable_balance_scheduling=True), kv_role="kv_both") == "plain"
    assert _check(_additional(enable_balance_scheduling=True), kv_role=None) == "plain"


@pytest.mark.parametrize("kv_role", [None, "kv_both"])
def test_dyntra_lb_with_balance(kv_role):
    _check_raises(
        _additional(ON, enable_balance_scheduling=True),
        "DyntraLB cannot be used with enable_balance_scheduling.",
        kv_role=kv_role,
    )


def test_balance_from_env_counts(monkeypatch):
    monkeypatch.setenv("VLLM_ASCEND_BALANCE_SCHEDULING", "true")
    _check_raises(
        _additional(ON), "DyntraLB cannot be used with enable_balance_scheduling.", kv_role=None
    )


def test_short_request_first_rejected_on_consumer():
    message = (
        "short_request_first_config is not supported on PD-disaggregated D nodes "
        "(kv_role='kv_consumer')."
    )
    _check_raises(_additional(short_request_first_config={"enabled": True}), message)
    _check_raises(_additional(ON, short_request_first_config={"enabled": True}), message)
    raw = _additional(short_request_first_config={"enabled": True})
    assert _check(raw, kv_role="kv_both") == "plain"


@pytest.mark.parametrize(
    "kv_role, shown", [(None, "None"), ("kv_both", "'kv_both'"), ("kv_producer", "'kv_producer'")]
)
def test_dyntra_lb_requires_consumer(kv_role, shown):
    _check_raises(
        _additional(ON),
        "DyntraLB is only supported on PD-disaggregated D nodes "
        f"(kv_role='kv_consumer', but got kv_role={shown}).",
        kv_role=kv_role,
    )


@pytest.mark.parametrize("dp", [1, 0])
def test_dyntra_lb_requires_dp(dp):
    _check_raises(_additional(ON), "DyntraLB requires data_parallel_size > 1.", dp=dp)


def test_dyntra_lb_single_node():
    _check_raises(
        _additional(ON),
        "DyntraLB only supports decoder instances that run on a single node; "
        "got nnodes_within_dp=2.",
        nnodes_within_dp=2,
    )


def test_dyntra_lb_with_profiling_chunk():
    _check_raises(
        _additional(ON, profiling_chunk_config={"enabled": True}),
        "DyntraLB cannot be used with profiling_chunk_config.",
    )


def test_dyntra_lb_with_batch_job_sched():
    _check_raises(
        _additional(ON, batch_job_sched_config={"enabled": True}),
        "DyntraLB cannot be used with batch_job_sched_config: the batch-job scheduler "
        "replaces the DyntraLB scheduler, and the reference then fails at run time "
        "when the DyntraLB engine core calls prepare_dyntra_lb_step on it.",
    )


def test_dyntra_lb_block_order():
    """Within the DyntraLB block: role, then dp size, then nodes, then profiling, then
    batch-job (docs/config.md, "Decode-node startup checks"; batch-job last, quirk Q10)."""
    raw = _additional(
        ON, profiling_chunk_config={"enabled": True}, batch_job_sched_config={"enabled": True}
    )
    with pytest.raises(ValueError, match="kv_role='kv_consumer', but got kv_role=None"):
        _check(raw, kv_role=None, dp=1, nnodes_within_dp=2)
    with pytest.raises(ValueError, match=re.escape("requires data_parallel_size > 1")):
        _check(raw, dp=1, nnodes_within_dp=2)
    with pytest.raises(ValueError, match="nnodes_within_dp=2"):
        _check(raw, nnodes_within_dp=2)
    with pytest.raises(ValueError, match="profiling_chunk_config"):
        _check(raw)


def test_disabled_dyntra_lb_skips_its_checks():
    raw = _additional(
        {"enabled": False},
        profiling_chunk_config={"enabled": True},
        batch_job_sched_config={"enabled": True},
    )
    assert _check(raw, kv_role=None, dp=1, nnodes_within_dp=4) == "plain"


@pytest.mark.parametrize("dyntra", [ON, {"enabled": False}])
@pytest.mark.parametrize(
    "async_scheduling, variant", [(False, "recompute"), (True, "async_recompute")]
)
def test_recompute_variants(dyntra, async_scheduling, variant):
    raw = _additional(dyntra, recompute_scheduler_enable=True)
    assert _check(raw, async_scheduling=async_scheduling) == variant


def test_recompute_forced_off_on_producer(caplog):
    raw = _additional(recompute_scheduler_enable=True)
    with caplog.at_level(logging.WARNING, logger="dyntra_lb"):
        assert _check(raw, kv_role="kv_producer") == "plain"
        assert _check(raw, kv_role="kv_producer", async_scheduling=True) == "async"
    assert any("kv_producer" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("kv_role, shown", [(None, "None"), ("kv_both", "'kv_both'")])
def test_recompute_requires_consumer(kv_role, shown):
    _check_raises(
        _additional(recompute_scheduler_enable=True),
        "recompute_scheduler_enable is only supported on PD-disaggregated D nodes "
        f"(kv_role='kv_consumer', but got kv_role={shown}).",
        kv_role=kv_role,
    )


def test_dyntra_lb_checks_before_recompute():
    raw = _additional(ON, recompute_scheduler_enable=True)
    _check_raises(raw, "DyntraLB requires data_parallel_size > 1.", dp=1)


# --- diagnostics_enabled ----------------------------------------------------------------


@pytest.mark.parametrize(
    "raw, expected",
    [
        (_additional({"enable_diagnostics": True}), True),
        (_additional({"enable_diagnostics": True, "enabled": False}), True),
        (_additional({"enable_diagnostics": True, "bogus": 1}), True),
        (_additional({"enable_diagnostics": "true"}), False),
        (_additional({"enable_diagnostics": 1}), False),
        (_additional({"enable_diagnostics": False}), False),
        (_additional({}), False),
        ({"scheduler_config": {"dyntra_lb_config": [("enable_diagnostics", True)]}}, False),
        ({"scheduler_config": "x"}, False),
        ({"dyntra_lb_config": {"enable_diagnostics": True}}, False),
        ({}, False),
        (None, False),
        ('{"scheduler_config": {"dyntra_lb_config": {"enable_diagnostics": true}}}', False),
    ],
)
def test_diagnostics_enabled(raw, expected):
    assert diagnostics_enabled(raw) is expected


def test_diagnostics_enabled_accepts_loaded_config():
    cfg = load_additional_config(_additional({"enable_diagnostics": True}))
    assert diagnostics_enabled(cfg) is True


# ------------------------------------------- keys vllm-ascend ignores, duplicates (issue 12)


@pytest.mark.parametrize("raw, expected", [
    ({"scheduler_confg": {"dyntra_lb_config": {"enabled": True}}},
     ["additional_config.scheduler_confg: unknown key, which vllm-ascend ignores "
      "(did you mean scheduler_config?)"]),
    ({"scheduler_config": {"dyntra_lb_confg": {"enabled": True}}},
     ["additional_config.scheduler_config.dyntra_lb_confg: unknown key, which vllm-ascend "
      "ignores (did you mean dyntra_lb_config?)"]),
    ({"dyntra_lb_config": {"enabled": True}},
     ["additional_config.dyntra_lb_config: unknown key, which vllm-ascend ignores (it "
      "belongs in additional_config.scheduler_config.dyntra_lb_config)"]),
    ({"DYNTRA_LB_ENABLE": 1},
     ["additional_config.DYNTRA_LB_ENABLE: unknown key, which vllm-ascend ignores"]),
])
def test_keys_vllm_ascend_ignores_are_named_with_the_closest_known_key(raw, expected):
    assert unknown_keys(raw) == expected
    # ... and still ignored, as on vllm-ascend: plain DP.
    assert load_additional_config(raw).dyntra_lb.enabled is False


def test_keys_vllm_ascend_reads_are_not_reported():
    raw = {"enable_shared_expert_dp": True, "eplb_config": {}, "recompute_scheduler_enable":
           False, "scheduler_config": {"dyntra_lb_config": {"enabled": True},
                                       "enable_balance_scheduling": False,
                                       "batch_job_sched_config": {}}}
    assert unknown_keys(raw) == []
    assert unknown_keys(load_additional_config(raw)) == []


@pytest.mark.parametrize("text, path", [
    ('{"scheduler_config": {"dyntra_lb_config": {"enabled": true, "enabled": false}}}',
     "scheduler_config.dyntra_lb_config.enabled"),
    ('{"scheduler_config": {}, "scheduler_config": {"dyntra_lb_config": {}}}',
     "scheduler_config"),
    ('{"eplb_config": {"a": [{"k": 1, "k": 2}]}}', "eplb_config.a[0].k"),
])
def test_a_key_given_twice_at_any_depth_is_an_error_naming_it(text, path):
    with pytest.raises(ValueError, match=re.escape(f"additional_config has the key {path} "
                                                   "twice")):
        load_additional_config(text)
