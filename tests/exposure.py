"""What a running ``dyntra-emu run`` exposes to other users and machines, seen from
outside the way ``ss -ltnp`` and ``ls -l`` would: ``watch_run`` starts the CLI in a
subprocess with a private TMPDIR and samples, until it exits, the sockets its processes
(the launcher, multiprocessing's helpers, every rank) listen on, and its scratch files:
everything in that TMPDIR, the launcher's ``/dev/shm/dyntra-emu-launch-<pid>-*`` files,
and any file under /dev/shm or /tmp that one of its processes holds open or mapped.

Used by tests/cli/test_security.py (the kit) and tests/upstream/test_vllm_ascend_security.py
(``--impl vllm-ascend``); docs/security.md names the tests.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import stat
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from tests.held_logs import holds_a_step

LOOPBACK = ("127.0.0.1", "::1")
_SHARED_ROOTS = ("/dev/shm/", "/tmp/")


@dataclass(frozen=True)
class Listener:
    """A socket that accepts connections (TCP, LISTEN) or datagrams (UDP, unconnected)."""

    role: str  # "launcher", "rank", "fork server", "resource tracker", "child"
    pid: int
    protocol: str
    address: str
    port: int


@dataclass(frozen=True)
class Scratch:
    """One scratch path as seen at some sample. ``top`` is the path other users would
    have to get through: the entry directly in TMPDIR, /dev/shm or /tmp."""

    path: str
    top: str
    kind: str  # "dir", "file", "socket", "other"
    mode: int  # permission bits
    uid: int


@dataclass
class Observed:
    returncode: int
    stdout: str
    stderr: str
    samples_under_way: int = 0  # samples taken while a rank's event log was being written
    listeners: set[Listener] = field(default_factory=set)
    scratch: dict[str, Scratch] = field(default_factory=dict)
    left: list[str] = field(default_factory=list)  # scratch still there after the exit
    servers: set[int] = field(default_factory=set)  # fork servers seen at any sample

    def exposed(self) -> list[Listener]:
        return sorted((lst for lst in self.listeners if lst.address not in LOOPBACK),
                      key=lambda lst: (lst.role, lst.pid, lst.port))

    def listening(self, role: str) -> set[int]:
        """The pids of that role seen listening."""
        return {lst.pid for lst in self.listeners if lst.role == role}

    def shared(self) -> list[Scratch]:
        """Scratch whose way in (its top entry) another user could take: not ours, or with
        any group or other permission bit."""
        tops = [s for s in self.scratch.values() if s.path == s.top]
        return sorted((s for s in tops if s.uid != os.getuid() or s.mode & 0o077),
                      key=lambda s: s.path)


def network_interface() -> tuple[str, str] | None:
    """(name, IPv4 address) of an up interface other than loopback, if this machine has
    one: where a test points what must not listen on it anyway."""
    stats = psutil.net_if_stats()
    for name, addresses in sorted(psutil.net_if_addrs().items()):
        for a in addresses:
            if (name in stats and stats[name].isup and a.family == socket.AF_INET
                    and not a.address.startswith("127.")):
                return name, a.address
    return None


def watch_run(argv: list[str], tmp_path: Path, out: Path, env: dict | None = None,
              timeout: float = 300.0) -> Observed:
    """Run ``python -m emu run *argv --out out`` with TMPDIR=tmp_path/tmp and watch it
    until it exits (see the module docstring)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    logs = tmp_path / "watched.stdout", tmp_path / "watched.stderr"
    with open(logs[0], "w") as stdout, open(logs[1], "w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "emu", "run", *map(str, argv), "--out", str(out)],
            stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
            env={**os.environ, **(env or {}), "TMPDIR": str(tmp)})
    observed = Observed(0, "", "")
    deadline = time.monotonic() + timeout
    try:
        while proc.poll() is None:
            assert time.monotonic() < deadline, f"the run did not end within {timeout} s"
            under_way = any(map(holds_a_step, out.glob("rank*.steps")))
            _sample(proc.pid, tmp, tmp_path, observed)
            observed.samples_under_way += under_way and proc.poll() is None
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    # A server forked from a server is known to be one once it has forked: before, in
    # its first moments, it may hold the store socket it is handing rank 0.
    observed.listeners = {dataclasses.replace(lst, role="fork server")
                          if lst.pid in observed.servers else lst
                          for lst in observed.listeners}
    observed.returncode = proc.returncode
    observed.stdout, observed.stderr = logs[0].read_text(), logs[1].read_text()
    observed.left = sorted(p for p in {*_tree(tmp), *_launch_files(proc.pid)}
                           if p != str(tmp))
    return observed


