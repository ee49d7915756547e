"""The launcher with real rank processes and real gloo groups: results, groups, and every
way a run can fail (raise, die, hang, time out, parent killed) ending as one named error
with no process left behind."""

import collections
import ctypes
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest
import torch
import torch.distributed as dist

from emu.cluster import rank_start
from emu.cluster.launcher import launch
from emu.cluster.supervision import ClusterError
from emu.rank.context import Preload

pytestmark = pytest.mark.integration

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


# --- targets (module level: the spawn start method pickles them by name) ---------------


def all_reduce_target(ctx, args):
    dp = torch.tensor([float(ctx.rank + args)])
    dist.all_reduce(dp, group=ctx.dp_group)
    dev = torch.tensor([2.0 ** ctx.rank], device=ctx.device)
    dist.all_reduce(dev, op=dist.ReduceOp.MAX, group=ctx.device_group)
    return {
        "rank": ctx.rank,
        "dp_size": ctx.dp_size,
        "local_rank": ctx.local_rank,
        "dp_sum": dp.item(),
        "device_max": dev.item(),
        "device": str(ctx.device),
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "separate": ctx.device_group is not ctx.dp_group,
        "dp_is_default": ctx.dp_group is dist.group.WORLD,
        "dp_backend": dist.get_backend(ctx.dp_group),
        "device_backend": dist.get_backend(ctx.device_group),
        "sizes": (dist.get_world_size(ctx.dp_group), dist.get_world_size(ctx.device_group)),
        "out_dir": ctx.out_dir,
    }


def raise_target(ctx, failing_rank):
    x = torch.ones(1)
    dist.all_reduce(x, group=ctx.dp_group)  # every rank is past startup
    if ctx.rank == failing_rank:
        raise ValueError(f"boom from rank {ctx.rank}")
    dist.all_reduce(x, group=ctx.dp_group)  # the others wait here for the failed rank


def exit_target(ctx, failing_rank):
    x = torch.ones(1)
    dist.all_reduce(x, group=ctx.dp_group)
    if ctx.rank == failing_rank:
        os._exit(3)
    dist.all_reduce(x, group=ctx.dp_group)


def exit_then_slow_report_target(ctx, failing_rank):
    x = torch.ones(1)
    dist.all_reduce(x, group=ctx.dp_group)
    if ctx.rank == failing_rank:
        os._exit(3)
    try:
        dist.all_reduce(x, group=ctx.dp_group)
    except RuntimeError:  # the peer went away; reporting it takes a moment here
        time.sleep(0.3)
        raise ValueError(f"rank {ctx.rank} saw its peer go") from None


def crash_target(ctx, failing_rank):
    x = torch.ones(1)
    dist.all_reduce(x, group=ctx.dp_group)
    if ctx.rank == failing_rank:
        ctypes.string_at(0)  # SIGSEGV
    dist.all_reduce(x, group=ctx.dp_group)


def echo_first_target(ctx, args):
    x = torch.ones(1)
    dist.all_reduce(x, group=ctx.dp_group)
    if ctx.rank == 1:
        dist.all_reduce(x, op="no such op", group=ctx.dp_group)  # fails inside torch.distributed
    try:
        dist.all_reduce(x, group=ctx.dp_group)  # fails once rank 1 has exited
    except RuntimeError:
        pass
    raise ValueError("root cause on rank 0")


def sleep_target(ctx, args):
    time.sleep(3600)


def skip_collective_target(ctx, late_rank):
    x = torch.ones(1)
    dist.all_reduce(x, group=ctx.dp_group)
    if ctx.rank == late_rank:
        time.sleep(3600)
    dist.all_reduce(x, group=ctx.dp_group)


def forked_target(ctx, args):
    """Whether this rank is a fork of a fork server (which imported rank_preload)."""
    return "emu.cluster.rank_preload" in sys.modules


def pid_file_target(ctx, args):
    (ctx.out_dir / f"rank{ctx.rank}.pid").write_text(str(os.getpid()))
    time.sleep(3600)


# --- helpers ---------------------------------------------------------------------------



# --- success ---------------------------------------------------------------------------


@pytest.mark.parametrize("dp_size", [2, 4])
def test_ranks_run_target_with_both_groups_and_return_in_rank_order(
        dp_size, tmp_path, no_leftover_processes):
    results = launch(all_reduce_target, 10, dp_size=dp_size, device="cpu",
                     out_dir=tmp_path / "out")

    assert [r["rank"] for r in results] == list(range(dp_size))
    expected_sum = sum(range(dp_size)) + 10 * dp_size
    for r in results:
        assert r["dp_size"] == dp_size
        assert r["local_rank"] == r["rank"]
        assert r["dp_sum"] == expected_sum
        assert r["device_max"] == 2.0 ** (dp_size - 1)
        assert r["device"] == "cpu"
        assert (r["threads"], r["interop_threads"]) == (1, 1)
        assert r["separate"] and r["dp_is_default"]
        assert (r["dp_backend"], r["device_backend"]) == ("gloo", "gloo")
        assert r["sizes"] == (dp_size, dp_size)
        assert r["out_dir"] == tmp_path / "out"
    assert (tmp_path / "out").is_dir()


