"""``dyntra-emu ab`` and ``sweep`` on vllm-ascend's code: a contributor's branch against its
base (``ab --vllm-ascend-a BASE --vllm-ascend-b BRANCH``) with a one-rule change to
``_balance_load`` made in a copy of the shared tree here, the same tree twice, and a
sweep whose every run is vllm-ascend's.

The tree A/B runs on rank threads: each run in a process of its own
(``emu.run_apart``), since one process can hold one tree."""

from __future__ import annotations

import json
import pathlib
import shutil

import pytest

from emu.impl.vllm_ascend.tree import content_hash
from tests.records import event_log, events
from tests.upstream.conftest import TREE, dyntra_emu

pytestmark = pytest.mark.integration

CORE = pathlib.Path("vllm_ascend/patch/platform/patch_dyntra_lb_core.py")
# _balance_load's bubble: the most loaded rank's blocks above the mean ...
BUBBLE_RULE = "            return max_blk - avg_blk\n"
# ... in the branch, above the least loaded rank's.
BRANCH_RULE = "            return max_blk - min(tot_blks)\n"

# A small workload on which DyntraLB plans at every step (static mode from step 0). The
# recipe's published setup (emu/cli/recipe_hint.py) is replaced flag by flag: its own
# rate, round robin, the default cost profile and DyntraLB config.
SMALL = ["--impl", "vllm-ascend", "--workload", "recipe:pr12292,n=12,rate=2.5", "--dp", "2",
         "--block-size", "128", "--max-num-seqs", "4", "--device", "cpu", "--quiet",
         "--transport", "thread", "--router", "round_robin", "--cost-model", "kv-token",
         "--additional-config", json.dumps({"scheduler_config": {"dyntra_lb_config": {
             "enabled": True, "mode": "static", "start_step": 0}}})]


def copy_of_tree(tmp_path: pathlib.Path, name: str, rule: str | None = None) -> pathlib.Path:
    """A copy of the shared tree; with ``rule``, its planner's bubble is ``rule``."""
    tree = tmp_path / name
    shutil.copytree(TREE, tree, ignore=shutil.ignore_patterns("__pycache__"))
    if rule is not None:
        path = tree / CORE
        path.chmod(0o644)
        text = path.read_text()
        assert text.count(BUBBLE_RULE) == 1
        path.write_text(text.replace(BUBBLE_RULE, rule))
    return tree


def _plans(run_dir: pathlib.Path) -> list[list]:
    """Every rank's generated plans, step by step, from its event log."""
    ranks = len(list(run_dir.glob("rank*.steps")))
    return [[step["plan_generated"] for step in events(run_dir, rank)
             if step["kind"] == "step"]
            for rank in range(ranks)]


def _metrics(run_dir: pathlib.Path) -> dict:
    return json.loads((run_dir / "metrics.json").read_text())


