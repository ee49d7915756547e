"""Fuzz the config parser: whatever JSON-like value a user passes, the only exception that
escapes is ValueError (a clear rejection), never a crash of another type."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dyntra_lb.config import (
    AdditionalConfig,
    DyntraLBConfig,
    check_deployment,
    diagnostics_enabled,
    load_additional_config,
)

DYNTRA_KEYS = [
    "enabled",
    "enable_diagnostics",
    "mode",
    "start_step",
    "end_step",
    "bubble_threshold",
    "long_req_block_threshold",
    "dynamic_max_step",
]
SCHEDULER_KEYS = [
    "dyntra_lb_config",
    "enable_balance_scheduling",
    "recompute_scheduler_enable",
    "profiling_chunk_config",
    "batch_job_sched_config",
    "short_request_first_config",
]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-3, max_value=300),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.sampled_from(["static", "dynamic", "true", "1", ""]),
    st.integers(min_value=10**300, max_value=10**320),
)
json_values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.text(max_size=6), children, max_size=4),
    ),
    max_leaves=12,
)
dyntra_dicts = st.dictionaries(
    st.one_of(st.sampled_from(DYNTRA_KEYS), st.text(max_size=4)), json_values, max_size=9
)
# Mostly valid blocks, so that the startup checks after parsing get exercised too.
plausible_dyntra = st.fixed_dictionaries(
    {"enabled": st.booleans()},
    optional={
        "enable_diagnostics": st.one_of(st.booleans(), json_values),
        "mode": st.sampled_from(["static", "dynamic", "other"]),
        "start_step": st.integers(min_value=-1, max_value=20),
        "end_step": st.integers(min_value=-2, max_value=40),
        "bubble_threshold": st.one_of(st.floats(), st.integers(-1, 10)),
        "long_req_block_threshold": st.integers(min_value=0, max_value=1000),
        "dynamic_max_step": st.integers(min_value=0, max_value=300),
    },
)
sub_configs = st.one_of(
    st.fixed_dictionaries({"enabled": st.booleans()}),
    json_values,
    st.dictionaries(st.sampled_from(["enabled", "x"]), json_values, max_size=2),
)
scheduler_dicts = st.fixed_dictionaries(
    {},
    optional={
        "dyntra_lb_config": st.one_of(plausible_dyntra, dyntra_dicts, json_values),
        "enable_balance_scheduling": st.one_of(st.booleans(), json_values),
        "recompute_scheduler_enable": st.one_of(st.booleans(), json_values),
        "profiling_chunk_config": sub_configs,
        "batch_job_sched_config": sub_configs,
        "short_request_first_config": sub_configs,
        "other": json_values,
    },
)
additional_configs = st.one_of(
    json_values,
    st.fixed_dictionaries(
        {},
        optional={
            "scheduler_config": st.one_of(scheduler_dicts, scheduler_dicts, json_values),
            "enable_balance_scheduling": json_values,
            "recompute_scheduler_enable": json_values,
            "dyntra_lb_config": json_values,
        },
    ),
)
enabled_only = st.fixed_dictionaries({"enabled": st.booleans()})
plausible_scheduler = st.fixed_dictionaries(
    {"dyntra_lb_config": plausible_dyntra},
    optional={
        "enable_balance_scheduling": st.booleans(),
        "recompute_scheduler_enable": st.booleans(),
        "profiling_chunk_config": enabled_only,
        "batch_job_sched_config": enabled_only,
        "short_request_first_config": enabled_only,
    },
)
additional_configs = st.one_of(
    additional_configs,
    st.fixed_dictionaries({"scheduler_config": plausible_scheduler}),
    st.fixed_dictionaries(
        {"scheduler_config": plausible_scheduler},
        optional={"enable_balance_scheduling": st.booleans(), "extra": json_values},
    ),
)
deployments = st.fixed_dictionaries(
    {
        "kv_role": st.sampled_from([None, "kv_consumer", "kv_producer", "kv_both"]),
        "data_parallel_size": st.integers(min_value=0, max_value=8),
        "nnodes_within_dp": st.integers(min_value=1, max_value=3),
        "async_scheduling": st.booleans(),
    }
)

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(dyntra_dicts)
def test_from_dict_only_raises_value_error(d):
    try:
        cfg = DyntraLBConfig.from_dict(d)
    except ValueError:
        return
    assert isinstance(cfg.bubble_threshold, float)
    assert cfg.mode in ("static", "dynamic")


@FUZZ
@given(json_values)
def test_from_dict_any_value(value):
    try:
        DyntraLBConfig.from_dict(value)
    except ValueError:
        pass


@FUZZ
@given(additional_configs, deployments)
def test_load_and_check_only_raise_value_error(raw, deployment):
    try:
        cfg = load_additional_config(raw)
    except ValueError:
        cfg = None
    if cfg is not None:
        assert isinstance(cfg, AdditionalConfig)
        for attr in (
            "enable_balance_scheduling",
            "recompute_scheduler_enable",
            "profiling_chunk_enabled",
            "batch_job_sched_enabled",
            "short_request_first_enabled",
        ):
            assert isinstance(getattr(cfg, attr), bool)
        try:
            variant = check_deployment(cfg, **deployment)
        except ValueError:
            pass
        else:
            assert variant in ("plain", "async", "recompute", "async_recompute")
    assert isinstance(diagnostics_enabled(raw), bool)


@FUZZ
@given(additional_configs, deployments)
def test_json_text_same_outcome_as_dict(raw, deployment):
    """The JSON text of a value parses like the value itself."""
    text = json.dumps(raw)
    try:
        from_text = load_additional_config(text)
    except ValueError:
        from_text = None
    if not isinstance(raw, dict) and raw is not None:
        return
    try:
        from_value = load_additional_config(raw)
    except ValueError:
        from_value = None
    if raw is None:  # JSON null is not an object: rejected as text, defaults as None
        assert from_text is None
        return
    if from_value is None or from_text is None:
        assert from_value is None and from_text is None
        return
    assert repr(from_text.dyntra_lb) == repr(from_value.dyntra_lb)
    try:
        check_deployment(text, **deployment)
    except ValueError:
        pass


@FUZZ
@given(st.text(max_size=60))
def test_arbitrary_text_only_raises_value_error(text):
    try:
        load_additional_config(text)
    except ValueError:
        pass


@FUZZ
@given(st.text(alphabet='{}[]":,0123456789 \ntruefalsnNI-.e', max_size=40))
def test_json_like_text_only_raises_value_error(text):
    try:
        load_additional_config(text)
    except ValueError:
        pass


def test_deep_nesting_is_a_value_error():
    with pytest.raises(ValueError) as info:
        load_additional_config("[" * 100_000 + "]" * 100_000)
    assert str(info.value) == "additional_config is not valid JSON: nested too deeply."


def test_integer_beyond_digit_limit_is_a_value_error():
    with pytest.raises(ValueError, match=r"^additional_config is not valid JSON: "):
        load_additional_config('{"scheduler_config": ' + "1" * 5000 + "}")
