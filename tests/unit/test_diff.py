"""emu.offline.diff on synthetic event logs: alignment per rank and iteration, what counts as a
divergence (and what is normalised away), which divergence is the first, its context,
and the diagnostics-line comparison across the kit's and vllm-ascend's log prefixes."""

from __future__ import annotations

import copy
import json

import pytest

from emu.offline.diff import DiffInputError, compare, format_report, plot_load, read_run
from emu.records.convert import convert_run
from emu.run_status import write_status


def _step(i: int, rank: int, **overrides) -> dict:
    record = {
        "kind": "step", "rank": rank, "iter": i, "wave": 0, "step_counter": i + 1,
        "clock_s": 0.01 * i, "own_cost_s": 0.01, "step_time_s": 0.01, "dummy": False,
        "num_running": 2, "num_waiting": 1, "running_blocks": 10 + i + rank,
        "waiting_blocks": 3, "scheduled_tokens": 2, "plan_applied": None, "paused": [],
        "resumed": [], "admitted": [], "preempted": [], "finished": [],
        "plan_generated": {"out_blk": [], "in_blk": [3], "freeze": False},
        "lb_active": True, "kv_free_blocks": 100, "kv_held_blocks": 12,
        "paused_kv_blocks": {},
        "collectives": [{"seq": 2 * i, "site": "engine.lockstep", "op": "all_reduce_max",
                         "shape": [3], "dtype": "int64"},
                        {"seq": 2 * i + 1, "site": "dyntra_lb.allgather", "op": "all_gather",
                         "shape": [6], "dtype": "int32"}],
    }
    record.update(overrides)
    return record


def _request(rid: str, rank: int, **overrides) -> dict:
    record = {"kind": "request", "rank": rank, "request_id": rid, "arrival_s": 0.0,
              "prompt_tokens": 40, "output_tokens": 3, "first_scheduled_s": 0.0,
              "token_times_s": [0.01, 0.02, 0.03], "finish_s": 0.03, "pauses": []}
    record.update(overrides)
    return record


def _steps(dp=2, n=6):
    return [[_step(i, r) for i in range(n)] for r in range(dp)]


def write_run(directory, steps, requests=None, logs=None):
    directory.mkdir(parents=True)
    for rank, rank_steps in enumerate(steps):
        lines = [json.dumps(s, sort_keys=True) for s in rank_steps]
        lines += [json.dumps(r, sort_keys=True) for r in (requests or {}).get(rank, [])]
        (directory / f"rank{rank}.events.jsonl").write_text("\n".join(lines) + "\n")
        if logs is not None:
            (directory / f"rank{rank}.log").write_text(logs[rank])
    convert_run(directory)
    return directory


def _pair(tmp_path, steps_a, steps_b, **kwargs):
    kwargs_b = {k[:-2]: v for k, v in kwargs.items() if k.endswith("_b")}
    kwargs_a = {k[:-2]: v for k, v in kwargs.items() if k.endswith("_a")}
    a = read_run(write_run(tmp_path / "a", steps_a, **kwargs_a), "kit")
    b = read_run(write_run(tmp_path / "b", steps_b, **kwargs_b), "vllm-ascend")
    return a, b


def test_identical_runs_count_what_was_compared(tmp_path):
    requests = {0: [_request("r0", 0)], 1: [_request("r1", 1)]}
    a, b = _pair(tmp_path, _steps(), _steps(), requests_a=requests, requests_b=requests)
    report = compare(a, b)
    assert report.identical and report.first is None
    assert report.counts == {"ranks": 2, "steps": 12, "collectives": 24, "plans": 12,
                             "requests": 2, "diagnostics_lines": 0}
    assert format_report(report).splitlines()[-1].startswith("identical: 2 ranks, 12 step")


