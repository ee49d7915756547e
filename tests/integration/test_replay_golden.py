"""Golden check of `dyntra-emu replay` against a real emulated run: a dp=2 static-mode run
with diagnostics on writes rank 0's requests/modifications tables; replaying that log with
this checkout's planner must reproduce every plan, and each rebuilt snapshot must sit at
the step, wave and plans the ranks' event logs recorded."""

import random

import pytest

from emu.offline import replay
from emu.offline.logscan import read_log
from emu.run import run_cluster
from emu.spec import RunSpec
from emu.workload import TraceRequest

pytestmark = pytest.mark.integration

MAX_NUM_SEQS = 4


def _trace():
    rng = random.Random(3)
    trace, t = [], 0.0
    for i in range(40):
        t += rng.choice([0.0, 0.001, 0.01])
        trace.append(TraceRequest(f"r{i}", t, rng.choice([64, 300, 1500, 4000]),
                                  rng.randint(5, 60)))
    return trace


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    config = {"scheduler_config": {"dyntra_lb_config": {
        "enabled": True, "enable_diagnostics": True, "mode": "static", "start_step": 0,
        "bubble_threshold": 2}}}
    return run_cluster(RunSpec(trace=_trace(), dp_size=2, out_dir=tmp_path_factory.mktemp("run"),
                               additional_config=config, max_num_seqs=MAX_NUM_SEQS,
                               block_size=16, device="cpu"))


def _plans_by_step(result, rank):
    return [(e["step_counter"], e["wave"], e["plan_generated"]) for e in result.events(rank)
            if e["kind"] == "step" and e["plan_generated"] is not None]


def _check(report, run):
    assert report.warnings == []
    summary = report.summary()
    assert summary["compared"] == summary["snapshots"] == summary["reproduced"]
    snaps = [r.snapshot for r in report.results]
    for rank in range(2):
        expected = _plans_by_step(run, rank)
        assert [(s.step, s.wave, s.logged_plans[rank]) for s in snaps] == expected
    # the run exercised more than "freeze everything"
    plans = [p for s in snaps for p in s.logged_plans]
    assert any(p["out_blk"] for p in plans) and any(p["in_blk"] for p in plans)


def test_replay_of_rank0_log_reproduces_every_plan(run):
    report = replay.replay(read_log(run.logs[0]), max_num_seqs=MAX_NUM_SEQS)
    assert report.summary()["snapshots"] > 50
    _check(report, run)


def _messages(path):
    """Split a rank log into logged messages (a message starts with its process tag;
    the table lines that follow belong to it)."""
    messages = []
    for line in path.read_text().splitlines():
        if line.startswith("(EngineCore_DP") or not messages:
            messages.append([line])
        else:
            messages[-1].append(line)
    return messages


def test_replay_of_interleaved_rank_logs(run, tmp_path):
    """Both ranks writing into one file, message by message, in a shuffled order that
    keeps each rank's own order (what one shared stdout looks like)."""
    queues = [_messages(p) for p in run.logs]
    rng = random.Random(0)
    merged = []
    while any(queues):
        q = rng.choice([q for q in queues if q])
        merged.extend(q.pop(0))
    path = tmp_path / "both.log"
    path.write_text("\n".join(merged) + "\n")
    report = replay.replay(read_log(path), max_num_seqs=MAX_NUM_SEQS)
    assert sorted(report.scan.streams) == ["EngineCore_DP0", "EngineCore_DP1"]
    _check(report, run)
