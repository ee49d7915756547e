"""What the kit exposes, opens, writes, deletes and reads (docs/security.md names each
test here for the statement it holds):

- a run listens on loopback only: the rendezvous store (rank 0's) and every rank's gloo
  sockets (also when the environment names a network interface for gloo); rank threads
  listen on nothing;
- its scratch files (the launcher's /dev/shm files, the fork server's socket directory,
  the thread transport's and the recipe's temporary directories) are the user's only
  while it runs, and gone after;
- ``--overwrite`` removes an earlier run's files and never follows a symbolic link out
  of the output directory (run, ab, sweep);
- a trace, a ``--cost-model`` file and an ``--additional-config @FILE`` are data with
  size and value limits: past one, one clear error and nothing runs.

The upstream tier checks the same for ``--impl vllm-ascend``
(tests/upstream/test_vllm_ascend_security.py)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from emu import limits
from emu.cli import inputs
from emu.workload import jsonl
from tests.exposure import network_interface, watch_run

pytestmark = pytest.mark.integration

# Rank 1 sleeps 2 s (wall clock) before a collective of step 5: the run is under way,
# its groups made, for long enough to be seen; virtual time is untouched.
HOLD = ["--fault", "delay:rank=1,site=engine.lockstep,step=5,seconds=2"]


def _argv(clikit, trace: Path, *flags: str) -> list:
    return ["--workload", trace, *clikit.SMALL, *HOLD, *flags]


@pytest.fixture(scope="module")
def process_run(tmp_path_factory, clikit):
    """One dp=2 run with rank processes, watched from outside while it runs. The
    environment names a network interface for gloo (``GLOO_SOCKET_IFNAME``, as a user or
    a host's profile may), when this machine has one: ``launch`` must pin gloo's pair
    sockets to loopback all the same, every rank being on this machine."""
    tmp_path = tmp_path_factory.mktemp("process-run")
    trace = clikit.write_trace(tmp_path / "tiny.jsonl", clikit.tiny_requests())
    interface = network_interface()
    env = None if interface is None else {"GLOO_SOCKET_IFNAME": interface[0]}
    seen = watch_run(_argv(clikit, trace), tmp_path, tmp_path / "out", env=env)
    assert seen.returncode == 0, seen.stderr
    assert seen.samples_under_way > 0
    return seen


def test_a_process_run_listens_on_loopback_only(process_run):
    # What there was to see: gloo in both ranks and the rendezvous store, which rank 0
    # serves on the socket the launcher bound and handed over as rank 0 started.
    assert len(process_run.listening("rank")) == 2
    assert process_run.exposed() == []


def test_a_thread_run_listens_on_nothing(tmp_path, tiny_trace, clikit):
    seen = watch_run(_argv(clikit, tiny_trace, "--transport", "thread"), tmp_path,
                     tmp_path / "out")
    assert seen.returncode == 0, seen.stderr
    assert seen.samples_under_way > 0
    assert seen.listeners == set()
    # its scratch: the watchdog's guard file in /dev/shm (private), gone after
    assert any(Path(s.path).name.startswith("dyntra-emu-launch-")
               and s.path.endswith("-guard") for s in seen.scratch.values())
    assert seen.shared() == []
    assert seen.left == []


def test_a_process_run_keeps_its_scratch_private_and_leaves_none(process_run):
    scratch = process_run.scratch.values()
    # What there was to see: the launcher's /dev/shm files (guard, one stack per rank)
    # and multiprocessing's directory for the fork server's socket.
    shm = {s.path.rsplit("-", 1)[1] for s in scratch if s.path.startswith("/dev/shm/")
           and "dyntra-emu-launch-" in s.path}
    assert {"guard", "rank0.stack", "rank1.stack"} <= shm
    assert any(s.kind == "socket" and Path(s.top).name.startswith("pymp-") for s in scratch)
    assert process_run.shared() == []
    for s in scratch:  # the files in /dev/shm themselves: 0600
        if s.path == s.top and s.path.startswith("/dev/shm/"):
            assert s.mode == 0o600, s
    assert process_run.left == []


def test_a_recipe_trace_is_written_where_only_the_user_reads(cli, monkeypatch, tmp_path):
    """The trace a recipe generates lives in a private temporary directory while the
    CLI checks it, and is gone after."""
    seen = []

    def write_and_look(value, seed, path):
        written = real(value, seed, path)
        seen.append((path, os.stat(path.parent), os.stat(path)))
        return written

    real = inputs.write_recipe_trace
    monkeypatch.setattr(inputs, "write_recipe_trace", write_and_look)
    proc = cli("validate", "--workload", "recipe:pr12292,n=8", "--dp", "2",
               "--block-size", "2048")
    assert proc.returncode == 0, proc.stderr
    [(path, directory, _)] = seen
    assert stat.S_IMODE(directory.st_mode) == 0o700 and directory.st_uid == os.getuid()
    assert not path.parent.exists()


# ------------------------------------------------------------------ --overwrite


def _outside(tmp_path: Path) -> Path:
    """Files outside the output directory that a symbolic link inside it points to."""
    outside = tmp_path / "outside"
    outside.mkdir()
    for name in ("metrics.json", "rank0.steps", "rank0.log", "keep.txt"):
        (outside / name).write_text(f"not the kit's: {name}\n")
    return outside


def _untouched(outside: Path) -> None:
    assert sorted(p.name for p in outside.iterdir()) == [
        "keep.txt", "metrics.json", "rank0.log", "rank0.steps"]
    for p in outside.iterdir():
        assert p.read_text() == f"not the kit's: {p.name}\n"


THREAD = ["--transport", "thread"]


def test_overwrite_removes_links_named_like_run_files_not_their_targets(cli, tmp_path,
                                                                        tiny_trace, clikit):
    outside = _outside(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    for name in ("metrics.json", "rank0.log", "rank0.steps"):
        (out / name).symlink_to(outside / name)
    (out / "rank1.log").symlink_to(outside / "new.log")  # dangling: would create it
    refused = cli("run", "--workload", tiny_trace, *clikit.SMALL, *THREAD, "--out", out)
    assert refused.returncode == 2 and "already holds a run" in refused.stderr
    proc = cli("run", "--workload", tiny_trace, *clikit.SMALL, *THREAD, "--out", out, "--overwrite")
    assert proc.returncode == 0, proc.stderr
    _untouched(outside)
    for name in ("metrics.json", "rank0.log", "rank1.log"):
        assert not (out / name).is_symlink() and (out / name).is_file(), name
    assert not (out / "rank0.steps").is_symlink() and (out / "rank0.steps").is_dir()
    assert json.loads((out / "metrics.json").read_text())["requests_finished"] == 10


def test_overwrite_removes_a_linked_run_subdirectory_not_what_it_points_to(cli, tmp_path,
                                                                           tiny_trace,
                                                                           clikit):
    """``ab`` writes into DIR/a and DIR/b: a link standing at DIR/a is an earlier run's
    entry, refused without --overwrite, removed (the link) with it."""
    outside = _outside(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "a").symlink_to(outside, target_is_directory=True)
    argv = ["ab", "--workload", tiny_trace, *clikit.SMALL, *THREAD, "--out", out]
    refused = cli(*argv)
    assert refused.returncode == 2 and "already holds a run (a)" in refused.stderr
    proc = cli(*argv, "--overwrite")
    assert proc.returncode == 0, proc.stderr
    _untouched(outside)
    assert not (out / "a").is_symlink()
    assert json.loads((out / "a" / "metrics.json").read_text())["requests_finished"] == 10


@pytest.mark.parametrize("link", ["runs/baseline", "runs", "summary.md"])
def test_sweep_overwrite_never_follows_a_link(cli, tmp_path, tiny_trace, clikit, link):
    outside = _outside(tmp_path)
    out = tmp_path / "out"
    (out / link).parent.mkdir(parents=True)
    target = outside / "keep.txt" if link == "summary.md" else outside
    (out / link).symlink_to(target)
    proc = cli("sweep", "--workload", tiny_trace, *clikit.SMALL, "--grid", "bubble_threshold=3",
               "--jobs", "1", "--out", out, "--overwrite", timeout=300)
    assert proc.returncode == 0, proc.stderr
    _untouched(outside)
    assert not (out / link).is_symlink()
    assert (out / "runs" / "baseline" / "metrics.json").is_file()


# ---------------------------------------------------------------- input limits


def _refused(cli, clikit, tmp_path, *flags_and_message):
    """``run`` with the flags is refused with the message (the last argument) and
    starts nothing."""
    *flags, message = flags_and_message
    clikit.assert_user_error(cli("run", *clikit.SMALL, *flags), message)
    assert not (tmp_path / "runs").exists()


def _sparse(path: Path, size: int) -> Path:
    with open(path, "wb") as f:
        f.truncate(size)
    return path


@pytest.mark.parametrize("source", ["large file", "device"])
def test_a_trace_past_the_size_limit_is_one_error(cli, clikit, tmp_path, source):
    path = (_sparse(tmp_path / "big.jsonl", limits.MAX_TRACE_BYTES + 1)
            if source == "large file" else Path("/dev/zero"))
    _refused(cli, clikit, tmp_path, "--workload", path,
             f"{path}: cannot read trace: larger than the limit of 256 MiB")


def test_a_trace_past_the_request_limit_is_one_error(cli, clikit, tmp_path, monkeypatch):
    # The limit is a million requests; the same check, with a limit of 5.
    monkeypatch.setattr(jsonl, "MAX_TRACE_REQUESTS", 5)
    trace = clikit.write_trace(tmp_path / "six.jsonl", clikit.tiny_requests()[:6])
    _refused(cli, clikit, tmp_path, "--workload", trace,
             f"{trace}:6: more than 5 requests, the limit for a trace")


def test_a_recipe_past_the_request_limit_is_one_error(cli, clikit, tmp_path):
    _refused(cli, clikit, tmp_path, "--workload", "recipe:pr12292,n=1000001",
             "--workload recipe:pr12292,n=1000001: n=1000001: at most 1,000,000 requests")
    # hours of traffic at the recipe's rate: the requests they make
    _refused(cli, clikit, tmp_path, "--workload", "recipe:mooncake-like,hours=60",
             "--workload recipe:mooncake-like,hours=60: hours=60: 1,182,000 requests at "
             "5.47222/s, past 1,000,000")


@pytest.mark.parametrize("source", ["large file", "device"])
def test_a_cost_model_file_past_the_size_limit_is_one_error(cli, clikit, tmp_path,
                                                            tiny_trace, source):
    path = (_sparse(tmp_path / "big.json", limits.MAX_SMALL_FILE_BYTES + 1)
            if source == "large file" else Path("/dev/zero"))
    _refused(cli, clikit, tmp_path, "--workload", tiny_trace, "--cost-model", path,
             f"{path}: cannot read the profile file: larger than the limit of 1 MiB")


def test_a_config_file_past_the_size_limit_is_one_error(cli, clikit, tmp_path, tiny_trace):
    _refused(cli, clikit, tmp_path, "--workload", tiny_trace,
             "--additional-config", "@/dev/zero",
             "--additional-config @/dev/zero: cannot read /dev/zero: larger than the limit "
             "of 1 MiB")


@pytest.mark.parametrize("key,value,limit", [
    ("fixed_s", 61.0, "60"), ("fixed_s", 1e300, "60"), ("per_kv_token_s", 1.5, "1"),
    ("per_scheduled_token_s", 2.0, "1"), ("per_running_request_s", 2.0, "1"),
    ("per_kv_block_s", 2.0, "1")])
def test_a_cost_model_value_past_its_limit_is_one_error(cli, clikit, tmp_path, tiny_trace,
                                                         key, value, limit):
    """Such a step cost would overflow the lockstep collective's int64 mid-run."""
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"name": "big", key: value}))
    _refused(cli, clikit, tmp_path, "--workload", tiny_trace, "--cost-model", path,
             f"{path}: key {key!r} must be at most {limit} seconds, got {value!r}")


