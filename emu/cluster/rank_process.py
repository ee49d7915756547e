"""A rank process's life once it has booted: its process groups, the target, the report
to the launcher, the teardown; and `join_from_env`, the same for one rank under torchrun.

`emu.cluster.launcher.launch` starts each rank with `emu.cluster.rank_boot.main`, which
ties the rank to its parent and then calls `rank_main` here; the launcher itself (the
parent side) never runs this module's code. Under torchrun each process calls
`join_from_env` instead.

In each rank: one intra-op and one inter-op thread, the default process group (gloo,
CPU tensors) is the DP group that carries wave sync and the DyntraLB collectives, and a
second group made with `new_group` is the device group for the lockstep "model"
collective (gloo on CPU, HCCL on NPU). Both use the configured collective timeout.
"""

from __future__ import annotations

import atexit
import faulthandler
import gc
import os
import pathlib
import pickle
import signal
import socket
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

from emu.cluster.device import bind_rank_device, check_kind
from emu.cluster.rank_spec import RankSpec
from emu.cluster.rendezvous import (
    LOOPBACK_HOST,
    pin_gloo_to_loopback,
    warn_if_master_addr_exposed,
)
from emu.process_exit import flush_and_exit, keep_operators_registered
from emu.rank.context import RankContext
from emu.rank.recorder import GuardSlot


def _limit_threads() -> None:
    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already fixed by an earlier parallel region; harmless
        pass


def _make_groups(kind: str, local_rank: int, timeout: timedelta, **init_kwargs):
    """Pin the rank to its device, then make the default process group (gloo: the DP
    group) and the device group; returns (torch device, DP group, device group)."""
    device_str, device_backend = bind_rank_device(kind, local_rank)
    dist.init_process_group("gloo", timeout=timeout, **init_kwargs)
    device_group = dist.new_group(backend=device_backend, timeout=timeout)
    return torch.device(device_str), dist.group.WORLD, device_group


def _in_torch_distributed(exc: BaseException) -> bool:
    """True when the exception was raised inside a torch.distributed call, which is how a
    rank sees a dead or stuck peer (gloo raises a plain RuntimeError)."""
    frames = traceback.extract_tb(exc.__traceback__)
    dist_dir = os.path.dirname(dist.__file__)
    return bool(frames) and frames[-1].filename.startswith(dist_dir)


def rank_store(port: int, timeout: timedelta, listener: socket.socket | None
               ) -> dist.TCPStore:
    """A launch's rendezvous store as one rank sees it: rank 0 serves it on ``listener``,
    the socket the launcher bound to 127.0.0.1 at ``port`` (`emu.cluster.rendezvous`);
    every other rank (no ``listener``) is a client of it."""
    if listener is None:
        return dist.TCPStore(LOOPBACK_HOST, port, is_master=False, timeout=timeout)
    return dist.TCPStore(LOOPBACK_HOST, port, is_master=True, wait_for_workers=False,
                         master_listen_fd=listener.detach(), timeout=timeout)