def _sample(launcher_pid: int, tmp: Path, tmp_path: Path, observed: Observed) -> None:
    """One look at the sockets and scratch of the launcher's processes. Files under
    tmp_path (the output directory, the private TMPDIR walked anyway) are not scratch."""
    processes = _processes(launcher_pid)
    observed.servers.update(p.pid for p, role in processes if role == "fork server")
    held: set[str] = set()
    for process, role in processes:
        try:
            connections = process.net_connections("inet")
            held.update(p for p in _held_shared_files(process)
                        if not p.startswith(f"{tmp_path}/"))
        except (psutil.NoSuchProcess, psutil.AccessDenied, FileNotFoundError,
                ProcessLookupError):  # it exited while we looked (/proc/PID/maps: ESRCH)
            continue
        for c in connections:
            tcp = c.type == socket.SOCK_STREAM
            if (c.status == psutil.CONN_LISTEN) if tcp else not c.raddr:
                observed.listeners.add(Listener(role, process.pid, "tcp" if tcp else "udp",
                                                c.laddr.ip, c.laddr.port))
    for path in {*_tree(tmp), *_launch_files(launcher_pid), *held}:
        if path == str(tmp):
            continue
        entry = _scratch(path, tmp)
        if entry is not None:
            observed.scratch[path] = entry


def _processes(launcher_pid: int) -> list[tuple[psutil.Process, str]]:
    """The launcher and its descendants, each with its role. A rank is a child of a
    fork server (whose command line it shares, being its fork), or a spawned child of the
    launcher (the fork server's socket does not fit a long TMPDIR)."""
    try:
        launcher = psutil.Process(launcher_pid)
        descendants = [(p, " ".join(p.cmdline()), p.ppid())
                       for p in launcher.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []
    servers = {p.pid for p, cmdline, parent in descendants
               if parent == launcher_pid and "forkserver" in cmdline}
    # A server's fork that forks processes of its own is a server too (a vllm-ascend
    # tree's, forked from the one that imported vLLM); a rank forks none.
    parents = {parent for _, _, parent in descendants}
    servers |= {p.pid for p, cmdline, parent in descendants
                if parent in servers and "forkserver" in cmdline and p.pid in parents}
    out = [(launcher, "launcher")]
    for process, cmdline, parent in descendants:
        if process.pid in servers:
            role = "fork server"
        elif parent in servers or (parent == launcher_pid and "spawn_main" in cmdline):
            role = "rank"
        elif "resource_tracker" in cmdline:
            role = "resource tracker"
        else:
            role = "child"
        out.append((process, role))
    return out


def _held_shared_files(process: psutil.Process) -> set[str]:
    """Files under /dev/shm or /tmp the process has open or mapped."""
    paths = {f.path for f in process.open_files()}
    with open(f"/proc/{process.pid}/maps") as maps:
        for line in maps:
            parts = line.split(maxsplit=5)
            if len(parts) == 6:
                paths.add(parts[5].strip().removesuffix(" (deleted)"))
    return {p for p in paths if p.startswith(_SHARED_ROOTS)}


def _tree(root: Path) -> list[str]:
    """Every path under root, root included (symbolic links not followed)."""
    paths = []
    for directory, dirs, files in os.walk(root):
        paths.append(directory)
        paths.extend(os.path.join(directory, name) for name in dirs + files)
    return paths


def _launch_files(launcher_pid: int) -> list[str]:
    return [str(p) for p in Path("/dev/shm").glob(f"dyntra-emu-launch-{launcher_pid}-*")]


def _scratch(path: str, tmp: Path) -> Scratch | None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    roots = (str(tmp) + "/", *_SHARED_ROOTS)
    root = next((r for r in roots if path.startswith(r)), None)
    top = path if root is None else root + path[len(root):].split("/", 1)[0]
    kind = ("dir" if stat.S_ISDIR(st.st_mode) else "file" if stat.S_ISREG(st.st_mode)
            else "socket" if stat.S_ISSOCK(st.st_mode) else "other")
    return Scratch(path, top, kind, stat.S_IMODE(st.st_mode), st.st_uid)
