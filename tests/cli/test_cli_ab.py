"""`dyntra-emu ab`: two real cluster runs and their side-by-side report."""

from __future__ import annotations

import json
import re

import pytest

from tests.records import events

pytestmark = pytest.mark.integration

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_ab_off_against_default_config(cli, tiny_trace, tmp_path, clikit):
    out = tmp_path / "ab"

    # The console script in its own process, as the README's main job runs it.
    proc = cli("ab", "--workload", tiny_trace, *clikit.SMALL, "--seed", "3", "--out", out,
               process=True)

    assert proc.returncode == 0, proc.stderr
    assert "A (DyntraLB off): 2 ranks" in proc.stderr
    assert "B (DyntraLB on): 2 ranks" in proc.stderr
    lines = proc.stdout.splitlines()
    # The header says which scheduling mode ran: vLLM's default for the node.
    assert lines[0] == "Scheduling: async in both runs"
    lines = lines[1:]
    # The table: a header, a rule, one row per metric up to the first blank line.
    header = re.split(r"\s{2,}", lines[0].strip())
    assert header == ["metric", "DyntraLB off", "DyntraLB on", "delta", "delta %"]
    table = lines[2:lines.index("")]
    rows = {line.split()[0]: line.split() for line in table}
    assert all(len(row) == 5 for row in rows.values()), table
    # Wall-clock figures are noise between runs: apart, and without a delta.
    assert not any(name.startswith("wall") for name in rows)
    wall = lines.index("Wall-clock time of the emulator itself (measured, varies between "
                       "runs; not compared):")
    assert re.split(r"\s{2,}", lines[wall + 1].strip()) == ["wall-clock", "DyntraLB off",
                                                            "DyntraLB on"]
    # Every metric, with absolute and relative deltas.
    for name in ("throughput_tok_s", "bubble_ratio", "balance_ratio", "tpot_ms.p99",
                 "ttft_ms.p50", "itl_ms.p90", "e2e_ms.mean", "plan_churn.active_steps",
                 "pauses.total", "per_rank.1.utilisation"):
        assert name in rows, name
    assert rows["requests_finished"][1:3] == ["10", "10"]
    assert rows["requests_finished"][3] == "+0"
    assert rows["plan_churn.active_steps"][1] == "0"
    assert int(rows["plan_churn.active_steps"][2]) > 0
    assert "Key metrics, DyntraLB off -> DyntraLB on:" in proc.stdout
    # DyntraLB's control plane: nothing for A; B ran its collectives and planner, but under
    # async scheduling all of it overlaps the forward in flight, so nothing is charged
    # (the synchronous charge and the headroom line net of it: test_engine_control_plane)
    control_b = json.loads((out / "b" / "metrics.json").read_text())["control_plane"]
    assert control_b["collectives_s"] > 0 and control_b["total_s"] == 0
    assert float(rows["control_plane.total_s"][1]) == 0
    assert re.search(r"DyntraLB control plane \(s\)\s+0\.000 -> 0\.000", proc.stdout)

    metrics_a = json.loads((out / "a" / "metrics.json").read_text())
    metrics_b = json.loads((out / "b" / "metrics.json").read_text())
    assert metrics_a["seed"] == metrics_b["seed"] == 3
    off = {"scheduler_config": {"dyntra_lb_config": {
        **clikit.STATIC["scheduler_config"]["dyntra_lb_config"], "enabled": False}}}
    assert metrics_a["config"]["additional_config"] == off
    assert metrics_b["config"]["additional_config"] == clikit.STATIC
    for run in ("a", "b"):
        assert (out / run / "rank1.steps").exists()
    for png in ("load_ab.png", "bubble_ab.png", "tpot_ab.png"):
        assert (out / png).read_bytes()[:8] == PNG_MAGIC, png
    summary = (out / "summary.md").read_text()
    assert "A = `DyntraLB off`, B = `DyntraLB on`" in summary
    assert "](bubble_ab.png)" in summary