def rank_main(spec: RankSpec, payload: bytes, conn, store_listener: socket.socket | None
              ) -> None:
    """Called by `emu.cluster.rank_boot.main` in a new rank of `launch` (already tied to
    its parent):
    set up, run the target, report to the parent, then wait for the parent's go-ahead
    (every rank finished) before tearing the groups down."""
    stack_file = open(spec.stack_path, "w")  # noqa: SIM115 - kept open for faulthandler
    faulthandler.enable(stack_file, all_threads=True)
    # SIGTERM from the launcher: write the Python stack, then die of SIGTERM.
    faulthandler.register(signal.SIGTERM, stack_file, all_threads=True, chain=True)
    try:
        _limit_threads()
        target, args = pickle.loads(payload)
        pin_gloo_to_loopback()
        timeout = timedelta(seconds=spec.collective_timeout_s)
        device, dp_group, device_group = _make_groups(
            spec.device_kind, spec.rank, timeout,
            store=rank_store(spec.store_port, timeout, store_listener),
            rank=spec.rank, world_size=spec.dp_size,
        )
        ctx = RankContext(spec.rank, spec.dp_size, spec.rank, dp_group, device_group, device,
                          spec.out_dir, GuardSlot.attach(spec.guard_path, spec.rank))
        result = target(ctx, args)
        conn.send(("ok", result))
    except BaseException as exc:
        # Once failing, finish the report even if the launcher's SIGTERM arrives meanwhile
        # (it does when another rank failed first); SIGKILL still ends a stuck send. One
        # call replaces the stack dump by "ignore": unregistering the dump first would
        # leave a moment in which SIGTERM kills the rank with neither stack nor report.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        summary = traceback.format_exception_only(type(exc), exc)[-1].strip()
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        try:
            conn.send(("error", summary, text, _in_torch_distributed(exc)))
        finally:
            flush_and_exit(1)
    try:
        conn.recv()
    except EOFError:  # the parent is gone; PDEATHSIG normally got here first
        flush_and_exit(1)
    dist.destroy_process_group()
    # atexit handlers (logging.shutdown among them) yes, interpreter finalization no:
    # with torch loaded it is a large share of a short rank's CPU, spent on a process
    # about to vanish (benchmarks/RESULTS.md, "Start-up and teardown costs").
    keep_operators_registered()
    atexit._run_exitfuncs()
    flush_and_exit(0)


def _env_int(name: str) -> int:
    value = os.environ.get(name)
    if value is None:
        raise RuntimeError(f"join_from_env needs the {name} environment variable (torchrun "
                           "sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT)")
    try:
        return int(value)
    except ValueError:
        raise RuntimeError(f"environment variable {name} must be an int; got {value!r}") \
            from None


def join_from_env(target, args, *, device: str = "cpu",
                  out_dir: pathlib.Path | str | None = None,
                  collective_timeout_s: float = 60.0):
    """Run this process as one rank of a cluster started by torchrun; returns this rank's
    `target(ctx, args)`. ``device``: the kind the device group uses, "cpu" or "npu"
    (`emu.cluster.device.select_device` chose it for this machine's LOCAL_WORLD_SIZE
    ranks). Failures propagate as exceptions and torchrun stops the others.
    Where the rendezvous and gloo listen is torchrun's and the user's choice (MASTER_ADDR,
    GLOO_SOCKET_IFNAME), not pinned to loopback as under `launch`: rank 0 warns when a
    run on one machine is given a network MASTER_ADDR (emu.cluster.rendezvous)."""
    rank, world_size, local_rank = (_env_int(n) for n in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        if name not in os.environ:
            raise RuntimeError(f"join_from_env needs the {name} environment variable")
    warn_if_master_addr_exposed(rank, world_size)
    check_kind(device)
    if out_dir is not None:
        out_dir = pathlib.Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
    _limit_threads()
    torch_device, dp_group, device_group = _make_groups(
        device, local_rank, timedelta(seconds=collective_timeout_s),
        init_method="env://", rank=rank, world_size=world_size)
    ctx = RankContext(rank, world_size, local_rank, dp_group, device_group, torch_device,
                      out_dir)
    try:
        result = target(ctx, args)
        dist.barrier(group=dp_group)  # no rank closes its connections while peers still use them
    finally:
        dist.destroy_process_group()
    del ctx, dp_group, device_group
    _end_group_threads()
    return result


def _end_group_threads() -> None:
    """Under torchrun, after ``destroy_process_group``: make the groups go now.

    ``destroy_process_group`` only unregisters the groups; each one, with its gloo
    threads (a socket loop per group, worker loops), lives until its last reference
    goes, and the target's objects hold references in reference cycles (the engine and
    its collective recorder point at each other), which only the cyclic garbage
    collector frees. Left alone, those threads can still be running when the process
    exits (if the collector has not run since) and go on handling the peers' sockets
    through interpreter finalization and C++ static destruction, which can end the
    process with SIGABRT (``std::terminate``) after a successful run. A collection here
    destroys the groups, which joins their threads, while the process is healthy. (Rank
    processes of ``launch`` leave through ``os._exit`` instead.)"""
    gc.collect()
