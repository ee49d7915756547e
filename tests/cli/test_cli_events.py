"""`dyntra-emu events` (a run's records as the event and wall logs' JSON Lines) and
`dyntra-emu convert` (a run directory of those logs, from before the records were
Parquet): what a user of the old logs types, end to end."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.integration


@pytest.fixture
def run_dir(cli, tiny_trace, clikit, tmp_path):
    out = tmp_path / "run"
    proc = cli("run", "--workload", tiny_trace, *clikit.SMALL, "--transport", "thread",
               "--quiet", "--out", out)
    assert proc.returncode == 0, proc.stderr
    return out


def test_events_prints_each_ranks_log_then_the_next(cli, run_dir):
    ranks = [cli("events", run_dir, "--rank", rank) for rank in (0, 1)]
    every = cli("events", run_dir)
    assert every.returncode == 0 and all(p.returncode == 0 for p in ranks)
    assert every.stdout == ranks[0].stdout + ranks[1].stdout
    records = [json.loads(line) for line in ranks[1].stdout.splitlines()]
    assert {r["rank"] for r in records} == {1}
    # each step record, then the records of the requests it finished
    last_step = None
    for record in records:
        if record["kind"] == "step":
            last_step = record
        elif record["finish_s"] is not None:
            assert record["request_id"] in last_step["finished"]
    requests = cli("events", run_dir, "--requests")
    assert [json.loads(line)["request_id"] for line in requests.stdout.splitlines()] == [
        r["request_id"] for line in every.stdout.splitlines()
        if (r := json.loads(line))["kind"] == "request"]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert len(requests.stdout.splitlines()) == metrics["requests_total"]
    wall = [json.loads(line) for line in cli("events", run_dir, "--wall", "--rank", "0")
            .stdout.splitlines()]
    assert [w["iter"] for w in wall] == [r["iter"] for r in records if r["kind"] == "step"]
    assert all(w["step_wall_s"] > 0 and w.keys() >= {"planner_s"} for w in wall)


def test_a_run_directory_of_json_lines_logs_is_refused_until_converted(cli, run_dir,
                                                                      tmp_path, clikit):
    old = tmp_path / "old"
    old.mkdir()
    for rank in (0, 1):
        (old / f"rank{rank}.events.jsonl").write_text(
            cli("events", run_dir, "--rank", rank).stdout)
        (old / f"rank{rank}.wall.jsonl").write_text(
            cli("events", run_dir, "--rank", rank, "--wall").stdout)
    for command in (("timeline", old), ("events", old), ("gate", old, "--baseline", old),
                    ("diff", old, run_dir)):
        proc = cli(*command)
        clikit.assert_user_error(proc, f"convert them with: dyntra-emu convert {old}",
                                 code=proc.returncode or 2)
        assert proc.returncode != 0, command
    converted = cli("convert", old)
    assert converted.returncode == 0, converted.stderr
    for rank in (0, 1):
        assert cli("events", old, "--rank", rank).stdout == \
            (old / f"rank{rank}.events.jsonl").read_text()
    gate = cli("gate", old, "--baseline", run_dir)
    assert gate.returncode == 0, gate.stdout + gate.stderr


def test_events_names_what_is_wrong(cli, run_dir, tmp_path, clikit):
    clikit.assert_user_error(cli("events", run_dir, "--rank", "2"),
                             f"--rank 2: {run_dir} has records of ranks 0..1")
    (tmp_path / "empty").mkdir()
    clikit.assert_user_error(cli("events", tmp_path / "empty"), "no records")
    clikit.assert_user_error(cli("convert", run_dir), "no JSON Lines event logs")
