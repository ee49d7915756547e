"""Issue 51: the metrics and plots of a run hold a part or a window of its step and
wall-clock records at a time, never a whole run's columns (emu.records.ranks,
emu.step_passes), and give what the same columns held whole give.

A real run (rank threads over their collectives, dp 2) writes its records in parts far
shorter than the run; every table the metrics and plots then make into columns is
counted."""

from __future__ import annotations

import dataclasses

import pytest

import emu.metrics
from emu.metrics import Run, compute_metrics, load_run
from emu.plots import write_plots
from emu.records import ranks, selection, writer
from emu.records.columns import from_steps_table, from_wall_table
from emu.records.reader import read_table
from emu.run import run_cluster
from emu.spec import RunSpec
from emu.workload import WORKLOADS_DIR, load_trace

pytestmark = pytest.mark.integration

PART_ROWS = {"steps": 64, "wall": 48}
WINDOW = 50  # rows per window: windows straddle the parts


def test_metrics_and_plots_hold_a_part_or_a_window_of_the_steps(tmp_path, monkeypatch):
    for table, rows in PART_ROWS.items():
        monkeypatch.setitem(writer.BATCH_ROWS, table, rows)
    monkeypatch.setattr(ranks, "WINDOW_ROWS", WINDOW)
    monkeypatch.setattr(selection, "KEEP", 40)  # the wall percentiles' buckets split too
    trace = [dataclasses.replace(r, output_tokens=min(r.output_tokens, 96))
             for r in load_trace(WORKLOADS_DIR / "default.jsonl")
             if r.prompt_tokens < 4_000][:64]
    config = {"scheduler_config": {"dyntra_lb_config": {
        "enabled": True, "mode": "static", "start_step": 0, "bubble_threshold": 1.0}}}
    result = run_cluster(RunSpec(trace=trace, dp_size=2, out_dir=tmp_path / "run",
                                 additional_config=config, max_num_seqs=4, block_size=16,
                                 num_gpu_blocks=1024, device="cpu", transport="thread",
                                 run_timeout_s=300.0))
    made = {"steps": [], "wall": []}  # rows of each table made into columns

    def counted(table, convert):
        def made_into_columns(arrow_table):
            made[table].append(len(arrow_table))
            return convert(arrow_table)
        return made_into_columns

    monkeypatch.setattr(emu.metrics, "from_steps_table", counted("steps", from_steps_table))
    monkeypatch.setattr(emu.metrics, "from_wall_table", counted("wall", from_wall_table))
    run = load_run(result.out_dir)
    steps = run.n_steps
    assert steps > 4 * PART_ROWS["steps"]  # many parts a rank

    metrics = compute_metrics(run)
    write_plots(run, tmp_path)

    # every step and wall record was read (the rank pass and the window pass), and never
    # more than a part or a window of them at a time
    assert sum(made["steps"]) == 2 * 2 * steps
    assert max(made["steps"]) <= max(PART_ROWS["steps"], WINDOW)
    assert sum(made["wall"]) >= 2 * steps
    assert max(made["wall"]) <= PART_ROWS["wall"]

    # the same records held whole give the same metrics, wall-clock section included
    whole = Run(dp_size=2, state=run.state, requests=run.requests,
                steps=[from_steps_table(read_table(result.out_dir, r, "steps"))
                       for r in range(2)],
                wall=[from_wall_table(read_table(result.out_dir, r, "wall")) for r in range(2)])
    monkeypatch.setattr(ranks, "WINDOW_ROWS", 10 * steps)
    assert compute_metrics(whole) == metrics
    assert metrics["plan_churn"]["active_steps"] > 0  # DyntraLB moved requests
