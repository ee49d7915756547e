"""How often one command works out each input of its run: ``count_calls`` counts the
calls of a function in this process, wherever a module imported it by name, and
``RESOLVED_ONCE`` names what one ``dyntra-emu run`` must work out once, each with the
function that does it every time.

Used by tests/cli/test_cli_run.py (``test_run_dynamic_config_from_file``: the kit) and
tests/upstream/test_resolved_once_upstream.py (``--impl vllm-ascend``, whose tree is
resolved too).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Counted:
    """A function that works something out (``module.name``), and which of its calls
    count: ``counts(path, args, kwargs)`` for the run whose trace is ``path`` (None: all
    of them). ``not_from``: callers (modules) whose calls are not the run's own."""

    module: str
    name: str
    counts: Callable[[Path, tuple, dict], bool] | None = None
    not_from: tuple[str, ...] = ()


def _reads(trace: Path, args: tuple, kwargs: dict) -> bool:
    return Path(args[0]) == trace


# What one run works out, once: the additional config parsed (the summary's notes read
# the config recorded in metrics.json, a result of the run, and are left out), the
# device chosen, the trace file read, the run's logs read (for the metrics and the plots
# alike: the run carries what it read, RunResult.loaded).
RESOLVED_ONCE = {
    "additional config parsed": Counted("dyntra_lb.config", "load_additional_config",
                                        not_from=("emu.no_effect",)),
    "device chosen": Counted("emu.cluster.device", "select_device"),
    "trace file read": Counted("emu.limits", "read_limited", counts=_reads),
    "run's logs read": Counted("emu.metrics", "load_run"),
}

# What a vllm-ascend run works out once besides: its tree (each resolve runs
# `git rev-parse`) and the tree's content hash.
TREE_RESOLVED_ONCE = {
    "vllm-ascend tree resolved": Counted("emu.impl.vllm_ascend.tree", "resolve"),
    "tree's git commit read": Counted("emu.impl.vllm_ascend.tree", "_git_commit"),
    "tree's content hashed": Counted("emu.impl.vllm_ascend.tree", "content_hash"),
}


def count_calls(monkeypatch, counted: dict[str, Counted], trace: Path) -> dict[str, list]:
    """From now on, each call of each counted function (by its name in ``counted``):
    the calling module, appended to its list. Every module that holds the function by
    name gets the counting one; a module imported later takes it from the function's
    own module."""
    calls: dict[str, list] = {}
    for what, spec in counted.items():
        calls[what] = []
        module = importlib.import_module(spec.module)
        original = getattr(module, spec.name)

        def counting(*args, _original=original, _spec=spec, _calls=calls[what], **kwargs):
            caller = sys._getframe(1).f_globals.get("__name__", "")
            if (_spec.counts is None or _spec.counts(trace, args, kwargs)) and \
                    caller not in _spec.not_from:
                _calls.append(caller)
            return _original(*args, **kwargs)

        for name, holder in list(sys.modules.items()):
            if name.partition(".")[0] in ("emu", "dyntra_lb") and \
                    getattr(holder, spec.name, None) is original:
                monkeypatch.setattr(holder, spec.name, counting)
    return calls
