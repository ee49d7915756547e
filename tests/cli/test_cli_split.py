"""`run --split N` (docs/split.md): a small trace cut into 2 windows, each run by a real
cluster (2 rank threads) in a job process of the local executor, stitched and compared
with the same trace's whole run.

- every request of the trace is reported once, with its tokens;
- with a 1 s warm-up the stitched throughput and TPOT p50 are within 2 % of the whole
  run's, and the measured steps within 5 % of its steps;
- with a warm-up longer than the trace every window replays all of it, so the measured
  parts are the whole run's own steps and requests: every per-step and per-request
  figure is the whole run's;
- the flags refused, each in one line, nothing written."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.integration

# 120 requests over 12 s, of uneven size: the load changes along the trace.
REQUESTS = [{"request_id": f"q{i}", "arrival_s": round(0.1 * i + 0.009 * (i % 7), 3),
             "prompt_tokens": 40 + 150 * (i % 3) + 7 * (i % 5),
             "output_tokens": 10 + 13 * (i % 4) + 3 * (i % 7)} for i in range(120)]

# The figures a stitch must give as the whole run does when every window replays all.
SAME = [("steps",), ("requests_total",), ("output_tokens",), ("throughput_tok_s",),
        ("virtual_time_s",), ("busy_time_s",), ("bubble_ratio",), ("balance_ratio",),
        ("ttft_ms", "p99"), ("tpot_ms", "p50"), ("tpot_ms", "p99"), ("itl_ms", "mean"),
        ("e2e_ms", "max"), ("pauses", "total"), ("pauses", "longest_paused_ms"),
        ("plan_churn", "outs")]


@pytest.fixture(scope="module")
def whole_and_splits(tmp_path_factory):
    """The whole run, a 2-window split with a 1 s warm-up, and one whose 100 s warm-up
    covers the trace: their metrics."""
    from tests.cli.conftest import SMALL, write_trace
    from tests.in_process import run_in_process

    where = tmp_path_factory.mktemp("split")
    trace = write_trace(where / "trace.jsonl", REQUESTS)
    base = ["run", "--workload", str(trace), *SMALL, "--transport", "thread", "--quiet"]
    runs = {"whole": [], "split": ["--split", "2", "--split-warmup", "1", "--jobs", "2"],
            "covering": ["--split", "2", "--split-warmup", "100", "--jobs", "2"]}
    metrics = {}
    for name, flags in runs.items():
        proc = run_in_process([*base, *flags, "--out", str(where / name)], where)
        assert proc.returncode == 0, proc.stderr
        metrics[name] = json.loads((where / name / "metrics.json").read_text())
    return where, metrics


def _get(metrics, path):
    for key in path:
        metrics = metrics[key]
    return metrics


def test_every_request_is_reported_once(whole_and_splits):
    where, metrics = whole_and_splits
    split = metrics["split"]
    assert split["requests_total"] == split["requests_finished"] == len(REQUESTS)
    assert split["output_tokens"] == sum(r["output_tokens"] for r in REQUESTS)
    windows = split["split"]["per_window"]
    assert [w["requests"] for w in windows] == [60, 60]
    # each window's run replayed its own requests and its warm-up or cool-down, which
    # the stitch left out
    for window in windows:
        recorded = json.loads((where / "split" / "windows" / f"w{window['window']}" /
                               "metrics.json").read_text())["requests_total"]
        assert recorded == (window["requests"] + window["warmup_requests"]
                            + window["cooldown_requests"]) > window["requests"]
    assert split["split"]["windows"] == 2 and split["split"]["warmup_s"] == 1.0


def test_the_split_is_within_tolerance_of_the_whole_run(whole_and_splits):
    _, metrics = whole_and_splits
    whole, split = metrics["whole"], metrics["split"]
    for path, tolerance in [(("throughput_tok_s",), 0.02), (("tpot_ms", "p50"), 0.02),
                            (("steps",), 0.05)]:
        assert _get(split, path) == pytest.approx(_get(whole, path), rel=tolerance), path


def test_a_warmup_covering_the_trace_gives_the_whole_run(whole_and_splits):
    where, metrics = whole_and_splits
    whole, covering = metrics["whole"], metrics["covering"]
    for path in SAME:
        assert _get(covering, path) == pytest.approx(_get(whole, path), rel=1e-9), path
    assert "Stitched from 2 windows" in (where / "covering" / "summary.md").read_text()
    for plot in ("load.png", "bubble.png", "tpot.png"):
        assert (where / "covering" / plot).stat().st_size > 0


@pytest.mark.parametrize("flags, message", [
    (["--split-warmup", "5"], "--split-warmup: only with --split N"),
    (["--jobs", "2"], "--jobs: only with --split N"),
    (["--split", "2", "--fault", "slow:rank=0,extra_ms=1"], "--fault: not with --split"),
    (["--split", "2", "--max-concurrency", "4"], "not with --max-concurrency"),
    (["--split", "64"], "cannot be cut into 64 windows"),
    (["--split", "1"], "--split: "),
])
def test_bad_split_flags_are_refused_before_anything_runs(cli, tmp_path, tiny_trace,
                                                          clikit, flags, message):
    out = tmp_path / "out"
    proc = cli("run", "--workload", tiny_trace, *clikit.SMALL, *flags, "--out", out)
    clikit.assert_user_error(proc, message)
    assert not out.exists()


def test_a_failing_window_fails_the_run_names_it_and_stitches_nothing(cli, tmp_path,
                                                                      clikit, monkeypatch):
    # Window 1's run gets a wall-clock limit no cluster start can meet: it fails for real
    # (its ranks stopped, error.txt), window 0 is stopped or finishes.
    import dataclasses

    import emu.cli.split as split
    import emu.cli.tune  # noqa: F401  (binds window_specs as it is imported: before the
    # patch, so that the patched one cannot stay there for a later test of this worker)

    cut = split.window_specs

    def failing_second(*args, **kwargs):
        windows, runs = cut(*args, **kwargs)
        spec = dataclasses.replace(runs[1].spec, run_timeout_s=0.001)
        return windows, [runs[0], dataclasses.replace(runs[1], spec=spec)]

    monkeypatch.setattr(split, "window_specs", failing_second)
    trace = clikit.write_trace(tmp_path / "trace.jsonl", REQUESTS)
    out = tmp_path / "out"
    proc = cli("run", "--workload", trace, *clikit.SMALL, "--transport", "thread", "--split",
               "2", "--split-warmup", "1", "--jobs", "2", "--out", out)
    assert proc.returncode == 1, proc.stderr
    assert ("dyntra-emu run: error: run window 1 (60 requests arriving 6.036 s to the "
            "end) failed: run exceeded run_timeout_s=0.001") in proc.stderr
    assert f"report in {out / 'windows' / 'w1' / 'error.txt'}" in proc.stderr
    assert (out / "windows" / "w1" / "error.txt").exists()
    assert not any((out / name).exists() for name in ("metrics.json", "summary.md",
                                                      "load.png"))


def test_ab_split_compares_the_sides_window_by_window(cli, tmp_path, clikit):
    trace = clikit.write_trace(tmp_path / "trace.jsonl", REQUESTS)
    out = tmp_path / "ab"
    proc = cli("ab", "--workload", trace, *clikit.SMALL, "--transport", "thread",
               "--additional-config", json.dumps(clikit.STATIC), "--split", "2",
               "--split-warmup",
               "1", "--jobs", "2", "--out", out, "--quiet")
    assert proc.returncode == 0, proc.stderr
    sides = [json.loads((out / side / "metrics.json").read_text()) for side in "ab"]
    assert [m["requests_total"] for m in sides] == [len(REQUESTS)] * 2
    # each window's throughput gain, as each side's metrics.json records the window
    gains = [(b["throughput_tok_s"] / a["throughput_tok_s"] - 1) * 100
             for a, b in zip(*(m["split"]["per_window"] for m in sides), strict=True)]
    assert len(gains) == 2
    row = next(line for line in proc.stdout.splitlines()
               if line.startswith("output throughput"))
    assert row.split()[2:4] == [f"{g:+.2f}" for g in gains[:1]] + ["%"]
    assert f"{gains[1]:+.2f} %" in row
    assert "a spread over time, one trace; not over seeds" in proc.stdout
    assert "Stitched from 2 windows" in proc.stdout
    assert "## The gain per window" in (out / "summary.md").read_text()


def test_ab_split_is_refused_with_seeds(cli, tmp_path, clikit):
    proc = cli("ab", "--workload", "recipe:pr12292,n=20", *clikit.SMALL, "--seeds", "2",
               "--split", "2", "--out", tmp_path / "ab")
    clikit.assert_user_error(proc, "--split 2: not with --seeds")


def test_tune_split_takes_each_window_as_a_seed(cli, tmp_path, clikit):
    """`tune --split 2` on one trace: the windows stand for the seeds; what the study
    keeps of each baseline window is its measured part (not the window's whole run), and
    "How sure" is the spread over the windows."""
    optuna = pytest.importorskip("optuna")
    from emu.metrics import load_run
    from emu.split.stitch import measured_metrics
    from emu.split.windows import cut
    from emu.tune import STUDY_NAME
    from emu.tune.study import BASELINES_ATTR
    from emu.workload import load_trace

    trace = clikit.write_trace(tmp_path / "trace.jsonl", REQUESTS)
    proc = cli("tune", "--workload", trace, *clikit.SMALL, "--objectives", "throughput",
               "--knobs", "mode,start_step", "--trials", "2", "--min-gain", "0",
               "--split", "2", "--split-warmup", "1", "--jobs", "2", "--out", "t")
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "t" / "tune.json").read_text())
    assert report["seeds"] == [0, 1] and report["ab"] is None
    study = optuna.load_study(study_name=STUDY_NAME,
                              storage=f"sqlite:///{tmp_path / 't' / 'study.db'}")
    kept = study.user_attrs[BASELINES_ATTR]
    windows = cut(load_trace(trace), 2, 1.0)
    for window in windows:
        out = tmp_path / "t" / "runs" / "baseline" / f"seed{window.index}"
        measured = measured_metrics([(window, load_run(out))], last=1)[0]
        whole_window = json.loads((out / "metrics.json").read_text())
        assert kept[str(window.index)]["throughput_tok_s"] == pytest.approx(
            measured["throughput_tok_s"], rel=1e-12)
        assert measured["throughput_tok_s"] != pytest.approx(
            whole_window["throughput_tok_s"], rel=1e-3)
    assert "throughput over the 2 windows of the trace (a spread over time" in proc.stdout


def test_tune_split_is_refused_with_seeds(cli, tmp_path, clikit, tiny_trace):
    proc = cli("tune", "--workload", tiny_trace, *clikit.SMALL, "--split", "2", "--seeds",
               "2", "--out", tmp_path / "t")
    clikit.assert_user_error(proc, "--split 2: not with --seeds or --ab-seeds")
