"""How a process of the command ends once its work is done: atexit handlers yes,
interpreter finalization no.

Finalization tears the heap down object by object (with torch loaded, its last
collection walks every live object and torch unregisters its operator kernels one
library at a time): about half a second of CPU for a process that is about to vanish,
and a tenth of a short run's command (benchmarks/RESULTS.md, "Speed: the whole
command"). Nothing of it is an output: the command's files are closed when its command
returns, and the standard streams are flushed here.

Called by the ``dyntra-emu`` console script and ``python -m emu`` (``end_command``, after
``emu.cli.main.main`` returned; ``main`` itself returns, for callers in a process that goes
on, such as the tests), and by a rank process (``flush_and_exit``, in
``emu.cluster.rank_process``).
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import weakref
from typing import NoReturn


def end_command(code: int | None) -> NoReturn:
    """End the command's process with ``code`` (None: 0), as ``sys.exit`` would but
    without finalization: the atexit handlers run (multiprocessing's, logging's, weakref
    finalizers such as temporary directories'), then stdout and stderr are flushed. A
    thread that is not a daemon still running (Python would wait for it), or a stream
    that cannot be flushed (a closed pipe: Python reports it and exits 120), leaves
    through ``sys.exit`` as before."""
    main = threading.main_thread()
    if any(t is not main and not t.daemon for t in threading.enumerate()):
        sys.exit(code)
    keep_operators_registered()
    atexit._run_exitfuncs()
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except (OSError, ValueError):
        sys.exit(code)
    os._exit(code or 0)


def keep_operators_registered() -> None:
    """Before the process's atexit handlers run: drop torch's unregistering of its
    operator kernels from them. Each ``torch.library.Library`` (torch's own, vLLM's)
    unregisters its kernels in a weakref finalizer that runs at exit, rewriting dispatch
    tables (in a rank forked from a fork server, a copy-on-write page fault per page:
    benchmarks/RESULTS.md, "Launch CPU"). The process then leaves through ``os._exit``,
    so nothing could see the tables again. weakref keeps the live finalizers in a private
    registry (no public accessor); a process without torch, a Python without the registry,
    or a torch without ``_del_library`` leaves the finalizers as they are."""
    torch = sys.modules.get("torch")
    unregister = getattr(getattr(torch, "library", None), "_del_library", None)
    if unregister is None:
        return
    for finalizer, info in list(getattr(weakref.finalize, "_registry", {}).items()):
        if info.func is unregister:
            finalizer.atexit = False


def flush_and_exit(code: int) -> NoReturn:
    """Leave at once, after flushing stdout and stderr as far as they can be: a rank
    process after a failure (finalization can block in a group whose peers are stuck; the
    launcher has the report already) and after its atexit handlers."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)
