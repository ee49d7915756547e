"""vllm-ascend's DyntraLB on the thread transport: every rank's vLLM engine core and
vllm-ascend's code in this process, as green threads over in-memory collectives, must give
byte for byte the event logs, rank logs (vllm-ascend's own DyntraLB lines and vLLM's
warnings) and metrics (wall-clock section aside) of rank processes over gloo, and fail the
way they fail. The cases are the kit's thread-transport cases
(``tests/integration/test_transport_thread.py``) with ``impl="vllm-ascend"``."""

from __future__ import annotations

import dataclasses
import shutil

import pytest

from emu.cluster.supervision import ClusterError
from emu.faults import FaultPlan
from emu.impl.vllm_ascend.tree import TreeError
from emu.metrics import compute_metrics, load_run
from emu.rank.costs import PROFILES
from emu.run import run_cluster
from tests.integration.test_faults import HANGING, make_spec
from tests.integration.test_transport_thread import (
    case_spec,
    rank_threads,
    without_wall,
)
from tests.records import event_log
from tests.upstream.conftest import TREE

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]


def upstream_case(name: str, dp_size: int, out_dir, **fields):
    fields = {"vllm_ascend": str(TREE), "run_timeout_s": 600.0, **fields}
    return dataclasses.replace(case_spec(name, dp_size, out_dir), impl="vllm-ascend",
                               **fields)


RANK_FILES = ("rank{r}.log", "rank{r}.vllm.log")


# MTP drafts through vLLM's spec-decode path, with vLLM's default async scheduling and
# with synchronous scheduling.
VARIANTS = {"static-mtp": {"cost_model": PROFILES["kv-token-mtp3"]},
            "static-sync-mtp": {"cost_model": PROFILES["kv-token-mtp3"],
                                "async_scheduling": False}}


@pytest.mark.parametrize("name,dp_size", [
    *[(name, dp) for name in ("static", "dynamic", "off") for dp in (2, 4)],
    ("static-mtp", 2), ("static-sync-mtp", 2)])
def test_vllm_ascend_rank_threads_are_byte_identical_to_processes(tmp_path, name, dp_size,
                                                                   no_leftover_processes):
    spec = upstream_case(name.split("-")[0], dp_size, tmp_path / "process",
                         **VARIANTS.get(name, {}))
    processes = run_cluster(spec)
    threads = run_cluster(dataclasses.replace(spec, transport="thread",
                                              out_dir=tmp_path / "thread"))
    assert not rank_threads()
    assert [s.steps for s in threads.ranks] == [s.steps for s in processes.ranks]
    for rank in range(dp_size):
        for pattern in RANK_FILES:
            name_r = pattern.format(r=rank)
            a = (processes.out_dir / name_r).read_bytes()
            assert a == (threads.out_dir / name_r).read_bytes(), name_r
        a = event_log(processes.out_dir, rank)
        assert a and a == event_log(threads.out_dir, rank), f"rank {rank}'s records"
    a = compute_metrics(load_run(processes.out_dir))
    b = compute_metrics(load_run(threads.out_dir))
    assert without_wall(a) == without_wall(b)
    assert a["requests_finished"] == len(spec.trace)
    if name != "off":  # vllm-ascend's DyntraLB planned, and logged it on every rank
        assert a["plan_churn"]["active_steps"] > 0
        for rank in range(dp_size):
            assert "patch_dyntra_lb_core.py" in (threads.out_dir / f"rank{rank}.log").read_text()
    if name.endswith("mtp"):  # decoding requests ran drafts: more tokens than requests
        steps = [e for r in range(dp_size) for e in threads.events(r) if e["kind"] == "step"]
        assert any(s["scheduled_tokens"] > s["num_running"] > 0 for s in steps)


def test_every_rank_thread_logs_vllms_once_warnings_as_a_process_would(tmp_path):
    """vLLM logs some warnings once per process; each rank thread has its own 'once'."""
    run = run_cluster(upstream_case("static", 2, tmp_path, transport="thread"))
    for rank in range(2):
        assert "Using custom scheduler class" in (run.out_dir / f"rank{rank}.vllm.log").read_text()


