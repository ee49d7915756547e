"""Tables, summary.md and plots (emu/report.py) on hand-written and synthetic runs."""

import re
import struct

import numpy as np
import pytest

from emu.metrics import Run, compute_metrics
from emu.plots import write_ab_plots, write_plots
from emu.report import (
    ab_table,
    ab_wall_table,
    summary_table,
    write_ab_summary_md,
    write_summary_md,
)


def synthetic_run(seed: int, *, dp: int = 4, steps: int = 400, balance_from: int | None = None,
                  wall: bool = False) -> Run:
    """A plausible run: per-rank loads drift apart; from `balance_from` on, plans are
    applied and pull every rank towards the mean. Step cost follows the emulator's
    default model (20 ms + 19.2 us per block)."""
    rng = np.random.default_rng(seed)
    loads = rng.integers(200, 900, size=dp).astype(float)
    rank_steps: list[list[dict]] = [[] for _ in range(dp)]
    clock = 0.0
    for it in range(1, steps + 1):
        active = balance_from is not None and it >= balance_from
        loads = np.clip(loads + rng.normal(0, 25, size=dp), 0, None)
        if active:
            loads += 0.15 * (loads.mean() - loads)
        blocks = np.rint(loads).astype(int)
        own = 0.020 + 19.2e-6 * blocks
        step_time = float(own.max())
        for r in range(dp):
            plan = {"out_blk": [12] * int(r % 2), "in_blk": [8] * int(r == 0),
                    "freeze": False} if active else None
            rank_steps[r].append({
                "kind": "step", "rank": r, "iter": it, "wave": 0, "step_counter": it,
                "clock_s": clock, "own_cost_s": float(own[r]), "step_time_s": step_time,
                "dummy": False, "num_running": 8, "num_waiting": 1,
                "running_blocks": int(blocks[r]), "waiting_blocks": 10,
                "scheduled_tokens": 8, "plan_applied": plan, "paused": [], "resumed": [],
                "admitted": [], "finished": [], "plan_generated": plan,
                "lb_active": active, "collectives": [],
            })
        clock += step_time
    requests = []
    for i in range(120):
        rank = i % dp
        arrival = float(rng.uniform(0, clock * 0.6))
        n_tokens = int(rng.integers(2, 200))
        gap = clock / steps * float(rng.lognormal(0.0, 0.25))
        first = arrival + float(rng.uniform(0.02, 0.3))
        times = [first + k * gap for k in range(n_tokens)]
        done = times[-1] <= clock
        times = [t for t in times if t <= clock]
        pauses = [[first + gap, first + 3 * gap]] if i % 7 == 0 else []
        requests.append({
            "kind": "request", "rank": rank, "request_id": f"req-{i}", "arrival_s": arrival,
            "prompt_tokens": 500, "output_tokens": n_tokens, "first_scheduled_s": arrival,
            "token_times_s": times, "finish_s": times[-1] if done else None,
            "pauses": pauses,
        })
    wall_recs = None
    if wall:
        wall_recs = [[{"iter": s["iter"], "planner_s": 2e-4, "lb_comm_s": 5e-4}
                      for s in rank if s["lb_active"]] for rank in rank_steps]
    return Run.from_records(dp_size=dp, steps=rank_steps, requests=requests, wall=wall_recs)


def _png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


@pytest.fixture(scope="module")
def runs():
    off = synthetic_run(1)
    on = synthetic_run(1, balance_from=120, wall=True)
    return off, on


def test_summary_table_shows_headline_numbers(runs):
    m = compute_metrics(runs[1], seed=3)
    text = summary_table(m)
    lines = text.splitlines()
    assert lines[0].startswith("run")
    assert f"{m['throughput_tok_s']:.1f} tok/s" in text
    assert f"{m['bubble_ratio'] * 100:.1f} %" in text
    assert f"{m['balance_ratio']:.3f}" in text
    tpot = next(line for line in lines if line.startswith("TPOT"))
    assert tpot.split()[1:] == [f"{m['tpot_ms'][s]:.2f}" for s in ("p50", "p90", "p99", "mean")]
    assert "planner wall time per step" in text
    rank_rows = [line for line in lines if line[:1].isdigit()]
    assert len(rank_rows) == 4
    assert "planner wall time" not in summary_table(compute_metrics(runs[0]))


def test_summary_table_handles_empty_run():
    m = compute_metrics(Run.from_records(dp_size=1, steps=[[]], requests=[]))
    text = summary_table(m)
    assert "throughput" in text and "- tok/s" in text


