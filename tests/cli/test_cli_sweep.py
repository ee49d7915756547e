"""`dyntra-emu sweep` through the real CLI: a 2x2 grid end to end (its table must be the
metrics of the runs it lists, and a run of a point's spec by `dyntra-emu run` or the
`dyntra_cluster` fixture records and measures the same), and bad input refused with one
line, exit 2, nothing run."""

from __future__ import annotations

import csv
import json
import os

import pytest

pytestmark = pytest.mark.integration


def test_sweep_2x2_end_to_end(sweep_2x2, cli, clikit, tmp_path, dyntra_cluster):
    proc, out = sweep_2x2
    assert proc.returncode == 0, proc.stderr
    trace = out.parent / "sweep.jsonl"
    for name in ("sweep.json", "sweep.csv", "summary.md", "pareto.png", "kv_blocks.png"):
        assert (out / name).stat().st_size > 0, name
    sweep = json.loads((out / "sweep.json").read_text())
    rows = {r["name"]: r for r in sweep["rows"]}
    assert list(rows) == ["baseline", "p01", "p02", "p03", "p04"]
    assert sweep["grid"] == {"bubble_threshold": [1, 5], "mode": ["static", "dynamic"],
                             "long_req_block_threshold": [30]}
    assert sweep["async_scheduling"] is True  # vLLM's default, said in the output
    assert "Scheduling: async in every run" in proc.stdout
    base = json.loads((out / "runs" / "baseline" / "metrics.json").read_text())
    assert base["config"]["additional_config"]["scheduler_config"]["dyntra_lb_config"][
        "enabled"] is False
    seen_values = set()
    for name, row in rows.items():
        metrics = json.loads((out / row["run_dir"] / "metrics.json").read_text())
        assert metrics["requests_finished"] == 16
        assert metrics["config"]["additional_config"] == row["additional_config"]
        lb = row["additional_config"]["scheduler_config"]["dyntra_lb_config"]
        for key, value in row["values"].items():
            assert lb[key] == value
        seen_values.add(tuple(sorted(row["values"].items())))
        expected = {
            "throughput_tok_s": metrics["throughput_tok_s"],
            "bubble_ratio": metrics["bubble_ratio"],
            "balance_ratio": metrics["balance_ratio"],
            "tpot_p50_ms": metrics["tpot_ms"]["p50"],
            "tpot_p99_ms": metrics["tpot_ms"]["p99"],
            "ttft_p90_ms": metrics["ttft_ms"]["p90"],
            "pauses": metrics["pauses"]["total"],
        }
        base_values = {
            "throughput_tok_s": base["throughput_tok_s"], "bubble_ratio": base["bubble_ratio"],
            "balance_ratio": base["balance_ratio"], "tpot_p50_ms": base["tpot_ms"]["p50"],
            "tpot_p99_ms": base["tpot_ms"]["p99"], "ttft_p90_ms": base["ttft_ms"]["p90"],
            "pauses": base["pauses"]["total"]}
        for column, value in expected.items():
            assert row[column] == value, (name, column)
            assert row[f"{column}_delta"] == pytest.approx(value - base_values[column])
        if name != "baseline":
            assert lb["enabled"] is True
    assert len(seen_values) == 5  # four distinct grid points and the baseline
    assert any(r["pauses"] > 0 for r in rows.values())  # DyntraLB did something

    # The CSV carries the same numbers.
    with open(out / "sweep.csv") as f:
        csv_rows = {r["name"]: r for r in csv.DictReader(f)}
    assert set(csv_rows) == set(rows)
    for name, row in rows.items():
        assert float(csv_rows[name]["throughput_tok_s"]) == pytest.approx(
            row["throughput_tok_s"])
        assert csv_rows[name]["mode"] == str(row["values"].get("mode", ""))

    # Best for throughput among the grid points, printed as a ready config.
    grid_rows = [r for n, r in rows.items() if n != "baseline"]
    best = max(grid_rows, key=lambda r: r["throughput_tok_s"])
    assert sweep["best"] == best["name"]  # ties: the earlier point
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("--additional-config "))
    printed = json.loads(line.split(" ", 1)[1].strip("'"))
    assert printed == rows[sweep["best"]]["additional_config"]
    top = max(rows.values(), key=lambda r: r["throughput_tok_s"])
    assert top["name"] in sweep["pareto_front"]
    assert "| p" in proc.stdout and "baseline (DyntraLB off)" in proc.stdout

    # One spec, one record: a point's spec run by `dyntra-emu run` and by the fixture
    # records the config the sweep recorded (from the spec alone: the additional config,
    # the workload's name, the engine settings, the cost model, the impl and its
    # planner, the device) and measures the same run.
    swept = json.loads((out / "runs" / "p04" / "metrics.json").read_text())
    point = swept["config"]["additional_config"]
    run = cli("run", "--workload", trace, *clikit.SMALL, "--additional-config",
              json.dumps(point), "--transport", "thread", "--out", "run", "--quiet")
    assert run.returncode == 0, run.stderr
    ran = json.loads((tmp_path / "run" / "metrics.json").read_text())
    fixture = dyntra_cluster(workload=str(trace), additional_config=point, max_num_seqs=4,
                             block_size=16, num_gpu_blocks=512, device="cpu",
                             transport="thread", strict=False)  # strict: off, as the CLI's
    assert swept["config"] == ran["config"] == fixture.metrics["config"]
    assert (ran["config"]["impl"], ran["config"]["planner"], ran["config"]["workload"],
            ran["config"]["cost_model"]["name"], ran["config"]["device"]) == (
        "kit", "reference", str(trace), "kv-token", "cpu")
    measured = [{k: v for k, v in m.items() if k != "wall"}  # wall-clock: not the spec's
                for m in (swept, ran, fixture.metrics)]
    assert measured[0] == measured[1] == measured[2]


