"""Metrics from hand-written event logs (emu/metrics.py); every expected number below is
worked out by hand from the records in `tiny_run`."""

import json
import math

import pytest

from emu.metrics import (
    PartialRunError,
    RunError,
    compute_metrics,
    distribution,
    load_run,
    step_series,
    tpot_values_ms,
    write_metrics,
)
from emu.records.convert import ConvertError, convert_run
from emu.run_status import unfinished_note, write_status

approx = pytest.approx


def step(rank, it, clock, own, step_time, blocks, *, plan=None, paused=(), resumed=(),
         preempted=(), dummy=False, lb_active=False):
    return {
        "kind": "step", "rank": rank, "iter": it, "wave": 0, "step_counter": it,
        "clock_s": clock, "own_cost_s": own, "step_time_s": step_time, "dummy": dummy,
        "num_running": 1, "num_waiting": 0, "running_blocks": blocks, "waiting_blocks": 0,
        "scheduled_tokens": 1, "plan_applied": plan, "paused": list(paused),
        "resumed": list(resumed), "preempted": list(preempted), "admitted": [],
        "finished": [], "plan_generated": None,
        "lb_active": lb_active, "collectives": [],
    }


def request(rank, rid, arrival, first_scheduled, token_times, finish, pauses=()):
    return {
        "kind": "request", "rank": rank, "request_id": rid, "arrival_s": arrival,
        "prompt_tokens": 100, "output_tokens": 8, "first_scheduled_s": first_scheduled,
        "token_times_s": list(token_times), "finish_s": finish,
        "pauses": [list(p) for p in pauses],
    }


def plan(out=(), inn=(), freeze=False):
    return {"out_blk": list(out), "in_blk": list(inn), "freeze": freeze}


RANK0 = [
    step(0, 1, 0.00, 0.02, 0.03, 10),
    step(0, 2, 0.03, 0.03, 0.03, 20, plan=plan(out=[5, 3])),
    step(0, 3, 0.06, 0.02, 0.04, 0, plan=plan(freeze=True), dummy=True),
    step(0, 4, 0.10, 0.02, 0.02, 0, dummy=True),
    request(0, "A", 0.00, 0.00, [0.03, 0.06, 0.10], 0.10),
    request(0, "D", 0.02, 0.03, [0.06], 0.06),
]
RANK1 = [
    step(1, 1, 0.00, 0.03, 0.03, 30),
    step(1, 2, 0.03, 0.01, 0.03, 0, plan=plan(inn=[7]), paused=["B"]),
    step(1, 3, 0.06, 0.04, 0.04, 40, resumed=["B"], preempted=["C"]),
    step(1, 4, 0.10, 0.02, 0.02, 0, dummy=True),
    request(1, "B", 0.01, 0.03, [0.06, 0.10], None, pauses=[(0.07, 0.09), (0.10, None)]),
    request(1, "C", 0.05, None, [], None),
]


def _write_run(path, ranks, wall=None):
    path.mkdir(exist_ok=True)
    for r, recs in enumerate(ranks):
        (path / f"rank{r}.events.jsonl").write_text(
            "".join(json.dumps(rec, sort_keys=True) + "\n" for rec in recs))
    for r, recs in (wall or {}).items():
        (path / f"rank{r}.wall.jsonl").write_text(
            "".join(json.dumps(rec) + "\n" for rec in recs))
    convert_run(path)
    return path


@pytest.fixture
def tiny_run(tmp_path):
    wall = {0: [{"iter": 2, "planner_s": 0.001, "lb_comm_s": 0.002},
                {"iter": 3, "planner_s": 0.003, "lb_comm_s": 0.004}]}
    return load_run(_write_run(tmp_path / "run", [RANK0, RANK1], wall))


@pytest.fixture
def m(tiny_run):
    return compute_metrics(tiny_run, config={"dp": 2}, seed=7)


def test_load_run_splits_records(tiny_run):
    assert tiny_run.dp_size == 2
    assert [len(s) for s in tiny_run.steps] == [4, 4]
    assert sorted(r["request_id"] for r in tiny_run.request_records()) == ["A", "B", "C", "D"]
    assert [w.planner_s.tolist() for w in tiny_run.wall] == [[0.001, 0.003], []]
    assert [w.collectives_s.tolist() for w in tiny_run.wall] == [[0.002, 0.004], []]