def test_first_divergence_is_the_earliest_iteration_then_the_lowest_rank(tmp_path):
    steps_b = _steps()
    steps_b[0][4]["plan_generated"] = {"out_blk": [5], "in_blk": [3], "freeze": False}
    steps_b[1][3]["admitted"] = ["x"]
    steps_b[0][3]["running_blocks"] += 1
    a, b = _pair(tmp_path, _steps(), steps_b)
    report = compare(a, b)
    assert [(d.iter, d.rank, d.kind) for d in report.divergences] == [
        (3, 0, "snapshot"), (3, 1, "schedule"), (4, 0, "plan")]
    first = report.first
    assert first.fields == {"running_blocks": [13, 14]}
    # context: both sides' state on every rank at that iteration, and the steps before
    assert first.context["state"]["kit"]["running_blocks"] == 13
    assert first.context["state"]["vllm-ascend"]["running_blocks"] == 14
    assert [s["running_blocks"] for s in first.context["ranks"]["kit"]] == [13, 14]
    assert [e["kit"]["iter"] for e in first.context["before"]] == [0, 1, 2]
    assert report.divergences[1].context == {}  # only the first carries context
    groups = report.by_kind()
    assert list(groups) == ["plan", "schedule", "snapshot"]
    assert groups["plan"] == {"count": 1, "ranks": [0], "first_iter": 4,
                              "fields": ["plan_generated"]}
    text = format_report(report)
    assert "first divergence at rank 0, iteration 3: snapshot" in text
    assert "kit: 13" in text and "vllm-ascend: 14" in text


def test_context_is_clipped_at_the_first_step(tmp_path):
    steps_b = _steps()
    steps_b[1][1]["step_counter"] = 99
    a, b = _pair(tmp_path, _steps(), steps_b)
    report = compare(a, b, before=3)
    assert report.first.kind == "counter" and report.first.rank == 1
    assert [e["kit"]["iter"] for e in report.first.context["before"]] == [0]


def test_preempted_order_and_collective_seq_are_not_divergences(tmp_path):
    steps_a, steps_b = _steps(), _steps()
    steps_a[0][2]["preempted"] = ["r2", "r1"]
    steps_b[0][2]["preempted"] = ["r1", "r2"]
    for step in steps_b[1]:
        for c in step["collectives"]:
            c["seq"] += 100
    assert compare(*_pair(tmp_path, steps_a, steps_b)).identical


def test_a_collective_of_another_dtype_or_a_missing_one_diverges(tmp_path):
    steps_b = _steps()
    steps_b[1][2]["collectives"][1]["dtype"] = "int64"
    steps_b[0][5]["collectives"].pop()
    report = compare(*_pair(tmp_path, _steps(), steps_b))
    assert [(d.kind, d.rank, d.iter) for d in report.divergences] == [
        ("collectives", 1, 2), ("collectives", 0, 5)]
    a_side, b_side = report.first.fields["collectives"]
    assert a_side[1] == ["dyntra_lb.allgather", "all_gather", [6], "int32"]
    assert b_side[1] == ["dyntra_lb.allgather", "all_gather", [6], "int64"]


def test_a_run_with_fewer_steps_diverges_at_its_end(tmp_path):
    steps_b = [s[:4] for s in _steps()]
    report = compare(*_pair(tmp_path, _steps(), steps_b))
    assert [(d.kind, d.rank, d.iter) for d in report.divergences] == [
        ("steps", 0, 4), ("steps", 1, 4)]
    assert report.first.fields == {"steps": [6, 4]}
    assert report.first.context["state"]["vllm-ascend"] is None


