"""``dyntra-emu diff`` on real runs: our DyntraLB (kit) against vllm-ascend's on the tier's
static and dynamic runs (vLLM's default, async scheduling) and on bundled prefixes with
synchronous scheduling, with and without MTP (identical, diagnostics lines included), a
contributor's change
to vllm-ascend's planner named at the first step where the plans part, and the planner
swap (``RunSpec.planner="reference"`` in vllm-ascend's engine) leaving the event logs
byte-identical."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import shutil
import subprocess

import pytest

from emu.metrics import compute_metrics, load_run
from emu.records.reader import wall_records
from emu.run import run_cluster
from tests.integration.conftest import spec
from tests.records import events
from tests.upstream.conftest import REPO, TREE, dyntra_emu, upstream_spec

pytestmark = pytest.mark.integration

CORE = pathlib.Path("vllm_ascend/patch/platform/patch_dyntra_lb_core.py")
TIE_RULE = "if new_dist < best_dist or"


def _diff(*args) -> subprocess.CompletedProcess:
    return dyntra_emu("diff", *args)


@pytest.mark.parametrize("name", ["static", "dynamic"])
def test_kit_and_vllm_ascend_are_identical_step_by_step(upstream_run, tmp_path, name):
    """The same named run (trace, config, engine settings, seed) on both impls: every
    step record, request record and diagnostics line is the same, DyntraLB's
    control-plane charge (the default profile's terms) included."""
    kit_dir = tmp_path / "kit"
    run_cluster(spec(name, 2, kit_dir))
    vllm_ascend = upstream_run(name, 2)
    proc = _diff(kit_dir, vllm_ascend.out_dir, "--json")
    report = json.loads(proc.stdout)
    assert proc.returncode == 0, json.dumps(report["first"], indent=1)
    assert report["identical"]
    counts = report["counts"]
    assert counts["plans"] > 0 and counts["requests"] == len(spec(name, 2, "-").trace)
    control = compute_metrics(load_run(kit_dir))["control_plane"]
    assert control["planner_s"] > 0 and control["collectives_s"] > 0
    if name == "static":  # diagnostics on: rank 0's tables were compared line by line
        assert counts["diagnostics_lines"] > counts["plans"]


BUNDLED = REPO / "fixtures" / "workloads"
# Every divergence class docs/upstream-findings.md lists was fixed; a new one fails here.
DOCUMENTED_DIVERGENCES: set[str] = set()


@pytest.mark.parametrize("workload,mode,cost_model", [("uniform", "static", "kv-token"),
                                                     ("longtail", "dynamic", "kv-token-mtp3")])
def test_bundled_workloads_diff_identical_with_synchronous_scheduling(tmp_path, workload, mode,
                                                                      cost_model):
    """``dyntra-emu diff`` (kit against vllm-ascend) with vLLM's synchronous scheduling on
    the first 16 requests of a bundled workload, outputs capped at 60 tokens,
    diagnostics on, without and with MTP (async: test_async_upstream.py)."""
    requests = [json.loads(line) for line in
                (BUNDLED / f"{workload}.jsonl").read_text().splitlines()[:16]]
    trace = tmp_path / f"{workload}.jsonl"
    trace.write_text("".join(json.dumps({**r, "output_tokens": min(r["output_tokens"], 60)})
                             + "\n" for r in requests))
    lb = {"enabled": True, "mode": mode, "start_step": 0, "enable_diagnostics": True,
          "long_req_block_threshold": 40}
    proc = _diff("--workload", trace, "--dp", 2, "--block-size", 16, "--max-num-seqs", 4,
                 "--num-gpu-blocks", 1024, "--device", "cpu", "--quiet", "--vllm-ascend",
                 TREE, "--additional-config", json.dumps({"scheduler_config": {
                     "dyntra_lb_config": lb}}), "--out", tmp_path / "diff", "--json",
                 "--cost-model", cost_model, "--no-async-scheduling", "--transport", "thread")
    assert proc.returncode in (0, 1), proc.stderr
    report = json.loads(proc.stdout)
    assert set(report["by_kind"]) <= DOCUMENTED_DIVERGENCES, json.dumps(report["first"],
                                                                        indent=1)
    assert report["counts"]["plans"] > 0 and report["counts"]["requests"] == 16
    assert report["counts"]["diagnostics_lines"] > 0
    for side in ("a", "b"):
        config = json.loads((tmp_path / "diff" / side / "metrics.json").read_text())["config"]
        assert config["async_scheduling"] is False


def mutated_tree(tmp_path: pathlib.Path) -> pathlib.Path:
    """A copy of the tree whose ``_balance_load`` also accepts swaps that only tie the
    best distance (``<`` flipped to ``<=``): a contributor's planner change."""
    tree = tmp_path / "vllm-ascend-ties"
    shutil.copytree(TREE, tree)
    path = tree / CORE
    path.chmod(0o644)
    text = path.read_text()
    assert text.count(TIE_RULE) == 1
    path.write_text(text.replace(TIE_RULE, "if new_dist <= best_dist or"))
    return tree


def _first_plan_difference(dir_a: pathlib.Path, dir_b: pathlib.Path, dp: int):
    """(iteration, rank) of the first generated plan that differs, read from the logs."""
    steps = [[[s for s in events(d, r) if s["kind"] == "step"] for r in range(dp)]
             for d in (dir_a, dir_b)]
    for i in range(min(len(steps[0][0]), len(steps[1][0]))):
        for r in range(dp):
            if steps[0][r][i]["plan_generated"] != steps[1][r][i]["plan_generated"]:
                return i, r
    return None


def test_a_changed_tie_rule_is_named_at_the_first_step_where_the_plans_part(tmp_path):
    tree = mutated_tree(tmp_path)
    out = tmp_path / "diff"
    static = spec("static", 2, out)
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps({k: v for k, v in dataclasses.asdict(r).items()
                                         if v is not None}) + "\n" for r in static.trace))
    config = json.dumps(static.additional_config)
    proc = _diff("--vllm-ascend-a", TREE, "--vllm-ascend-b", tree, "--workload", trace,
                 "--dp", 2, "--block-size", static.block_size, "--num-gpu-blocks",
                 static.num_gpu_blocks, "--max-num-seqs", static.max_num_seqs, "--device",
                 "cpu", "--additional-config", config, "--out", out, "--quiet",
                 # rank threads: each tree's run in a process of its own (emu.run_apart)
                 "--transport", "thread")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    truth = _first_plan_difference(out / "a", out / "b", 2)
    assert truth is not None  # the mutation changed a plan on this trace
    iteration, rank = truth
    assert (f"DIVERGENT: first divergence at rank {rank}, iteration {iteration}: plan"
            in proc.stdout), proc.stdout
    report = json.loads((out / "diff.json").read_text())
    first = report["first"]
    assert (first["kind"], first["rank"], first["iter"]) == ("plan", rank, iteration)
    assert "plan_generated" in first["fields"]
    # nothing diverged before it: the steps before are the same on both sides
    for entry in first["context"]["before"]:
        assert entry["A"] == entry["B"]
    assert (out / "load_diff.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("name", ["static", "dynamic"])
def test_the_reference_planner_in_vllm_ascends_engine_changes_no_byte(upstream_run, tmp_path, name):
    """``planner="reference"``: vllm-ascend's engine and scheduler with dyntra_lb.planner.front in
    place of ``_balance_load``; the event logs are byte-identical to vllm-ascend's own
    planner's, and both wall logs time the planner at every planning step."""
    own = upstream_run(name, 2)
    swapped = run_cluster(upstream_spec(name, 2, tmp_path / "reference-planner",
                                        planner="reference"))
    for rank in range(2):
        assert swapped.event_log(rank) == own.event_log(rank)
    metrics_plans = sum(s.num_plans for s in swapped.ranks)
    assert metrics_plans > 0
    for result in (own, swapped):
        timed = list(wall_records(result.out_dir, 0))
        assert all("planner_s" in w for w in timed)
        assert sum(w["planner_s"] > 0 for w in timed) == result.ranks[0].num_plans


def test_the_opt_in_planner_runs_the_same_in_both_engines(tmp_path):
    """``planner="fill-protect"`` in the kit and in vllm-ascend's engine (in place of
    ``_balance_load``) on the starvation trace of tests/integration/test_engine_planners.py:
    the same plans and the same steps, byte for byte, and not the reference's (so the
    swap really ran it)."""
    from emu.workload import TraceRequest
    from tests.integration.test_engine_planners import CONFIG, TRACE

    def starved(base):
        return dataclasses.replace(base, trace=[TraceRequest(**r) for r in TRACE],
                                   additional_config=CONFIG, max_num_seqs=2)

    kit = run_cluster(dataclasses.replace(starved(spec("static", 2, tmp_path / "kit")),
                                          planner="fill-protect"))
    ours = run_cluster(starved(upstream_spec("static", 2, tmp_path / "vllm-ascend",
                                             planner="fill-protect")))
    reference = run_cluster(starved(spec("static", 2, tmp_path / "reference")))
    for rank in range(2):
        assert ours.event_log(rank) == kit.event_log(rank)
    assert kit.event_log(0) != reference.event_log(0)
