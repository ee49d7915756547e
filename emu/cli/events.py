"""`dyntra-emu events`: a run's records as JSON Lines on stdout, the lines its ranks'
event logs (``rank<r>.events.jsonl``) held before the records were Parquet, for grep and
jq (`dyntra-emu convert` turns a directory of such logs into records)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from emu.cli.errors import UsageError
from emu.cli.flags import Formatter, wrap

EPILOG = """\
examples:
  dyntra-emu events runs/lt                      # every rank's event log, rank after rank
  dyntra-emu events runs/lt --rank 1 | jq -c 'select(.paused != [])'
  dyntra-emu events runs/lt --requests | jq .token_times_s[0]
  dyntra-emu events runs/lt --wall --rank 0      # the wall-clock log
  dyntra-emu convert runs/old                    # a run directory of JSON Lines logs

The records themselves are Parquet (rank<r>.steps/, rank<r>.requests/,
rank<r>.wall/): pandas, polars and DuckDB read them as they are (docs/records.md).
"""


def cmd_events(args) -> int:
    from emu.records.reader import (
        RecordsError,
        event_lines,
        record_ranks,
        request_lines,
        wall_lines,
    )

    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise UsageError(f"{run_dir}: not a run directory")
    try:
        ranks = record_ranks(run_dir)
    except RecordsError as exc:
        raise UsageError(str(exc)) from None
    if not ranks:
        raise UsageError(f"{run_dir}: no records (rank<r>.steps/)")
    if args.rank is not None:
        if args.rank not in ranks:
            raise UsageError(f"--rank {args.rank}: {run_dir} has records of ranks "
                             f"0..{ranks[-1]}")
        ranks = [args.rank]
    lines = wall_lines if args.wall else request_lines if args.requests else event_lines
    out = sys.stdout
    try:
        for rank in ranks:
            for line in lines(run_dir, rank):
                out.write(line + "\n")
        out.flush()
    except BrokenPipeError:  # a reader that stops early (| head) is no error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (RecordsError, OSError) as exc:
        raise UsageError(f"{run_dir}: cannot read the records: {exc}") from None
    return 0


def add_parser(sub) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "events", help="print a run's records as JSON Lines (its event logs)",
        description=wrap("Print a run's records as JSON Lines, byte for byte the event log "
                         "(rank<r>.events.jsonl) of earlier versions: each step record, "
                         "then the records of the requests it finished, then those still "
                         "in flight at the end; keys sorted."),
        formatter_class=Formatter, allow_abbrev=False, epilog=EPILOG)
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run's output directory")
    parser.add_argument("--rank", type=int, metavar="R",
                        help="only rank R's records (default: every rank, rank after rank)")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--requests", action="store_true",
                       help="only the request records")
    which.add_argument("--wall", action="store_true",
                       help="the wall-clock log instead (rank<r>.wall.jsonl of earlier "
                            "versions: each step's wall time, the planner's and DyntraLB's "
                            "collectives')")
    parser.set_defaults(func=cmd_events)
    return parser
