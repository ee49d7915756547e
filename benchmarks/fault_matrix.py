"""The fault matrix: every fault kind of emu/faults.py and every signal to the launcher,
on every path a run can take — the kit and vllm-ascend's DyntraLB (`--impl`), each on rank
processes and on the thread transport (`--transport`), and under torchrun — at dp=2 and
dp=4, through the real CLI (`python -m emu run`, or `torchrun ... -m emu run`) in a
subprocess, measured from outside the way a CI job would see it.

A path the CLI refuses is one row with its message: the matrix runs whatever the CLI
accepts, so it covers that path the day the CLI takes it. Under torchrun the matrix runs
the faults inside the ranks; signals go to torchrun, which owns the rank processes and
their handling, so they are not run there.

Per case it records: the exit code; the time from the fault to the launcher's exit; whether
the failing rank is named (in `error.txt`; under torchrun, in torchrun's failure report);
processes of the case still alive afterwards (every process started for the case carries
an environment marker, so ranks and helpers that outlive the launcher are found wherever
they were reparented); files left in the case's private TMPDIR and the launcher's
`/dev/shm/dyntra-emu-launch-<pid>-*` files; and what the output directory says about
itself (`run.json` state, and whether `emu.metrics.load_run` refuses it as partial).

Where the fault moment comes from: for a signal, when this script sends it (during
start-up: rank processes as soon as every one is inside `import torch`, rank threads as
soon as `run.json` exists, which can be before they start, then the CLI says no cluster
was running and there is no rank to report on; mid-run: once every rank has sealed a
part of its step records); for `kill` of a rank process, when it disappears; for the other
injected faults (and `kill` of a rank thread) the moment is inside the ranks, so the time
is counted from when every rank has opened its event log (the engine loops run; the fault
fires within their first steps or virtual seconds).

    .venv-upstream/bin/python benchmarks/fault_matrix.py                # every path, dp 2 and 4
    .venv/bin/python benchmarks/fault_matrix.py --impl kit --dp 2 --only kill sigterm-mid
    .venv-upstream/bin/python benchmarks/fault_matrix.py --impl vllm-ascend --transport process

The vllm-ascend paths need vLLM (the `.venv-upstream` environment) and a vllm-ascend tree
(`--vllm-ascend`, default `$DYNTRA_VLLM_ASCEND` or `../shared/upstream/vllm-ascend`).
Prints a Markdown table (benchmarks/RESULTS.md sums up the latest run; HISTORY.md has
every row of an earlier one) and exits 1 if any case that ran is not green. Takes long:
each case starts real ranks (each imports torch; a vllm-ascend rank imports vLLM too).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
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
SETTLE_S = 5.0  # how long leftovers get to go away after the launcher exited
# What `import vllm` makes in TMPDIR: torch's compile cache, one per user, created on the
# first import (torch._dynamo) and reused by every later process; not a scratch file of
# the run, so it is listed apart (every case here has a fresh TMPDIR, so it shows up).
TORCH_CACHE = "torchinductor_"
IMPLS = ("kit", "vllm-ascend")
TRANSPORTS = ("process", "thread", "torchrun")


@dataclass(frozen=True)
class RunPath:
    """One way a run executes: an impl on a transport ("torchrun": torchrun starts one
    process per rank, each running the CLI)."""

    impl: str
    transport: str

    @property
    def name(self) -> str:
        return f"{self.impl}, {self.transport}"


@dataclass(frozen=True)
class Case:
    name: str
    faults: tuple[str, ...] = ()
    signal: int | None = None
    when: str = ""  # "startup" | "mid" for signals
    long: bool = False  # a trace that never ends (signal cases)
    expect_code: int = 0
    expect_state: tuple[str, ...] = ("complete",)  # run.json's state, any of these
    named_rank: int | None = None  # the failing rank the report must name
    named_peer_of: int | None = None  # or a rank that waited for this one (torchrun)
    collective_timeout_s: float | None = None  # None: the CLI's default


def cases(path: RunPath) -> list[Case]:
    """The cases of a path: the faults inside the ranks everywhere, the signals to the
    launcher except under torchrun. Under torchrun a hang is found by the collective
    timeout of the ranks that wait for the stuck one (there is no watchdog), so one of
    them is named, whichever failed first; and when rank 1 fails, rank 0 (which writes
    run.json) either fails too or is stopped by torchrun first (run.json
    "interrupted"), whichever comes first.

    The hang of `delay` must be found in seconds, not the default 60: 3 s for the kit.
    A vllm-ascend rank imports vLLM after its groups are up (seconds of CPU each, more
    when ranks share cores: benchmarks/RESULTS.md, "Start-up and teardown costs"), so a
    peer's first collective can wait that long for it: its paths get 30 s (and a longer
    delay), above that start-up skew."""
    torchrun = path.transport == "torchrun"
    peer_failed = ("failed", "interrupted") if torchrun else ("failed",)
    timeout, delay = (30.0, 120) if path.impl == "vllm-ascend" else (3.0, 60)
    out = [
        Case("kill", ("kill:rank=1,step=30",), expect_code=1, expect_state=peer_failed,
             named_rank=1),
        Case("slow", ("slow:rank=1,extra_ms=5",)),
        Case("kv_fail", (f"kv_fail:request={VICTIM}",)),
        Case("kv_never", (f"kv_never:request={VICTIM},timeout_s=2",), expect_code=1,
             expect_state=peer_failed, named_rank=1),
        Case("not_ready", (f"not_ready:request={VICTIM},lookups=25",)),
        Case("delay", (f"delay:rank=1,site=engine.lockstep,step=20,seconds={delay}",),
             expect_code=1, expect_state=("failed",), named_rank=None if torchrun else 1,
             named_peer_of=1 if torchrun else None,
             collective_timeout_s=timeout),
    ]
    if torchrun:
        return out
    for sig, code, state in ((signal.SIGINT, 130, "interrupted"),
                             (signal.SIGTERM, 143, "interrupted"),
                             (signal.SIGKILL, -9, "running")):
        for when in ("startup", "mid"):
            out.append(Case(f"{sig.name.lower()}-{when}", signal=sig, when=when, long=True,
                            expect_code=code, expect_state=(state,)))
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


def _ranks(path: RunPath, launcher: psutil.Process) -> list[psutil.Process]:
    """The rank processes: the launcher's spawned children or the children of its fork
    server (or of the server that server forked); torchrun's workers; none for rank
    threads."""
    out = []
    for c in launcher.children():
        try:
            cmdline = " ".join(c.cmdline())
            if path.transport == "torchrun":
                # A worker once it runs: a child torchrun has forked but not yet exec'd
                # shows torchrun's own command line and environment (no RANK).
                if "emu" in c.cmdline() and "RANK" in c.environ():
                    out.append(c)
            elif "spawn_main" in cmdline:
                out.append(c)
            elif "multiprocessing.forkserver" in cmdline:
                for child in c.children():
                    # A server forked from the server (a vllm-ascend tree's) forks the
                    # ranks; until it has, it is no rank either.
                    grandchildren = child.children()
                    out.extend(grandchildren if grandchildren or _forks_servers(c) else
                               [child])
        except psutil.Error:
            pass
    return out


def _forks_servers(server: psutil.Process) -> bool:
    """Whether a fork server's children are servers: some child has children of its own."""
    return any(child.children() for child in server.children())


