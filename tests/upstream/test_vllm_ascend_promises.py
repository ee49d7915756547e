"""DyntraLB's promises, each broken by one edit in a copy of the shared vllm-ascend tree
(made here, in the test's temporary directory; the shared tree is never touched), the
way a contributor's change would break it, and each caught by strict mode: the run fails
naming the rank, the iteration and the request. The edit acts on rank 1 only, so the
rank named is known. (The last promise, every rank entering the same collectives, is
tests/upstream/test_vllm_ascend_broken.py: the guard names the ranks and vllm-ascend's
source line.) The kit's counterparts: tests/integration/test_strict_promises.py, whose
workload and expected messages these tests share; the unbroken tree runs that workload
clean."""

from __future__ import annotations

import pathlib
import re
import shutil

import pytest

from emu.cluster.supervision import ClusterError
from emu.run import run_cluster
from emu.spec import RunSpec
from tests.integration.test_strict_promises import (
    BROKEN,
    BROKEN_RANK,
    assert_exercises_every_promise,
    promise_spec,
    promise_trace,
)
from tests.upstream.conftest import TREE

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]

SCHEDULER = pathlib.Path("vllm_ascend/core/dyntra_lb_scheduler.py")
ON_RANK = f"self.vllm_config.parallel_config.data_parallel_rank == {BROKEN_RANK}"

# Per promise: (file, the line to edit (its text, stripped, once in the file), the
# lines that replace it, at its indentation).
EDITS = {
    # The pause releases the request's KV (the contributor).
    "pause_frees_kv": (SCHEDULER, "self.waiting.prepend_request(request)", [
        "self.waiting.prepend_request(request)",
        f"if {ON_RANK}:",
        "    self.kv_cache_manager.free(request)"]),
    # The pause keeps the KV, but a paused request re-enters as a fresh prefill.
    "resume_recomputes": (SCHEDULER, "if not self._can_admit_waiting_request(request):", [
        f"if {ON_RANK} and request.request_id in self._lb_paused_req_ids:",
        "    request.num_computed_tokens = 0",
        "if not self._can_admit_waiting_request(request):"]),
    # The admission set ignores in_blk: every candidate may enter.
    "admit_every_candidate": (SCHEDULER, "self._lb_admit_req_ids = admit_req_ids", [
        "self._lb_admit_req_ids = admit_req_ids",
        f"if {ON_RANK} and not self.lb_freeze:",
        "    self._lb_admit_req_ids = {r.request_id for r in self._lb_admission_candidates}"]),
    # A frozen rank's admission is left unrestricted.
    "frozen_rank_admits": (SCHEDULER, "self._lb_admit_req_ids = admit_req_ids", [
        "self._lb_admit_req_ids = admit_req_ids",
        f"if {ON_RANK} and self.lb_freeze:",
        "    self._lb_admit_req_ids = None"]),
    # The plan handed over after iteration k is applied at k+2 (a one-plan delay line).
    "plan_applied_late": (SCHEDULER, "self._lb_admit_req_ids = None", [
        "self._lb_admit_req_ids = None",
        f"if {ON_RANK}:",
        "    self.modifications, self._late = getattr(self, '_late', None), self.modifications"]),
}


def broken_tree(tmp_path: pathlib.Path, kind: str) -> pathlib.Path:
    """A copy of the shared tree with the edit of ``kind``."""
    tree = tmp_path / f"vllm-ascend-{kind}"
    shutil.copytree(TREE, tree)
    relative, anchor, replacement = EDITS[kind]
    path = tree / relative
    path.chmod(0o644)
    lines = path.read_text().splitlines(keepends=True)
    found = [i for i, line in enumerate(lines) if line.strip() == anchor]
    assert len(found) == 1, (kind, anchor, found)
    indent = lines[found[0]][: len(lines[found[0]]) - len(lines[found[0]].lstrip())]
    lines[found[0]:found[0] + 1] = [f"{indent}{line}\n" for line in replacement]
    path.write_text("".join(lines))
    return tree


def upstream_spec(tree: pathlib.Path, out_dir: pathlib.Path) -> RunSpec:
    """The kit's promise run, on vllm-ascend's DyntraLB from ``tree``."""
    return promise_spec(out_dir, impl="vllm-ascend", vllm_ascend=str(tree),
                        collective_timeout_s=30.0, run_timeout_s=600.0)


def test_the_unbroken_tree_runs_the_workload_clean(tmp_path, kit):
    result = run_cluster(upstream_spec(TREE, tmp_path))
    assert sum(r.num_finished for r in result.ranks) == len(promise_trace())
    assert_exercises_every_promise([s for r in (0, 1) for s in kit.steps(result, r)])


@pytest.mark.parametrize("kind", sorted(EDITS))
def test_a_broken_promise_is_named_with_its_rank_iteration_and_request(tmp_path, kind):
    spec = upstream_spec(broken_tree(tmp_path, kind), tmp_path / "run")
    with pytest.raises(ClusterError) as info:
        run_cluster(spec)
    err = info.value
    print(f"{kind}: {err.message}")  # the note's "message it produced"
    assert err.rank == BROKEN_RANK, err
    head = (rf"emu\.rank\.invariants\.InvariantError: strict invariant violated on rank "
            rf"{BROKEN_RANK} at iteration (\d+) \(wave \d+, step_counter \d+\): ")
    match = re.fullmatch(head + BROKEN[kind], err.message)
    assert match, err.message
    assert "emu/impl/vllm_ascend/invariants.py" in err.details[BROKEN_RANK]