def test_request_records_are_compared_after_the_steps(tmp_path):
    requests_a = {0: [_request("r0", 0)], 1: [_request("r1", 1)]}
    requests_b = {0: [_request("r0", 0, finish_s=0.04)], 1: [_request("r9", 1)]}
    steps_b = _steps()
    steps_b[1][5]["finished"] = ["r9"]
    report = compare(*_pair(tmp_path, _steps(), steps_b, requests_a=requests_a,
                            requests_b=requests_b))
    kinds = [(d.kind, d.rank, d.iter) for d in report.divergences]
    assert kinds[0] == ("schedule", 1, 5)
    assert ("request", 0, None) in kinds
    assert sum(k == ("request", 1, None) for k in kinds) == 2  # r1 and r9: one side each
    assert report.divergences[1].fields == {"finish_s": [0.03, 0.04]}


def test_different_dp_sizes_are_bad_input(tmp_path):
    a, b = _pair(tmp_path, _steps(dp=2), _steps(dp=4))
    with pytest.raises(DiffInputError, match="different DP sizes"):
        compare(a, b)


def test_a_directory_without_records_is_bad_input(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DiffInputError, match=r"no records \(rank<r>\.steps/\)"):
        read_run(tmp_path / "empty", "A")


def test_a_directory_of_json_lines_logs_names_the_command_that_converts_it(tmp_path):
    old = tmp_path / "old"
    old.mkdir()
    (old / "rank0.events.jsonl").write_text("{}\n")
    with pytest.raises(DiffInputError, match=f"convert them with: dyntra-emu convert {old}$"):
        read_run(old, "A")


_RULE = "=" * 85
_ROW = " DP0 | Run(1): [ 38]" + " " * 43 + "| Wait(0): []"
_CORE = "(EngineCore_DP0) INFO [patch_dyntra_lb_core.py:{}] {}"
KIT_LOG = "\n".join([
    "(EngineCore_DP0) INFO [dyntra_lb] Enable DyntraLB DP load balancing.",
    "(EngineCore_DP0) INFO emulated engine: max_num_seqs=4 block_size=16",
    "(EngineCore_DP0) INFO _has_global_unfinished_reqs | step_counter: 0",
    # the kit logs a table in one call: its continuation lines have no prefix
    f"(EngineCore_DP0) INFO {_RULE}",
    "[dyntra_lb] requests_by_rank (DP Workload Status):",
    _ROW,
    "(EngineCore_DP0) INFO _has_global_unfinished_reqs | step_counter: 1",
]) + "\n"
VLLM_LOG = "\n".join([
    "(EngineCore_DP0) INFO emulated engine: max_num_seqs=4 block_size=16",
    _CORE.format(75, "[dyntra_lb] Enable DyntraLB DP load balancing."),
    _CORE.format(109, "_has_global_unfinished_reqs | step_counter: 0"),
    _CORE.format(80, _RULE),
    _CORE.format(81, "[dyntra_lb] requests_by_rank (DP Workload Status):"),
    _CORE.format(88, _ROW),
    _CORE.format(109, "_has_global_unfinished_reqs | step_counter: 1"),
]) + "\n"


def test_diagnostics_lines_compare_equal_across_the_two_prefixes(tmp_path):
    a, b = _pair(tmp_path, _steps(dp=1), _steps(dp=1), logs_a=[KIT_LOG], logs_b=[VLLM_LOG])
    report = compare(a, b)
    assert report.identical, format_report(report)
    assert report.counts["diagnostics_lines"] == 6


def test_a_differing_diagnostics_line_is_named_with_its_iteration(tmp_path):
    changed = VLLM_LOG.replace("Run(1): [ 38]", "Run(1): [ 39]")
    a, b = _pair(tmp_path, _steps(dp=1), _steps(dp=1), logs_a=[KIT_LOG], logs_b=[changed])
    report = compare(a, b)
    [d] = report.divergences
    assert (d.kind, d.rank, d.iter) == ("diagnostics", 0, 0)
    lines_a, lines_b = d.fields["lines"]
    assert lines_a == [f"6: {_ROW}"]
    assert lines_b[0].startswith("6:  DP0 | Run(1): [ 39]")
    assert "rank 0, iteration 0: diagnostics" in format_report(report)


