"""What the launcher tells a rank process it starts: ``RankSpec``.

Its own module, importing only the standard library, because a spawned rank unpickles
it before anything else (``emu.cluster.rank_boot``), and both sides of a launch read
it: the launcher (``emu.cluster.launcher``) makes one per rank, the rank's boot code
and then its life in ``emu.cluster.rank_process`` use it.
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass


@dataclass(frozen=True)
class RankSpec:
    """What a rank needs from its launcher (picklable without importing torch).
    `parent_pid` is the process the rank is started from (the launcher, or its fork
    server); `environ` is the launcher's environment when it launched, which a forked
    rank takes over (the fork server's own is as old as the server)."""

    rank: int
    dp_size: int
    store_port: int
    device_kind: str
    out_dir: pathlib.Path | None
    collective_timeout_s: float
    parent_pid: int
    stack_path: str
    guard_path: str
    environ: dict[str, str]
