"""`dyntra-emu argv` run in the test's own process, as the console script would run it.

Used where a test checks what a command does rather than what its process does: the
command's fork servers (``emu.cluster.rank_start``), which import torch, vLLM and a
vllm-ascend tree once, then serve every later command of the same pytest worker, where
a fresh interpreter would import it all again.
Exit status, signals and what a process leaves behind need the console script in a
subprocess instead.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import signal
import subprocess
import traceback
from pathlib import Path


def run_in_process(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """`dyntra-emu argv` as the console script runs it, in this process: `main`'s return
    value or SystemExit is the exit code, an escaping exception prints its traceback and
    is exit code 1, and a warning logged without a handler reaches stderr as bare text
    (Python's last-resort handler in a fresh interpreter; pytest's own capture handlers
    would otherwise take it). The working directory and SIGTERM's handler are restored."""
    from emu.cli.main import main

    stdout, stderr = io.StringIO(), io.StringIO()
    warnings_to_stderr = logging.StreamHandler(stderr)
    warnings_to_stderr.setLevel(logging.WARNING)
    root = logging.getLogger()
    cwd_before = os.getcwd()
    os.chdir(cwd)
    sigterm = signal.getsignal(signal.SIGTERM)
    root.addHandler(warnings_to_stderr)
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                code = main(argv)
            except SystemExit as exc:
                code = _exit_code(exc, stderr)
            except Exception:
                traceback.print_exc()
                code = 1
    finally:
        root.removeHandler(warnings_to_stderr)
        signal.signal(signal.SIGTERM, sigterm)
        os.chdir(cwd_before)
    return subprocess.CompletedProcess(["dyntra-emu", *argv], code, stdout.getvalue(),
                                       stderr.getvalue())


def _exit_code(exc: SystemExit, stderr: io.StringIO) -> int:
    """The status the interpreter exits with for SystemExit(exc.code)."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=stderr)
    return 1