def test_plot_marks_the_divergences(tmp_path):
    steps_b = copy.deepcopy(_steps())
    steps_b[1][2]["running_blocks"] = 40
    a, b = _pair(tmp_path, _steps(), steps_b)
    path = plot_load(a, b, compare(a, b), tmp_path / "load_diff.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def _failed(directory, reason):
    write_status(directory, "failed", reason=reason)
    return directory


STALL = "rank 0 failed: emu.rank.context.StallError: rank 0 is stuck"


def test_a_failed_run_against_a_complete_one_diverges_in_its_outcome(tmp_path):
    a = read_run(write_run(tmp_path / "a", _steps()), "kit")
    b = read_run(_failed(write_run(tmp_path / "b", _steps(n=4)), STALL), "vllm-ascend")
    report = compare(a, b)
    assert list(report.by_kind()) == ["outcome", "steps"]
    outcome = report.divergences[0]
    assert outcome.fields == {"outcome": ["complete", STALL]}
    assert outcome.what == "vllm-ascend failed, kit completed"
    assert report.first.kind == "steps"  # the steps the failed run lacks
    text = format_report(report)
    assert f"vllm-ascend FAILED: {STALL}" in text and "outcome" in text


def test_two_runs_that_failed_the_same_way_compare_the_iterations_both_logged(tmp_path):
    # The launcher stops the surviving ranks wherever they are: B's got one step further.
    a = read_run(_failed(write_run(tmp_path / "a", _steps(n=4)), STALL), "kit")
    b = read_run(_failed(write_run(tmp_path / "b", _steps(n=5)), STALL), "vllm-ascend")
    report = compare(a, b)
    assert report.identical, format_report(report)
    assert report.counts["steps"] == 8
    assert format_report(report).splitlines()[-1].endswith(
        "both runs failed the same way, compared as far as every rank logged")


def test_two_runs_that_failed_differently_diverge_in_their_outcome(tmp_path):
    a = read_run(_failed(write_run(tmp_path / "a", _steps()), STALL), "kit")
    b = read_run(_failed(write_run(tmp_path / "b", _steps()), "rank 1 failed: RankKilled"),
                 "vllm-ascend")
    report = compare(a, b)
    [d] = report.divergences
    assert (d.kind, d.rank, d.what) == ("outcome", None, "both runs failed, for different "
                                        "reasons")
    path = plot_load(a, b, report, tmp_path / "load_diff.png")  # titled by the outcome
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_failed_run_logs_only_the_kept_iterations_diagnostics(tmp_path):
    # Rank 0 logged one iteration more than rank 1 before it was stopped.
    steps = _steps(n=2)
    steps[0].append(_step(2, 0))
    longer = KIT_LOG + "(EngineCore_DP0) INFO _has_global_unfinished_reqs | step_counter: 2\n"
    a = read_run(_failed(write_run(tmp_path / "a", steps, logs=[longer, ""]), STALL), "kit")
    b = read_run(_failed(write_run(tmp_path / "b", _steps(n=2), logs=[KIT_LOG, ""]), STALL),
                 "vllm-ascend")
    assert len(a.steps[0]) == 2 and a.logs == b.logs
    assert compare(a, b).identical


def test_a_long_differing_stretch_of_a_log_is_one_divergence(tmp_path, monkeypatch):
    monkeypatch.setattr("emu.offline.diff._MATCH_LIMIT", 3)
    row = "(EngineCore_DP0) INFO  DP0 | Run(1): [ {}]\n"
    log_a = KIT_LOG + "".join(row.format(n) for n in range(10))
    log_b = KIT_LOG + "".join(row.format(n) for n in range(10, 20))
    a, b = _pair(tmp_path, _steps(dp=1), _steps(dp=1), logs_a=[log_a], logs_b=[log_b])
    [d] = compare(a, b).divergences
    assert d.what == "rank0.log replace" and len(d.fields["lines"][0]) == 10