def test_a_draft_step_past_its_limit_is_one_error(cli, clikit, tmp_path, tiny_trace):
    path = tmp_path / "mtp.json"
    path.write_text(json.dumps({"name": "mtp", "num_speculative_tokens": 2,
                                "draft_acceptance_rate": 0.5, "draft_step_s": 90.0}))
    _refused(cli, clikit, tmp_path, "--workload", tiny_trace, "--cost-model", path,
             f"{path}: key 'draft_step_s' must be at most 60 seconds, got 90.0")


def test_a_slow_fault_past_its_limit_is_one_error(cli, clikit, tmp_path, tiny_trace):
    _refused(cli, clikit, tmp_path, "--workload", tiny_trace,
             "--fault", "slow:rank=0,extra_ms=1e300",
             "extra_ms must be at most 60000 (a minute per step), got 1e+300")


def test_a_cost_model_at_its_limits_runs(cli, tmp_path, tiny_trace, clikit):
    path = tmp_path / "slow.json"
    path.write_text(json.dumps({
        "name": "at-the-limits", "fixed_s": 60.0, "per_kv_token_s": 1.0,
        "per_scheduled_token_s": 1.0, "per_running_request_s": 1.0, "per_kv_block_s": 1.0,
        "num_speculative_tokens": 16, "draft_acceptance_rate": 1.0, "draft_step_s": 60.0}))
    proc = cli("run", "--workload", tiny_trace, *clikit.SMALL, *THREAD, "--cost-model", path,
               "--fault", "slow:rank=1,extra_ms=60000", "--out", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["requests_finished"] == 10