def test_time_steps_and_throughput(m):
    assert m["steps"] == 4
    assert m["virtual_time_s"] == approx(0.12)
    assert m["busy_time_s"] == approx(0.12)
    assert m["output_tokens"] == 6
    assert m["throughput_tok_s"] == approx(6 / 0.12)
    assert m["requests_total"] == 4
    assert m["requests_finished"] == 2
    assert m["preemptions"] == 1


def test_bubble_ratio(m):
    # rank 0 waits 0.01 + 0 + 0.02 + 0, rank 1 waits 0 + 0.02 + 0 + 0; dp * total = 0.24
    assert m["bubble_ratio"] == approx(0.05 / 0.24)


def test_balance_ratio_skips_steps_without_load(m):
    # steps: (10, 30) -> 20/30; (20, 0) -> 10/20; (0, 40) -> 20/40; (0, 0) excluded
    assert m["balance_ratio"] == approx((2 / 3 + 0.5 + 0.5) / 3)
    assert m["balance_steps"] == 3


def test_per_rank_utilisation(m):
    r0, r1 = m["per_rank"]
    assert r0["utilisation"] == approx(0.09 / 0.12)
    assert r1["utilisation"] == approx(0.10 / 0.12)
    assert (r0["output_tokens"], r1["output_tokens"]) == (4, 2)
    assert (r0["requests_finished"], r1["requests_finished"]) == (2, 0)
    assert (r0["dummy_steps"], r1["dummy_steps"]) == (2, 1)
    assert r0["mean_running_blocks"] == approx(7.5)
    assert r1["max_running_blocks"] == 40
    # with equal step times per rank, the bubble ratio is 1 - mean utilisation
    assert m["bubble_ratio"] == approx(1 - (r0["utilisation"] + r1["utilisation"]) / 2)


def test_ttft_queue_and_e2e(m):
    # TTFT: A 30, B 50, D 40 (C has no token); percentiles interpolate linearly
    assert m["ttft_ms"] == approx({"count": 3, "mean": 40.0, "p50": 40.0, "p90": 48.0,
                                   "p99": 49.8, "max": 50.0})
    assert m["queue_ms"] == approx({"count": 3, "mean": 10.0, "p50": 10.0, "p90": 18.0,
                                    "p99": 19.8, "max": 20.0})
    # finished only: A 100, D 40
    assert m["e2e_ms"]["count"] == 2
    assert m["e2e_ms"]["mean"] == approx(70.0)
    assert m["e2e_ms"]["p50"] == approx(70.0)


def test_tpot_and_itl(m, tiny_run):
    # TPOT: A (0.10 - 0.03) / 2 = 35 ms, B (0.10 - 0.06) / 1 = 40 ms; D has one token
    assert tpot_values_ms(tiny_run) == approx([35.0, 40.0])
    assert m["tpot_ms"]["mean"] == approx(37.5)
    assert m["tpot_ms"]["p99"] == approx(39.95)
    # ITL: every gap: A 30, 40; B 40
    assert m["itl_ms"]["count"] == 3
    assert m["itl_ms"]["mean"] == approx(110 / 3)
    assert m["itl_ms"]["p50"] == approx(40.0)


def test_pauses(m):
    # B: 0.07-0.09 closed, 0.10-open (not finished -> until end of run 0.12)
    pauses = dict(m["pauses"])
    durations = pauses.pop("duration_ms")
    longest = pauses.pop("longest_paused_ms")
    # 1 of the run's 4 requests (A and D on rank 0, B and C on rank 1) was paused
    assert pauses == {"total": 2, "requests_paused": 1, "requests_paused_pct": 25.0,
                      "per_request_mean": 0.5, "per_request_max": 2, "open_at_end": 1}
    assert durations == approx({"count": 2, "mean": 20.0, "p50": 20.0, "p90": 20.0,
                                "p99": 20.0, "max": 20.0})
    # B's two pauses, 20 ms each, add up: the longest time one request spent paused
    assert longest == approx(40.0)


