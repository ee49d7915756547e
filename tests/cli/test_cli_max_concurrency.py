"""`--max-concurrency N` (closed-loop clients) through the real `dyntra-emu`: a bad N is
a usage error naming the flag before anything starts; a good one is recorded in
metrics.json and holds the run to N requests in flight."""

from __future__ import annotations

import json

import pytest

from emu.spec import RunSpec, check
from emu.workload import TraceRequest
from tests.records import events


@pytest.mark.parametrize("value", ["0", "-3", "1.5", "two", ""])
def test_bad_limit_is_a_usage_error_and_nothing_runs(cli, tiny_trace, clikit, value):
    proc = cli("run", "--workload", tiny_trace, *clikit.SMALL, "--max-concurrency", value,
               "--out", "out")
    clikit.assert_user_error(proc, "--max-concurrency", "expected an integer >= 1",
                             repr(value))
    assert not (tiny_trace.parent / "out").exists()


def test_sweep_and_ab_take_the_flag(cli):
    for command in ("ab", "sweep", "validate"):
        proc = cli(command, "--help")
        assert proc.returncode == 0 and "--max-concurrency N" in proc.stdout, command


def test_the_limit_is_recorded_and_holds(cli, tiny_trace, clikit, tmp_path):
    proc = cli("run", "--workload", tiny_trace, *clikit.SMALL, "--max-concurrency", "2",
               "--transport", "thread", "--out", "out", "--quiet")
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "out"
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["config"]["max_concurrency"] == 2
    assert metrics["requests_finished"] == 10
    held = {}
    for rank in range(2):
        for record in events(out, rank):
            if record["kind"] == "step":
                held[record["iter"]] = (held.get(record["iter"], 0) + record["num_running"]
                                        + record["num_waiting"])
    assert max(held.values()) == 2


def spec(**fields) -> RunSpec:
    return RunSpec(trace=[TraceRequest("r0", 0.0, 16, 4)], dp_size=2, out_dir="unused",
                   **fields)


@pytest.mark.parametrize("value", [0, 2.0, True, "4"])
def test_a_bad_limit_from_python_names_the_field(value):
    with pytest.raises(ValueError, match=r"RunSpec.max_concurrency: must be an int >= 1, "
                                         r"or None, got"):
        check(spec(max_concurrency=value))
