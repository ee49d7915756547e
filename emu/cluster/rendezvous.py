"""Where the ranks of a run listen for each other, and who else can reach them.

``emu.cluster.launcher.launch`` starts every rank on this machine, so nothing of a run
needs to be reachable from another one, and nothing is:

* the rendezvous store (torch's ``TCPStore``: no authentication; every rank publishes
  there how its peers reach it) is served by rank 0 from a socket the launcher bound to
  127.0.0.1 (``store_listener``) and handed over with the rank's start; the others
  connect to its port. The host a ``TCPStore`` is given does not limit where it listens
  (it listens on every interface), hence the socket made here. Serving it from a rank
  keeps torch out of the launching process: a ``dyntra-emu`` command that runs its
  ranks as processes never imports it;
* each rank's gloo pair sockets are pinned to the loopback interface
  (``pin_gloo_to_loopback``); by default gloo listens on the address the machine's
  hostname resolves to, which on many hosts is a network address.

Under torchrun (``emu.cluster.rank_process.join_from_env``) the rendezvous is torchrun's:
its store listens where torch puts it (every interface) and the ranks find it at the
user's ``MASTER_ADDR``; ``warn_if_master_addr_exposed`` says so when a run whose ranks
are all on this machine is given a network address (docs/security.md).

Standard library only: the launcher imports it.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
from pathlib import Path

LOOPBACK_HOST = "127.0.0.1"

_IFF_LOOPBACK = 0x8  # linux/if.h
_SYS_NET = Path("/sys/class/net")

logger = logging.getLogger(__name__)


def store_listener() -> socket.socket:
    """The launch's rendezvous socket: bound to 127.0.0.1 at a free port and listening,
    made by the launcher before any rank starts (every rank is given its port) and
    handed to rank 0, which serves the store on it
    (``emu.cluster.rank_process.rank_store``). A peer that connects before rank 0
    serves waits in the socket's backlog."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((LOOPBACK_HOST, 0))
        sock.listen()
    except OSError:
        sock.close()
        raise
    return sock


def pin_gloo_to_loopback() -> None:
    """In a rank of ``launch``, before its process groups are made: gloo, which reads
    ``GLOO_SOCKET_IFNAME`` whenever it makes a group, listens on the loopback interface
    only. A value the user set is replaced: every peer of the rank is on this machine.
    Where no loopback interface is found (systems without Linux's /sys/class/net),
    gloo keeps its default."""
    interface = _loopback_interface()
    if interface is not None:
        os.environ["GLOO_SOCKET_IFNAME"] = interface


def _loopback_interface() -> str | None:
    try:
        names = sorted(p.name for p in _SYS_NET.iterdir())
    except OSError:
        return None
    for name in names:
        try:
            flags = int((_SYS_NET / name / "flags").read_text(), 16)
        except (OSError, ValueError):
            continue
        if flags & _IFF_LOOPBACK:
            return name
    return None


def warn_if_master_addr_exposed(rank: int, world_size: int) -> None:
    """Under torchrun, once per run (rank 0): warn when every rank is on this machine
    (``LOCAL_WORLD_SIZE`` equals ``WORLD_SIZE``) but ``MASTER_ADDR`` is not a loopback
    address: the ranks find each other through a network address although none is on
    another machine."""
    address = os.environ.get("MASTER_ADDR", "")
    if rank != 0 or os.environ.get("LOCAL_WORLD_SIZE") != str(world_size):
        return
    if is_loopback(address):
        return
    logger.warning(
        "warning: MASTER_ADDR=%s is not a loopback address, but all %d ranks of this run "
        "are on this machine: they meet through a network address, at torchrun's "
        "rendezvous store, which has no authentication (and listens on every interface "
        "whatever MASTER_ADDR says). On one machine, dyntra-emu started without torchrun "
        "keeps the rendezvous and gloo on 127.0.0.1 (docs/security.md).",
        address, world_size)


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an IP address or a name) is, or resolves only to, loopback
    addresses; a name that does not resolve is not."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except (socket.gaierror, UnicodeError):
        return False
    return all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)
