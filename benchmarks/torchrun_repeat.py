"""`dyntra-emu run` under torchrun, many times in a row under CPU load: what
`tests/cli/test_cli_run.py::test_run_under_torchrun` runs once (torchrun
--standalone, two ranks, the CLI tests' tiny trace), repeated `--runs` times while
`--busy` Python processes spin on the CPU. A run counts as clean when torchrun exits 0
and rank 0 wrote metrics.json for every request; for any other run the tail of its
output is printed (a rank dying at exit shows up as torchrun's "exitcode: -6").

    .venv/bin/python benchmarks/torchrun_repeat.py                  # 50 runs, 2 busy loops
    .venv/bin/python benchmarks/torchrun_repeat.py --runs 20 --busy 4

Exits 1 unless every run was clean.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BUSY = "while True: pass"


def tiny_trace(path: Path) -> Path:
    """The CLI tests' ten requests of uneven size arriving within 0.1 s."""
    path.write_text("".join(
        json.dumps({"request_id": f"req-{i}", "arrival_s": round(0.01 * i, 3),
                    "prompt_tokens": 40 + 150 * (i % 3), "output_tokens": 8 + 9 * (i % 4)})
        + "\n" for i in range(10)))
    return path


def run_once(torchrun: Path, trace: Path, out: Path) -> tuple[bool, float, str]:
    """(clean, seconds, output tail) of one run."""
    command = [str(torchrun), "--standalone", "--nproc-per-node", "2", "-m", "emu", "run",
               "--workload", str(trace), "--block-size", "16", "--num-gpu-blocks", "512",
               "--max-num-seqs", "4", "--device", "cpu", "--quiet", "--out", str(out)]
    start = time.monotonic()
    proc = subprocess.run(command, cwd=out.parent, capture_output=True, text=True,
                          timeout=600, stdin=subprocess.DEVNULL)
    seconds = time.monotonic() - start
    try:
        finished = json.loads((out / "metrics.json").read_text())["requests_finished"]
    except (OSError, ValueError, KeyError):
        finished = None
    clean = proc.returncode == 0 and finished == 10
    tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-25:])
    return clean, seconds, f"exit {proc.returncode}, requests finished {finished}\n{tail}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--busy", type=int, default=2, help="busy Python loops meanwhile")
    args = parser.parse_args(argv)
    torchrun = Path(sys.executable).with_name("torchrun")
    busy = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(args.busy)]
    seconds, failures = [], 0
    try:
        with tempfile.TemporaryDirectory(prefix="torchrun-repeat-") as tmp:
            trace = tiny_trace(Path(tmp) / "tiny.jsonl")
            for i in range(args.runs):
                clean, took, tail = run_once(torchrun, trace, Path(tmp) / f"run{i}")
                seconds.append(took)
                failures += not clean
                print(f"run {i + 1}/{args.runs}: {'clean' if clean else 'FAILED'} "
                      f"({took:.1f} s)", file=sys.stderr, flush=True)
                if not clean:
                    print(tail, file=sys.stderr, flush=True)
    finally:
        for p in busy:
            p.kill()
            p.wait()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.1f} at the end; {args.busy} busy loops")
    print(f"{args.runs - failures} of {args.runs} runs clean; median "
          f"{statistics.median(seconds):.1f} s per run")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