def test_a_fork_server_evicted_leaves_its_siblings_sockets(monkeypatch, tmp_path,
                                                          no_leftover_processes):
    """A launcher's fork servers share one socket directory; one that exits while the
    launcher lives (evicted for another preload) removes its own socket only, so the next
    launch still forks its ranks. (It removed the whole directory: a running server's
    socket vanished, and a server started next could not bind.) The third launch forks
    from the server the second one started, after the first one's server exited."""
    servers = collections.OrderedDict()  # its own: this worker's servers stay as they are
    monkeypatch.setattr(rank_start, "_servers", servers)
    monkeypatch.setattr(rank_start, "MAX_SERVERS", 1)
    preloads = [Preload(("json",)), Preload(("csv",)), Preload(("csv",))]
    try:
        for preload in preloads:  # the second launch evicts the first one's server
            forked = launch(forked_target, None, dp_size=2, device="cpu", out_dir=tmp_path,
                            preload=preload)
            assert forked == [True, True]
    finally:
        for server in servers.values():
            rank_start._stop(server)


def test_two_launches_at_once_do_not_collide(no_leftover_processes):
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = [pool.submit(launch, all_reduce_target, offset, dp_size=2, device="cpu")
                   for offset in (100, 1000)]
        first, second = (f.result() for f in futures)
    assert [r["dp_sum"] for r in first] == [201.0, 201.0]
    assert [r["dp_sum"] for r in second] == [2001.0, 2001.0]


# --- failures --------------------------------------------------------------------------


@pytest.mark.parametrize("dp_size", [2, 4])
def test_rank_raising_is_named_with_its_traceback_and_all_ranks_stop(
        dp_size, no_leftover_processes):
    failing = dp_size - 1
    with pytest.raises(ClusterError) as info:
        launch(raise_target, failing, dp_size=dp_size, device="cpu")

    err = info.value
    assert err.rank == failing
    assert err.message == f"ValueError: boom from rank {failing}"
    assert err.failed_ranks[0] == failing
    assert "Traceback (most recent call last)" in err.details[failing]
    assert "in raise_target" in err.details[failing]
    assert f"rank {failing} failed: ValueError: boom from rank {failing}" in str(err)
    for rank in range(dp_size - 1):
        # stopped while waiting for the failed rank (stack dump), or it saw the peer go
        # away first (its own gloo traceback): either way inside the target
        assert "raise_target" in err.details[rank]


@pytest.mark.parametrize("dp_size", [2, 4])
def test_rank_dying_mid_run_is_named_while_peers_wait_in_a_collective(
        dp_size, no_leftover_processes):
    with pytest.raises(ClusterError) as info:
        launch(exit_target, 1, dp_size=dp_size, device="cpu")

    err = info.value
    assert err.rank == 1
    assert err.message == "exited with code 3"
    assert err.details[1] == "exited with code 3 before reporting a result or an error"
    assert str(err).startswith("rank 1 failed: exited with code 3")
    for rank in set(range(dp_size)) - {1}:
        assert "exit_target" in err.details[rank]


def test_peers_of_a_dead_rank_report_their_own_failure_before_being_stopped(
        no_leftover_processes):
    # Found in CI: the launcher stopped rank 0 as it was reporting the peer's death, and
    # its report was lost. Peers now get a moment (SETTLE_S) to end on their own.
    with pytest.raises(ClusterError) as info:
        launch(exit_then_slow_report_target, 1, dp_size=2, device="cpu")

    err = info.value
    assert err.rank == 1
    assert err.failed_ranks == [1, 0]
    assert "ValueError: rank 0 saw its peer go" in err.details[0]
    assert "stopped by the launcher" not in err.details[0]


def test_rank_crashing_is_named_with_the_stack_it_crashed_in(no_leftover_processes):
    with pytest.raises(ClusterError) as info:
        launch(crash_target, 0, dp_size=2, device="cpu")

    err = info.value
    assert err.rank == 0
    assert err.message == "killed by signal SIGSEGV"
    assert "Segmentation fault" in err.details[0]
    assert "crash_target" in err.details[0]
    assert "crash_target" in err.details[1]


def test_error_inside_torch_distributed_yields_to_a_plain_failure_of_another_rank(
        no_leftover_processes):
    # rank 1 fails first, but inside a torch.distributed call (as a rank does when a peer
    # dies); rank 0's own error follows and is the one reported
    with pytest.raises(ClusterError) as info:
        launch(echo_first_target, None, dp_size=2, device="cpu")

    err = info.value
    assert err.rank == 0
    assert err.message == "ValueError: root cause on rank 0"
    assert err.failed_ranks == [0, 1]
    assert "no such op" in err.details[1]


def test_run_timeout_stops_every_rank_and_dumps_stacks(no_leftover_processes):
    with pytest.raises(ClusterError) as info:
        launch(sleep_target, None, dp_size=2, device="cpu", run_timeout_s=3.0)

    err = info.value
    assert err.rank is None
    assert err.failed_ranks == []
    assert "run exceeded run_timeout_s" in err.message
    for rank in (0, 1):
        assert err.details[rank].startswith("stopped by the launcher")


