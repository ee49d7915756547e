"""`dyntra-emu validate`: every problem listed, exit 1; an OK line and exit 0 otherwise.
Nothing is started."""

from __future__ import annotations

import json

import pytest


def test_defaults_are_valid(cli):
    proc = cli("validate")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("OK: the default config (DyntraLB static mode from step 0) "
                                  "and workload default (300 requests) are valid for dp=4")


def test_own_trace_and_config_are_valid(cli, tiny_trace, clikit):
    proc = cli("validate", "--workload", tiny_trace, "--dp", "2", "--additional-config",
               json.dumps(clikit.STATIC))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("OK: --additional-config (DyntraLB static mode")
    assert "(10 requests) are valid for dp=2" in proc.stdout


def test_every_problem_is_listed(cli, tmp_path, clikit):
    lines = [
        '{"request_id": "a", "arrival_s": 0, "prompt_tokens": 3.0, "output_tokens": 5}',
        '{"request_id": "a", "arrival_s": 1, "prompt_tokens": 3, "output_tokens": 5}',
        "",
        '{"request_id": "c", "arrival_s": 0.5, "prompt_tokens": 9, "output_tokens": 5, '
        '"rank": 2}',
        "not json",
    ]
    trace = tmp_path / "bad.jsonl"
    trace.write_text("\n".join(lines) + "\n")
    config = '{"scheduler_config": {"dyntra_lb_config": {"enabled": true, "mode": "fast"}}}'

    proc = cli("validate", "--workload", trace, "--dp", "2", "--additional-config", config)

    assert proc.returncode == 1
    problems = [ln for ln in proc.stdout.splitlines() if ln.startswith("problem: ")]
    expected = [
        "--additional-config: dyntra_lb_config.mode must be one of ['dynamic', 'static'], "
        "got 'fast'.",
        f"{trace}:1: field 'prompt_tokens': expected an integer >= 1, got 3.0",
        f"{trace}:2: field 'request_id': duplicate id 'a' (first used on line 1)",
        f"{trace}:4: field 'rank': expected an integer in 0..1 for dp_size=2, got 2",
        f"{trace}:4: field 'arrival_s': arrivals must be non-decreasing",
        f"{trace}:5: invalid JSON",
    ]
    for fragment in expected:
        assert any(fragment in p for p in problems), (fragment, problems)
    assert len(problems) == len(expected)
    assert proc.stdout.rstrip().endswith(f"{len(expected)} problem(s) found")
    assert "Traceback" not in proc.stderr


def test_problems_that_depend_on_the_cluster_size(cli, tmp_path, clikit):
    """dp=1 with DyntraLB on, and a request larger than a rank's KV pool."""
    trace = clikit.write_trace(tmp_path / "big.jsonl", [
        {"request_id": "small", "arrival_s": 0, "prompt_tokens": 10, "output_tokens": 5},
        {"request_id": "huge", "arrival_s": 0, "prompt_tokens": 5000, "output_tokens": 100}])

    proc = cli("validate", "--workload", trace, "--dp", "1", "--block-size", "16",
               "--num-gpu-blocks", "100")

    assert proc.returncode == 1
    assert ("problem: --dp 1: DyntraLB requires data_parallel_size > 1. DyntraLB is enabled "
            "by the default config; use --dp 2 or more") in proc.stdout
    assert (f"problem: {trace}:2: request 'huge' needs 319 KV blocks (5000 prompt + 100 "
            "output tokens, --block-size 16) but a rank has --num-gpu-blocks 100") in proc.stdout
    assert "2 problem(s) found" in proc.stdout


def test_unreadable_config_file_and_bad_trace_both_reported(cli, tmp_path, clikit):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"request_id": "a", "arrival_s": 0, "prompt_tokens": 1}\n')

    proc = cli("validate", "--workload", trace, "--additional-config", "@missing.json")

    assert proc.returncode == 1
    assert "problem: --additional-config @missing.json: cannot read missing.json" in proc.stdout
    assert f"problem: {trace}:1: field 'output_tokens': missing (required)" in proc.stdout


def _typo(key_path: list[str]) -> str:
    """The DyntraLB-enabling config with its keys spelled as in key_path."""
    return json.dumps({key_path[0]: {key_path[1]: {"enabled": True}}})


def test_a_misspelled_config_key_is_a_problem_not_plain_dp(cli, tiny_trace):
    for path, fragment in [
        (["scheduler_confg", "dyntra_lb_config"],
         "additional_config.scheduler_confg: unknown key, which vllm-ascend ignores (did "
         "you mean scheduler_config?)"),
        (["scheduler_config", "dyntra_lb_confg"],
         "additional_config.scheduler_config.dyntra_lb_confg: unknown key, which "
         "vllm-ascend ignores (did you mean dyntra_lb_config?)"),
    ]:
        proc = cli("validate", "--dp", "2", "--workload", tiny_trace, "--additional-config",
                   _typo(path))
        assert proc.returncode == 1, proc.stdout
        assert f"problem: --additional-config: {fragment}" in proc.stdout
        assert "OK" not in proc.stdout


