"""`--cost-model` and `fit-cost` through the real `dyntra-emu` (subprocess): the profile
decides the virtual time, is recorded in metrics.json and summary.md, and bad profiles
are one clear error before anything starts."""

from __future__ import annotations

import json


def _run(cli, trace, out, clikit, *extra):
    proc = cli("run", "--workload", trace, *clikit.SMALL, "--no-dyntra-lb", "--quiet",
               "--out", out, *extra)
    assert proc.returncode == 0, proc.stderr
    return json.loads((out / "metrics.json").read_text())


def test_kv_token_profile_does_not_depend_on_the_block_size(cli, tiny_trace, tmp_path,
                                                            clikit):
    # Plain DP with plenty of KV: the block size changes nothing but the block counts.
    small = [a for a in clikit.SMALL if a not in ("--block-size", "16")]
    runs = {}
    for profile in ("kv-token", "planner-heuristic"):
        for block_size in (16, 64):
            out = tmp_path / f"{profile}-{block_size}"
            proc = cli("run", "--workload", tiny_trace, *small, "--block-size", block_size,
                       "--no-dyntra-lb", "--quiet", "--out", out, "--cost-model", profile)
            assert proc.returncode == 0, proc.stderr
            runs[profile, block_size] = json.loads((out / "metrics.json").read_text())
    assert runs["kv-token", 16]["busy_time_s"] == runs["kv-token", 64]["busy_time_s"]
    # the planner's heuristic charges whole blocks: fewer, larger blocks are cheaper
    assert (runs["planner-heuristic", 64]["busy_time_s"]
            < runs["planner-heuristic", 16]["busy_time_s"])
    recorded = runs["planner-heuristic", 16]["config"]["cost_model"]
    assert recorded["name"] == "planner-heuristic"
    assert recorded["per_kv_block_s"] == 19.2e-6
    assert "| cost model | planner-heuristic |" in (
        tmp_path / "planner-heuristic-16" / "summary.md").read_text()


def test_profile_file_from_fit_cost_drives_a_run(cli, tiny_trace, tmp_path, clikit):
    csv_path = tmp_path / "steps.csv"
    csv_path.write_text("running_requests,kv_tokens,scheduled_tokens,step_ms\n"
                        "1,1000,1,50.1\n2,2000,2,50.2\n4,4000,4,50.4\n8,9000,8,50.9\n")
    proc = cli("fit-cost", csv_path, "--name", "slow-node", "--terms",
               "fixed_s,per_kv_token_s", "--out", tmp_path / "slow.json")
    assert proc.returncode == 0, proc.stderr
    assert "RMSE" in proc.stdout and "R^2 1.0000" in proc.stdout
    profile = json.loads((tmp_path / "slow.json").read_text())
    assert abs(profile["fixed_s"] - 0.050) < 1e-9
    default = _run(cli, tiny_trace, tmp_path / "default", clikit)
    slow = _run(cli, tiny_trace, tmp_path / "slow", clikit, "--cost-model",
                tmp_path / "slow.json")
    assert slow["config"]["cost_model"]["name"] == "slow-node"
    assert slow["steps"] == default["steps"]
    assert slow["busy_time_s"] > 2 * default["busy_time_s"]  # 50 ms steps instead of ~20


def test_bad_profiles_are_usage_errors(cli, tiny_trace, tmp_path, clikit):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"name": "x", "fixed_s": 0.02, "per_block_s": 1e-5}))
    out = tmp_path / "out"
    proc = cli("run", "--workload", tiny_trace, *clikit.SMALL, "--out", out,
               "--cost-model", bad)
    clikit.assert_user_error(proc, f"--cost-model {bad}: unknown key 'per_block_s'")
    assert not out.exists()
    proc = cli("ab", "--workload", tiny_trace, *clikit.SMALL, "--cost-model", "fast")
    clikit.assert_user_error(proc, "--cost-model 'fast': not a bundled profile")
    proc = cli("fit-cost", tmp_path / "missing.csv")
    clikit.assert_user_error(proc, "missing.csv: cannot read")
