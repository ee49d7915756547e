"""Where a command's processes keep the bytecode of the modules they import.

Python compiles a module's source the first time it imports it and keeps the bytecode
in a ``__pycache__`` beside the source, unless ``PYTHONDONTWRITEBYTECODE`` is set: then
every start compiles every module it imports again (torch, vLLM, numba, ours), seconds
of CPU per process. Beside the source is not always ours to write to either: a
vllm-ascend tree given with ``--vllm-ascend`` (often read-only, or somebody's checkout)
would get ``__pycache__`` directories of our making.

``use_cache()`` points this process at one cache of its own, outside every source tree
(``sys.pycache_prefix``: the user's cache directory, ``$XDG_CACHE_HOME/dyntra-emu/
pycache``, default ``~/.cache/dyntra-emu/pycache``), and lets it write there even where
``PYTHONDONTWRITEBYTECODE`` is set, as ``.ci/run`` does for the tests. A prefix the user
chose (``PYTHONPYCACHEPREFIX``, ``-X pycache_prefix``) is kept. The environment carries
the choice to every Python process the command starts (rank processes, fork servers,
jobs, Ray workers). A process started with ``-B``, as multiprocessing starts its fork
servers when the command was, reads the cache but does not write it, so the fork server
of the ranks calls ``use_cache()`` too (``emu.cluster.rank_preload``).

Called first by the ``dyntra-emu`` command (``emu.cli``) and by every fork server of
CPU ranks, before they import anything heavy. Python checks a cached file against its
source's size and time stamp, as it does in ``__pycache__``; a cache that cannot be
written (no home directory) leaves the process compiling as before.
"""

from __future__ import annotations

import os
import sys


def cache_dir() -> str:
    """The kit's bytecode cache: ``$XDG_CACHE_HOME/dyntra-emu/pycache``, by default
    under ``~/.cache``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "dyntra-emu", "pycache")


def use_cache() -> None:
    """From now on this process, and every process it starts, reads and writes bytecode
    in one cache outside the source trees (see the module docstring)."""
    if sys.pycache_prefix is None:
        sys.pycache_prefix = cache_dir()
    sys.dont_write_bytecode = False
    os.environ["PYTHONPYCACHEPREFIX"] = sys.pycache_prefix
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
