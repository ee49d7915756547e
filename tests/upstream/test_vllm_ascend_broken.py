"""A contributor's broken vllm-ascend change is caught: in a copy of the shared tree,
one rank skips ``_do_lb_allgather`` at one step. The guard names the disagreement — the
other rank waits in the all-gather at vllm-ascend's source line — every rank is stopped
and no process is left."""

from __future__ import annotations

import pathlib
import shutil
import time

import pytest

from emu.cluster.supervision import ClusterError
from emu.run import run_cluster
from tests.upstream.conftest import TREE, upstream_spec

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]

CORE = pathlib.Path("vllm_ascend/patch/platform/patch_dyntra_lb_core.py")
SKIPPED_AT = 12  # the step_counter at which rank 1 skips the all-gather
COLLECTIVE_TIMEOUT_S = 10.0


def broken_tree(tmp_path: pathlib.Path) -> tuple[pathlib.Path, int]:
    """A copy of the tree whose rank 1 returns from ``_do_lb_allgather`` before the
    collective at step SKIPPED_AT; returns it and the all-gather's line in the copy."""
    tree = tmp_path / "vllm-ascend-broken"
    shutil.copytree(TREE, tree)
    path = tree / CORE
    path.chmod(0o644)
    lines = path.read_text().splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if "def _do_lb_allgather" in line)
    body = next(i for i in range(start + 1, len(lines)) if lines[i].strip())
    indent = lines[body][: len(lines[body]) - len(lines[body].lstrip())]
    lines[body:body] = [f"{indent}if self.dp_rank == 1 and self.step_counter == {SKIPPED_AT}:\n",
                        f"{indent}    return False\n"]
    path.write_text("".join(lines))
    gather = next(i for i, line in enumerate(lines, 1) if "dist.all_gather(" in line)
    return tree, gather


def test_a_rank_skipping_the_all_gather_is_named_at_vllm_ascends_line(
        tmp_path, no_leftover_processes):
    tree, gather_line = broken_tree(tmp_path)
    # Rank processes: a tree other than the shared one is never imported by rank threads
    # of a process that has the shared tree (emu.impl.vllm_ascend.rank_state).
    spec = upstream_spec("static", 2, tmp_path / "run", vllm_ascend=str(tree),
                         collective_timeout_s=COLLECTIVE_TIMEOUT_S, transport="process")
    start = time.monotonic()
    with pytest.raises(ClusterError) as info:
        run_cluster(spec)
    print(f"failed after {time.monotonic() - start:.1f} s (collective timeout "
          f"{COLLECTIVE_TIMEOUT_S:g} s)")
    err = info.value
    print(err.message)  # the strict-mode note's "message it produced"
    assert err.message.startswith("collective mismatch")
    origin = f"dyntra_lb.allgather@{CORE.as_posix()}:{gather_line}"
    assert "rank 0 waits in seq" in err.message and origin in err.message
    assert "rank 1 waits in seq" in err.message and "engine.lockstep" in err.message
    entered = {r: c["entered"] for r, c in err.collectives.items()}
    assert entered[0]["site"] == f"dyntra_lb.allgather@{CORE.as_posix()}:{gather_line}"
    assert entered[0]["step_counter"] == SKIPPED_AT
    assert entered[1]["site"] == "engine.lockstep"
    assert "_do_lb_allgather" in err.details[0]  # rank 0's Python stack is in the report
