"""The fault matrix: every fault kind of emu/faults.py and every signal to the launcher,
at dp=2 and dp=4, through the real CLI (`python -m emu run`) in a subprocess, measured
from outside the way a CI job would see it.

Per case it records: the exit code; the time from the fault to the launcher's exit; whether
`error.txt` names the failing rank; processes of the case still alive afterwards (every
process started for the case carries an environment marker, so ranks and helpers that
outlive the launcher are found wherever they were reparented); files left in the case's
private TMPDIR and the launcher's `/dev/shm/dyntra-emu-launch-<pid>-*` files; and what the output
directory says about itself (`run.json` state, and whether `emu.metrics.load_run`
refuses it as partial).

Where the fault moment comes from: for a signal, when this script sends it (during
start-up: as soon as every rank process is inside `import torch`; mid-run: once every
rank has written event-log records); for `kill`, when the killed rank's process
disappears; for the other injected faults the moment is inside the ranks, so the time
is counted from when every rank has opened its event log (the engine loops run; the
fault fires within their first steps or virtual seconds).

    .venv/bin/python benchmarks/fault_matrix.py                 # all cases, dp 2 and 4
    .venv/bin/python benchmarks/fault_matrix.py --dp 2 --only kill sigterm-mid

Prints a Markdown table (the one in benchmarks/RESULTS.md) and exits 1 if any case is not
green. Takes a few minutes: each case starts real rank processes (each imports torch).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from emu.metrics import PartialRunError, load_run  # noqa: E402

MARKER = "DYNTRA_FAULT_MATRIX_CASE"
BLOCK_SIZE = 16
VICTIM = "victim"  # the request the KV faults target, pinned to rank 1
COLLECTIVE_TIMEOUT_S = 3.0
SETTLE_S = 5.0  # how long leftovers get to go away after the launcher exited


@dataclass(frozen=True)
class Case:
    name: str
    faults: tuple[str, ...] = ()
    signal: int | None = None
    when: str = ""  # "startup" | "mid" for signals
    long: bool = False  # a trace that never ends (signal cases)
    expect_code: int = 0
    expect_state: str = "complete"
    named_rank: int | None = None  # error.txt must name this rank's failure


def cases() -> list[Case]:
    out = [
        Case("kill", ("kill:rank=1,step=30",), expect_code=1, expect_state="failed",
             named_rank=1),
        Case("slow", ("slow:rank=1,extra_ms=5",)),
        Case("kv_fail", (f"kv_fail:request={VICTIM}",)),
        Case("kv_never", (f"kv_never:request={VICTIM},timeout_s=2",), expect_code=1,
             expect_state="failed", named_rank=1),
        Case("not_ready", (f"not_ready:request={VICTIM},lookups=25",)),
        Case("delay", ("delay:rank=1,site=engine.lockstep,step=20,seconds=60",),
             expect_code=1, expect_state="failed", named_rank=1),
    ]
    for sig, code, state in ((signal.SIGINT, 130, "interrupted"),
                             (signal.SIGTERM, 143, "interrupted"),
                             (signal.SIGKILL, -9, "running")):
        for when in ("startup", "mid"):
            out.append(Case(f"{sig.name.lower()}-{when}", signal=sig, when=when, long=True,
                            expect_code=code, expect_state=state))
    return out


def write_trace(path: Path, dp: int, long: bool) -> Path:
    """A small trace: 4 requests per rank plus VICTIM pinned to rank 1; with `long`, every
    request wants 100,000 tokens (the run is stopped, never ends)."""
    requests = [{"request_id": f"r{i}", "arrival_s": round(0.01 * i, 3),
                 "prompt_tokens": 40 + 90 * (i % 4),
                 "output_tokens": 100_000 if long else 20 + 7 * (i % 5)}
                for i in range(4 * dp)]
    requests.insert(2, {"request_id": VICTIM, "arrival_s": requests[1]["arrival_s"],
                        "prompt_tokens": 200, "output_tokens": 100_000 if long else 30,
                        "rank": 1})
    path.write_text("".join(json.dumps(r) + "\n" for r in requests))
    return path


def case_processes(tag: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get(MARKER) == tag:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return [p for p in found if _alive(p)]


def _alive(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _ranks(launcher: psutil.Process) -> list[psutil.Process]:
    """Spawned rank processes, or the children of the launcher's fork server."""
    out = []
    for c in launcher.children():
        try:
            cmdline = " ".join(c.cmdline())
            if "spawn_main" in cmdline:
                out.append(c)
            elif "multiprocessing.forkserver" in cmdline:
                out.extend(c.children())
        except psutil.Error:
            pass
    return out