def test_ab_two_configs(cli, tiny_trace, tmp_path, clikit):
    dynamic = {"scheduler_config": {"dyntra_lb_config": {
        "enabled": True, "mode": "dynamic", "start_step": 0, "long_req_block_threshold": 5}}}
    path = tmp_path / "dynamic.json"
    path.write_text(json.dumps(dynamic))
    out = tmp_path / "modes"

    proc = cli("ab", "--workload", tiny_trace, *clikit.SMALL, "--quiet", "--out", out,
               "--config-a", json.dumps(clikit.STATIC), "--config-b", f"@{path}")

    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert proc.stdout.splitlines()[1].split()[:3] == ["metric", "A", "B"]
    metrics_b = json.loads((out / "b" / "metrics.json").read_text())
    assert metrics_b["config"]["additional_config"] == dynamic


def test_ab_over_workload_seeds(ab_over_seeds):
    """--seeds N with a generated workload: N A/B pairs on N different traces, each delta
    per seed and as a mean with its confidence interval."""
    # The recipe's long request decodes 4,096 tokens: four runs of it on rank threads
    # (byte-identical to rank processes, tests/integration/test_transport_thread.py).
    proc, out = ab_over_seeds
    assert proc.returncode == 0, proc.stderr
    assert "B vs A on 2 seeds of recipe:pr12292,n=6,rate=20" in proc.stdout
    assert "seed 3" in proc.stdout and "seed 4" in proc.stdout
    assert "mean ± 95 % CI" in proc.stdout
    traces = []
    for seed in (3, 4):
        a = json.loads((out / f"seed{seed}" / "a" / "metrics.json").read_text())
        b = json.loads((out / f"seed{seed}" / "b" / "metrics.json").read_text())
        assert a["seed"] == b["seed"] == seed
        assert a["config"]["workload"] == b["config"]["workload"]
        traces.append(a["output_tokens"])
        assert b["plan_churn"]["active_steps"] > 0  # B is static from step 0
    assert traces[0] != traces[1]  # different seeds, different traces
    assert "mean ± 95 % CI" in (out / "summary.md").read_text()
    # every metric over the seeds: each side's mean and B's change, from the runs' metrics
    every = {row["metric"]: row for row in json.loads((out / "ab.json").read_text())["metrics"]}
    runs = {(seed, side): json.loads((out / f"seed{seed}" / side / "metrics.json").read_text())
            for seed in (3, 4) for side in "ab"}
    for metric, path in (("throughput_tok_s", ("throughput_tok_s",)),
                         ("tpot_ms.p99", ("tpot_ms", "p99")),
                         ("pauses.total", ("pauses", "total"))):
        values = {}
        for key, m in runs.items():
            for part in path:
                m = m[part]
            values[key] = m
        row = every[metric]
        assert row["a_mean"] == pytest.approx((values[3, "a"] + values[4, "a"]) / 2)
        assert row["b_mean"] == pytest.approx((values[3, "b"] + values[4, "b"]) / 2)
        deltas = [values[s, "b"] - values[s, "a"] for s in (3, 4)]
        assert row["delta"] == pytest.approx(sum(deltas) / 2)
        assert row["delta_ci95"] == pytest.approx(12.706 * abs(deltas[0] - deltas[1]) / 2)
    assert "Every metric, mean over the 2 seeds" in proc.stdout
    assert re.search(r"^throughput_tok_s\s", proc.stdout, re.M)
    assert "Headroom over 2 seeds: " in proc.stdout
    for seed in (3, 4):
        for plot in ("load_ab.png", "bubble_ab.png", "tpot_ab.png"):
            assert (out / f"seed{seed}" / plot).read_bytes()[:8] == PNG_MAGIC


