"""Latency of DyntraLB's two collectives over gloo on this machine, at DP sizes 2-64:
the data behind the collective terms of the control-plane cost (docs/cost-models.md,
"DyntraLB's control plane").

Each DP size runs as that many processes (forked from this one after ``import torch``)
in one gloo group on the loopback interface, as the emulator's rank processes are. Per
rank, for each collective, ``--iters`` calls back to back after ``--warmup`` untimed
ones; one sample is a call's wall time, and the figure reported is, per call, the
slowest rank's time (a step waits for the last rank), then the median over the calls.
The collectives are those of ``dyntra_lb.coordinator`` with production's shapes:

- ``all_reduce_max``: the dynamic-mode flag, int32[2] (8 bytes);
- ``all_gather``: the snapshot, int32[2 * max_num_seqs + 2] per rank, for each
  ``--max-num-seqs``.

A machine with fewer cores than ranks runs the ranks in turn, so above the core count
the figures include the operating system's scheduling of the ranks, which a decode
host with a core per rank does not pay; the script prints the core count next to the
table for that reason. The per-peer step of a ring collective is therefore measured on
its own first (``hop``): half the round trip of one snapshot-sized message (136 bytes)
between two processes over a loopback TCP socket with Nagle off, the transport gloo
uses, which two cores run without taking turns. gloo's all-gather passes each rank's
payload ``dp - 1`` hops around the ring, so this is the per-peer term's estimate.

    .venv/bin/python benchmarks/collective_bench.py                  # dp 2 4 8 16 32 64
    .venv/bin/python benchmarks/collective_bench.py --dp 2 4 --iters 200 --json out.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import socket
import statistics
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from emu.cluster.rank_process import rank_store
from emu.cluster.rendezvous import LOOPBACK_HOST, pin_gloo_to_loopback, store_listener

_HOP_BYTES = 136  # the all-gather payload at max_num_seqs 16: int32[34]


def _rank(rank: int, dp: int, port: int, sizes: list[int], warmup: int, iters: int,
          out) -> None:
    """One rank: join the group, time every collective, send the samples to rank 0's
    parent through ``out`` (rank 0 only sends the gathered samples)."""
    pin_gloo_to_loopback()
    store = dist.TCPStore(LOOPBACK_HOST, port, is_master=False,
                          timeout=timedelta(seconds=300))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=dp,
                            timeout=timedelta(seconds=300))
    cases = [("all_reduce_max", 2, _all_reduce(torch.zeros(2, dtype=torch.int32)))]
    for mns in sizes:
        length = 2 * mns + 2
        send = torch.zeros(length, dtype=torch.int32)
        recv = [torch.zeros(length, dtype=torch.int32) for _ in range(dp)]
        cases.append((f"all_gather mns={mns}", length, _all_gather(recv, send)))
    samples = {}
    for name, _, fn in cases:
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(iters):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        samples[name] = times
    gathered = [None] * dp if rank == 0 else None
    dist.gather_object(samples, gathered, dst=0)
    if rank == 0:
        out.send(gathered)
    dist.destroy_process_group()


def _all_reduce(tensor):
    return lambda: dist.all_reduce(tensor, op=dist.ReduceOp.MAX)


def _all_gather(recv, send):
    return lambda: dist.all_gather(recv, send)


def _echo(port: int) -> None:
    with socket.create_connection((LOOPBACK_HOST, port)) as peer:
        peer.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while data := peer.recv(_HOP_BYTES):
            peer.sendall(data)


def hop_us(iters: int, warmup: int) -> float:
    """Median half round trip of a 136-byte message to an echoing process (us)."""
    with socket.socket() as server:
        server.bind((LOOPBACK_HOST, 0))
        server.listen(1)
        echo = multiprocessing.get_context("fork").Process(
            target=_echo, args=(server.getsockname()[1],))
        echo.start()
        peer, _ = server.accept()
    with peer:
        peer.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        message, times = b"x" * _HOP_BYTES, []
        for _ in range(warmup + iters):
            start = time.perf_counter()
            peer.sendall(message)
            received = 0
            while received < _HOP_BYTES:
                received += len(peer.recv(_HOP_BYTES - received))
            times.append(time.perf_counter() - start)
    echo.join()
    return statistics.median(times[warmup:]) / 2 * 1e6


def measure(dp: int, sizes: list[int], warmup: int, iters: int) -> dict[str, float]:
    """Median over calls of the slowest rank's time, in microseconds, per collective."""
    context = multiprocessing.get_context("fork")
    listener = store_listener()
    port = listener.getsockname()[1]
    _store = rank_store(port, timedelta(seconds=300), listener)  # serves the ranks' rendezvous
    receive, send = context.Pipe(duplex=False)
    ranks = [context.Process(target=_rank, args=(r, dp, port, sizes, warmup, iters,
                                                 send)) for r in range(dp)]
    for process in ranks:
        process.start()
    gathered = receive.recv()
    for process in ranks:
        process.join()
        if process.exitcode != 0:
            raise RuntimeError(f"dp {dp}: a rank exited with {process.exitcode}")
    result = {}
    for name in gathered[0]:
        slowest = [max(column) for column in zip(*(g[name] for g in gathered), strict=True)]
        result[name] = statistics.median(slowest) * 1e6
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dp", type=int, nargs="+", default=[2, 4, 8, 16, 32, 64])
    parser.add_argument("--max-num-seqs", type=int, nargs="+", default=[16, 128, 256],
                        help="all-gather payloads: int32[2 * N + 2] per rank")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--json", metavar="FILE", help="also write the table here")
    args = parser.parse_args(argv)
    print(f"gloo collective latency: python {platform.python_version()}, torch "
          f"{torch.__version__}, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f}; {args.iters} calls after {args.warmup} warm-up, "
          "median of the slowest rank's time per call (us)")
    hop = hop_us(10 * args.iters, args.warmup)
    print(f"  hop (loopback TCP, {_HOP_BYTES} B, half round trip): {hop:.1f} us", flush=True)
    rows = []
    for dp in args.dp:
        started = time.monotonic()
        result = measure(dp, args.max_num_seqs, args.warmup, args.iters)
        for name, us in result.items():
            op, _, mns = name.partition(" mns=")
            bytes_per_rank = 8 if op == "all_reduce_max" else 4 * (2 * int(mns) + 2)
            rows.append({"dp": dp, "op": op, "bytes_per_rank": bytes_per_rank,
                         "median_us": us})
            print(f"  dp {dp:>3}  {name:<22} {bytes_per_rank:>6} B/rank  {us:>10.1f} us",
                  flush=True)
        print(f"  (dp {dp}: {time.monotonic() - started:.0f} s wall, load average "
              f"{os.getloadavg()[0]:.1f})", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpus": os.cpu_count(), "hop_us": hop, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