def test_ranks_stopped_as_they_start_die_of_sigterm(tmp_path, no_leftover_processes):
    """Launched from a script, as by the dyntra-emu console script, and stopped in their
    first moments (a run timeout of 10 ms; Ctrl-C during start-up alike): a rank re-runs
    the launching script before it leaves its fork server, ignoring SIGTERM as the
    server does. One SIGTERM was lost there, and every rank was killed at the end of the
    grace, with no stack."""
    script = tmp_path / "launch.py"
    script.write_text(textwrap.dedent(f"""
        import json, sys
        sys.path[:0] = [{ROOT!r}, {HERE!r}]
        from emu.cluster.launcher import launch
        from emu.cluster.supervision import ClusterError
        from test_launcher import sleep_target
        if __name__ == "__main__":
            try:
                launch(sleep_target, None, dp_size=2, device="cpu", run_timeout_s=0.01)
            except ClusterError as err:
                print(json.dumps(err.details))
    """))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    details = json.loads(proc.stdout)
    for rank in ("0", "1"):
        assert details[rank].startswith(
            "stopped by the launcher (killed by signal SIGTERM)"), details[rank]


def test_collective_timeout_is_configurable_and_names_the_waiting_rank(
        no_leftover_processes):
    with pytest.raises(ClusterError) as info:
        launch(skip_collective_target, 0, dp_size=2, device="cpu", collective_timeout_s=2.0)

    err = info.value
    # rank 1 timed out in the collective; rank 0, which never entered it, was stopped
    # and its stack shows where it was instead
    assert err.rank == 1
    assert "Timed out" in err.details[1]
    assert "stopped by the launcher" in err.details[0]
    assert "time.sleep" in err.details[0] or "skip_collective_target" in err.details[0]


def test_ranks_die_when_the_launching_process_is_killed(tmp_path):
    code = textwrap.dedent(f"""
        import sys
        sys.path[:0] = [{ROOT!r}, {HERE!r}]
        from emu.cluster.launcher import launch
        from test_launcher import pid_file_target
        if __name__ == "__main__":
            launch(pid_file_target, None, dp_size=2, device="cpu", out_dir={str(tmp_path)!r})
    """)
    script = tmp_path / "parent.py"
    script.write_text(code)
    parent = subprocess.Popen([sys.executable, str(script)])
    try:
        pid_files = [tmp_path / f"rank{r}.pid" for r in (0, 1)]
        for _ in range(600):
            if all(p.exists() and p.read_text() for p in pid_files):
                break
            assert parent.poll() is None, "the launching process ended early"
            time.sleep(0.1)
        rank_pids = [int(p.read_text()) for p in pid_files]
        assert all(psutil.pid_exists(pid) for pid in rank_pids)
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()

    def alive(pid):
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    for _ in range(100):
        if not any(alive(pid) for pid in rank_pids):
            break
        time.sleep(0.1)
    survivors = [pid for pid in rank_pids if alive(pid)]
    for pid in survivors:  # do not leave them behind when the assertion fails
        os.kill(pid, signal.SIGKILL)
    assert survivors == []


# --- refused before any rank starts -----------------------------------------------------


def test_bad_arguments_are_refused_before_any_rank_starts(no_leftover_processes):
    with pytest.raises(ValueError, match="dp_size"):
        launch(all_reduce_target, 0, dp_size=0, device="cpu")
    with pytest.raises(ValueError, match="collective_timeout_s"):
        launch(all_reduce_target, 0, dp_size=2, device="cpu", collective_timeout_s=0)
    with pytest.raises(TypeError, match="picklable"):
        launch(lambda ctx, args: None, 0, dp_size=2, device="cpu")
    with pytest.raises(ValueError, match="device must be one of"):
        launch(all_reduce_target, 0, dp_size=2, device="gpu")


# --- under torchrun ---------------------------------------------------------------------


def test_join_from_env_under_torchrun(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {ROOT!r})
        import torch
        import torch.distributed as dist
        from emu.cluster.rank_process import join_from_env

        def target(ctx, args):
            x = torch.tensor([float(ctx.rank)])
            dist.all_reduce(x, group=ctx.dp_group)
            dist.all_reduce(x, group=ctx.device_group)
            return {{"rank": ctx.rank, "dp_size": ctx.dp_size, "local_rank": ctx.local_rank,
                    "sum": x.item(), "separate": ctx.device_group is not ctx.dp_group,
                    "threads": torch.get_num_threads(), "device": str(ctx.device)}}

        result = join_from_env(target, None, device="cpu", out_dir={str(tmp_path)!r})
        path = f"{tmp_path}/rank{{result['rank']}}.json"
        open(path, "w").write(json.dumps(result))
    """))
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "--log-dir", str(tmp_path / "torchrun"), str(script)],
        timeout=120, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert results == [
        {"rank": r, "dp_size": 2, "local_rank": r, "sum": 2.0, "separate": True, "threads": 1,
         "device": "cpu"} for r in (0, 1)]