def test_paused_share_counts_every_request(tmp_path):
    """The share of requests paused is over every request of the run, finished or not,
    paused or not: 1 of 4 is 25 %; the longest paused time is one request's sum."""
    run = load_run(_write_run(tmp_path / "r", [[
        step(0, 1, 0.0, 0.02, 0.02, 5),
        request(0, "P", 0.0, 0.0, [0.01], 0.5, pauses=[(0.1, 0.2), (0.3, 0.35)]),
        request(0, "Q", 0.0, 0.0, [0.01], 0.5),
        request(0, "R", 0.0, 0.0, [0.01], 0.5),
        request(0, "S", 0.0, 0.0, [0.01], None),
    ]]))
    pauses = compute_metrics(run)["pauses"]
    assert pauses["requests_paused"] == 1
    assert pauses["requests_paused_pct"] == approx(25.0)
    assert pauses["longest_paused_ms"] == approx(150.0)


def test_open_pause_of_finished_request_ends_at_finish(tmp_path):
    run = load_run(_write_run(tmp_path / "r", [[
        step(0, 1, 0.0, 0.02, 0.02, 5),
        request(0, "X", 0.0, 0.0, [0.01], 0.5, pauses=[(0.2, None)]),
    ]]))
    assert compute_metrics(run)["pauses"]["duration_ms"]["max"] == approx(300.0)


def test_plan_churn(m):
    # step 2: rank 0 outs 2, rank 1 ins 1; step 3: rank 0 empty freeze plan
    assert m["plan_churn"] == approx({
        "active_steps": 2, "outs": 2, "ins": 1, "per_active_step": 1.5,
        "freeze_rank_steps": 1, "paused": 1, "resumed": 1,
    })


def test_wall_clock_sections(m, tmp_path):
    assert m["wall"]["records"] == 2
    assert m["wall"]["planner_ms"]["mean"] == approx(2.0)
    assert m["wall"]["lb_comm_ms"]["max"] == approx(4.0)
    assert m["wall"]["planner_total_s"] == approx(0.004)
    assert m["wall"]["lb_comm_total_s"] == approx(0.006)
    assert m["wall"]["step_wall_ms"]["count"] == 0
    no_wall = compute_metrics(load_run(_write_run(tmp_path / "nw", [RANK0, RANK1])))
    assert no_wall["wall"] is None
    # The ranks' own field name for the collectives, read where lb_comm_s is absent; a
    # record with neither is left out.
    wall = {0: [{"iter": 2, "dyntra_lb_collectives_s": 0.005},
                {"iter": 3, "lb_comm_s": 0.001, "dyntra_lb_collectives_s": 0.009},
                {"iter": 4, "planner_s": 0.002}]}
    kit = compute_metrics(load_run(_write_run(tmp_path / "kit", [RANK0, RANK1], wall)))
    assert kit["wall"]["lb_comm_ms"]["count"] == 2
    assert kit["wall"]["lb_comm_total_s"] == approx(0.006)


def test_wall_clock_engine_field_names(tmp_path):
    """emu/impl/kit/engine.py writes `dyntra_lb_collectives_s` and `step_wall_s`; a run without
    DyntraLB has no planner fields at all."""
    wall = {0: [{"iter": 1, "step_wall_s": 0.010, "planner_s": 0.001,
                 "dyntra_lb_collectives_s": 0.003}],
            1: [{"iter": 1, "step_wall_s": 0.030}]}
    m = compute_metrics(load_run(_write_run(tmp_path / "w", [RANK0, RANK1], wall)))
    assert m["wall"]["records"] == 2
    assert m["wall"]["step_wall_ms"]["mean"] == approx(20.0)
    assert m["wall"]["planner_ms"]["count"] == 1
    assert m["wall"]["lb_comm_ms"]["mean"] == approx(3.0)


def test_required_keys_config_seed_and_json_roundtrip(m, tmp_path):
    for key in ("throughput_tok_s", "bubble_ratio", "balance_ratio", "ttft_ms", "tpot_ms",
                "itl_ms", "e2e_ms", "pauses", "plan_churn", "steps", "virtual_time_s",
                "requests_finished", "config", "seed", "schema_version"):
        assert key in m, key
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        assert {"p50", "p90", "p99", "mean"} <= set(m[key])
    assert m["config"] == {"dp": 2} and m["seed"] == 7
    path = tmp_path / "metrics.json"
    write_metrics(m, path)
    text = path.read_text()
    assert json.loads(text) == m
    assert text.endswith("}\n")


