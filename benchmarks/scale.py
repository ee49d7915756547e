"""Long traces: a whole ``dyntra-emu run`` on synthetic Mooncake-shaped traffic
(``fixtures/generate.py --recipe mooncake-like``) of several lengths and DP sizes, for two
checkouts side by side: wall time, CPU time (user + sys), real-time factor (virtual time
over wall time, and over CPU time: the figure that holds on a loaded machine), peak RSS,
bytes written per rank per virtual hour, and where the wall time went (ranks, metrics,
plots).

    .venv/bin/python benchmarks/scale.py --baseline /work/baseline --candidate .
    .venv/bin/python benchmarks/scale.py --baseline /work/baseline --only baseline
    .venv/bin/python benchmarks/scale.py --candidate . --hours 0.25 --dp 8

Each trace is generated once, by this checkout's generator (a checkout without the
recipe runs the same file), with the recipe's rate at dp 16 and the same requests per rank
at other DP sizes (9,850 an hour at dp 8), and every checkout runs
``CHECKOUT/.venv/bin/dyntra-emu run --workload FILE --dp D --transport thread`` under
``/usr/bin/time -v`` (CPU time), its process tree's RSS polled every 0.2 s (peak RSS).
The phases come from what the run leaves on disk, whatever its record format: ranks
from the run's start line on stderr to the last write of a ``rank*`` file, metrics from
there to ``metrics.json``, plots from there to the last ``*.png``; what is left of the
wall time (start-up, trace reading, the summary) is "other".

Memory on a shared machine: a side whose peak RSS is estimated (``--gb-per-rank-hour``
x DP x hours) past what the machine has available, less a margin, is skipped with the
reason printed; main before issue 51 holds every record in memory (6.4 GB for 1 h at
dp 16), so the baseline never runs past ``BASELINE_MAX_HOURS``. A run whose tree grows
past ``--max-rss-gb`` is stopped and reported as such.

Results accumulate in ``--results`` (JSON, one entry per side and size, the last
measurement kept), so the two sides can be run at different times; the table printed at
the end is built from that file.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
SIDES = ("baseline", "candidate")
# Main before issue 51 needs ~6.4 GB per dp-16 hour: 4 h would need ~25 GB.
BASELINE_MAX_HOURS = 1.0
# Left free for the other users of the machine when deciding whether a run fits.
MARGIN_GB = 3.0
POLL_S = 0.2
# The DP size the recipe's default rate (19,700 requests an hour) is for.
FULL_RATE_DP = 16
_TIME_FIELDS = {"User time (seconds)": "user_s", "System time (seconds)": "sys_s",
                "Maximum resident set size (kbytes)": "maxrss_kb"}


def generate_trace(hours: float, dp: int, where: Path) -> Path:
    """The mooncake-like trace of ``hours`` (seed 0) for ``dp`` ranks, written once under
    ``where``: the recipe's 19,700 requests an hour at dp 16, the same load per rank at
    another DP size (at dp 8 the full rate overloads the ranks: main stalls after ~50k
    steps of 1 h, every KV block held)."""
    path = where / f"mooncake-like-{hours:g}h-dp{dp}.jsonl"
    rate = [] if dp == FULL_RATE_DP else ["--rate", repr(19_700 / 3600 * dp / FULL_RATE_DP)]
    if not path.exists():
        subprocess.run([sys.executable, str(REPO / "fixtures" / "generate.py"), "--recipe",
                        "mooncake-like", "--hours", f"{hours:g}", *rate, "--seed", "0",
                        "--out", str(path)], check=True, stdout=subprocess.DEVNULL)
    return path


def _tree_rss(proc: psutil.Process) -> int:
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def run_once(checkout: Path, trace: Path, dp: int, out_dir: Path, max_rss: int) -> dict:
    """One ``dyntra-emu run`` of ``checkout`` into ``out_dir``: its measurements."""
    command = ["/usr/bin/time", "-v", str(checkout / ".venv" / "bin" / "dyntra-emu"), "run",
               "--workload", str(trace), "--dp", str(dp), "--transport", "thread",
               "--out", str(out_dir)]
    started = time.monotonic()
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    lines: list[tuple[float, str]] = []

    def read_stderr() -> None:
        for line in proc.stderr:
            lines.append((time.time(), line.rstrip("\n")))

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    watched = psutil.Process(proc.pid)
    peak, stopped = 0, None
    while proc.poll() is None:
        peak = max(peak, _tree_rss(watched))
        if peak > max_rss and stopped is None:
            stopped = f"stopped at {peak / 2**30:.1f} GB RSS (--max-rss-gb)"
            os.killpg(proc.pid, signal.SIGTERM)
        time.sleep(POLL_S)
    wall = time.monotonic() - started
    reader.join()
    text = [line for _, line in lines]
    result = {"wall_s": wall, "returncode": proc.returncode, "peak_rss_bytes": peak}
    for line in text:
        key, _, value = line.strip().partition(": ")
        if key in _TIME_FIELDS:
            result[_TIME_FIELDS[key]] = float(value)
    if "maxrss_kb" in result:
        result["peak_rss_bytes"] = max(peak, int(result.pop("maxrss_kb")) * 1024)
    result["cpu_s"] = result.pop("user_s", 0.0) + result.pop("sys_s", 0.0)
    (out_dir.parent / f"{out_dir.name}.stderr.txt").write_text("\n".join(text) + "\n")
    if stopped or proc.returncode != 0:
        said = [line for line in text if not line.startswith("\t")]  # not /usr/bin/time's
        result["error"] = stopped or "; ".join(said[-3:])
        return result
    metrics = json.loads((out_dir / "metrics.json").read_text())
    result["virtual_s"] = metrics["virtual_time_s"]
    result["requests"] = metrics.get("requests_finished")
    result["run_dir_bytes"] = sum(p.stat().st_size for p in out_dir.rglob("*") if p.is_file())
    result["phases"] = _phases(lines, out_dir, started_wall=time.time() - wall, wall=wall)
    return result


def _phases(lines: list[tuple[float, str]], out_dir: Path, *, started_wall: float,
            wall: float) -> dict:
    """Seconds of ranks, metrics, plots and other, from the run's start line on stderr
    and the modification times of what it wrote (see the module docstring)."""
    start = next((t for t, line in lines if re.match(r"run: \d+ ranks", line)), started_wall)
    ranks_end = max(p.stat().st_mtime for p in out_dir.glob("rank*"))
    metrics_end = (out_dir / "metrics.json").stat().st_mtime
    plots_end = max((p.stat().st_mtime for p in out_dir.glob("*.png")), default=metrics_end)
    phases = {"ranks": ranks_end - start, "metrics": metrics_end - ranks_end,
              "plots": plots_end - metrics_end}
    phases["other"] = wall - sum(phases.values())
    return phases


def estimated_gb(side: str, hours: float, dp: int, gb_per_rank_hour: float) -> float:
    """The peak RSS a run is expected to need (the baseline grows with the trace; a
    candidate is expected not to, but is given the same estimate up to one hour)."""
    return 0.5 + gb_per_rank_hour * dp * (hours if side == "baseline" else min(hours, 1.0))


def skip_reason(side: str, hours: float, dp: int, args) -> str | None:
    if side == "baseline" and hours > BASELINE_MAX_HOURS:
        return (f"main before the change keeps every record in memory (~6.4 GB per dp-16 "
                f"hour, ~{estimated_gb(side, hours, dp, args.gb_per_rank_hour):.0f} GB "
                f"here); not run past {BASELINE_MAX_HOURS:g} h on a shared machine")
    need = estimated_gb(side, hours, dp, args.gb_per_rank_hour)
    available = psutil.virtual_memory().available / 2**30
    if need > available - MARGIN_GB:
        return (f"needs ~{need:.1f} GB, the machine has {available:.1f} GB available "
                f"(keeping {MARGIN_GB:g} GB for others)")
    return None


def table(results: dict, cells: list[tuple[float, int]]) -> str:
    head = ("| trace | dp | side | requests | virtual s | wall s | CPU s | x real time "
            "(wall / CPU) | peak RSS GiB | MiB / rank-hour | ranks / metrics / plots / other "
            "s (wall) |\n|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|")
    rows = [head]
    for hours, dp in cells:
        for side in SIDES:
            r = results.get(f"{side} {hours:g}h dp{dp}")
            if r is None:
                continue
            label = f"{hours:g} h"
            if "skipped" in r or "error" in r:
                why = r.get("skipped") or r.get("error")
                rows.append(f"| {label} | {dp} | {side} | | | | | | | | "
                            f"{'skipped' if 'skipped' in r else 'failed'}: {why} |")
                continue
            rank_hours = dp * r["virtual_s"] / 3600
            p = r["phases"]
            rows.append(
                f"| {label} | {dp} | {side} {r['commit']} | {r['requests']:,} | "
                f"{r['virtual_s']:,.0f} | "
                f"{r['wall_s']:.0f} | {r['cpu_s']:.0f} | {r['virtual_s'] / r['wall_s']:.1f} / "
                f"{r['virtual_s'] / r['cpu_s']:.1f} | "
                f"{r['peak_rss_bytes'] / 2**30:.2f} | "
                f"{r['run_dir_bytes'] / 2**20 / rank_hours:.1f} | "
                f"{p['ranks']:.0f} / {p['metrics']:.0f} / {p['plots']:.0f} / "
                f"{p['other']:.0f} |")
    return "\n".join(rows)


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",")]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, help="checkout of main before the change "
                        "(with its .venv)")
    parser.add_argument("--candidate", type=Path, help="checkout with the change (with its "
                        ".venv)")
    parser.add_argument("--only", choices=SIDES, help="run one side (the table still shows "
                        "both from --results)")
    parser.add_argument("--hours", type=_floats, default=[0.25, 1.0, 4.0],
                        help="trace lengths in hours, comma-separated (default 0.25,1,4)")
    parser.add_argument("--dp", type=lambda t: [int(x) for x in t.split(",")],
                        default=[8, 16], help="DP sizes, comma-separated (default 8,16)")
    parser.add_argument("--work", type=Path,
                        default=Path(tempfile.gettempdir()) / "dyntra-scale",
                        help="traces and run directories (runs are deleted once measured)")
    parser.add_argument("--results", type=Path,
                        help="results JSON (default WORK/results.json)")
    parser.add_argument("--gb-per-rank-hour", type=float, default=0.42,
                        help="baseline memory per rank per virtual hour, for the skip "
                             "estimate (default 0.42: 6.4 GB for 1 h at dp 16)")
    parser.add_argument("--deadline", metavar="HH:MM",
                        help="start no run after this UTC time of day (the cells left are "
                             "reported as not run)")
    parser.add_argument("--max-rss-gb", type=float, default=8.0,
                        help="stop a run whose process tree passes this RSS (default 8)")
    args = parser.parse_args(argv)
    checkouts = {"baseline": args.baseline, "candidate": args.candidate}
    sides = [s for s in SIDES if checkouts[s] is not None and args.only in (None, s)]
    if not sides:
        parser.error("give --baseline and/or --candidate")
    for side in sides:
        if not (checkouts[side] / ".venv" / "bin" / "dyntra-emu").exists():
            parser.error(f"--{side} {checkouts[side]}: no .venv/bin/dyntra-emu there")
    args.work.mkdir(parents=True, exist_ok=True)
    results_path = args.results or args.work / "results.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else {}
    cells = [(h, d) for h in args.hours for d in args.dp]
    print(f"machine: {platform.machine()}, {os.cpu_count()} cpus, "
          f"{psutil.virtual_memory().total / 2**30:.0f} GiB, load average "
          f"{os.getloadavg()[0]:.1f}; " + ", ".join(f"{s} {checkouts[s]}" for s in sides),
          flush=True)
    for hours, dp in cells:
        trace = generate_trace(hours, dp, args.work)
        for side in sides:
            key = f"{side} {hours:g}h dp{dp}"
            reason = skip_reason(side, hours, dp, args)
            if reason is None and args.deadline and (
                    time.strftime("%H:%M", time.gmtime()) >= args.deadline):
                reason = f"not started: past --deadline {args.deadline} UTC"
            if reason is not None:
                print(f"{key}: skipped: {reason}", flush=True)
                results[key] = {"skipped": reason}
            else:
                out_dir = args.work / f"run-{side}-{hours:g}h-dp{dp}"
                shutil.rmtree(out_dir, ignore_errors=True)
                load = os.getloadavg()[0]
                r = run_once(checkouts[side].resolve(), trace, dp, out_dir,
                             int(args.max_rss_gb * 2**30))
                r["load_before"] = load
                r["commit"] = subprocess.run(
                    ["git", "-C", str(checkouts[side]), "rev-parse", "--short", "HEAD"],
                    capture_output=True, text=True).stdout.strip()
                shutil.rmtree(out_dir, ignore_errors=True)
                results[key] = r
                print(f"{key}: {json.dumps(r)}", flush=True)
            results_path.write_text(json.dumps(results, indent=1))
    print(table(results, cells))
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
