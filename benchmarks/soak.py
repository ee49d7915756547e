"""Soak test: a dp=2 cluster with DyntraLB in static mode for 100,000 steps.

One real cluster run (``emu.run.run_cluster``: one process per rank, real gloo
groups, event and wall logs written as in a normal run) over a long steady workload:
Poisson arrivals at about 90 % of what the ranks can serve, so batches stay nearly full,
requests keep finishing and arriving, and DyntraLB plans on every step. ``max_steps``
ends the run on every rank at the same iteration.

While it runs, a thread of this process samples each rank process from the outside
(psutil on the launcher's children; a rank is recognised by the event log it holds
open) every ``--interval`` seconds: resident memory (RSS), open file descriptors, and
the steps the rank has logged so far. Nothing is added to the ranks. Afterwards:

- RSS of each rank at the start (the first sample after ``--warmup`` steps: imports,
  process groups and the first full batch are behind it) and at the end (the last
  sample), and the growth in percent; the smallest and largest sample in between;
- open file descriptors at the start and at the end;
- steps per second per ``--window`` steps, from rank 0's wall log (the wall time of
  each iteration of its busy loop; the ranks run in lockstep).

Prints a table, writes ``soak.json`` next to the logs, and exits with status 1 when a
rank's RSS grew by 10 % or more (``--max-growth``).

    .venv/bin/python benchmarks/soak.py                  # 100,000 steps, ~5-10 minutes
    .venv/bin/python benchmarks/soak.py --steps 10000    # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import random
import shutil
import sys
import tempfile
import threading
import time

import psutil
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from emu.records.reader import wall_records  # noqa: E402
from emu.run import run_cluster  # noqa: E402
from emu.spec import RunSpec  # noqa: E402
from emu.workload import TraceRequest  # noqa: E402

DP_SIZE = 2
MAX_NUM_SEQS = 16
BLOCK_SIZE = 128
STATIC = {"scheduler_config": {"dyntra_lb_config": {
    "enabled": True, "mode": "static", "start_step": 0}}}
# Virtual step time is about 25 ms at these batch sizes; the trace covers this much per
# step (generously) so that it does not run out before max_steps.
TRACE_S_PER_STEP = 0.040
LOAD = 0.9


def steady_trace(steps: int, dp_size: int, seed: int = 0) -> list[TraceRequest]:
    """Poisson arrivals at LOAD x the service rate: each rank holds up to MAX_NUM_SEQS
    requests, each decodes about 200 tokens (one per ~25 ms step), so a rank serves
    MAX_NUM_SEQS / 200 / 0.025 requests per second. Prompts of 2-24 blocks."""
    rng = random.Random(seed)
    rate = LOAD * dp_size * MAX_NUM_SEQS / 200 / 0.025
    horizon = steps * TRACE_S_PER_STEP
    trace, t, i = [], 0.0, 0
    while t < horizon:
        trace.append(TraceRequest(f"soak-{i:06d}", round(t, 6),
                                  rng.randint(2, 24) * BLOCK_SIZE - rng.randint(0, 64),
                                  rng.randint(100, 300)))
        t += rng.expovariate(rate)
        i += 1
    return trace


class Sampler(threading.Thread):
    """Samples every rank process of this launcher (RSS, fds, and the steps that finished
    requests, from the progress feed) until stopped."""

    _STEP = b'"kind":"step"'

    def __init__(self, out_dir: pathlib.Path, dp_size: int, interval_s: float):
        super().__init__(name="soak-sampler", daemon=True)
        # each rank's progress feed (emu/rank/eventlog.py): a step line for every step
        # that finished requests, written as it happens
        self.logs = [out_dir / f"rank{r}.progress.jsonl" for r in range(dp_size)]
        self.interval_s = interval_s
        self.procs: dict[int, psutil.Process] = {}
        self.offsets = [0] * dp_size
        self.steps = [0] * dp_size
        self.samples: list[dict] = []
        self.start_time = time.monotonic()
        self._stop_event = threading.Event()

    def stop(self) -> None:
        self._stop_event.set()
        self.join()

    def run(self) -> None:
        while not self._stop_event.wait(self.interval_s):
            self.sample()

    def _find_ranks(self) -> None:
        wanted = {str(p): r for r, p in enumerate(self.logs) if r not in self.procs}
        for child in psutil.Process().children(recursive=True):
            try:
                for f in child.open_files():
                    if f.path in wanted:
                        self.procs[wanted[f.path]] = child
            except psutil.Error:
                continue

    def _count_steps(self, rank: int) -> None:
        try:
            with open(self.logs[rank], "rb") as f:
                f.seek(self.offsets[rank])
                chunk = f.read()
        except OSError:
            return
        end = chunk.rfind(b"\n") + 1
        self.offsets[rank] += end
        self.steps[rank] += chunk[:end].count(self._STEP)

    def sample(self) -> None:
        if len(self.procs) < len(self.logs):
            self._find_ranks()
        now = time.monotonic() - self.start_time
        for rank, proc in sorted(self.procs.items()):
            self._count_steps(rank)
            try:
                with proc.oneshot():
                    rss, fds = proc.memory_info().rss, proc.num_fds()
            except psutil.Error:  # the rank has exited
                continue
            self.samples.append({"t": round(now, 3), "rank": rank, "steps": self.steps[rank],
                                 "rss": rss, "fds": fds})


def step_rates(run_dir: pathlib.Path, window: int) -> list[dict]:
    """Steps per second of each full window of ``window`` iterations (rank 0's wall
    table)."""
    rates, total, count, first = [], 0.0, 0, 0
    for record in wall_records(run_dir, 0):
        total += record["step_wall_s"]
        count += 1
        if count == window:
            rates.append({"steps": f"{first}-{first + window - 1}",
                          "steps_per_s": window / total})
            first += window
            total, count = 0.0, 0
    return rates


def summarize(samples: list[dict], dp_size: int, warmup: int) -> list[dict]:
    per_rank = []
    for rank in range(dp_size):
        mine = [s for s in samples if s["rank"] == rank]
        if not mine:
            raise RuntimeError(f"no sample of rank {rank}; was the run too short for "
                               f"--interval?")
        warm = [s for s in mine if s["steps"] >= warmup] or mine
        start, end = warm[0], mine[-1]
        per_rank.append({
            "rank": rank,
            "start_steps": start["steps"], "end_steps": end["steps"],
            "rss_start_mb": start["rss"] / 2**20, "rss_end_mb": end["rss"] / 2**20,
            "rss_first_sample_mb": mine[0]["rss"] / 2**20,
            "rss_min_mb": min(s["rss"] for s in warm) / 2**20,
            "rss_max_mb": max(s["rss"] for s in warm) / 2**20,
            "rss_growth_pct": (end["rss"] - start["rss"]) / start["rss"] * 100,
            "fds_start": start["fds"], "fds_end": end["fds"],
            "fds_max": max(s["fds"] for s in warm),
        })
    return per_rank


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100_000, help="steps per rank")
    parser.add_argument("--interval", type=float, default=1.0,
                        help="seconds between samples (default 1)")
    parser.add_argument("--warmup", type=int, default=1000,
                        help="steps before the start sample (default 1000)")
    parser.add_argument("--window", type=int, default=10_000,
                        help="steps per steps/s window (default 10000)")
    parser.add_argument("--max-growth", type=float, default=10.0,
                        help="fail at this RSS growth in percent (default 10)")
    parser.add_argument("--out", type=pathlib.Path,
                        help="keep the run's files here (default: a temporary directory, "
                             "removed afterwards except soak.json printed)")
    args = parser.parse_args(argv)

    keep = args.out is not None
    out_dir = args.out if keep else pathlib.Path(tempfile.mkdtemp(prefix="dyntra-soak-"))
    trace = steady_trace(args.steps, DP_SIZE)
    spec = RunSpec(trace=trace, dp_size=DP_SIZE, out_dir=out_dir, additional_config=STATIC,
                   max_num_seqs=MAX_NUM_SEQS, block_size=BLOCK_SIZE, num_gpu_blocks=4096,
                   device="cpu", max_steps=args.steps)
    load_before = os.getloadavg()
    print(f"soak: dp={DP_SIZE}, DyntraLB static, {args.steps:,} steps, {len(trace):,} "
          f"requests in the trace; logs in {out_dir}", flush=True)
    sampler = Sampler(out_dir, DP_SIZE, args.interval)
    sampler.start()
    start = time.monotonic()
    try:
        result = run_cluster(spec)
    finally:
        sampler.stop()
    wall_s = time.monotonic() - start
    load_after = os.getloadavg()

    ranks = summarize(sampler.samples, DP_SIZE, args.warmup)
    rates = step_rates(result.out_dir, args.window)
    report = {
        "command": " ".join([pathlib.Path(sys.executable).name, *sys.argv]),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version(), "torch": torch.__version__,
                    "loadavg_before": load_before, "loadavg_after": load_after},
        "steps": [r.steps for r in result.ranks], "truncated": result.truncated,
        "requests_in_trace": len(trace),
        "finished": [r.num_finished for r in result.ranks],
        "virtual_time_s": result.ranks[0].clock_s,
        "wall_s": wall_s, "loop_wall_s": [r.loop_wall_s for r in result.ranks],
        "mean_steps_per_s": result.ranks[0].steps / result.ranks[0].loop_wall_s,
        "ranks": ranks, "steps_per_s": rates, "samples": sampler.samples,
    }
    json_path = (out_dir if keep else pathlib.Path(tempfile.gettempdir())) / "soak.json"
    json_path.write_text(json.dumps(report, indent=1) + "\n")
    if not keep:
        shutil.rmtree(out_dir)

    print(f"\n{result.ranks[0].steps:,} steps per rank in {wall_s:.0f} s wall "
          f"({report['mean_steps_per_s']:.0f} steps/s in the loop), virtual time "
          f"{report['virtual_time_s']:.0f} s, finished requests {report['finished']}; "
          f"load average {load_before[0]:.1f} -> {load_after[0]:.1f}")
    print("\nrank  RSS start (MB)  RSS end (MB)  growth  RSS min/max (MB)  fds start/end")
    for r in ranks:
        print(f"{r['rank']:>4}  {r['rss_start_mb']:>14.1f}  {r['rss_end_mb']:>12.1f}  "
              f"{r['rss_growth_pct']:>+5.1f}%  {r['rss_min_mb']:>7.1f}/{r['rss_max_mb']:<8.1f}"
              f"  {r['fds_start']:>5}/{r['fds_end']}")
    print("\nsteps           steps/s (rank 0 wall log)")
    for w in rates:
        print(f"{w['steps']:<15} {w['steps_per_s']:8.0f}")
    print(f"\nraw numbers: {json_path}")

    bad = [r for r in ranks if r["rss_growth_pct"] >= args.max_growth]
    for r in ranks:
        if r["fds_end"] > r["fds_start"]:
            print(f"warning: rank {r['rank']} holds more file descriptors at the end "
                  f"({r['fds_start']} -> {r['fds_end']})")
    if bad:
        print(f"FAIL: RSS grew by {args.max_growth:g} % or more on rank(s) "
              f"{[r['rank'] for r in bad]}")
        return 1
    print(f"OK: RSS growth below {args.max_growth:g} % on every rank")
    return 0


if __name__ == "__main__":
    sys.exit(main())
