"""`dyntra-emu run` end to end: real CLI in a subprocess, real rank processes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.call_counts import RESOLVED_ONCE, count_calls
from tests.exposure import network_interface

pytestmark = pytest.mark.integration

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_run_writes_every_output(cli, tiny_trace, tmp_path, clikit):
    out = tmp_path / "out"
    out.mkdir()
    # A stale rank log of an earlier dp=3 run: --overwrite must remove it, or the
    # metrics would mix a third rank into this dp=2 run.
    (out / "rank2.steps").write_text("stale\n")

    # The console script in its own process: the one end-to-end run of `run` as typed.
    proc = cli("run", "--workload", tiny_trace, *clikit.SMALL, "--seed", "7", "--out", out,
               "--overwrite", process=True)

    assert proc.returncode == 0, proc.stderr
    # Not a terminal: no bar, but a start line and a finish line on stderr.
    assert "run: 2 ranks, workload" in proc.stderr
    assert ("(10 requests), DyntraLB static mode from step 0, async scheduling, "
            "DP sync every 32 steps (vLLM < 0.30), seed 7"
            in proc.stderr)
    assert "finished in" in proc.stderr
    # The summary table on stdout.
    for row in ("DP bubble ratio", "requests finished", "10 / 10", "TPOT",
                "steps with a plan applied"):
        assert row in proc.stdout, row
    # vLLM's default for the node: async scheduling, said in the summary
    assert re.search(r"scheduling\s+async", proc.stdout)
    assert f"Outputs in {out}/" in proc.stdout

    names = {p.name for p in out.iterdir()}
    for rank in (0, 1):
        assert {f"rank{rank}.steps", f"rank{rank}.requests",
                f"rank{rank}.wall", f"rank{rank}.log"} <= names
    assert "rank2.steps" not in names
    for png in ("load.png", "bubble.png", "tpot.png"):
        assert (out / png).read_bytes()[:8] == PNG_MAGIC, png

    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["seed"] == 7
    assert metrics["dp_size"] == 2
    assert metrics["requests_finished"] == 10
    assert metrics["config"]["additional_config"] == clikit.STATIC
    assert metrics["config"]["block_size"] == 16
    assert metrics["config"]["max_num_seqs"] == 4
    assert metrics["config"]["workload"] == str(tiny_trace)
    assert metrics["plan_churn"]["active_steps"] > 0  # DyntraLB ran from step 0
    assert metrics["config"]["async_scheduling"] is True

    summary = (out / "summary.md").read_text()
    assert "## Latency (ms)" in summary
    for png in ("load.png", "bubble.png", "tpot.png"):
        assert f"]({png})" in summary


def test_run_plain_dp_as_module_into_runs_dir(cli, tiny_trace, tmp_path, clikit):
    """`python -m emu run --no-dyntra-lb --quiet --no-async-scheduling` without --out:
    runs/<stamp>-run in the working directory, nothing on stderr, no DyntraLB activity,
    synchronous scheduling."""
    proc = cli("run", "--workload", tiny_trace, *clikit.SMALL, "--no-dyntra-lb", "--quiet",
               "--no-async-scheduling", module=True)

    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    (out,) = (tmp_path / "runs").iterdir()
    assert out.name.endswith("-run")
    assert f"Outputs in runs/{out.name}/" in proc.stdout
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["config"]["additional_config"] == {}
    assert metrics["config"]["async_scheduling"] is False
    assert re.search(r"scheduling\s+synchronous", proc.stdout)
    assert metrics["plan_churn"]["active_steps"] == 0
    assert metrics["requests_finished"] == 10
    assert metrics["seed"] == 0


def test_the_command_never_imports_torch_for_a_run_on_rank_processes(tiny_trace, tmp_path,
                                                                     clikit):
    """torch is imported by the ranks (rank 0 serves the rendezvous store), not by the
    command's own process: neither to parse its flags (``--help`` is quick) nor to run
    the ranks, so its import never stands before the ranks start."""
    script = ("import sys\n"
              "from emu.cli.main import main\n"
              "with_the_cli = 'torch' in sys.modules\n"
              "code = main(sys.argv[1:])\n"
              "print(with_the_cli, code, 'torch' in sys.modules)\n")
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-c", script, "run", "--workload", str(tiny_trace),
                           *clikit.SMALL, "--quiet", "--out", str(out)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=240,
                          stdin=subprocess.DEVNULL)
    assert proc.stdout.split()[-3:] == ["False", "0", "False"], proc.stdout + proc.stderr
    assert json.loads((out / "metrics.json").read_text())["requests_finished"] == 10


def test_run_dynamic_config_from_file(cli, tiny_trace, tmp_path, clikit, monkeypatch):
    """--additional-config @file takes a decode node's config as is; and the command
    works out each input of its run once (tests/call_counts.py): the config is parsed
    once, the device chosen once, the trace read once, the run's logs read once, from
    the check to metrics.json and the plots (counted in the command's process, which
    launches rank processes)."""
    config = {"scheduler_config": {"dyntra_lb_config": {
        "enabled": True, "mode": "dynamic", "start_step": 0, "long_req_block_threshold": 5,
        "dynamic_max_step": 8}}}
    path = tmp_path / "decode.json"
    path.write_text(json.dumps(config))
    out = tmp_path / "dyn"
    calls = count_calls(monkeypatch, RESOLVED_ONCE, tiny_trace)

    proc = cli("run", "--workload", tiny_trace, *clikit.SMALL, "--additional-config",
               f"@{path}", "--out", out)

    assert proc.returncode == 0, proc.stderr
    assert "DyntraLB dynamic mode from step 0, long requests > 5 blocks" in proc.stderr
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["config"]["additional_config"] == config
    assert {what: len(callers) for what, callers in calls.items()} == \
        dict.fromkeys(RESOLVED_ONCE, 1), calls


def test_run_reads_each_record_table_once(cli, tiny_trace, tmp_path, clikit, monkeypatch):
    """The metrics and the plots come from one loading of the records: the run as read
    for the metrics (``RunResult.loaded``) is the one the plots draw, and the plots read
    nothing again (their lines come from the metrics' pass over the steps). Every table
    is read part after part: the requests twice (the second time to add the inter-token
    latencies up in order), the steps three times (the lockstep check of their
    iterations, the pass rank after rank, the pass window after window), the wall-clock
    times five times (the check that every part reads, their sums, then each of the
    three fields' mean and percentiles: a tiny run's values fit one bucket)."""
    import emu.metrics
    import emu.records.ranks

    reads: list[str] = []

    def counting(read):
        def counting_read(run_dir, rank, table, *args, **kwargs):
            reads.append(f"rank{rank}.{table}")
            return read(run_dir, rank, table, *args, **kwargs)
        return counting_read

    for module in (emu.metrics, emu.records.ranks):
        monkeypatch.setattr(module, "read_parts", counting(module.read_parts))
    out = tmp_path / "out"
    proc = cli("run", "--workload", tiny_trace, *clikit.SMALL, "--transport", "thread",
               "--out", out)

    assert proc.returncode == 0, proc.stderr
    assert (out / "load.png").exists() and (out / "metrics.json").exists()
    assert sorted(reads) == sorted(f"rank{r}.{t}" for r in (0, 1)
                                   for t, times in (("requests", 2), ("steps", 3),
                                                    ("wall", 5))
                                   for _ in range(times))


@pytest.mark.parametrize("command", [None, "run", "ab", "validate"])
def test_help_explains_and_gives_examples(cli, command):
    proc = cli(*([command] if command else []), "--help")
    assert proc.returncode == 0
    assert "examples:" in proc.stdout
    assert "dyntra-emu" in proc.stdout
    if command is None:
        for name in ("run", "ab", "validate"):
            assert f"\n    {name} " in proc.stdout
    else:
        assert "--workload FILE|NAME" in proc.stdout


def test_python_dash_m_emu_is_the_same_cli(cli):
    proc = cli("--help", module=True)
    assert proc.returncode == 0
    assert proc.stdout.startswith("usage: dyntra-emu")


def test_run_under_torchrun(cli, tiny_trace, tmp_path, clikit):
    """torchrun starts the ranks (each one `python -m emu run`); rank 0 reports. The
    rendezvous is torchrun's, at a network address when this machine has one: rank 0
    then says once that the address exposes it, all ranks being on this machine (and
    says nothing on loopback). docs/security.md names this test for the warning."""
    torchrun = Path(sys.executable).with_name("torchrun")
    out = tmp_path / "tr"
    small = list(clikit.SMALL)
    del small[small.index("--dp"):small.index("--dp") + 2]  # the DP size is WORLD_SIZE
    interface = network_interface()
    address = "127.0.0.1" if interface is None else interface[1]
    proc = subprocess.run(
        [str(torchrun), "--standalone", "--local-addr", address, "--nproc-per-node", "2",
         "--log-dir", str(tmp_path / "torchrun"), "-m", "emu", "run", "--workload",
         str(tiny_trace), *small, "--out", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL)

    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("DP bubble ratio") == 1  # only rank 0 prints the summary
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["dp_size"] == 2
    assert metrics["requests_finished"] == 10
    assert (out / "load.png").exists()
    warning = (f"warning: MASTER_ADDR={address} is not a loopback address, but all 2 "
               "ranks of this run are on this machine")
    assert proc.stderr.count(warning) == (0 if interface is None else 1), proc.stderr


@pytest.mark.parametrize("args, fragment", [
    (["--dp", "3", "--out", "x"], "--dp 3: under torchrun the DP size is WORLD_SIZE=2"),
    ([], "--out: required under torchrun"),
])
def test_torchrun_environment_errors(tmp_path, tiny_trace, clikit, args, fragment):
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    proc = subprocess.run([sys.executable, "-m", "emu", "run", "--workload", str(tiny_trace),
                           *args], cwd=tmp_path, capture_output=True, text=True, env=env,
                          timeout=120, stdin=subprocess.DEVNULL)
    clikit.assert_user_error(proc, fragment)


@pytest.mark.parametrize("command", ["replay", "explain"])
def test_offline_commands_are_wired_in(cli, command):
    proc = cli(command, "--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"usage: dyntra-emu {command}")