def _rank_process(path: RunPath, ranks: list[psutil.Process], rank: int) -> psutil.Process:
    """The process of `rank`: under torchrun the one whose RANK it is, else the rank-th
    started (the launcher starts them in rank order)."""
    if path.transport == "torchrun":
        return next(p for p in ranks if p.environ().get("RANK") == str(rank))
    return sorted(ranks, key=lambda p: p.create_time())[rank]


def _importing_torch(p: psutil.Process) -> bool:
    try:
        return "/torch/lib/" in Path(f"/proc/{p.pid}/maps").read_text()
    except OSError:
        return False


def _logs_opened(out: Path, dp: int) -> bool:
    """Every rank's engine loop has started (it opens its step records first)."""
    return all((out / f"rank{r}.steps").exists() for r in range(dp))


def _logs_written(out: Path, dp: int) -> bool:
    """Every rank has sealed a part of its step records (a batch of steps in). Not its
    progress feed: that gets a line when a request finishes, and the mid-run signals'
    trace asks 100,000 tokens of every request, so no rank writes one before the signal
    (the signal was then never sent, and each such case ran into its run timeout)."""
    return all(any((out / f"rank{r}.steps").glob("part-*.parquet")) for r in range(dp))


def command(path: RunPath, case: Case, dp: int, trace: Path, out: Path,
            tree: str) -> list[str]:
    """The case's command line: the CLI, or torchrun starting it once per rank (its
    worker logs go next to the output: by default torchrun keeps them in a
    `torchelastic_*` directory of TMPDIR, which it does not remove)."""
    flags = ["--workload", str(trace), "--block-size", str(BLOCK_SIZE),
             "--num-gpu-blocks", "8192", "--max-num-seqs", "4", "--device", "cpu", "--quiet",
             "--run-timeout", "300", "--out", str(out), "--impl", path.impl]
    if path.impl == "vllm-ascend":
        flags += ["--vllm-ascend", tree]
    if path.transport == "thread":
        flags += ["--transport", "thread"]
    if case.collective_timeout_s is not None:
        flags += ["--collective-timeout", str(case.collective_timeout_s)]
    for fault in case.faults:
        flags += ["--fault", fault]
    if path.transport == "torchrun":
        torchrun = Path(sys.executable).with_name("torchrun")
        return [str(torchrun), "--standalone", "--nproc-per-node", str(dp),
                "--log-dir", str(out.parent / "torchrun-logs"), "-m", "emu", "run", *flags]
    return [sys.executable, "-m", "emu", "run", "--dp", str(dp), *flags]