def test_metrics_are_deterministic(tmp_path):
    a = compute_metrics(load_run(_write_run(tmp_path / "a", [RANK0, RANK1])), seed=1)
    b = compute_metrics(load_run(_write_run(tmp_path / "b", [RANK0, RANK1])), seed=1)
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def test_empty_distribution_and_run_without_steps(tmp_path):
    assert distribution([]) == {"count": 0, "mean": None, "p50": None, "p90": None,
                                "p99": None, "max": None}
    run = load_run(_write_run(tmp_path / "e", [[request(0, "X", 0.0, None, [], None)]]))
    m = compute_metrics(run)
    assert m["steps"] == 0 and m["virtual_time_s"] == 0.0
    assert m["throughput_tok_s"] is None and m["bubble_ratio"] is None
    assert m["balance_ratio"] is None
    json.dumps(m, allow_nan=False)


def test_step_series(tiny_run):
    s = step_series(tiny_run)
    assert [(x.tolist(), y.tolist()) for x, y in s.loads] == [
        ([1, 2, 3, 4], [10, 20, 0, 0]), ([1, 2, 3, 4], [30, 0, 40, 0])]
    assert s.imbalance[1].tolist() == [20, 20, 40, 0]
    assert s.bubble[0].tolist() == approx([0.0, 0.03, 0.06, 0.10])
    bubble = [0.01 / 0.06 * 100, 0.02 / 0.06 * 100, 0.02 / 0.08 * 100, 0.0]
    assert s.bubble[1].tolist() == approx(bubble)
    # four steps: every window of 32 steps centred on one holds them all
    assert s.bubble_smooth[1].tolist() == approx([sum(bubble) / 4] * 4)
    assert s.plan_spans == [(2, 3)]
    assert s.max_running_blocks == 40


