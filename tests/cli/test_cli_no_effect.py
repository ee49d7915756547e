""""Why nothing happened" and the headroom line through the real `dyntra-emu`
(subprocess, dp=2 clusters): a dynamic-mode run whose prompts never exceed
long_req_block_threshold says so with the numbers, one that has such a prompt does not,
and `validate` warns about it before anything runs."""

from __future__ import annotations

import json


def _dynamic(threshold: int) -> str:
    return json.dumps({"scheduler_config": {"dyntra_lb_config": {
        "enabled": True, "mode": "dynamic", "start_step": 0,
        "long_req_block_threshold": threshold, "dynamic_max_step": 8}}})


# The tiny trace's largest prompt: 340 tokens = 22 blocks of 16.
NOTE = ("DyntraLB generated no plan: dynamic mode never activated: the largest prompt is "
        "22 blocks (340 tokens at block size 16)")


def test_dynamic_run_without_long_requests_says_why(cli, tiny_trace, tmp_path, clikit):
    out = tmp_path / "quiet"
    proc = cli("run", "--workload", tiny_trace, *clikit.SMALL, "--quiet", "--out", out,
               "--additional-config", _dynamic(30))
    assert proc.returncode == 0, proc.stderr
    assert f"note: {NOTE}" in proc.stdout
    assert "long_req_block_threshold = 30 blocks" in proc.stdout
    assert "### Why nothing happened" in (out / "summary.md").read_text()
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["lb_activity"]["planner_steps"] == 0
    assert metrics["plan_churn"]["active_steps"] == 0


def test_dynamic_run_with_a_long_request_has_no_note(cli, tiny_trace, tmp_path, clikit):
    out = tmp_path / "active"
    proc = cli("run", "--workload", tiny_trace, *clikit.SMALL, "--quiet", "--out", out,
               "--additional-config", _dynamic(5))
    assert proc.returncode == 0, proc.stderr
    assert "note:" not in proc.stdout
    assert "Why nothing happened" not in (out / "summary.md").read_text()
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["lb_activity"]["planner_steps"] > 0


def test_ab_reports_headroom_and_the_note(cli, tiny_trace, tmp_path, clikit):
    out = tmp_path / "ab"
    proc = cli("ab", "--workload", tiny_trace, *clikit.SMALL, "--quiet", "--out", out,
               "--additional-config", _dynamic(30))
    assert proc.returncode == 0, proc.stderr
    a = json.loads((out / "a" / "metrics.json").read_text())
    bound = a["headroom"]["sol_throughput_tok_s"]
    assert bound >= a["throughput_tok_s"]
    assert (f"Headroom: perfectly balanced, the steps of DyntraLB off would give {bound:.1f} "
            "tok/s") in proc.stdout
    assert "headroom.sol_throughput_tok_s" in proc.stdout  # in the full A/B table
    assert f"note (DyntraLB on): {NOTE}" in proc.stdout
    assert "note (DyntraLB off)" not in proc.stdout
    summary = (out / "summary.md").read_text()
    assert "Headroom:" in summary and f"(DyntraLB on) {NOTE}" in summary


def test_validate_warns_before_a_run(cli, tiny_trace, clikit):
    proc = cli("validate", "--workload", tiny_trace, *clikit.SMALL,
               "--additional-config", _dynamic(30))
    assert proc.returncode == 0, proc.stderr
    assert ("warning: DyntraLB will generate no plan: dynamic mode never activated: the "
            "largest prompt is 22 blocks") in proc.stdout
    assert proc.stdout.rstrip().splitlines()[-1].startswith("OK:")
    proc = cli("validate", "--workload", tiny_trace, *clikit.SMALL,
               "--additional-config", _dynamic(5))
    assert proc.returncode == 0 and "warning" not in proc.stdout
