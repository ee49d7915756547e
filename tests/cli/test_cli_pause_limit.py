"""--pause-limit-ms and --pause-victim on the command line (docs/pause-limit.md), and
ab's closing verdict against DyntraLB off (--min-gain): the limit reaches B and not the
DyntraLB-off A; the verdict's numbers are the runs' own; the flags with vllm-ascend, or
drop without a limit, are refused in one line before anything runs."""

from __future__ import annotations

import json

import pytest

from tests.cli.conftest import assert_user_error

pytestmark = pytest.mark.integration


def _verdict(stdout: str) -> str:
    (line,) = [line for line in stdout.splitlines() if line.startswith("Verdict: ")]
    return line


def test_ab_limits_b_and_closes_with_a_verdict_built_from_its_runs(cli, tiny_trace,
                                                                   tmp_path, clikit):
    common = ["ab", "--workload", tiny_trace, *clikit.SMALL, "--transport", "thread",
              "--quiet", "--pause-limit-ms", "50"]
    proc = cli(*common, "--min-gain", "0", "--out", "low")
    assert proc.returncode == 0, proc.stderr
    a, b = (json.loads((tmp_path / "low" / side / "metrics.json").read_text())
            for side in "ab")
    assert "pause_limit" not in a["config"]  # DyntraLB off: nothing to limit
    assert b["config"]["pause_limit"] == {"limit_ms": 50, "victim": "next"}
    gain = (b["throughput_tok_s"] / a["throughput_tok_s"] - 1) * 100
    tpot = f"TPOT p99 {a['tpot_ms']['p99']:.1f} -> {b['tpot_ms']['p99']:.1f} ms"
    line = _verdict(proc.stdout)
    worth = gain >= 0
    assert line.startswith("Verdict: worth it" if worth else "Verdict: keep DyntraLB off")
    assert f"throughput {gain:+.2f} %" in line and tpot in line

    proc = cli(*common, "--min-gain", "1000", "--out", "high")
    assert proc.returncode == 0, proc.stderr
    line = _verdict(proc.stdout)
    assert line.startswith(f"Verdict: keep DyntraLB off: throughput {gain:+.2f} %, below "
                           "--min-gain 1000 %; the tail cost would be " + tpot)


def test_two_configs_get_no_verdict_against_dyntra_lb_off(cli, tiny_trace, clikit):
    proc = cli("ab", "--workload", tiny_trace, *clikit.SMALL, "--transport", "thread",
               "--quiet", "--config-a", json.dumps(clikit.STATIC), "--config-b",
               json.dumps(clikit.STATIC), "--pause-limit-ms", "50", "--out", "ab")
    assert proc.returncode == 0, proc.stderr
    assert "Verdict:" not in proc.stdout


@pytest.mark.parametrize("flags, message", [
    (["--impl", "vllm-ascend", "--pause-limit-ms", "500"],
     "--pause-limit-ms 500: is the kit's opt-in, not vllm-ascend's code; run it with "
     "--impl kit (docs/pause-limit.md)"),
    (["--impl", "vllm-ascend", "--pause-victim", "least-paused"],
     "--pause-victim least-paused: is the kit's opt-in, not vllm-ascend's code"),
    (["--pause-victim", "drop"],
     "--pause-victim drop: drops the out_blk values whose victim is at its pause limit, so "
     "it needs --pause-limit-ms 2000"),
    (["--pause-limit-ms", "0"], "--pause-limit-ms: expected an integer >= 1, got '0'"),
])
@pytest.mark.parametrize("command", ["run", "ab", "sweep"])
def test_the_flags_are_refused_in_one_line_before_anything_runs(cli, tiny_trace, tmp_path,
                                                                clikit, command, flags,
                                                                message):
    extra = ["--grid", "mode=static"] if command == "sweep" else []
    proc = cli(command, "--workload", tiny_trace, *clikit.SMALL, *extra, *flags,
               "--out", "x")
    assert_user_error(proc, message)
    (error,) = [line for line in proc.stderr.splitlines() if "error:" in line]  # one line
    assert message in error
    assert not (tmp_path / "x").exists()