def test_load_run_errors(tmp_path):
    with pytest.raises(RunError, match="not a directory"):
        load_run(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(RunError, match=r"no records \(rank<r>\.steps/\)"):
        load_run(tmp_path / "empty")
    gap = _write_run(tmp_path / "gap", [RANK0, RANK1])
    for table in ("steps", "requests"):
        (gap / f"rank1.{table}").rename(gap / f"rank2.{table}")
    with pytest.raises(RunError, match=r"ranks \[0, 2\]; expected ranks 0\.\.1"):
        load_run(gap)
    short = _write_run(tmp_path / "short", [RANK0, RANK1[:2] + RANK1[4:]])
    with pytest.raises(RunError, match="rank 1 logged 2 steps and rank 0 logged 4"):
        load_run(short)
    bad = _write_run(tmp_path / "bad", [RANK0])
    with open(bad / "rank0.events.jsonl", "a") as f:
        f.write('{"kind": "step", \n')
    with pytest.raises(ConvertError, match=r"rank0\.events\.jsonl:7: invalid JSON"):
        convert_run(bad)
    with pytest.raises(ConvertError, match="unknown record kind 'wave'"):
        _write_run(tmp_path / "odd", [[{"kind": "wave"}]])
    torn = _write_run(tmp_path / "torn", [RANK0])
    (torn / "rank0.steps" / "part-00000.parquet").write_bytes(b"PAR1 cut short")
    with pytest.raises(RunError, match=r"part-00000\.parquet: not a readable Parquet"):
        load_run(torn)


# ------------------------------------------------------------- partial runs (issue 12)


def _interrupted_run(tmp_path, state="interrupted"):
    """A run stopped mid-way: rank 1 got one step further than rank 0, and only A's
    request record was written (B, C were in flight)."""
    rank0 = [step(0, 1, 0.0, 0.02, 0.03, 10), request(0, "A", 0.0, 0.0, [0.03], 0.03),
             step(0, 2, 0.03, 0.03, 0.03, 20)]
    rank0[2]["admitted"] = ["B"]
    rank1 = [step(1, 1, 0.0, 0.03, 0.03, 30), step(1, 2, 0.03, 0.01, 0.03, 0, paused=["C"]),
             step(1, 3, 0.06, 0.01, 0.03, 0)]
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = _write_run(tmp_path / "partial", [rank0, rank1])
    write_status(path, state, reason="interrupted by SIGTERM: every rank was stopped")
    return path


def test_an_unfinished_run_is_refused_by_default(tmp_path):
    path = _interrupted_run(tmp_path)
    with pytest.raises(PartialRunError, match=r"run\.json says 'interrupted': interrupted "
                                              r"by SIGTERM.*allow_partial=True"):
        load_run(path)
    with pytest.raises(PartialRunError, match="still running, or its launcher"):
        load_run(_interrupted_run(tmp_path / "again", state="running"))


def test_an_unfinished_run_read_as_partial_keeps_its_requests_in_flight(tmp_path):
    run = load_run(_interrupted_run(tmp_path), allow_partial=True)
    assert run.state == "interrupted"
    assert [rank.iter.tolist() for rank in run.steps] == [[1, 2], [1, 2]]
    unfinished = {(r["rank"], r["request_id"]): r for r in run.request_records()
                  if r.get("unfinished")}
    assert sorted(unfinished) == [(0, "B"), (1, "C")]
    m = compute_metrics(run)
    assert m["run_state"] == "interrupted"
    assert (m["requests_total"], m["requests_finished"], m["requests_unfinished"]) == (3, 1, 2)
    assert m["steps"] == 2


def test_a_complete_run_and_a_directory_without_run_json_read_as_before(tmp_path):
    legacy = _write_run(tmp_path / "legacy", [RANK0, RANK1])
    assert load_run(legacy).state is None
    assert compute_metrics(load_run(legacy))["run_state"] is None
    write_status(legacy, "complete")
    assert compute_metrics(load_run(legacy))["run_state"] == "complete"


def test_offline_tools_flag_a_log_of_an_unfinished_run(tmp_path):
    path = _interrupted_run(tmp_path)
    (path / "rank0.log").write_text("")
    note = unfinished_note(path / "rank0.log")
    assert note.startswith("warning: ") and "interrupted" in note and "rank0.log is partial" in note
    write_status(path, "complete")
    assert unfinished_note(path / "rank0.log") is None


def test_headroom_is_the_bubble_free_bound(m):
    # own costs per step (rank 0, rank 1) / step time: (.02, .03)/.03, (.03, .01)/.03,
    # (.02, .04)/.04, (.02, .02)/.02 -> balanced steps take the mean own cost
    h = m["headroom"]
    assert h["cost_balance_ratio"] == approx((0.025 / 0.03 + 0.02 / 0.03 + 0.75 + 1) / 4)
    assert h["sol_busy_time_s"] == approx(0.025 + 0.02 + 0.03 + 0.02)
    assert h["sol_virtual_time_s"] == approx(0.095)  # no idle gap in this run
    assert h["sol_throughput_tok_s"] == approx(6 / 0.095)
    assert h["max_gain"] == approx(0.12 / 0.095 - 1)


def test_headroom_keeps_idle_gaps(tmp_path):
    # one wave of two steps, 1 s idle, one more step: the gap is no rank's fault
    ranks = [[step(0, 1, 0.0, 0.02, 0.04, 1), step(0, 2, 1.04, 0.04, 0.04, 1),
              request(0, "A", 0.0, 0.0, [0.04, 1.08], 1.08)],
             [step(1, 1, 0.0, 0.04, 0.04, 1), step(1, 2, 1.04, 0.04, 0.04, 1)]]
    m = compute_metrics(load_run(_write_run(tmp_path / "g", ranks)))
    assert m["virtual_time_s"] == approx(1.08) and m["busy_time_s"] == approx(0.08)
    assert m["headroom"]["sol_virtual_time_s"] == approx(1.08 - 0.08 + 0.03 + 0.04)
    assert m["headroom"]["max_gain"] == approx(1.08 / 1.07 - 1)


def test_lb_activity(m, tmp_path):
    assert m["lb_activity"] == {"planner_steps": 0, "waves": 1, "longest_wave_steps": 4,
                                "largest_prompt_tokens": 100}
    ranks = [[step(0, 1, 0.0, 0.02, 0.02, 1, lb_active=True), step(0, 2, 0.02, 0.02, 0.02, 1)],
             [step(1, 1, 0.0, 0.02, 0.02, 1), step(1, 2, 0.02, 0.02, 0.02, 1, lb_active=True)]]
    active = compute_metrics(load_run(_write_run(tmp_path / "a", ranks)))
    assert active["lb_activity"]["planner_steps"] == 2


def test_headroom_of_a_run_without_steps(tmp_path):
    run = load_run(_write_run(tmp_path / "e", [[request(0, "X", 0.0, None, [], None)]]))
    h = compute_metrics(run)["headroom"]
    assert h["cost_balance_ratio"] is None and h["sol_throughput_tok_s"] is None
    assert h["max_gain"] is None


def test_itl_takes_gaps_within_requests_only():
    """Requests without tokens first, between and last, same-step tokens (no ITL),
    and a request whose first token comes before the previous one's last."""
    from itertools import pairwise

    import numpy as np

    from emu.metrics import Run

    def columns(times):
        records = [{"rank": 0, "request_id": str(i), "token_times_s": t, "pauses": []}
                   for i, t in enumerate(times)]
        return Run.from_records(1, [[]], records).requests

    times = [[], [1.0, 1.5, 1.5, 2.0], [], [0.5], [0.25, 3.0], []]
    expected = [(b - a) * 1e3 for t in times for a, b in pairwise(t) if b != a]
    itl = columns(times).itl_ms
    assert np.repeat(itl.values, itl.counts).tolist() == sorted(expected) \
        == [500.0, 500.0, 2750.0]
    assert itl.total == sum(expected)
    assert columns([]).itl_ms.count == 0


def test_requests_read_part_by_part_equal_the_whole_table():
    """Token times reduced part by part (as load_run reads them) give the columns of the
    whole table read at once, wherever the parts split the requests."""
    import numpy as np

    from emu.records.columns import from_requests_parts, from_requests_table, records_table

    rng = np.random.default_rng(3)
    records = []
    for i in range(40):
        start = float(rng.integers(0, 50))
        times = np.cumsum(rng.choice([0.0, 0.0, 0.5, 1.25], size=int(rng.integers(0, 9))))
        records.append({"rank": 0, "request_id": str(i), "arrival_s": start,
                        "token_times_s": (start + times).tolist(), "pauses": []})
    table = records_table(records, "requests")
    whole = from_requests_table(table)
    cuts = [0, 1, 1, 7, 20, 33, 40]
    parts = [table.slice(a, b - a) for a, b in zip(cuts, cuts[1:], strict=False)]

    split = from_requests_parts(lambda: iter(parts))

    tokens = [r["token_times_s"] for r in records]
    expected = {"token_counts": [len(t) for t in tokens],
                "first_token_s": [t[0] if t else math.nan for t in tokens],
                "last_token_s": [t[-1] if t else math.nan for t in tokens]}
    assert 0 in expected["token_counts"]
    for name, values in expected.items():
        assert np.array_equal(getattr(split, name), values, equal_nan=True)
        assert np.array_equal(getattr(whole, name), values, equal_nan=True)
    assert np.array_equal(split.itl_ms.values, whole.itl_ms.values)
    assert np.array_equal(split.itl_ms.counts, whole.itl_ms.counts)
    assert split.itl_ms.total == whole.itl_ms.total
    assert whole.itl_ms.count == sum(
        1 for r in records for a, b in zip(r["token_times_s"], r["token_times_s"][1:],
                                           strict=False) if b != a)


def test_requests_of_many_parts_are_joined_into_the_table_of_the_whole(monkeypatch):
    """load_run joins the requests' parts (their token times dropped) a few dozen at a
    time as they come: the table and columns are those of the whole table, in order."""
    import numpy as np

    from emu.records import columns
    from emu.records.columns import from_requests_parts, from_requests_table, records_table

    monkeypatch.setattr(columns, "_JOINED_PARTS", 3)
    records = [{"rank": i // 10, "request_id": f"r{i}", "arrival_s": 0.1 * i,
                "token_times_s": [0.1 * i + 0.5 * k for k in range(i % 4)],
                "pauses": [(0.1 * i, 0.1 * i + 0.2)] * (i % 3)}
               for i in range(40)]
    table = records_table(records, "requests")
    whole = from_requests_table(table)
    parts = [table.slice(i, 1) for i in range(40)]  # 13 joins of 3 and one part held

    split = from_requests_parts(lambda: iter(parts))

    assert split.table.to_pylist() == whole.table.to_pylist()
    assert [r["request_id"] for r in split.table.to_pylist()] == [f"r{i}" for i in range(40)]
    for name in ("rank", "arrival_s", "token_counts", "pause_offsets", "pause_start_s",
                 "pause_end_s"):
        assert np.array_equal(getattr(split, name), getattr(whole, name), equal_nan=True), name
