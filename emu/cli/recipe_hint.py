"""`run` and `ab` on a recipe that rebuilds a published run: a hint with the flags of
that run's setup when the command's differ (``emu.recipes.setup_hint``)."""

from __future__ import annotations

import sys

from emu.recipes import setup_hint


def print_setup_hint(workload: str, spec) -> None:
    """Print the hint on stderr (even with --quiet, like the config warnings)."""
    hint = setup_hint(workload, spec)
    if hint is not None:
        print(hint, file=sys.stderr, flush=True)
