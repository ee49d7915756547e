"""Step-cost profiles (emu/rank/costs.py): bundled profiles, profile files, the fit."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from emu.cli.main import build_parser
from emu.rank.costs import (
    PROFILES,
    CostProfileError,
    StepCostModel,
    fit,
    load_profile,
    profile_from_dict,
    read_measurements,
    write_profile,
)


def test_default_profile_charges_kv_tokens_whatever_the_block_size():
    model = StepCostModel()
    tokens = 8 * 2048  # 8 requests of 2048 tokens: 128 blocks of 128 or 8 of 2048
    assert model.cost(128, tokens, 8, 8, False) == model.cost(8, tokens, 8, 8, False)
    # at block size 128 it charges what the planner heuristic charges for whole blocks
    heuristic = PROFILES["planner-heuristic"]
    assert model.cost(128, tokens, 8, 8, False) == heuristic.cost(128, tokens, 8, 8, False)
    # ... and the heuristic is 16x cheaper on the same tokens in 2048-token blocks
    assert heuristic.cost(8, tokens, 8, 8, False) < model.cost(8, tokens, 8, 8, False)


def test_bundled_profiles_are_named_and_described():
    assert set(PROFILES) >= {"kv-token", "planner-heuristic", "ascend-qwen3-30b-a3b"}
    for name, profile in PROFILES.items():
        assert profile.name == name
        assert profile.description
    assert replace(PROFILES["kv-token"], description="") == StepCostModel()


def test_profile_file_round_trips(tmp_path):
    profile = StepCostModel(name="node-a", fixed_s=0.031, per_kv_token_s=7e-8,
                            per_scheduled_token_s=1e-6, per_running_request_s=3e-5,
                            description="measured")
    path = tmp_path / "node-a.json"
    write_profile(profile, path)
    assert load_profile(str(path)) == profile


def test_bundled_name_wins_and_unknown_name_is_named():
    assert load_profile("planner-heuristic") is PROFILES["planner-heuristic"]
    with pytest.raises(CostProfileError, match="'nope': not a bundled profile"):
        load_profile("nope")


@pytest.mark.parametrize("data, message", [
    ({"name": "x", "fixed_s": 0.02, "per_kv_tokens_s": 1e-7}, "unknown key 'per_kv_tokens_s'"),
    ({"fixed_s": 0.02}, "key 'name' is missing"),
    ({"name": "x", "fixed_s": -1}, "key 'fixed_s' must be a finite number >= 0"),
    ({"name": "x", "fixed_s": 0.02, "per_kv_token_s": "0.1"}, "key 'per_kv_token_s'"),
    ({"name": "x"}, "fixed_s must be at least 1 microsecond"),
    ([1, 2], "expected a JSON object"),
])
def test_bad_profile_file_names_the_key(tmp_path, data, message):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(CostProfileError, match=message) as info:
        load_profile(str(path))
    assert str(path) in str(info.value)


def test_profile_file_with_invalid_json_names_the_line(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"name": "x",\n "fixed_s": }')
    with pytest.raises(CostProfileError, match=r"bad.json:2: invalid JSON"):
        load_profile(str(path))


def _synthetic(n=400, seed=0, noise_ms=0.0):
    rng = np.random.default_rng(seed)
    running = rng.integers(1, 64, size=n).astype(float)
    kv = running * rng.integers(500, 20_000, size=n)
    scheduled = running * rng.integers(1, 4, size=n)  # not collinear with running
    step_ms = 18.0 + 0.12e-3 * kv + 4e-3 * scheduled + 0.05 * running
    step_ms = step_ms + rng.normal(0.0, noise_ms, size=n) if noise_ms else step_ms
    return np.column_stack([running, kv, scheduled, step_ms])


def test_fit_recovers_known_coefficients():
    result = fit(_synthetic(), "synthetic")
    p = result.profile
    assert p.fixed_s == pytest.approx(0.018, rel=1e-9)
    assert p.per_kv_token_s == pytest.approx(0.12e-6, rel=1e-9)
    assert p.per_scheduled_token_s == pytest.approx(4e-6, rel=1e-9)
    assert p.per_running_request_s == pytest.approx(5e-5, rel=1e-9)
    assert p.per_kv_block_s == 0.0
    assert result.rmse_ms == pytest.approx(0.0, abs=1e-9)
    assert result.r2 == pytest.approx(1.0)


def test_fit_with_noise_reports_its_error():
    result = fit(_synthetic(noise_ms=0.5), "noisy")
    assert result.profile.per_kv_token_s == pytest.approx(0.12e-6, rel=0.02)
    assert 0.4 < result.rmse_ms < 0.6
    assert 0.9 < result.r2 < 1.0


def test_fit_refuses_what_the_data_cannot_tell():
    data = _synthetic()
    data[:, 2] = data[:, 0]  # scheduled tokens == running requests (plain decode)
    with pytest.raises(CostProfileError, match="cannot be told apart"):
        fit(data, "x")
    assert fit(data, "x", ["fixed_s", "per_kv_token_s", "per_running_request_s"]).rows == 400
    with pytest.raises(CostProfileError, match="2 row"):
        fit(data[:2], "x")
    with pytest.raises(CostProfileError, match="unknown term"):
        fit(data, "x", ["fixed_s", "per_kv_blocks_s"])


def test_fit_command_writes_a_loadable_profile(tmp_path, capsys):
    rows = _synthetic(n=50)
    csv_path = tmp_path / "steps.csv"
    csv_path.write_text("step_ms,running_requests,kv_tokens,scheduled_tokens,note\n" + "".join(
        f"{r[3]},{int(r[0])},{int(r[1])},{int(r[2])},x\n" for r in rows))
    out = tmp_path / "node.json"
    args = build_parser().parse_args(["fit-cost", str(csv_path), "--name", "node", "--out",
                                      str(out)])
    assert args.func(args) == 0
    printed = capsys.readouterr().out
    assert "RMSE" in printed and "R^2 1.0000" in printed
    profile = load_profile(str(out))
    assert profile.name == "node"
    assert profile.per_kv_token_s == pytest.approx(0.12e-6, rel=1e-6)


def test_measurements_csv_errors_name_the_place(tmp_path):
    path = tmp_path / "m.csv"
    path.write_text("running_requests,kv_tokens,step_ms\n1,2,3\n")
    with pytest.raises(CostProfileError, match=r"m.csv:1: missing column\(s\) scheduled_tokens"):
        read_measurements(path)
    path.write_text("running_requests,kv_tokens,scheduled_tokens,step_ms\n1,2,3,4\n1,x,3,4\n")
    with pytest.raises(CostProfileError, match=r"m.csv:3: column 'kv_tokens'"):
        read_measurements(path)


def test_profile_from_dict_fills_missing_terms_with_zero():
    p = profile_from_dict({"name": "only-fixed", "fixed_s": 0.01}, "x")
    assert p.cost(100, 10_000, 10, 10, False) == 10_000