def test_ab_table_every_metric_with_deltas():
    a = {"schema_version": 1, "seed": 0, "config": {"x": 1}, "dp_size": 2,
         "throughput_tok_s": 100.0, "bubble_ratio": 0.2, "steps": 10,
         "ttft_ms": {"count": 3, "mean": 10.0, "p50": None}, "per_rank": [
             {"rank": 0, "utilisation": 0.5}], "extra": 0}
    b = {"schema_version": 1, "seed": 0, "config": {"x": 2}, "dp_size": 2,
         "throughput_tok_s": 110.0, "bubble_ratio": 0.15, "steps": 12,
         "ttft_ms": {"count": 3, "mean": 12.5, "p50": 4.0}, "per_rank": [
             {"rank": 0, "utilisation": 0.6}], "extra": 3}
    rows = {line.split()[0]: line.split()[1:]
            for line in ab_table(a, b, ("off", "on")).splitlines()[2:]}
    assert ab_table(a, b, ("off", "on")).splitlines()[0].split() == \
        ["metric", "off", "on", "delta", "delta", "%"]
    assert rows["throughput_tok_s"] == ["100.0000", "110.0000", "+10.0000", "+10.0%"]
    assert rows["bubble_ratio"] == ["0.2000", "0.1500", "-0.0500", "-25.0%"]
    assert rows["steps"] == ["10", "12", "+2", "+20.0%"]
    assert rows["ttft_ms.mean"] == ["10.0000", "12.5000", "+2.5000", "+25.0%"]
    assert rows["ttft_ms.p50"] == ["-", "4.0000", "-", "-"]
    assert rows["per_rank.0.utilisation"] == ["0.5000", "0.6000", "+0.1000", "+20.0%"]
    assert rows["extra"] == ["0", "3", "+3", "-"]  # relative change from 0 is undefined
    for not_metric in ("seed", "schema_version", "config.x", "dp_size", "per_rank.0.rank"):
        assert not_metric not in rows
    assert list(rows)[:3] == ["throughput_tok_s", "bubble_ratio", "steps"]


def test_ab_table_covers_every_numeric_metric(runs):
    ma, mb = (compute_metrics(r) for r in runs)
    table = ab_table(ma, mb, ("off", "on"))
    names = {line.split()[0] for line in table.splitlines()[2:]}
    for key in ("throughput_tok_s", "bubble_ratio", "balance_ratio", "tpot_ms.p99",
                "pauses.duration_ms.mean", "plan_churn.per_active_step",
                "per_rank.3.utilisation"):
        assert key in names, key


def test_wall_clock_figures_are_shown_apart_and_never_compared(runs):
    """Issue 12: two runs of the same virtual-time work differ in wall-clock time by
    chance; such a row in the A/B table is noise labelled as a change (and a +1000 %
    one widened the table)."""
    ma, mb = compute_metrics(runs[1]), compute_metrics(runs[1])  # runs[1] has wall logs
    mb["wall"]["lb_comm_total_s"] = 40 * ma["wall"]["lb_comm_total_s"]
    table = ab_table(ma, mb, ("off", "on"))
    names = {line.split()[0] for line in table.splitlines()[2:]}
    assert not any(name.startswith("wall") for name in names), sorted(names)
    wall = ab_wall_table(ma, mb, ("off", "on")).splitlines()
    assert wall[0].startswith("Wall-clock time of the emulator itself")
    assert re.split(r"\s{2,}", wall[1].strip()) == ["wall-clock", "off", "on"]
    rows = {line.split()[0]: line.split()[1:] for line in wall[3:]}
    assert rows["lb_comm_total_s"] == [f"{ma['wall']['lb_comm_total_s']:.3f}",
                                       f"{mb['wall']['lb_comm_total_s']:.3f}"]
    assert "planner_ms.p99" in rows
    assert ab_wall_table({"wall": None}, {"wall": None}) is None


def test_summary_md_files(runs, tmp_path):
    m = compute_metrics(runs[1], seed=11, config={"dp_size": 4, "mode": "static"})
    plots = write_plots(runs[1], tmp_path)
    write_summary_md(tmp_path / "summary.md", m, title="default at dp=4", plots=plots)
    md = (tmp_path / "summary.md").read_text()
    assert md.startswith("# default at dp=4\n")
    assert "Seed: `11`" in md
    assert "![load](load.png)" in md and "![tpot](tpot.png)" in md
    assert f"| throughput | {m['throughput_tok_s']:.1f} tok/s |" in md
    assert "| DP bubble ratio | " in md and "| planner wall time per step | " in md
    assert '```json\n{\n  "dp_size": 4,\n  "mode": "static"\n}\n```' in md

    ma = compute_metrics(runs[0], seed=11)
    write_ab_summary_md(tmp_path / "ab.md", ma, m, ("off", "on"),
                        plots=[tmp_path / "x" / "bubble_ab.png"])
    ab = (tmp_path / "ab.md").read_text()
    assert "A = `off`, B = `on`" in ab
    assert "| wall." not in ab and "## Wall-clock time (measured, not compared)" in ab
    assert "## Config of off" in ab and "## Config of on" in ab
    assert "| bubble_ratio |" in ab
    assert "![bubble_ab](x/bubble_ab.png)" in ab


def test_plots_are_written_as_readable_pngs(runs, tmp_path):
    paths = write_plots(runs[1], tmp_path)
    assert [p.name for p in paths] == ["load.png", "bubble.png", "tpot.png"]
    for p in paths:
        width, height = _png_size(p)
        assert width >= 800 and height >= 500, (p, width, height)
        assert p.stat().st_size > 20_000
    ab = write_ab_plots(runs[0], runs[1], ("off", "on"), tmp_path)
    assert [p.name for p in ab] == ["load_ab.png", "bubble_ab.png", "tpot_ab.png"]
    assert _png_size(ab[0])[1] > _png_size(paths[0])[1]  # three stacked panels


def test_plots_survive_a_run_without_steps_or_tokens(tmp_path):
    empty = Run.from_records(dp_size=2, steps=[[], []], requests=[])
    write_plots(empty, tmp_path)
    write_ab_plots(empty, empty, ("a", "b"), tmp_path)
    assert all((tmp_path / n).exists() for n in ("load.png", "tpot_ab.png"))
