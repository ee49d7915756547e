"""`dyntra-emu gate`: real runs (dp 2, rank threads) checked against a baseline: a run
against itself passes, a worse config against a better baseline fails on the metrics
it made worse, an `ab --seeds` baseline, partial runs and bad input refused (exit 2)."""

from __future__ import annotations

import json
import shutil

import pytest
from junitparser import Failure, JUnitXml

pytestmark = pytest.mark.integration

STATIC_CONFIG = json.dumps({"scheduler_config": {"dyntra_lb_config": {
    "enabled": True, "mode": "static", "start_step": 0}}})


def _run(cli, clikit, trace, out, *extra):
    proc = cli("run", "--workload", trace, *clikit.SMALL, "--transport", "thread", "--quiet",
               "--out", out, *extra)
    assert proc.returncode == 0, proc.stderr
    return json.loads((out / "metrics.json").read_text())


def _table(stdout: str) -> dict[str, list[str]]:
    """The gate's table: metric -> its cells."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("metric "))
    rows = {}
    for line in lines[start + 2:]:
        if not line.strip():
            break
        cells = line.split()
        rows[cells[0]] = cells
    return rows


def _junit_failures(path) -> tuple[int, set[str]]:
    (suite,) = list(JUnitXml.fromfile(str(path)))
    cases = list(suite)
    assert suite.tests == len(cases) and suite.errors == 0
    failed = {c.name for c in cases if any(isinstance(r, Failure) for r in c.result)}
    assert suite.failures == len(failed)
    return len(cases), failed


def test_gate_passes_a_run_against_itself_and_catches_a_worse_config(cli, tiny_trace,
                                                                     tmp_path, clikit):
    # The better baseline: DyntraLB off. The worse config: DyntraLB static from step 0,
    # which on this small trace pauses requests that then wait: their TPOT stretches.
    base = _run(cli, clikit, tiny_trace, tmp_path / "off", "--no-dyntra-lb")
    worse = _run(cli, clikit, tiny_trace, tmp_path / "static",
                 "--additional-config", STATIC_CONFIG)
    assert base["pauses"]["total"] == 0 and worse["pauses"]["total"] > 0

    # A run against itself: as a directory, and as its metrics.json.
    for baseline in (tmp_path / "off", tmp_path / "off" / "metrics.json"):
        proc = cli("gate", tmp_path / "off", "--baseline", baseline,
                   "--junit", tmp_path / "self.xml")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        rows = _table(proc.stdout)
        assert {cells[-1] for cells in rows.values()} == {"pass"}
        assert "PASS: 16 metrics checked, none regressed" in proc.stdout
        assert _junit_failures(tmp_path / "self.xml") == (16, set())

    # A run directory without metrics.json (the pytest plugin writes none): its metrics
    # come from its event logs.
    bare = tmp_path / "bare"
    shutil.copytree(tmp_path / "off", bare)
    (bare / "metrics.json").unlink()
    proc = cli("gate", bare, "--baseline", tmp_path / "off")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS: 16 metrics checked, none regressed" in proc.stdout

    # The worse config against the better baseline.
    proc = cli("gate", tmp_path / "static", "--baseline", tmp_path / "off",
               "--junit", tmp_path / "gate.xml")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    rows = _table(proc.stdout)
    flagged = {name for name, cells in rows.items() if cells[-1] == "REGRESSION"}
    # What the default tolerances say, from the two metrics files.
    expected = {name for name, value, limit in (
        ("tpot_ms.p99", worse["tpot_ms"]["p99"], base["tpot_ms"]["p99"] * 1.10),
        ("tpot_ms.p50", worse["tpot_ms"]["p50"], base["tpot_ms"]["p50"] * 1.05),
        ("itl_ms.p99", worse["itl_ms"]["p99"], base["itl_ms"]["p99"] * 1.10),
        ("ttft_ms.p50", worse["ttft_ms"]["p50"], base["ttft_ms"]["p50"] * 1.10),
        ("ttft_ms.p99", worse["ttft_ms"]["p99"], base["ttft_ms"]["p99"] * 1.10),
        ("e2e_ms.p99", worse["e2e_ms"]["p99"], base["e2e_ms"]["p99"] * 1.10),
        ("virtual_time_s", worse["virtual_time_s"], base["virtual_time_s"] * 1.02),
        ("bubble_ratio", worse["bubble_ratio"], base["bubble_ratio"] + 0.01),
        ("throughput_tok_s", -worse["throughput_tok_s"], -base["throughput_tok_s"] * 0.98),
        ("balance_ratio", -worse["balance_ratio"], -(base["balance_ratio"] - 0.01)),
        ("pauses.requests_paused_pct", worse["pauses"]["requests_paused_pct"],
         base["pauses"]["requests_paused_pct"] + 5),
        ("pauses.longest_paused_ms", worse["pauses"]["longest_paused_ms"],
         base["pauses"]["longest_paused_ms"] * 1.10),
    ) if value > limit}
    assert "tpot_ms.p99" in expected  # the paused requests' TPOT
    assert flagged == expected
    assert rows["requests_finished"][-1] == "pass"
    assert rows["tpot_ms.p99"][1:3] == [f"{base['tpot_ms']['p99']:.6g}",
                                        f"{worse['tpot_ms']['p99']:.6g}"]
    assert f"REGRESSION: {len(flagged)} of 16 metrics regressed" in proc.stdout
    assert "note: the run and the baseline differ in config additional_config" in proc.stdout
    assert _junit_failures(tmp_path / "gate.xml") == (16, flagged)

    # --json: the same verdicts.
    proc = cli("gate", tmp_path / "static", "--baseline", tmp_path / "off", "--json")
    assert proc.returncode == 1
    report = json.loads(proc.stdout)
    assert report["passed"] is False
    assert {c["metric"] for c in report["checks"] if c["verdict"] == "REGRESSION"} == flagged

    # Each regressed metric turned off: the gate passes.
    offs = [f"--tol={name}=off" for name in sorted(flagged)]
    proc = cli("gate", tmp_path / "static", "--baseline", tmp_path / "off", *offs)
    assert proc.returncode == 0, proc.stdout
    assert f"PASS: {16 - len(flagged)} metrics checked" in proc.stdout

    proc = cli("gate", tmp_path / "static", "--baseline", tmp_path / "off",
               "--tol", "tpot_ms.p99x=+5%")
    clikit.assert_user_error(proc, "--tol tpot_ms.p99x=+5%: unknown metric 'tpot_ms.p99x' "
                                   "(did you mean tpot_ms.p99?)")


def test_gate_refuses_a_partial_run(cli, tiny_trace, tmp_path, clikit):
    killed = tmp_path / "killed"
    proc = cli("run", "--workload", tiny_trace, *clikit.SMALL, "--transport", "thread",
               "--quiet", "--fault", "kill:rank=1,step=5", "--out", killed)
    assert proc.returncode == 1, proc.stderr
    whole = tmp_path / "whole"
    _run(cli, clikit, tiny_trace, whole)
    for run, base in ((killed, whole), (whole, killed)):
        proc = cli("gate", run, "--baseline", base)
        clikit.assert_user_error(proc, f"{killed}: the run did not finish (run.json says "
                                       "'failed'", "a partial run cannot be gated")
    proc = cli("gate", whole, "--baseline", tmp_path / "nowhere")
    clikit.assert_user_error(proc, f"{tmp_path / 'nowhere'}: no such file or directory")


def test_gate_against_ab_seeds(cli, tmp_path, clikit, ab_over_seeds):
    """The B runs of `ab --seeds` as the baseline: one of them passes; the same seed with
    a slow rank falls below the prediction interval of throughput."""
    proc, seeds = ab_over_seeds
    assert proc.returncode == 0, proc.stderr
    record = json.loads((seeds / "ab.json").read_text())
    assert record["seeds"] == [3, 4]
    for run in record["runs"]:
        for side in ("a", "b"):
            assert run[side]["metrics"] == json.loads(
                (seeds / run[side]["dir"] / "metrics.json").read_text())

    proc = cli("gate", seeds / "seed3" / "b", "--baseline", seeds)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "run b (B) over seeds 3, 4" in proc.stdout
    assert _table(proc.stdout)["throughput_tok_s"][5:9] == ["-95", "%", "PI", "of"]

    slow = tmp_path / "slow"
    proc = cli("run", *clikit.AB_OVER_SEEDS, "--seed", "3", "--additional-config",
               json.dumps(clikit.STATIC),
               "--fault", "slow:rank=0,extra_ms=200", "--out", slow)
    assert proc.returncode == 0, proc.stderr
    proc = cli("gate", slow, "--baseline", seeds / "ab.json", "--json")
    assert proc.returncode == 1, proc.stdout
    checks = {c["metric"]: c for c in json.loads(proc.stdout)["checks"]}
    assert checks["throughput_tok_s"]["verdict"] == "REGRESSION"
    assert checks["throughput_tok_s"]["run"] < checks["throughput_tok_s"]["low"]
    assert checks["requests_finished"]["verdict"] == "pass"

    proc = cli("gate", slow, "--baseline", seeds, "--baseline-side", "c")
    clikit.assert_user_error(proc, "--baseline-side: invalid choice: 'c'")
