"""One `dyntra-emu run` works out each input of its run once (tests/call_counts.py):
its additional config is parsed once, its device chosen once and its trace file read
once, from the command's check to metrics.json. Counted in the command's process,
which launches rank processes."""

from __future__ import annotations

import json

from tests.call_counts import RESOLVED_ONCE, count_calls


def test_one_run_works_out_each_input_once(cli, tmp_path, tiny_trace, clikit, monkeypatch):
    calls = count_calls(monkeypatch, RESOLVED_ONCE, tiny_trace)
    out = tmp_path / "out"
    proc = cli("run", "--workload", tiny_trace, *clikit.SMALL[:-2], "--device", "auto",
               "--additional-config", json.dumps(clikit.STATIC), "--out", out, "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "metrics.json").read_text())["requests_finished"] == 10
    assert {what: len(callers) for what, callers in calls.items()} == \
        dict.fromkeys(RESOLVED_ONCE, 1), calls
