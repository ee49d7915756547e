"""Helpers of the CLI tests: each test runs the real `dyntra-emu` in the test's tmp_path,
with tiny traces written there so cluster runs stay short (dp=2, block size 16).

Two ways to run it. `cli(...)` calls the command's `main(argv)` in the test's own
process: the same parser, checks, launcher and rank processes as the console script,
without a fresh interpreter and its fork server importing torch again (most of a tiny
run's cost). `cli(..., process=True)` runs the installed console script (or
`python -m emu`) in a subprocess, for what only a process shows: its exit status after
the interpreter's own handling, signals, what it leaves behind."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from filelock import FileLock

from tests.in_process import run_in_process

CONSOLE_SCRIPT = Path(sys.executable).with_name("dyntra-emu")

# Flags that keep a cluster run small: 2 ranks, 16-token blocks, the CPU.
SMALL = ["--dp", "2", "--block-size", "16", "--num-gpu-blocks", "512", "--max-num-seqs", "4",
         "--device", "cpu"]

STATIC = {"scheduler_config": {"dyntra_lb_config": {"enabled": True, "mode": "static",
                                                    "start_step": 0}}}

# A generated workload whose long request (4,096 output tokens) makes static mode plan,
# on 2 rank threads: the runs of ab_over_seeds.
AB_OVER_SEEDS = ["--workload", "recipe:pr12292,n=6,rate=20", "--dp", "2", "--block-size",
                 "2048", "--device", "cpu", "--quiet", "--transport", "thread"]
# The A/B of ab_over_seeds: DyntraLB off (A) against static mode (B), on seeds 3 and 4.
AB_OVER_SEEDS_AB = ["ab", *AB_OVER_SEEDS, "--seeds", "2", "--seed", "3", "--config-a", "{}",
                    "--config-b", json.dumps(STATIC)]
# A 2 x 2 grid (and the baseline) of small runs on rank processes: the runs of sweep_2x2.
SWEEP_2X2 = [*SMALL, "--grid", "bubble_threshold=1,5", "--grid", "mode=static,dynamic",
             "--grid", "long_req_block_threshold=30"]


def tiny_requests() -> list[dict]:
    """Ten requests of uneven size arriving within 0.1 s: enough for DyntraLB to plan."""
    return [
        {"request_id": f"req-{i}", "arrival_s": round(0.01 * i, 3),
         "prompt_tokens": 40 + 150 * (i % 3), "output_tokens": 8 + 9 * (i % 4)}
        for i in range(10)
    ]


def sweep_requests() -> list[dict]:
    """Sixteen requests of uneven size (two long prompts above 30 blocks of 16 tokens)."""
    return [{"request_id": f"s{i}", "arrival_s": round(0.02 * i, 3),
             "prompt_tokens": 600 if i in (3, 11) else 40 + 120 * (i % 4),
             "output_tokens": 6 + 5 * (i % 5)} for i in range(16)]


def write_trace(path: Path, requests: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in requests))
    return path


@pytest.fixture
def tiny_trace(tmp_path) -> Path:
    return write_trace(tmp_path / "tiny.jsonl", tiny_requests())


@pytest.fixture
def cli(tmp_path):
    """`cli(*args, module=False, process=False, timeout=..., cwd=None) -> CompletedProcess`
    running dyntra-emu in tmp_path, output captured as text. In the test's process by
    default (see above); process=True (implied by module=True: `python -m emu`) in a
    subprocess whose stdin is closed. stderr is never a terminal: no progress bar."""

    def run(*args, module: bool = False, process: bool = False, timeout: float = 240,
            cwd: Path | None = None):
        argv = [*map(str, args)]
        if not (process or module):
            return run_in_process(argv, cwd or tmp_path)
        command = [sys.executable, "-m", "emu"] if module else [str(CONSOLE_SCRIPT)]
        return subprocess.run([*command, *argv], cwd=cwd or tmp_path,
                              capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)

    return run


def assert_user_error(proc, *fragments: str, code: int = 2) -> None:
    """A user error: the exit code, every fragment in stderr, no Python traceback."""
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    for fragment in fragments:
        assert fragment in proc.stderr, (fragment, proc.stderr)


class CliKit:
    """Constants and helpers of this directory's tests (the ``clikit`` fixture), so test
    modules need no imports from this conftest."""

    SMALL = SMALL
    AB_OVER_SEEDS = AB_OVER_SEEDS
    AB_OVER_SEEDS_AB = AB_OVER_SEEDS_AB
    SWEEP_2X2 = SWEEP_2X2
    STATIC = STATIC
    tiny_requests = staticmethod(tiny_requests)
    write_trace = staticmethod(write_trace)
    assert_user_error = staticmethod(assert_user_error)


@pytest.fixture(scope="session")
def clikit() -> type[CliKit]:
    return CliKit


def _once_per_session(tmp_path_factory, worker_id, name: str, argv) -> tuple[
        subprocess.CompletedProcess, Path]:
    """`dyntra-emu argv(dir)` run once per test session, in the test's process, and its
    directory ``dir``: under xdist the first worker to ask runs it in the session's
    temporary directory, under a file lock, and the others read what it left there."""
    shared = tmp_path_factory.getbasetemp()
    if worker_id != "master":
        shared = shared.parent  # the session's, above each worker's
    where, result = shared / name, shared / f"{name}.json"
    with FileLock(shared / f"{name}.lock"):
        if not result.exists():
            where.mkdir()
            proc = run_in_process(argv(where), where)
            result.write_text(json.dumps([proc.args, proc.returncode, proc.stdout,
                                          proc.stderr]))
    return subprocess.CompletedProcess(*json.loads(result.read_text())), where


@pytest.fixture(scope="session")
def ab_over_seeds(tmp_path_factory, worker_id) -> tuple[subprocess.CompletedProcess, Path]:
    """One `ab --seeds 2` over a generated workload on rank threads, DyntraLB off (A)
    against static mode from step 0 (B), and its out dir: what `ab` reports over seeds
    (test_cli_ab.py), the baseline `gate` reads (test_cli_gate.py) and what the same
    command on a two-node Ray must give (test_cli_ray_cluster.py). Its four runs of the
    recipe's long request (4,096 tokens) are among the tier's longest, so the tests share
    one."""
    proc, where = _once_per_session(
        tmp_path_factory, worker_id, "ab-over-seeds",
        lambda where: [*AB_OVER_SEEDS_AB, "--out", str(where / "seeds")])
    return proc, where / "seeds"


@pytest.fixture(scope="session")
def sweep_2x2(tmp_path_factory, worker_id) -> tuple[subprocess.CompletedProcess, Path]:
    """One `sweep` of SWEEP_2X2 over sweep_requests() on rank processes, and its out dir
    (the trace is sweep.jsonl beside it): what test_cli_sweep.py checks, and what the
    same sweep on a Ray cluster must give (test_cli_ray_cluster.py)."""
    def argv(where: Path) -> list[str]:
        trace = write_trace(where / "sweep.jsonl", sweep_requests())
        return ["sweep", "--workload", str(trace), *SWEEP_2X2, "--jobs", "2",
                "--out", str(where / "sw")]

    proc, where = _once_per_session(tmp_path_factory, worker_id, "sweep-2x2", argv)
    return proc, where / "sw"