def test_a_branch_against_its_base_shows_the_change_with_its_ci(tmp_path):
    branch = copy_of_tree(tmp_path, "vllm-ascend-branch", BRANCH_RULE)
    out = tmp_path / "ab"

    proc = dyntra_emu("ab", *SMALL, "--seeds", 2, "--vllm-ascend-a", TREE, "--vllm-ascend-b",
                branch, "--out", out)

    assert proc.returncode == 0, proc.stderr
    record = json.loads((out / "ab.json").read_text())
    # Which tree is which: each side's path and content hash, in ab.json, in every run's
    # metrics.json and on the screen.
    base_hash, branch_hash = content_hash(TREE / "vllm_ascend"), content_hash(branch /
                                                                            "vllm_ascend")
    assert base_hash != branch_hash
    assert (record["trees"]["a"]["vllm_ascend"], record["trees"]["a"]["vllm_ascend_sha256"]) \
        == (str(TREE.resolve()), base_hash)
    assert (record["trees"]["b"]["vllm_ascend"], record["trees"]["b"]["vllm_ascend_sha256"]) \
        == (str(branch.resolve()), branch_hash)
    assert f"tree A: {TREE.resolve()}" in proc.stdout
    assert f"tree B: {branch.resolve()}" in proc.stdout
    for seed in (0, 1):
        for side, tree, digest in (("a", TREE, base_hash), ("b", branch, branch_hash)):
            config = _metrics(out / f"seed{seed}" / side)["config"]
            assert (config["vllm_ascend"], config["vllm_ascend_sha256"]) == \
                (str(tree.resolve()), digest)
    # The effect, in the runs' own event logs: the branch's planner made other plans.
    differing = [seed for seed in (0, 1)
                 if _plans(out / f"seed{seed}" / "a") != _plans(out / f"seed{seed}" / "b")]
    assert differing == [0, 1]
    # The throughput and latency changes, per seed as the runs measured them, with a CI.
    deltas = {d["label"]: d for d in record["deltas"]}
    for label, key in (("output throughput", "throughput_tok_s"),
                       ("TPOT p99", ("tpot_ms", "p99"))):
        per_seed = []
        for seed in (0, 1):
            a, b = (_metrics(out / f"seed{seed}" / side) for side in "ab")
            va, vb = ((m[key] if isinstance(key, str) else m[key[0]][key[1]]) for m in (a, b))
            per_seed.append((vb - va) / va * 100)
        assert deltas[label]["per_seed"] == pytest.approx(per_seed)
        assert any(d != 0 for d in per_seed), label
        assert deltas[label]["ci95"] > 0
    # Every metric over the seeds, the headroom line, each seed's overlay plots.
    every = {row["metric"]: row for row in record["metrics"]}
    assert every["throughput_tok_s"]["delta_pct"] == pytest.approx(
        deltas["output throughput"]["mean"])
    assert "Every metric, mean over the 2 seeds" in proc.stdout
    assert "Headroom over 2 seeds" in proc.stdout
    for seed in (0, 1):
        for plot in ("load_ab.png", "bubble_ab.png", "tpot_ab.png"):
            assert (out / f"seed{seed}" / plot).read_bytes()[:4] == b"\x89PNG"
    summary = (out / "summary.md").read_text()
    assert f"tree B: {branch.resolve()}" in summary and "seed1/load_ab.png" in summary


def test_the_same_tree_twice_changes_nothing(tmp_path):
    """A byte copy of the base at another path: a warning, and B's run is A's, step for
    step (its own process and tree notwithstanding)."""
    copy = copy_of_tree(tmp_path, "vllm-ascend-copy")
    out = tmp_path / "aa"

    proc = dyntra_emu("ab", *SMALL, "--vllm-ascend-a", TREE, "--vllm-ascend-b", copy, "--out", out)

    assert proc.returncode == 0, proc.stderr
    assert "warning: --vllm-ascend-a and --vllm-ascend-b hold the same vllm-ascend" in \
        proc.stderr
    for rank in range(2):
        assert event_log(out / "a", rank) == event_log(out / "b", rank)
    a, b = _metrics(out / "a"), _metrics(out / "b")
    assert a["config"]["vllm_ascend"] != b["config"]["vllm_ascend"]
    assert a["plan_churn"]["active_steps"] > 0
    drop = ("wall", "config")
    assert {k: v for k, v in a.items() if k not in drop} == \
        {k: v for k, v in b.items() if k not in drop}
    assert "throughput (tok/s)" in proc.stdout and "(+0.0 %)" in proc.stdout


DIAGNOSTICS = {"scheduler_config": {"dyntra_lb_config": {
    "enabled": True, "mode": "static", "start_step": 0, "enable_diagnostics": True}}}


def test_a_sweep_runs_vllm_ascend_in_every_run(tmp_path):
    out = tmp_path / "sweep"

    proc = dyntra_emu("sweep", *[f for f in SMALL if f not in ("--transport", "thread")],
                "--vllm-ascend", TREE, "--grid", "bubble_threshold=1,50", "--jobs", 2,
                "--additional-config", json.dumps(DIAGNOSTICS), "--out", out)

    assert proc.returncode == 0, proc.stderr
    rows = {row["name"]: row for row in json.loads((out / "sweep.json").read_text())["rows"]}
    assert set(rows) == {"baseline", "p01", "p02"}
    for name, row in rows.items():
        run_dir = out / row["run_dir"]
        metrics = _metrics(run_dir)
        assert metrics["config"]["impl"] == "vllm-ascend"
        assert row["throughput_tok_s"] == metrics["throughput_tok_s"]
        # vllm-ascend's own DyntraLB wrote the rank's log (its module names the lines)
        log = (run_dir / "rank0.log").read_text()
        enabled = name != "baseline"
        assert ("[patch_dyntra_lb_core.py:" in log) == enabled, name
        assert any(any(p) for p in _plans(run_dir)) == enabled, name
