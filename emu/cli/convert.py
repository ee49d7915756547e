"""`dyntra-emu convert`: a run directory of JSON Lines event logs (written before the
records were Parquet) turned into records, so that every command reads it."""

from __future__ import annotations

import argparse
from pathlib import Path

from emu.cli.errors import UsageError
from emu.cli.flags import Formatter, wrap


def cmd_convert(args) -> int:
    from emu.records.convert import ConvertError, convert_run, legacy_ranks

    run_dir = Path(args.run_dir)
    if not run_dir.is_dir() or not legacy_ranks(run_dir):
        raise UsageError(f"{run_dir}: no JSON Lines event logs (rank<r>.events.jsonl) to "
                         "convert")
    try:
        ranks = convert_run(run_dir)
    except (ConvertError, OSError) as exc:
        raise UsageError(str(exc)) from None
    print(f"Converted the logs of ranks 0..{ranks[-1]} in {run_dir} to Parquet records "
          "(rank<r>.steps/, rank<r>.requests/, rank<r>.wall/); the "
          "JSON Lines files are kept")
    return 0


def add_parser(sub) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "convert", help="convert a run directory of JSON Lines logs to Parquet records",
        description=wrap("Convert a run directory written before the records were Parquet "
                         "(rank<r>.events.jsonl, rank<r>.wall.jsonl) into records "
                         "(docs/records.md), so that every command reads it; the JSON "
                         "Lines files are kept."),
        formatter_class=Formatter, allow_abbrev=False)
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the run's output directory")
    parser.set_defaults(func=cmd_convert)
    return parser
