"""The pytest plugin (emu/pytest_plugin.py, entry point ``pytest11: dyntra_lb``): the
``dyntra_cluster`` fixture and the ``dp(n)`` marker, used here as a downstream project
would use them. Every call starts real rank processes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from emu.workload import TraceRequest

pytestmark = pytest.mark.integration

STATIC = {"scheduler_config": {"dyntra_lb_config": {"enabled": True, "mode": "static",
                                                    "start_step": 0}}}

# Rank 0 gets the big requests, rank 1 the small ones: DyntraLB has work to do.
TINY_TRACE = [
    {"request_id": f"big-{i}", "arrival_s": 0.0, "prompt_tokens": 600, "output_tokens": 30,
     "rank": 0}
    for i in range(4)
] + [
    {"request_id": f"small-{i}", "arrival_s": 0.0, "prompt_tokens": 40, "output_tokens": 30,
     "rank": 1}
    for i in range(4)
]


@pytest.mark.dp(2)
def test_fixture_runs_a_cluster(dyntra_cluster):
    run = dyntra_cluster(trace=TINY_TRACE, additional_config=STATIC, max_num_seqs=2,
                         block_size=16, num_gpu_blocks=512, device="cpu")

    assert dyntra_cluster.dp_size == 2
    assert len(run.result.ranks) == 2
    assert run.metrics["requests_finished"] == 8
    assert run.metrics["dp_size"] == 2
    assert run.metrics["config"]["additional_config"] == STATIC
    assert run.metrics["config"]["workload"] is None  # a list of requests has no name
    # DyntraLB was on from step 0: plans applied, and the event log shows them.
    assert run.metrics["plan_churn"]["active_steps"] > 0
    assert any(s["plan_applied"] is not None for s in run.steps(0))
    assert {r["request_id"] for r in run.requests(0)} == {f"big-{i}" for i in range(4)}
    assert len(run.requests()) == 8
    assert run.out_dir.is_dir() and (run.out_dir / "rank1.steps").exists()


def test_default_dp_and_trace_requests(dyntra_cluster):
    """Without the marker: 2 ranks. TraceRequest objects are accepted as they are; no
    additional config means plain DP."""
    trace = [TraceRequest(f"r{i}", 0.01 * i, 50, 10) for i in range(4)]
    run = dyntra_cluster(trace, block_size=16, num_gpu_blocks=256, device="cpu")

    assert run.metrics["dp_size"] == 2
    assert run.metrics["requests_finished"] == 4
    assert run.metrics["plan_churn"]["active_steps"] == 0
    assert all(not s["lb_active"] for s in run.steps(1))


def test_bad_arguments_fail_before_starting(dyntra_cluster):
    with pytest.raises(ValueError, match="exactly one of trace"):
        dyntra_cluster()
    with pytest.raises(ValueError, match="bundled workloads are: bimodal, default"):
        dyntra_cluster(workload="nope")
    with pytest.raises(ValueError, match="DyntraLB requires data_parallel_size > 1"):
        dyntra_cluster(trace=TINY_TRACE[:1], additional_config=STATIC, dp_size=1)


def test_downstream_suite_with_strict_markers(tmp_path):
    """A project that only installed dyntra-lb: the entry point loads the plugin, the
    marker passes --strict-markers, and the fixture starts its cluster."""
    (tmp_path / "test_downstream.py").write_text(textwrap.dedent("""
        import pytest

        @pytest.mark.dp(3)
        def test_mine(dyntra_cluster):
            result = dyntra_cluster(
                trace=[{"request_id": f"r{i}", "arrival_s": 0.0, "prompt_tokens": 32,
                        "output_tokens": 4} for i in range(3)],
                additional_config={"scheduler_config": {"dyntra_lb_config": {
                    "enabled": True, "mode": "static", "start_step": 0}}},
                max_num_seqs=8, block_size=16, num_gpu_blocks=64, device="cpu")
            assert result.metrics["requests_finished"] == 3
            assert len(result.events) == 3

        @pytest.mark.dp(0)
        def test_bad_marker(dyntra_cluster):
            pass
    """))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "--strict-markers", "-p", "no:cacheprovider",
         "test_downstream.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL,
        env={k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")})

    assert "1 passed, 1 error" in proc.stdout, proc.stdout + proc.stderr
    assert "@pytest.mark.dp expects an integer >= 1, got 0" in proc.stdout
