"""Where a long run has got to, on a stderr that is not a terminal (CI logs, nohup, a
pipe): status lines at most every ``emu.cli.progress.STATUS_INTERVAL_S`` (shrunk here so
that a short run prints several), silenced by --quiet. The numbers are checked against
what the run wrote."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

import emu.cli.progress

# One run of `dyntra-emu ARGS` in a fresh interpreter whose status interval is 20 ms.
_SHRUNK = ("import sys; import emu.cli.progress as p; p.STATUS_INTERVAL_S = 0.02; "
           "from emu.cli.main import main; sys.exit(main(sys.argv[1:]))")
# 39 requests of Mooncake-shaped traffic on 2 rank threads: a few seconds of wall time.
_MOONCAKE = ["--workload", "recipe:mooncake-like,hours=0.002", "--dp", "2", "--transport",
             "thread", "--device", "cpu"]
_LINE = re.compile(r"^(?P<desc>.+?): (?:(?P<runs>\d+)/(?P<of>\d+) runs done, )?virtual time "
                   r"(?P<clock>[\d.]+) s(?: \(summed over runs\))?, (?P<done>[\d,]+)/"
                   r"(?P<total>[\d,]+) requests finished, (?P<factor>[\d.]+)x real time, "
                   r"ETA (?P<eta>\S+)$")


def status_lines(stderr: str, desc: str) -> list[dict]:
    found = []
    for line in stderr.splitlines():
        match = _LINE.match(line)
        if match and match["desc"] == desc:
            found.append({"clock": float(match["clock"]),
                          "done": int(match["done"].replace(",", "")),
                          "total": int(match["total"].replace(",", "")),
                          "factor": float(match["factor"]), "eta": match["eta"],
                          "runs": match["runs"] and (int(match["runs"]), int(match["of"]))})
    return found


def assert_consistent(lines: list[dict], total: int) -> None:
    """Requests finished never exceed the total and end at it; virtual time never goes
    back and grows; the last line says nothing is left."""
    assert len(lines) >= 3, lines
    assert all(line["total"] == total for line in lines)
    assert all(0 <= line["done"] <= total for line in lines), lines
    assert [line["done"] for line in lines] == sorted(line["done"] for line in lines)
    clocks = [line["clock"] for line in lines]
    assert clocks == sorted(clocks) and clocks[-1] > clocks[0]
    assert lines[-1]["done"] == total and lines[-1]["eta"] == "0s"
    assert lines[-1]["factor"] > 0


def test_a_run_prints_status_lines_into_a_pipe(tmp_path):
    """The console's own process, stderr a pipe: status lines and no progress bar; the
    last one at the run's totals (metrics.json)."""
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-c", _SHRUNK, "run", *_MOONCAKE, "--out",
                           str(out)], capture_output=True, text=True, timeout=240,
                          stdin=subprocess.DEVNULL, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    metrics = json.loads((out / "metrics.json").read_text())
    lines = status_lines(proc.stderr, "run")
    assert_consistent(lines, metrics["requests_finished"])
    assert metrics["requests_finished"] == 39
    assert lines[-1]["clock"] == pytest.approx(metrics["virtual_time_s"], abs=0.05)
    assert "\r" not in proc.stderr and "req/s" not in proc.stderr  # no tqdm bar


def test_quiet_prints_no_status_line(cli, monkeypatch):
    monkeypatch.setattr(emu.cli.progress, "STATUS_INTERVAL_S", 0.02)
    proc = cli("run", *_MOONCAKE, "--out", "run", "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""


def test_a_run_shorter_than_the_interval_prints_none(cli, tiny_trace, clikit):
    proc = cli("run", "--workload", tiny_trace, *clikit.SMALL, "--out", "run")
    assert proc.returncode == 0, proc.stderr
    assert "requests finished" not in proc.stderr, proc.stderr


def test_ab_prints_status_lines_for_each_side(cli, monkeypatch, tmp_path):
    """Each side of an A/B (DyntraLB off against production's default config) has its
    own lines; on the Mooncake-shaped recipe DyntraLB pauses requests, and only with it
    on."""
    monkeypatch.setattr(emu.cli.progress, "STATUS_INTERVAL_S", 0.02)
    proc = cli("ab", *_MOONCAKE, "--out", "ab")
    assert proc.returncode == 0, proc.stderr
    paused = {}
    for side in ("a", "b"):
        metrics = json.loads((tmp_path / "ab" / side / "metrics.json").read_text())
        desc = next(d for d in {m["desc"] for m in map(_LINE.match, proc.stderr.splitlines())
                                if m} if d.startswith(side.upper()))
        assert_consistent(status_lines(proc.stderr, desc), metrics["requests_finished"])
        paused[side] = metrics["pauses"]["requests_paused"]
    assert paused["a"] == 0 and paused["b"] > 0, paused


def test_sweep_prints_status_lines_over_all_its_runs(cli, monkeypatch, tmp_path):
    """A sweep (its runs on rank threads in job processes): requests and virtual time
    summed over its runs, and how many runs are done."""
    monkeypatch.setattr(emu.cli.progress, "STATUS_INTERVAL_S", 0.02)
    proc = cli("sweep", *_MOONCAKE[:4], "--device", "cpu", "--out", "sweep", "--jobs", "1",
               "--grid", "bubble_threshold=1,5")
    assert proc.returncode == 0, proc.stderr
    runs = sorted((tmp_path / "sweep" / "runs").glob("*/metrics.json"))
    metrics = [json.loads(p.read_text()) for p in runs]
    assert len(metrics) == 3  # the baseline and two points
    lines = status_lines(proc.stderr, "sweep")
    assert_consistent(lines, sum(m["requests_finished"] for m in metrics))
    assert all(line["runs"][1] == 3 and line["runs"][0] <= 3 for line in lines)
    assert lines[-1]["runs"] == (3, 3)
    assert lines[-1]["clock"] == pytest.approx(sum(m["virtual_time_s"] for m in metrics),
                                               abs=0.15)
