"""Generator workloads and the seed statistics of `ab --seeds` (emu/recipes.py)."""

from __future__ import annotations

import json
import statistics

import pytest

from emu.recipes import mean_ci, parse_recipe, seed_summary, seed_table, write_recipe_trace
from emu.workload import load_trace


def test_parse_recipe():
    # the published request rate, unless the recipe gives its own
    assert parse_recipe("recipe:pr12292") == ("pr12292", {"rate": 400.0})
    assert parse_recipe("recipe:pr12292-gpqa,n=5") == ("pr12292-gpqa", {"n": 5})
    assert parse_recipe("recipe:pr12292,n=40,rate=1.5") == ("pr12292", {"n": 40, "rate": 1.5})
    with pytest.raises(ValueError, match="unknown recipe 'nope'; recipes are: "
                                         "mooncake-like, pr12292, pr12292-gpqa"):
        parse_recipe("recipe:nope")
    with pytest.raises(ValueError, match="'m=3': expected n=N or rate=R"):
        parse_recipe("recipe:pr12292,m=3")
    with pytest.raises(ValueError, match="'n=x': n must be a number"):
        parse_recipe("recipe:pr12292,n=x")


def test_a_recipe_takes_the_parameters_of_its_function():
    assert parse_recipe("recipe:mooncake-like,hours=0.25") == ("mooncake-like",
                                                               {"hours": 0.25})
    assert parse_recipe("recipe:mooncake-like,hours=2,rate=1") == (
        "mooncake-like", {"hours": 2.0, "rate": 1.0})
    with pytest.raises(ValueError, match="'n=5': expected rate=R or hours=H"):
        parse_recipe("recipe:mooncake-like,n=5")
    with pytest.raises(ValueError, match="'hours=1': expected n=N or rate=R"):
        parse_recipe("recipe:pr12292,hours=1")
    # the hours at the recipe's rate (19,700 an hour) past the limit of a trace
    with pytest.raises(ValueError, match="hours=60: 1,182,000 requests at 5.47222/s, past "
                                         "1,000,000"):
        parse_recipe("recipe:mooncake-like,hours=60")
    assert parse_recipe("recipe:mooncake-like,hours=60,rate=1") == (
        "mooncake-like", {"hours": 60.0, "rate": 1.0})


def test_mooncake_like_recipe_trace(tmp_path):
    trace = load_trace(write_recipe_trace("recipe:mooncake-like,hours=0.01", 0,
                                          tmp_path / "mc.jsonl"))
    assert len(trace) == 197 and trace[0].request_id == "mooncake-0000000"


def test_recipe_trace_follows_the_seed(tmp_path):
    a = load_trace(write_recipe_trace("recipe:pr12292,n=30", 4, tmp_path / "a.jsonl"))
    b = load_trace(write_recipe_trace("recipe:pr12292,n=30", 4, tmp_path / "b.jsonl"))
    c = load_trace(write_recipe_trace("recipe:pr12292,n=30", 5, tmp_path / "c.jsonl"))
    assert len(a) == 30 and a == b and a != c


def test_mean_ci_uses_students_t():
    values = [1.0, 2.0, 4.0]
    mean, half = mean_ci(values)
    assert mean == pytest.approx(7 / 3)
    assert half == pytest.approx(4.303 * statistics.stdev(values) / 3 ** 0.5)
    assert mean_ci([5.0, 5.0]) == (5.0, 0.0)


def _m(throughput, time_s, bubble, p50, p99):
    return {"throughput_tok_s": throughput, "virtual_time_s": time_s, "bubble_ratio": bubble,
            "tpot_ms": {"p50": p50, "p99": p99}}


def test_seed_summary_and_table():
    pairs = [(0, _m(100, 10, 0.20, 20, 40), _m(110, 9, 0.10, 19, 36)),
             (1, _m(200, 20, 0.30, 25, 50), _m(206, 19, 0.28, 25, 50))]
    rows = {label: (deltas, ci) for label, deltas, ci in seed_summary(pairs)}
    deltas, (mean, half) = rows["output throughput"]
    assert deltas == pytest.approx([10.0, 3.0]) and mean == pytest.approx(6.5)
    assert half == pytest.approx(12.706 * statistics.stdev([10.0, 3.0]) / 2 ** 0.5)
    assert rows["DP bubble ratio (points)"][0] == pytest.approx([-10.0, -2.0])
    table = seed_table(pairs)
    assert "seed 0" in table and "seed 1" in table
    assert "+6.50 ± " in table and "-6.00 ± " in table and "-10.00 pp" in table


def test_seed_summary_with_a_missing_value():
    pairs = [(0, _m(None, 10, 0.2, 20, 40), _m(110, 9, 0.1, 19, 36)),
             (1, _m(200, 20, 0.3, 25, 50), _m(206, 19, 0.28, 25, 50))]
    rows = {label: (deltas, ci) for label, deltas, ci in seed_summary(pairs)}
    assert rows["output throughput"] == ([], None)
    assert rows["duration (virtual time)"][1] is not None


def _gpqa_spec(**fields):
    from dyntra_lb.config import load_additional_config
    from emu.rank.costs import load_profile
    from emu.recipes import generator
    from emu.spec import RunSpec

    setup = dict(generator().RECIPE_SETUPS["pr12292-gpqa"])
    setup["cost_model"] = load_profile(setup["cost_model"])
    setup["additional_config"] = json.dumps(setup["additional_config"])
    setup["impl"] = "vllm-ascend"
    setup.update(fields)
    spec = RunSpec(trace=[], dp_size=8, out_dir="x", **setup)
    return spec, load_additional_config(spec.additional_config)


def test_setup_hint_names_what_differs_from_the_published_run():
    from emu.recipes import setup_hint

    spec, _ = _gpqa_spec()
    assert setup_hint("recipe:pr12292-gpqa", spec) is None  # as published
    assert "--block-size 2048" in setup_hint("recipe:pr12292", spec)  # another setup
    assert setup_hint("longtail", spec) is None
    spec, _ = _gpqa_spec(max_concurrency=None, max_num_seqs=16, router="round_robin")
    hint = setup_hint("recipe:pr12292-gpqa,n=50", spec)
    assert hint.startswith("hint: recipe:pr12292-gpqa rebuilds a published run; its setup "
                           "adds --max-concurrency 128 --max-num-seqs 256 --router vllm ")
    assert "--block-size" not in hint and "--async-scheduling" not in hint


def test_setup_hint_names_async_scheduling_when_turned_off():
    from emu.recipes import setup_hint

    spec, _ = _gpqa_spec(impl="kit", async_scheduling=False)
    assert setup_hint("recipe:pr12292-gpqa", spec).endswith(
        "adds --async-scheduling (docs/fidelity.md: what is published, cited or assumed)")