def _importing_torch(p: psutil.Process) -> bool:
    try:
        return "/torch/lib/" in Path(f"/proc/{p.pid}/maps").read_text()
    except OSError:
        return False


def _logs_opened(out: Path, dp: int) -> bool:
    """Every rank's engine loop has started (it opens its event log first)."""
    return all((out / f"rank{r}.events.jsonl").exists() for r in range(dp))


def _logs_written(out: Path, dp: int) -> bool:
    """Every rank has written event-log records (they are buffered: some steps in)."""
    return all((out / f"rank{r}.events.jsonl").exists()
               and (out / f"rank{r}.events.jsonl").stat().st_size > 0 for r in range(dp))


def run_case(case: Case, dp: int, work: Path) -> dict:
    tag = f"{case.name}-dp{dp}-{os.getpid()}"
    case_dir = work / f"{case.name}-dp{dp}"
    tmp, out = case_dir / "tmp", case_dir / "out"
    tmp.mkdir(parents=True)
    trace = write_trace(case_dir / "trace.jsonl", dp, case.long)
    command = [sys.executable, "-m", "emu", "run", "--workload", str(trace), "--dp", str(dp),
               "--block-size", str(BLOCK_SIZE), "--num-gpu-blocks", "8192",
               "--max-num-seqs", "4", "--device", "cpu", "--quiet",
               "--run-timeout", "300", "--out", str(out)]
    if case.name == "delay":  # the hang must be found in seconds, not the default 60
        command += ["--collective-timeout", str(COLLECTIVE_TIMEOUT_S)]
    for fault in case.faults:
        command += ["--fault", fault]
    env = {**os.environ, MARKER: tag, "TMPDIR": str(tmp)}
    start = time.monotonic()
    proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=case_dir,
                            start_new_session=True)
    launcher = psutil.Process(proc.pid)
    fault_at = None
    try:
        fault_at = _inject(case, dp, proc, launcher, out)
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            stdout, stderr = proc.communicate()
    end = time.monotonic()
    deadline = end + SETTLE_S
    while (left := case_processes(tag)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for p in left:  # never leave them behind, but count them
        try:
            p.kill()
        except psutil.Error:
            pass
    temp_left = sorted(p.name for p in tmp.iterdir())
    temp_left += sorted(p.name for p in Path("/dev/shm").glob(
        f"dyntra-emu-launch-{proc.pid}-*"))
    return _row(case, dp, proc.returncode, None if fault_at is None else end - fault_at,
                end - start, stderr, out, len(left), temp_left)


def _inject(case: Case, dp: int, proc, launcher, out: Path) -> float | None:
    """Deliver the case's fault; returns its moment (time.monotonic), if seen."""
    deadline = time.monotonic() + 240

    def wait_for(condition):
        while not condition():
            if proc.poll() is not None or time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    if case.signal is not None:
        if case.when == "startup":
            ok = wait_for(lambda: len(r := _ranks(launcher)) == dp
                          and all(_importing_torch(p) for p in r))
        else:
            ok = wait_for(lambda: _logs_written(out, dp))
        if not ok:
            return None
        if case.signal == signal.SIGINT:  # Ctrl-C in a terminal: the whole job
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(case.signal)
        return time.monotonic()
    if case.name == "kill":
        if not wait_for(lambda: len(_ranks(launcher)) == dp):
            return None
        victim = sorted(_ranks(launcher), key=lambda p: p.create_time())[1]
        if not wait_for(lambda: not _alive(victim)):
            return None
        return time.monotonic()
    if not wait_for(lambda: _logs_opened(out, dp)):
        return None
    return time.monotonic()


def _row(case: Case, dp: int, code: int, fault_to_exit, total, stderr: str, out: Path,
         leftover_procs: int, temp_left: list[str]) -> dict:
    error = out / "error.txt"
    report = error.read_text() if error.exists() else ""
    if case.named_rank is not None:
        r = case.named_rank
        section = report.split(f"--- rank {r} ---", 1)[1] if f"--- rank {r} ---" in report \
            else ""
        named = (f"rank {r} failed" in report.splitlines()[0] if report else False) or \
            "_sleep_before_collective" in section.split("--- rank", 1)[0]
        naming = f"rank {r}" if named else "NO"
    elif case.expect_state == "interrupted":
        named = bool(report) and all(f"--- rank {r} ---" in report for r in range(dp))
        naming = "every rank" if named else "NO"
    else:
        named = not report  # nothing failed: no report
        naming = "-" if named else "unexpected"
    try:
        state = json.loads((out / "run.json").read_text())["state"]
    except (OSError, ValueError, KeyError):
        state = "none"
    try:
        load_run(out)
        loaded = "reads"
    except PartialRunError:
        loaded = "refuses (partial)"
    except Exception as exc:  # noqa: BLE001 - recorded in the table
        loaded = f"error: {type(exc).__name__}"
    partial_ok = (loaded == "reads") == (case.expect_state == "complete")
    # A failing rank's report quotes its traceback on purpose; after a signal the
    # launcher's message is one line and no rank may print one (issue 12).
    traceback = case.signal is not None and "Traceback" in stderr
    green = (code == case.expect_code and named and leftover_procs == 0 and not temp_left
             and state == case.expect_state and partial_ok and not traceback)
    return {
        "case": case.name, "dp": dp, "fault": " ".join(case.faults) or
        f"{signal.Signals(case.signal).name} to the launcher, {case.when}",
        "exit": code, "expected_exit": case.expect_code,
        "fault_to_exit_s": fault_to_exit, "total_s": total, "error_txt_names": naming,
        "leftover_processes": leftover_procs, "leftover_temp": temp_left,
        "run_json": state, "load_run": loaded, "signal_traceback": traceback,
        "green": green, "stderr_tail": stderr.strip().splitlines()[-1:] if stderr else [],
    }


def markdown(rows: list[dict]) -> str:
    head = ("| case | dp | fault | exit (expected) | fault→exit s | total s | error.txt names "
            "| leftover procs | leftover temp | run.json | load_run | green |")
    lines = [head, "|" + "---|" * 12]
    for r in rows:
        f2e = "-" if r["fault_to_exit_s"] is None else f"{r['fault_to_exit_s']:.2f}"
        lines.append(
            f"| {r['case']} | {r['dp']} | `{r['fault']}` | {r['exit']} ({r['expected_exit']}) "
            f"| {f2e} | {r['total_s']:.1f} | {r['error_txt_names']} "
            f"| {r['leftover_processes']} | {len(r['leftover_temp'])} | {r['run_json']} "
            f"| {r['load_run']} | {'yes' if r['green'] else '**NO**'} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dp", type=int, nargs="+", default=[2, 4], choices=[2, 4])
    parser.add_argument("--only", nargs="+", metavar="CASE",
                        help="run only these cases: " + ", ".join(c.name for c in cases()))
    parser.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    args = parser.parse_args(argv)
    selected = [c for c in cases() if not args.only or c.name in args.only]
    rows = []
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fault-matrix-") as work:
        for dp in args.dp:
            for case in selected:
                row = run_case(case, dp, Path(work))
                rows.append(row)
                print(f"{row['case']:>14} dp={dp}: exit {row['exit']}, "
                      f"{'green' if row['green'] else 'NOT GREEN ' + str(row)}",
                      file=sys.stderr, flush=True)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}; {len(rows)} cases in "
          f"{time.monotonic() - began:.0f} s\n")
    print(markdown(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0 if all(r["green"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
