"""Bad flags and files: one clear message naming the flag or file:line, exit code 2, no
traceback, nothing started (no output directory). A failing cluster: the failing rank
and its error, exit code 1."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.held_logs import holds_a_step

STATIC = '{"scheduler_config": {"dyntra_lb_config": {"enabled": true, "mode": "static"}}}'


def lb(**keys) -> str:
    return json.dumps({"scheduler_config": {"dyntra_lb_config": {"enabled": True, **keys}}})


# (arguments after "run", fragments expected in stderr)
RUN_ERRORS = {
    "max-num-seqs-zero": (["--max-num-seqs", "0"],
                          ["argument --max-num-seqs: expected an integer >= 1, got '0'"]),
    "block-size-zero": (["--block-size", "0"],
                        ["argument --block-size: expected an integer >= 1, got '0'"]),
    "num-gpu-blocks-word": (["--num-gpu-blocks", "many"],
                            ["argument --num-gpu-blocks: expected an integer >= 1, got 'many'"]),
    "dp-zero": (["--dp", "0"], ["argument --dp: expected an integer >= 1, got '0'"]),
    "dp-one-with-dyntra-lb": (["--dp", "1"], [
        "--dp 1: DyntraLB requires data_parallel_size > 1.",
        "use --dp 2 or more, or run plain DP (--no-dyntra-lb)"]),
    "seed-negative": (["--seed", "-1"],
                      ["argument --seed: expected an integer in 0..4294967295, got '-1'"]),
    "timeout-zero": (["--collective-timeout", "0"],
                     ["argument --collective-timeout: expected a number of seconds > 0"]),
    "run-timeout-nan": (["--run-timeout", "nan"],
                        ["argument --run-timeout: expected a number of seconds > 0"]),
    "unknown-router": (["--router", "random"],
                       ["argument --router: invalid choice: 'random'", "round_robin"]),
    "unknown-device": (["--device", "gpu"], ["argument --device: invalid choice: 'gpu'"]),
    "misspelled-flag": (["--dpp", "2"],
                        ["unrecognized arguments: --dpp 2 (did you mean --dp?)"]),
    "unknown-workload-name": (["--workload", "longtale"], [
        "--workload 'longtale': no such file and not a bundled workload; bundled "
        "workloads are: bimodal, default, longtail, uniform"]),
    "missing-workload-file": (["--workload", "traces/mine.jsonl"],
                              ["--workload traces/mine.jsonl: no such file"]),
    "config-file-missing": (["--additional-config", "@decode.json"],
                            ["--additional-config @decode.json: cannot read decode.json: "
                             "No such file or directory"]),
    "config-file-empty-name": (["--additional-config", "@"],
                               ["--additional-config @: expected a file name after '@'"]),
    "config-not-json": (["--additional-config", "{enabled: true}"],
                        ["--additional-config: additional_config is not valid JSON"]),
    "config-not-object": (["--additional-config", "[1]"],
                          ["--additional-config: additional_config must be a JSON object"]),
    "config-bad-mode": (["--additional-config", lb(mode="fast")], [
        "--additional-config: dyntra_lb_config.mode must be one of ['dynamic', 'static'], "
        "got 'fast'."]),
    "config-unknown-key": (["--additional-config", lb(threshold=3)],
                           ["--additional-config: Unknown dyntra_lb_config keys: "
                            "['threshold']"]),
    "config-bad-type": (["--additional-config", lb(start_step="0")],
                        ["dyntra_lb_config.start_step must be an int, got str."]),
    "config-deployment": (["--additional-config", json.dumps({"scheduler_config": {
        "enable_balance_scheduling": True, "dyntra_lb_config": {"enabled": True}}})],
        ["--additional-config: enable_balance_scheduling only supports PD-mixed mode"]),
    "config-recompute": (["--additional-config", json.dumps({"scheduler_config": {
        "recompute_scheduler_enable": True}})],
        ["--impl kit: the kit runs vLLM's own scheduler (synchronous or async); the "
         "additional config selects vllm-ascend's recompute scheduler (scheduler_config."
         "recompute_scheduler_enable runs with --impl vllm-ascend)"]),
    "no-dyntra-lb-with-config": (["--no-dyntra-lb", "--additional-config", STATIC],
                                 ["not allowed with argument"]),
    "out-is-a-file": (["--out", "trace.jsonl"],
                      ["--out trace.jsonl: exists and is not a directory"]),
}


@pytest.fixture
def bad_trace(tmp_path):
    lines = [
        '{"request_id": "a", "arrival_s": 0, "prompt_tokens": 10, "output_tokens": 5}',
        '{"request_id": "b", "arrival_s": 0, "prompt_tokens": 0, "output_tokens": 5}',
        '{"request_id": "c", "arrival_s": 0, "prompt_tokens": 10, "output_tokens": 5, '
        '"rank": 9}',
    ]
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("case", list(RUN_ERRORS))
def test_run_user_error(cli, tmp_path, bad_trace, clikit, case):
    args, fragments = RUN_ERRORS[case]
    proc = cli("run", *args)
    clikit.assert_user_error(proc, *fragments)
    assert proc.stderr.count("error:") == 1
    assert not (tmp_path / "runs").exists()


def test_bad_trace_lists_every_line(cli, tmp_path, bad_trace, clikit):
    proc = cli("run", "--workload", bad_trace, "--dp", "2")
    clikit.assert_user_error(
        proc, "dyntra-emu run: error: 2 problems, nothing was started:",
        f"{bad_trace}:2: field 'prompt_tokens': expected an integer >= 1, got 0",
        f"{bad_trace}:3: field 'rank': expected an integer in 0..1 for dp_size=2, got 9")
    assert not (tmp_path / "runs").exists()


def test_request_larger_than_the_kv_pool(cli, tmp_path, clikit):
    trace = clikit.write_trace(tmp_path / "t.jsonl", [
        {"request_id": "big", "arrival_s": 0, "prompt_tokens": 4000, "output_tokens": 96}])
    proc = cli("run", "--workload", trace, "--dp", "2", "--block-size", "16",
               "--num-gpu-blocks", "64")
    clikit.assert_user_error(
        proc, f"{trace}:1: request 'big' needs 256 KV blocks (4000 prompt + 96 output "
              "tokens, --block-size 16) but a rank has --num-gpu-blocks 64; it could never run")


def test_out_dir_with_a_previous_run_is_kept(cli, tmp_path, tiny_trace, clikit):
    out = tmp_path / "old"
    out.mkdir()
    (out / "rank0.steps").write_text("{}\n")
    (out / "metrics.json").write_text("{}\n")
    proc = cli("run", "--workload", tiny_trace, "--dp", "2", "--out", out)
    clikit.assert_user_error(proc, f"--out {out}: already holds a run (metrics.json, "
                                   "rank0.steps); choose a new directory or pass "
                                   "--overwrite")
    assert (out / "metrics.json").read_text() == "{}\n"


def test_npu_without_torch_npu(cli, tmp_path, tiny_trace, clikit):
    try:
        import torch_npu  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("torch_npu is installed here")
    proc = cli("run", "--workload", tiny_trace, "--dp", "2", "--device", "npu")
    clikit.assert_user_error(proc, "--device npu: device 'npu' requested but torch_npu is not "
                                   "installed")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("args, fragment", [
    (["--additional-config", "{}"],
     "--additional-config: does not enable DyntraLB (scheduler_config.dyntra_lb_config."
     "enabled is not true), so both runs of ab would be the same"),
    (["--config-a", "{}"], "--config-b: required when the other of --config-a/--config-b "
                           "is given"),
    (["--config-a", "{}", "--config-b", "{}", "--additional-config", STATIC],
     "--additional-config: not allowed with --config-a/--config-b"),
    (["--config-a", "{}", "--config-b", lb(mode="x")],
     "--config-b: dyntra_lb_config.mode must be one of"),
])
def test_ab_user_error(cli, tmp_path, clikit, args, fragment):
    proc = cli("ab", *args)
    clikit.assert_user_error(proc, fragment)
    assert not (tmp_path / "runs").exists()


def test_no_command_prints_help(cli):
    proc = cli()
    assert proc.returncode == 2
    assert "commands:" in proc.stderr and "examples:" in proc.stderr


# ------------------------------------------------------------------- failed clusters


@pytest.mark.integration
def test_run_timeout_stops_the_cluster(cli, tmp_path, tiny_trace, clikit):
    out = tmp_path / "slow"
    # In a process of its own, whose start-up (torch, the fork server) alone outlasts 0.2 s.
    proc = cli("run", "--workload", tiny_trace, *clikit.SMALL, "--run-timeout", "0.2",
               "--out", out, process=True)
    assert proc.returncode == 1
    assert ("dyntra-emu run: error: the cluster failed: run exceeded run_timeout_s=0.2 "
            "and was stopped") in proc.stderr
    assert f"Every rank's report: {out / 'error.txt'}" in proc.stderr
    report = (out / "error.txt").read_text()
    assert "--- rank 0 ---" in report
    # each rank died of the launcher's SIGTERM, none was left to the SIGKILL after the
    # grace (emu.cluster.rank_start.stop_processes)
    assert report.count("killed by signal SIGTERM") == 2, report


@pytest.mark.integration
def test_a_killed_rank_is_named(tmp_path, clikit):
    """Kill rank 1 in the middle of a run: the CLI names it, stops the others, exits 1."""
    trace = clikit.write_trace(tmp_path / "long.jsonl", [
        {"request_id": f"r{i}", "arrival_s": 0, "prompt_tokens": 64, "output_tokens": 100_000}
        for i in range(4)])
    out = tmp_path / "killed"
    command = [sys.executable, "-m", "emu", "run", "--workload", str(trace), *clikit.SMALL,
               "--num-gpu-blocks", "8192", "--out", str(out)]
    proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        log = out / "rank1.steps"
        while not holds_a_step(log):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "rank 1 never opened its step records"
            time.sleep(0.1)
        rank1 = [p for p in psutil.Process(proc.pid).children(recursive=True)
                 if any(Path(f.path).parent == log for f in p.open_files())]
        assert rank1, "no process has rank1.steps open"
        rank1[0].send_signal(signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, (stdout, stderr)
    assert "dyntra-emu run: error: the cluster failed: rank 1 failed: killed by signal " \
           "SIGKILL" in stderr
    assert "--- rank 1 ---" in stderr
    assert "Every rank was stopped." in stderr
    assert "DP bubble ratio" not in stdout

