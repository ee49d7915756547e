"""The rest of the kit's surface on vllm-ascend's code: the ``dyntra_cluster`` fixture, the
``slow`` and ``not_ready`` faults (the other fault kinds have their tests on vllm-ascend
in test_vllm_ascend_threads.py, test_vllm_ascend_faults.py and
test_vllm_ascend_security.py; ``--max-concurrency`` in test_vllm_ascend_closed_loop.py),
and torchrun (dp 2 under ``torchrun --standalone``)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from emu.offline.diff import compare, read_run
from emu.run import run_cluster
from tests.integration.test_faults import (
    BLOCK_SIZE,
    STATIC,
    UNREADY,
    assert_nothing_lost,
    make_spec,
    two_wave_trace,
)
from tests.records import event_log, events
from tests.upstream.conftest import TREE, dyntra_emu

pytestmark = pytest.mark.integration

FAULTS = ["slow:rank=0,extra_ms=5", f"not_ready:request={UNREADY},lookups=25"]


def _steps(events: list[dict]) -> list[dict]:
    return [e for e in events if e["kind"] == "step"]


def _request(run_dir: pathlib.Path, request_id: str) -> dict:
    for log in run_dir.glob("rank*.steps"):
        for record in events(run_dir, int(log.name[len("rank"):-len(".steps")])):
            if record["kind"] == "request" and record["request_id"] == request_id:
                return record
    raise KeyError(request_id)


@pytest.mark.dp(2)
def test_the_fixture_runs_vllm_ascend_with_a_slow_rank_and_an_unready_load(
        dyntra_cluster, tmp_path):
    """Through the pytest plugin's fixture on rank threads: rank 0's steps cost 5 ms more
    and rank 1 waits for them in the lockstep; the connector answers "not ready" 25 times
    for UNREADY, which is scheduled later than without the fault; every request finishes
    once; and the kit does exactly the same, step for step."""
    run = dyntra_cluster(two_wave_trace(), additional_config=STATIC, max_num_seqs=4,
                         block_size=BLOCK_SIZE, num_gpu_blocks=1024, device="cpu",
                         strict=True, run_timeout_s=600.0, faults=FAULTS,
                         impl="vllm-ascend", vllm_ascend=str(TREE), transport="thread")
    assert run.metrics["config"]["impl"] == "vllm-ascend"
    assert run.metrics["plan_churn"]["active_steps"] > 0
    assert_nothing_lost(run.result, two_wave_trace())
    rank0, rank1 = _steps(run.events[0]), _steps(run.events[1])
    assert {s["own_cost_s"] for s in rank0 if s["dummy"]} == {0.025}
    assert {s["own_cost_s"] for s in rank1 if s["dummy"]} == {0.020}
    assert min(s["step_time_s"] for s in rank1) >= 0.025  # the lockstep waits for rank 0

    # the same slow rank with a ready connector schedules UNREADY earlier
    ready = run_cluster(make_spec(tmp_path / "kit-ready", faults=FAULTS[:1]))
    late, on_time = _request(run.out_dir, UNREADY), _request(ready.out_dir, UNREADY)
    assert late["first_scheduled_s"] > on_time["first_scheduled_s"]

    kit = run_cluster(make_spec(tmp_path / "kit", faults=FAULTS))
    report = compare(read_run(kit.out_dir, "kit"), read_run(run.out_dir, "vllm-ascend"))
    assert report.identical, report.first


def test_vllm_ascend_under_torchrun_is_the_launchers_run(tmp_path):
    """dp 2 under ``torchrun --standalone``: each torchrun process is one rank of
    vllm-ascend's engine, and the event logs are byte for byte those of the same run
    started by dyntra-emu itself."""
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps({"request_id": r.request_id, "arrival_s": r.arrival_s,
                                         "prompt_tokens": r.prompt_tokens,
                                         "output_tokens": r.output_tokens}) + "\n"
                             for r in two_wave_trace()))
    flags = ["run", "--impl", "vllm-ascend", "--vllm-ascend", TREE, "--workload", trace,
             "--block-size", BLOCK_SIZE, "--num-gpu-blocks", 1024, "--max-num-seqs", 4,
             "--device", "cpu", "--additional-config", json.dumps(STATIC), "--quiet"]
    torchrun = pathlib.Path(sys.executable).with_name("torchrun")
    under = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", "2", "-m",
                            "emu", *map(str, flags), "--out", str(tmp_path / "torchrun")],
                           capture_output=True, text=True, timeout=900,
                           stdin=subprocess.DEVNULL)
    assert under.returncode == 0, under.stderr
    direct = dyntra_emu(*flags, "--dp", 2, "--transport", "thread", "--out", tmp_path / "direct")
    assert direct.returncode == 0, direct.stderr
    for rank in range(2):
        assert event_log(tmp_path / "torchrun", rank) == event_log(tmp_path / "direct", rank)
    metrics = json.loads((tmp_path / "torchrun" / "metrics.json").read_text())
    assert metrics["config"]["impl"] == "vllm-ascend"
    assert metrics["requests_finished"] == len(two_wave_trace())
    assert metrics["plan_churn"]["active_steps"] > 0
