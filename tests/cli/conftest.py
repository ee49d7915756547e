"""Helpers of the CLI tests: every test runs the real `dyntra-emu` in a subprocess (the
console script installed next to this interpreter), in the test's tmp_path, with tiny
traces written there so cluster runs stay short (dp=2, block size 16)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

CONSOLE_SCRIPT = Path(sys.executable).with_name("dyntra-emu")

# Flags that keep a cluster run small: 2 ranks, 16-token blocks, the CPU.
SMALL = ["--dp", "2", "--block-size", "16", "--num-gpu-blocks", "512", "--max-num-seqs", "4",
         "--device", "cpu"]

STATIC = {"scheduler_config": {"dyntra_lb_config": {"enabled": True, "mode": "static",
                                                    "start_step": 0}}}


def tiny_requests() -> list[dict]:
    """Ten requests of uneven size arriving within 0.1 s: enough for DyntraLB to plan."""
    return [
        {"request_id": f"req-{i}", "arrival_s": round(0.01 * i, 3),
         "prompt_tokens": 40 + 150 * (i % 3), "output_tokens": 8 + 9 * (i % 4)}
        for i in range(10)
    ]


def write_trace(path: Path, requests: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in requests))
    return path


@pytest.fixture
def tiny_trace(tmp_path) -> Path:
    return write_trace(tmp_path / "tiny.jsonl", tiny_requests())


@pytest.fixture
def cli(tmp_path):
    """`cli(*args, module=False, timeout=...) -> CompletedProcess` running dyntra-emu in
    tmp_path (module=True: as `python -m emu`). Output is captured as text; stdin is
    closed and stderr is not a terminal, so no progress bar is drawn."""

    def run(*args, module: bool = False, timeout: float = 240, cwd: Path | None = None):
        command = [sys.executable, "-m", "emu"] if module else [str(CONSOLE_SCRIPT)]
        return subprocess.run([*command, *map(str, args)], cwd=cwd or tmp_path,
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
    STATIC = STATIC
    tiny_requests = staticmethod(tiny_requests)
    write_trace = staticmethod(write_trace)
    assert_user_error = staticmethod(assert_user_error)


@pytest.fixture(scope="session")
def clikit() -> type[CliKit]:
    return CliKit