def test_ab_seeds_needs_a_generated_workload(cli, tiny_trace, clikit):
    proc = cli("ab", "--workload", tiny_trace, *clikit.SMALL, "--seeds", "3")
    clikit.assert_user_error(proc, "--seeds 3: needs a generated workload")
    proc = cli("ab", "--workload", "recipe:pr12292,n=4", *clikit.SMALL, "--seeds", "1")
    clikit.assert_user_error(proc, "--seeds: ")


def test_planner_b_compares_two_planners_on_the_same_config(cli, tiny_trace, tmp_path, clikit):
    out = tmp_path / "planners"

    proc = cli("ab", "--workload", tiny_trace, *clikit.SMALL, "--planner-b", "fill-protect",
               "--transport", "thread", "--quiet", "--out", out)

    assert proc.returncode == 0, proc.stderr
    a, b = (json.loads((out / side / "metrics.json").read_text())["config"]
            for side in ("a", "b"))
    assert (a["planner"], b["planner"]) == ("reference", "fill-protect")
    assert a["additional_config"] == b["additional_config"]
    assert a["additional_config"]["scheduler_config"]["dyntra_lb_config"]["enabled"] is True
    # both runs balanced: plans were made on each side
    for side in ("a", "b"):
        steps = events(out / side, 0)
        assert any(s.get("plan_generated") for s in steps if s["kind"] == "step"), side
    assert "planner reference -> planner fill-protect" in proc.stdout


def test_planner_b_is_checked_before_run_a_starts(cli, tiny_trace, tmp_path, clikit):
    out = tmp_path / "bad"

    proc = cli("ab", "--workload", tiny_trace, *clikit.SMALL, "--planner-b", "vllm-ascend",
               "--out", out)

    clikit.assert_user_error(proc, "--planner-b vllm-ascend: only with --impl vllm-ascend")
    assert not out.exists()


def _one_error_line(proc) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


def test_a_tree_ab_is_refused_in_one_line_before_anything_runs(cli, tiny_trace, tmp_path,
                                                               clikit):
    """--vllm-ascend-a/-b: both, with --impl vllm-ascend, alone with what else could make
    the two runs differ, each a vllm-ascend tree; else one line, exit 2, no output."""
    out = tmp_path / "refused"
    not_a_tree = tmp_path / "not-a-tree"
    not_a_tree.mkdir()
    base = ["ab", "--workload", tiny_trace, *clikit.SMALL, "--out", out]
    va = ["--impl", "vllm-ascend"]
    cases = [
        ([*va, "--vllm-ascend-a", not_a_tree], "--vllm-ascend-b: required with "
                                               "--vllm-ascend-a"),
        ([*va, "--vllm-ascend-b", not_a_tree], "--vllm-ascend-a: required with "
                                               "--vllm-ascend-b"),
        (["--vllm-ascend-a", not_a_tree, "--vllm-ascend-b", not_a_tree],
         "--vllm-ascend-a: needs --impl vllm-ascend (the trees are vllm-ascend's code; "
         "--impl kit runs ours)"),
        ([*va, "--vllm-ascend-a", not_a_tree, "--vllm-ascend-b", not_a_tree,
          "--planner-b", "reference"], "--planner-b: not allowed with --vllm-ascend-a/"),
        ([*va, "--vllm-ascend-a", not_a_tree, "--vllm-ascend-b", not_a_tree,
          "--config-a", "{}", "--config-b", "{}"], "--config-a: not allowed with "),
        ([*va, "--vllm-ascend", not_a_tree, "--vllm-ascend-a", not_a_tree,
          "--vllm-ascend-b", not_a_tree], "--vllm-ascend: not allowed with "),
        ([*va, "--vllm-ascend-a", not_a_tree, "--vllm-ascend-b", tmp_path / "missing"],
         f"--vllm-ascend-a: {not_a_tree} is not a vllm-ascend source tree"),
    ]
    for flags, message in cases:
        proc = cli(*base, *flags)
        clikit.assert_user_error(proc, message)
        assert _one_error_line(proc), flags
        assert not out.exists(), flags
