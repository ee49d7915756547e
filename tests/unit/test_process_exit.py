"""How the command's process ends (emu/process_exit.py): its atexit handlers run and its
streams are flushed, the exit code is kept, interpreter finalization is skipped, and a
thread Python would wait for still makes it fall back to ``sys.exit``. Each case in a
fresh interpreter, since the function ends its process."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# An object whose finalizer writes a marker when the interpreter tears its modules down
# (that is, only under finalization), a buffered write to a pipe, an atexit handler.
TORN = """\
import sys

class Torn:
    def __del__(self):
        sys.stderr.write("torn down\\n")

kept = Torn()
"""
PRELUDE = TORN + """\
import atexit, threading
from emu.process_exit import end_command

atexit.register(lambda: sys.stdout.write("atexit ran\\n"))
sys.stdout.write("buffered, no newline")
"""


def _run(code: str) -> subprocess.CompletedProcess:
    # Buffered streams, as a user's pipe has them (the buffered write stays in memory).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    return subprocess.run([sys.executable, "-c", PRELUDE + code], capture_output=True,
                          text=True, env=env)


@pytest.mark.parametrize("code", [0, 3, None])
def test_the_process_ends_with_its_code_streams_flushed_atexit_run_and_no_teardown(code):
    proc = _run(f"end_command({code!r})")

    assert proc.returncode == (code or 0)
    assert proc.stdout == "buffered, no newlineatexit ran\n"
    assert "torn down" not in proc.stderr  # finalization skipped


def test_a_thread_python_waits_for_makes_it_exit_as_before():
    # A non-daemon thread still working: Python's exit waits for it, so must this one.
    proc = _run("""
def late():
    threading.Event().wait(0.3)
    sys.stdout.write(" thread done")
threading.Thread(target=late).start()
end_command(5)
""")

    assert proc.returncode == 5
    assert "thread done" in proc.stdout
    assert "torn down" in proc.stderr  # the ordinary exit, finalization included


def test_the_console_script_and_python_m_emu_end_through_it(tmp_path):
    # A sitecustomize (imported at start-up) holding an object whose finalizer marks the
    # interpreter's teardown: absent when the command's process skipped finalization.
    (tmp_path / "sitecustomize.py").write_text(TORN)
    missing = tmp_path / "no-such-run"
    script = os.path.join(os.path.dirname(sys.executable), "dyntra-emu")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    for argv in ([sys.executable, "-m", "emu"], [script]):
        proc = subprocess.run([*argv, "events", str(missing)], capture_output=True,
                              text=True, env=env)
        assert proc.returncode == 2, proc.stderr
        assert "no-such-run" in proc.stderr
        assert "torn down" not in proc.stderr, argv
