"""What a command reports when it cannot do its job, and the exit codes that go with it.

`emu.cli.main.main` turns each exception into one message on stderr and an exit code: a
UsageError (bad input, found before anything started) exits 2, ClusterFailed 1, an
interrupted run 130 (SIGINT) or 143 (SIGTERM).
"""

from __future__ import annotations

PROG = "dyntra-emu"

EXIT_USAGE = 2

EXIT_FAILED = 1


class UsageError(Exception):
    """Bad user input found before anything started; each entry of `problems` is one
    complete message (flag or file:line, what was expected)."""

    def __init__(self, *problems: str):
        super().__init__("\n".join(problems))
        self.problems = list(problems)


class ClusterFailed(Exception):
    """A cluster run failed after it started; the message is ready to print."""


class RunInterrupted(Exception):
    """SIGINT or SIGTERM stopped a cluster run; the message is ready to print and
    `exit_code` is the shell's status for that signal (130, 143)."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


class Terminated(KeyboardInterrupt):
    """SIGTERM outside a cluster launch (which handles it itself)."""


def raise_terminated(signum, frame):
    """The SIGTERM handler `main` installs: SIGTERM ends a command like Ctrl-C."""
    raise Terminated()
