"""`dyntra-emu timeline`: a run directory's timeline in the Trace Event Format, for
Perfetto (ui.perfetto.dev) and chrome://tracing; and the check of ``run --timeline FILE``
before the run starts. The events are emu/timeline.py's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from emu.cli.errors import PROG, UsageError
from emu.cli.flags import Formatter, wrap

DEFAULT_NAME = "timeline.json"

EPILOG = """\
examples:
  dyntra-emu timeline runs/lt                    # writes runs/lt/timeline.json
  dyntra-emu timeline runs/ab/b --out b.json     # one run of an A/B
  dyntra-emu run --workload longtail --timeline lt.json   # written right after the run

Open the file in https://ui.perfetto.dev ("Open trace file"), chrome://tracing ("Load")
or the Performance panel of Chrome's DevTools ("Load profile").
Each rank is a process with an engine thread (each step's own cost, then the bubble: the
wait for the slowest rank; the collectives; the plans DyntraLB generated) and a scheduler
thread (plans applied, admits, pauses, resumes, preemptions, finishes), with counters of
its KV blocks and requests; wave ends are lines across every rank. The axis is the run's
virtual time. A run that did not finish is read as far as every rank logged.
How to read it: docs/timeline.md.
"""


def check_timeline_path(value: str, flag: str, out_dir: str | None = None) -> Path:
    """The path a timeline will be written to, refused before anything runs when it is a
    directory or its directory does not exist (and is not ``out_dir``, the run's output
    directory, which the run creates)."""
    path = Path(value)
    if path.is_dir():
        raise UsageError(f"{flag} {value}: is a directory; give a file name, e.g. "
                         f"{path / DEFAULT_NAME}")
    in_out_dir = out_dir is not None and path.parent.resolve() == Path(out_dir).resolve()
    if not (path.parent.is_dir() or in_out_dir):
        raise UsageError(f"{flag} {value}: the directory {path.parent} does not exist")
    return path


def save_timeline(run, run_dir: Path, path: Path) -> int:
    """Write the timeline of ``run`` (an emu.metrics.Run read from ``run_dir``) to
    ``path``; returns the number of events. Called by ``timeline`` and by
    ``run --timeline`` after the run."""
    from emu.timeline import write_timeline

    try:
        return write_timeline(run, path, source=run_dir)
    except OSError as exc:
        raise UsageError(f"{path}: cannot write the timeline: {exc.strerror or exc}") from None


def cmd_timeline(args) -> int:
    from emu.metrics import RunError, load_run
    from emu.run_status import describe_unfinished, read_status

    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise UsageError(f"{run_dir}: not a run directory")
    out = check_timeline_path(args.out or str(run_dir / DEFAULT_NAME), "--out")
    status = read_status(run_dir)
    if status is not None and status.get("state") != "complete":
        print(f"{PROG} timeline: note: {describe_unfinished(run_dir, status)}; the timeline "
              "shows the steps every rank logged", file=sys.stderr)
    try:
        run = load_run(run_dir, allow_partial=True)
    except RunError as exc:
        raise UsageError(str(exc)) from None
    count = save_timeline(run, run_dir, out)
    print(f"Timeline of {run_dir} ({count} events) in {out}: open it in "
          "https://ui.perfetto.dev or chrome://tracing")
    return 0


def add_parser(sub) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "timeline", help="write a run's timeline (Trace Event Format: Perfetto, "
                         "chrome://tracing)",
        description=wrap("Write the timeline of a run directory in the Trace Event Format: "
                         "one track per rank, each step's own cost and its bubble apart, "
                         "collectives, pauses and resumes, plans, wave ends, on the run's "
                         "virtual time."),
        formatter_class=Formatter, allow_abbrev=False, epilog=EPILOG)
    parser.add_argument("run_dir", metavar="RUN_DIR",
                        help="a run's output directory (its rank<r>.steps/ records)")
    parser.add_argument("--out", metavar="FILE",
                        help=f"where to write it (default: RUN_DIR/{DEFAULT_NAME})")
    parser.set_defaults(func=cmd_timeline)
    return parser