def run_case(path: RunPath, case: Case, dp: int, work: Path, tree: str) -> dict:
    tag = f"{path.impl}-{path.transport}-{case.name}-dp{dp}-{os.getpid()}"
    case_dir = work / tag
    tmp, out = case_dir / "tmp", case_dir / "out"
    tmp.mkdir(parents=True)
    trace = write_trace(case_dir / "trace.jsonl", dp, case.long)
    env = {**os.environ, MARKER: tag, "TMPDIR": str(tmp)}
    start = time.monotonic()
    proc = subprocess.Popen(command(path, case, dp, trace, out, tree),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=case_dir,
                            start_new_session=True)
    launcher = psutil.Process(proc.pid)
    fault_at = None
    try:
        fault_at = _inject(path, case, dp, proc, launcher, out)
        stdout, stderr = proc.communicate(timeout=600)
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
    refused = _refusal(proc.returncode, stderr, out)
    if refused is not None:
        return {"path": path.name, "case": case.name, "dp": dp, "refused": refused,
                "green": True}
    caches = sorted(p.name for p in tmp.iterdir() if p.name.startswith(TORCH_CACHE))
    temp_left = [_entry(p) for p in sorted(tmp.iterdir()) if p.name not in caches]
    temp_left += [_entry(p) for p in sorted(Path("/dev/shm").glob(
        f"dyntra-emu-launch-{proc.pid}-*"))]
    row = _row(path, case, dp, proc.returncode,
               None if fault_at is None else end - fault_at, end - start, stderr, out,
               len(left), temp_left)
    return {**row, "torch_cache": caches}


