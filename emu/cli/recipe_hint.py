"""`run` and `ab` on a recipe that rebuilds a published run: a hint with the flags of
that run's setup when the command's differ (``emu.recipes.setup_hint``)."""

from __future__ import annotations

import sys

from emu import impl
from emu.recipes import setup_hint


def print_setup_hint(workload: str, spec, config) -> None:
    """Print the hint on stderr (even with --quiet, like the config warnings); ``config``
    is the run's parsed additional config, which the impl's check of async scheduling
    reads."""
    hint = setup_hint(workload, spec, async_supported(spec, config))
    if hint is not None:
        print(hint, file=sys.stderr, flush=True)


def async_supported(spec, config) -> bool:
    """Whether ``spec.impl`` would run this config with async scheduling (the kit
    refuses until it has an async mode)."""
    try:
        impl.get(spec.impl).check(config, dp_size=spec.dp_size, async_scheduling=True,
                                  vllm_ascend=spec.vllm_ascend)
    except ValueError:
        return False
    return True