def test_every_rank_thread_finds_its_own_vllm_ascend_config_at_every_step(tmp_path,
                                                                          monkeypatch):
    """vllm-ascend's config singleton holds the rank's own VllmConfig: whichever rank
    thread runs, at every forward, the singleton is that rank's."""
    import vllm_ascend.ascend_config as ascend_config

    from emu.impl.vllm_ascend.engine import EmulatedRank

    forward = EmulatedRank.forward
    seen = []

    def checked(self, scheduler_output):
        parallel = ascend_config._ASCEND_CONFIG.vllm_config.parallel_config
        seen.append((self.dp_rank, parallel.data_parallel_rank))
        return forward(self, scheduler_output)

    monkeypatch.setattr(EmulatedRank, "forward", checked)
    run_cluster(upstream_case("static", 4, tmp_path, transport="thread"))
    assert {rank for rank, _ in seen} == {0, 1, 2, 3}
    assert all(rank == own for rank, own in seen)


def test_a_killed_vllm_ascend_rank_thread_is_named_and_the_run_stops(tmp_path):
    spec = upstream_case("static", 2, tmp_path, transport="thread",
                         faults=FaultPlan.of(["kill:rank=1,step=30"]))
    with pytest.raises(ClusterError) as info:
        run_cluster(spec)
    err = info.value
    assert err.rank == 1 and err.failed_ranks == [1]
    assert err.message == "killed by fault kill:rank=1,step=30 at step 30"
    assert "stopped by the launcher" in err.details[0]
    assert not rank_threads()


def test_a_hang_among_vllm_ascend_rank_threads_names_the_waiting_rank(tmp_path):
    spec = upstream_case("static", 2, tmp_path, transport="thread", collective_timeout_s=1.0,
                         faults=FaultPlan.of(["delay:rank=1,site=engine.lockstep,step=5,"
                                              "seconds=3"]))
    with pytest.raises(ClusterError) as info:
        run_cluster(spec)
    err = info.value
    assert err.rank is None
    assert err.message.startswith("collective hang: no rank completed a collective for 1 s")
    assert err.message.endswith("engine.lockstep; not in a collective: rank 1")
    assert err.collectives[0]["entered"]["site"] == "engine.lockstep"
    assert "_sleep_before_collective" in err.details[1]
    assert not rank_threads()


def test_a_stuck_vllm_ascend_rank_thread_is_named_by_its_stall(tmp_path):
    """A load that never lands keeps its rank scheduling nothing: the stall watch names
    the rank and the request, as with rank processes and the kit."""
    spec = dataclasses.replace(
        make_spec(tmp_path, faults=[f"kv_never:request={HANGING},timeout_s=100000"]),
        impl="vllm-ascend", vllm_ascend=str(TREE), transport="thread", stall_steps=200)
    with pytest.raises(ClusterError) as info:
        run_cluster(spec)
    err = info.value
    assert err.rank == 1
    assert err.message.startswith("emu.rank.context.StallError: rank 1 is stuck: 1 unfinished "
                                  "request(s) but no token scheduled for 200 steps")
    assert f"{HANGING} (WAITING_FOR_REMOTE_KVS)" in err.message
    assert not rank_threads()


def test_rank_threads_of_a_second_tree_are_refused_before_any_rank_starts(tmp_path):
    """Rank threads share this process, and a tree's patches replace vLLM's classes when
    it is imported: once one tree is imported here, another cannot be, and says so."""
    run_cluster(upstream_case("off", 2, tmp_path / "first", transport="thread"))
    copy = tmp_path / "copy"
    shutil.copytree(TREE, copy, ignore=shutil.ignore_patterns("__pycache__", ".git"))
    out = tmp_path / "second"
    with pytest.raises(TreeError, match="rank threads run one vllm-ascend tree per process"):
        run_cluster(upstream_case("off", 2, out, transport="thread", vllm_ascend=str(copy)))
    assert not (out / "run.json").exists()