def _entry(path: Path) -> str:
    """A leftover, with what a directory holds (whose it is shows there)."""
    if path.is_dir():
        return f"{path.name}/{sorted(p.name for p in path.iterdir())}"
    return path.name


def _refusal(code: int, stderr: str, out: Path) -> str | None:
    """The CLI's message when it refused the command before starting anything (a usage
    error: exit 2, nothing written), else None."""
    if code != 2 or (out / "run.json").exists():
        return None
    lines = [ln for ln in stderr.strip().splitlines() if ln.startswith("dyntra-emu run: ")]
    return lines[-1] if lines else None


def _inject(path: RunPath, case: Case, dp: int, proc, launcher, out: Path) -> float | None:
    """Deliver the case's fault; returns its moment (time.monotonic), if seen."""
    deadline = time.monotonic() + 300

    def wait_for(condition):
        while not condition():
            if proc.poll() is not None or time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    threads = path.transport == "thread"
    if case.signal is not None:
        if case.when == "startup" and threads:
            ok = wait_for(lambda: (out / "run.json").exists())
        elif case.when == "startup":
            ok = wait_for(lambda: len(r := _ranks(path, launcher)) == dp
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
    if case.name == "kill" and not threads:
        if not wait_for(lambda: len(_ranks(path, launcher)) == dp):
            return None
        victim = _rank_process(path, _ranks(path, launcher), 1)
        if not wait_for(lambda: not _alive(victim)):
            return None
        return time.monotonic()
    if not wait_for(lambda: _logs_opened(out, dp)):
        return None
    return time.monotonic()


def _named(path: RunPath, case: Case, dp: int, stderr: str, out: Path) -> tuple[bool, str]:
    """Whether the report names what it should, and what the table says about it: the
    failing rank (error.txt's first line or the stack of the rank stuck before its
    collective; under torchrun, torchrun's "Root Cause" entry), every rank after a
    signal, nothing when nothing failed."""
    error = out / "error.txt"
    report = error.read_text() if error.exists() else ""
    if path.transport == "torchrun" and case.expect_code != 0:
        root = re.search(r"Root Cause \(first observed failure\):.*?\brank\s*:\s*(\d+)",
                         stderr, re.S)
        r = int(root.group(1)) if root else None
        named = r is not None and (r == case.named_rank if case.named_rank is not None
                                   else r != case.named_peer_of)
        return named, (f"rank {r} (torchrun)" if named else "NO")
    if case.named_rank is not None:
        r = case.named_rank
        section = report.split(f"--- rank {r} ---", 1)[1] if f"--- rank {r} ---" in report \
            else ""
        named = (f"rank {r} failed" in report.splitlines()[0] if report else False) or \
            "_sleep_before_collective" in section.split("--- rank", 1)[0]
        return named, (f"rank {r}" if named else "NO")
    if case.expect_state == ("interrupted",):
        if (path.transport == "thread" and case.when == "startup" and not report.count(
                "--- rank") and ("no cluster was running" in stderr
                                 or "no rank had started yet" in stderr)):
            # Rank threads start within milliseconds of run.json: the signal can come
            # before them, and then there is no rank to report on.
            return True, "no rank yet"
        named = bool(report) and all(f"--- rank {r} ---" in report for r in range(dp))
        return named, ("every rank" if named else "NO")
    return not report, ("-" if not report else "unexpected")  # nothing failed: no report


def _row(path: RunPath, case: Case, dp: int, code: int, fault_to_exit, total, stderr: str,
         out: Path, leftover_procs: int, temp_left: list[str]) -> dict:
    named, naming = _named(path, case, dp, stderr, out)
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
    partial_ok = (loaded == "reads") == (case.expect_state == ("complete",))
    # A failing rank's report quotes its traceback on purpose; after a signal the
    # launcher's message is one line and no rank may print one (issue 12).
    traceback = case.signal is not None and "Traceback" in stderr
    green = (code == case.expect_code and named and leftover_procs == 0 and not temp_left
             and state in case.expect_state and partial_ok and not traceback)
    return {
        "path": path.name, "case": case.name, "dp": dp, "fault": " ".join(case.faults) or
        f"{signal.Signals(case.signal).name} to the launcher, {case.when}",
        "exit": code, "expected_exit": case.expect_code,
        "fault_to_exit_s": fault_to_exit, "total_s": total, "names": naming,
        "leftover_processes": leftover_procs, "leftover_temp": temp_left,
        "run_json": state, "load_run": loaded, "signal_traceback": traceback,
        "green": green, "stderr_tail": stderr.strip().splitlines()[-3:] if stderr else [],
    }


def markdown(rows: list[dict]) -> str:
    head = ("| path | case | dp | fault | exit (expected) | fault→exit s | total s | names "
            "| leftover procs | leftover temp | run.json | load_run | green |")
    lines = [head, "|" + "---|" * 13]
    for r in rows:
        if "refused" in r:
            lines.append(f"| {r['path']} | all | {r['dp']} | refused by the CLI: "
                         f"`{r['refused']}` | | | | | | | | | - |")
            continue
        f2e = "-" if r["fault_to_exit_s"] is None else f"{r['fault_to_exit_s']:.2f}"
        lines.append(
            f"| {r['path']} | {r['case']} | {r['dp']} | `{r['fault']}` | {r['exit']} "
            f"({r['expected_exit']}) | {f2e} | {r['total_s']:.1f} | {r['names']} "
            f"| {r['leftover_processes']} | {len(r['leftover_temp'])}"
            f"{' (+ torch cache)' if r.get('torch_cache') else ''} | {r['run_json']} "
            f"| {r['load_run']} | {'yes' if r['green'] else '**NO**'} |")
    return "\n".join(lines)


def _default_tree() -> str:
    return os.environ.get("DYNTRA_VLLM_ASCEND") or str(
        ROOT.parent / "shared" / "upstream" / "vllm-ascend")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dp", type=int, nargs="+", default=[2, 4], choices=[2, 4])
    parser.add_argument("--impl", nargs="+", default=list(IMPLS), choices=IMPLS)
    parser.add_argument("--transport", nargs="+", default=list(TRANSPORTS),
                        choices=TRANSPORTS)
    parser.add_argument("--only", nargs="+", metavar="CASE",
                        help="run only these cases: " + ", ".join(
                            c.name for c in cases(RunPath("kit", "process"))))
    parser.add_argument("--vllm-ascend", default=_default_tree(), metavar="PATH",
                        help="the vllm-ascend tree of the vllm-ascend paths")
    parser.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    args = parser.parse_args(argv)
    rows = []
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fault-matrix-") as work:
        for impl in args.impl:
            for transport in args.transport:
                path = RunPath(impl, transport)
                for dp in args.dp:
                    rows += run_path(path, dp, args.only, Path(work), args.vllm_ascend)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}; {len(rows)} rows in "
          f"{time.monotonic() - began:.0f} s\n")
    print(markdown(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0 if all(r["green"] for r in rows) else 1


def run_path(path: RunPath, dp: int, only, work: Path, tree: str) -> list[dict]:
    """The rows of one path at one DP size; one row when the CLI refuses the path."""
    rows = []
    for case in cases(path):
        if only and case.name not in only:
            continue
        row = run_case(path, case, dp, work, tree)
        rows.append(row)
        if "refused" in row:
            print(f"{path.name} dp={dp}: refused: {row['refused']}", file=sys.stderr,
                  flush=True)
            return rows
        print(f"{path.name:>22} {row['case']:>15} dp={dp}: exit {row['exit']}, "
              f"{'green' if row['green'] else 'NOT GREEN ' + str(row)}",
              file=sys.stderr, flush=True)
    return rows


if __name__ == "__main__":
    sys.exit(main())