def test_a_duplicate_config_key_is_a_problem(cli, tiny_trace):
    text = '{"scheduler_config": {"dyntra_lb_config": {"enabled": true, "enabled": false}}}'
    proc = cli("validate", "--dp", "2", "--workload", tiny_trace, "--additional-config", text)
    assert proc.returncode == 1, proc.stdout
    assert ("problem: --additional-config: additional_config has the key "
            "scheduler_config.dyntra_lb_config.enabled twice") in proc.stdout
    proc = cli("run", "--dp", "2", "--workload", tiny_trace, "--additional-config", text)
    assert proc.returncode == 2 and "enabled twice" in proc.stderr


def test_run_warns_about_a_misspelled_key_and_runs_as_vllm_ascend_would(
        cli, tiny_trace, tmp_path, clikit):
    out = tmp_path / "typo"
    proc = cli("run", "--workload", tiny_trace, *clikit.SMALL, "--quiet", "--out", out,
               "--additional-config", _typo(["scheduler_config", "dyntra_lb_confg"]))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == (
        "dyntra-emu run: warning: --additional-config: additional_config.scheduler_config."
        "dyntra_lb_confg: unknown key, which vllm-ascend ignores (did you mean "
        "dyntra_lb_config?)\n")
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["plan_churn"]["active_steps"] == 0  # plain DP, as on the node


def test_ab_names_the_misspelled_key_when_nothing_enables_dyntra_lb(cli, tiny_trace, clikit):
    proc = cli("ab", "--workload", tiny_trace, *clikit.SMALL, "--additional-config",
               _typo(["scheduler_confg", "dyntra_lb_config"]))
    clikit.assert_user_error(proc, "does not enable DyntraLB",
                             "additional_config.scheduler_confg: unknown key, which "
                             "vllm-ascend ignores (did you mean scheduler_config?)")


def test_the_command_line_and_a_python_caller_are_refused_by_the_same_rules(
        cli, tmp_path, clikit):
    """The same RunSpec problems, each with its field (and the request or fault it is
    about), worded once with the flags and file:line and once in RunSpec's terms."""
    from emu.faults import FaultPlan
    from emu.spec import RunSpec, SpecError, check
    from emu.workload import load_trace

    trace = clikit.write_trace(tmp_path / "t.jsonl", [
        {"request_id": "small", "arrival_s": 0, "prompt_tokens": 10, "output_tokens": 5},
        {"request_id": "big", "arrival_s": 0, "prompt_tokens": 4000, "output_tokens": 96}])
    proc = cli("validate", "--workload", trace, "--dp", "2", "--block-size", "16",
               "--num-gpu-blocks", "64", "--planner", "vllm-ascend", "--fault",
               "kill:rank=3,step=1", "--fault", "kv_fail:request=nope")
    with pytest.raises(SpecError) as info:
        check(RunSpec(trace=load_trace(trace), dp_size=2, out_dir=tmp_path, block_size=16,
                      num_gpu_blocks=64, planner="vllm-ascend",
                      additional_config=clikit.STATIC,
                      faults=FaultPlan.of(["kill:rank=3,step=1", "kv_fail:request=nope"])))

    assert proc.returncode == 1
    assert [(p.field, p.index) for p in info.value.problems] == [
        ("trace", 1), ("planner", None), ("faults", 0), ("faults", 1)]
    planner = ("only with {} (the kit runs the planners of dyntra_lb/planner/registry.py: "
               "reference, fill-protect)")
    big = ("request 'big' needs 256 KV blocks (4000 prompt + 96 output tokens, {}) but a "
           "rank has {}; it could never run")
    assert proc.stdout.splitlines() == [
        f"problem: {trace}:2: " + big.format("--block-size 16", "--num-gpu-blocks 64"),
        "problem: --planner vllm-ascend: " + planner.format("--impl vllm-ascend"),
        "problem: --fault kill:rank=3,step=1: rank 3 is not a rank of this cluster "
        "(dp_size=2)",
        "problem: --fault kv_fail:request=nope: request 'nope' is not in the trace",
        "4 problem(s) found"]
    assert [str(p) for p in info.value.problems] == [
        "RunSpec.trace[1]: " + big.format("block_size=16", "num_gpu_blocks=64"),
        "RunSpec.planner='vllm-ascend': " + planner.format("impl='vllm-ascend'"),
        "RunSpec.faults[0] (kill:rank=3,step=1): rank 3 is not a rank of this cluster "
        "(dp_size=2)",
        "RunSpec.faults[1] (kv_fail:request=nope): request 'nope' is not in the trace"]
