"""`dyntra-emu diff DIR_A DIR_B` on real kit runs (no vLLM needed): identical runs exit 0,
a run whose event log was changed at one step exits 1 naming that step, the JSON report
and the plot, and bad input (exit 2, one line, nothing started)."""

from __future__ import annotations

import json
import shutil

import pytest

from emu.records.convert import convert_run
from tests.records import events


@pytest.fixture(scope="module")
def kit_run(tmp_path_factory):
    """One small kit run (static DyntraLB with diagnostics), shared by this module."""
    from tests.cli.conftest import SMALL, tiny_requests, write_trace
    from tests.in_process import run_in_process

    root = tmp_path_factory.mktemp("diff")
    trace = write_trace(root / "tiny.jsonl", tiny_requests())
    config = {"scheduler_config": {"dyntra_lb_config": {
        "enabled": True, "mode": "static", "start_step": 0, "enable_diagnostics": True}}}
    proc = run_in_process(["run", "--workload", str(trace), *SMALL, "--additional-config",
                           json.dumps(config), "--out", str(root / "run"), "--quiet"], root)
    assert proc.returncode == 0, proc.stderr
    return root / "run"


def _changed_copy(run, tmp_path, rank: int, iteration: int):
    """A copy of ``run`` whose rank ``rank`` generated another plan at ``iteration``: its
    event logs as JSON Lines, the one changed, converted to records."""
    copy = tmp_path / "changed"
    shutil.copytree(run, copy)
    for table in ("steps", "requests", "wall"):
        for directory in copy.glob(f"rank*.{table}"):
            shutil.rmtree(directory)
    for r in range(2):
        records = events(run, r)
        if r == rank:
            step = next(s for s in records if s["kind"] == "step" and s["iter"] == iteration)
            step["plan_generated"] = {"out_blk": [99], "in_blk": [], "freeze": True}
        (copy / f"rank{r}.events.jsonl").write_text(
            "".join(json.dumps(s, sort_keys=True) + "\n" for s in records))
    convert_run(copy)
    return copy


def test_a_run_against_itself_is_identical(cli, kit_run):
    proc = cli("diff", kit_run, kit_run)
    assert proc.returncode == 0, proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("identical: 2 ranks, ")
    lines = int(last.split(" requests, ")[1].split(" diagnostics")[0])
    assert lines > 0  # the diagnostics lines were compared too


def test_a_changed_plan_is_the_first_divergence(cli, kit_run, tmp_path):
    changed = _changed_copy(kit_run, tmp_path, rank=1, iteration=5)
    proc = cli("diff", kit_run, changed, "--out", tmp_path / "report")
    assert proc.returncode == 1, proc.stderr
    assert "DIVERGENT: first divergence at rank 1, iteration 5: plan" in proc.stdout
    assert "plan_generated" in proc.stdout and "[99]" in proc.stdout
    assert "the 3 steps before it on rank 1:" in proc.stdout
    report = json.loads((tmp_path / "report" / "diff.json").read_text())
    assert report["identical"] is False
    assert (report["first"]["rank"], report["first"]["iter"]) == (1, 5)
    assert report["by_kind"]["plan"]["count"] == 1
    png = tmp_path / "report" / "load_diff.png"
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_json_report_on_stdout(cli, kit_run, tmp_path):
    proc = cli("diff", kit_run, _changed_copy(kit_run, tmp_path, rank=0, iteration=2),
               "--json", "--context", "1")
    assert proc.returncode == 1
    report = json.loads(proc.stdout)
    assert report["first"]["kind"] == "plan" and report["first"]["rank"] == 0
    assert len(report["first"]["context"]["before"]) == 1


@pytest.mark.parametrize("args,fragment", [
    (["only-one"], "DIR_A DIR_B: expected two run directories, got 1"),
    (["missing-a", "missing-b"], "missing-a: not a directory with a run's records"),
])
def test_bad_directories(cli, clikit, args, fragment):
    clikit.assert_user_error(cli("diff", *args), fragment)


def test_run_flags_are_refused_with_two_directories(cli, clikit, kit_run):
    clikit.assert_user_error(cli("diff", kit_run, kit_run, "--seed", "3"),
                             "--seed: not allowed with DIR_A DIR_B")


def test_tree_flags_must_come_in_pairs(cli, clikit, tmp_path):
    proc = cli("diff", "--vllm-ascend-a", tmp_path, "--out", tmp_path / "out")
    clikit.assert_user_error(proc, "--vllm-ascend-b: required with the other")
    assert not (tmp_path / "out").exists()


def test_the_vllm_ascend_planner_needs_vllm_ascend_ranks(cli, clikit, tmp_path, tiny_trace):
    proc = cli("run", "--workload", tiny_trace, *clikit.SMALL, "--planner", "vllm-ascend",
               "--out", tmp_path / "out")
    clikit.assert_user_error(proc, "--planner vllm-ascend: only with --impl vllm-ascend")
    assert not (tmp_path / "out").exists()