@pytest.mark.parametrize("args,fragment", [
    (["--grid", "foo=1,2"], "--grid foo=1,2: unknown key 'foo'; expected a dyntra_lb_config "
                            "key: "),
    (["--grid", "mode=static,fast"], "dyntra_lb_config.mode must be one of"),
    (["--grid", "bubble_threshold"], "--grid bubble_threshold: expected KEY=V1,V2,..."),
    (["--grid", "start_step=" + ",".join(map(str, range(9))),
      "--grid", "bubble_threshold=" + ",".join(map(str, range(1, 9)))],
     "--grid: 72 points (9 x 8) is more than 64"),
    (["--grid", "mode=static", "--jobs", str((os.cpu_count() or 1) + 1)],
     f"--jobs {(os.cpu_count() or 1) + 1}: more than the {os.cpu_count()} cores"),
    ([], "--grid: required"),
    (["--grid", "mode=static", "--max-tpot-p99-ms", "50", "--objective", "bubble"],
     "--max-tpot-p99-ms: picks the highest throughput"),
])
def test_sweep_bad_input_is_one_line_and_nothing_runs(cli, clikit, tmp_path, tiny_trace,
                                                      args, fragment):
    proc = cli("sweep", "--workload", tiny_trace, *clikit.SMALL, *args, "--out", "never")
    clikit.assert_user_error(proc, fragment)
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "never").exists()


def test_without_jobs_a_sweep_runs_one_job_per_core(cli, clikit, tiny_trace, tmp_path,
                                                    monkeypatch):
    """Without --jobs a sweep (runs on rank threads: one busy process each) keeps every
    core busy: as many jobs under way at once as the cores, at most one per run. Seen
    as the jobs alive each time the executor starts one."""
    from emu.executors import local

    started, most_at_once = [], []

    def counting_start(*args, **kwargs):
        most_at_once.append(1 + sum(job.is_alive() for job, _ in started))
        started.append(start(*args, **kwargs))
        return started[-1]

    start = local.start_job
    monkeypatch.setattr(local, "start_job", counting_start)
    proc = cli("sweep", "--workload", tiny_trace, *clikit.SMALL, "--grid",
               "bubble_threshold=1,5", "--out", tmp_path / "sw")
    assert proc.returncode == 0, proc.stderr
    runs = 3  # the baseline and two points
    assert len(started) == runs
    assert max(most_at_once) == min(runs, os.cpu_count() or 1), most_at_once
    assert f"{min(runs, os.cpu_count() or 1)} job(s) at a time" in proc.stderr
