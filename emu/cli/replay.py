"""`dyntra-emu replay LOG`: re-run the planner on every snapshot a diagnostics log shows.

The replay itself is ``emu.offline.replay``, the plots of ``--plot``
``emu.offline.replay_plots``. The planner flags here (``--planner``, ``--threshold``,
``--max-num-seqs``) are ``explain``'s too, and ``emit`` prints both commands' reports.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from dyntra_lb.planner import registry as planners
from emu.knobs import Int
from emu.offline.logscan import read_log
from emu.offline.replay import format_report, replay
from emu.run_status import unfinished_note

positive_int = Int(1).parse


def threshold_value(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def add_planner_options(parser: argparse.ArgumentParser) -> None:
    """--planner, --threshold and --max-num-seqs (replay and explain)."""
    parser.add_argument("--planner", choices=planners.NAMES, default=planners.REFERENCE,
                        help="which of our planners to run (dyntra_lb/planner/registry.py; "
                             "default: reference, production's algorithm)")
    parser.add_argument("--threshold", type=threshold_value, default=None,
                        help="bubble_threshold for the planner (default: the log's "
                             "dyntra_lb_config.bubble_threshold line, else 5.0)")
    parser.add_argument("--max-num-seqs", type=positive_int, default=None,
                        help="vLLM max_num_seqs (drives the planner's fill step; default: "
                             "taken from a vLLM line in the log such as 'non-default "
                             "args: {...}', else unset)")


def emit(text: str) -> None:
    """Print a report; a reader that closes the pipe early (``| head``) is not an error."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def cmd_replay(args: argparse.Namespace) -> int:
    """Exit code: 0 when every compared plan is reproduced, 1 on any mismatch or planner
    error, 2 when the log cannot be read."""
    try:
        scan = read_log(args.log)
    except OSError as exc:
        print(f"dyntra-emu replay: cannot read {args.log}: {exc.strerror or exc}",
              file=sys.stderr)
        return 2
    note = unfinished_note(args.log)
    if note is not None:
        print(f"dyntra-emu replay: {note}", file=sys.stderr)
    report = replay(scan, threshold=args.threshold, max_num_seqs=args.max_num_seqs,
                    planner=args.planner)
    emit(json.dumps(report.to_dict(), indent=1) if args.json else format_report(report))
    if args.plot:
        try:
            from emu.offline.replay_plots import write_replay_plots  # matplotlib

            files = write_replay_plots(report, args.plot)
        except OSError as exc:
            print(f"dyntra-emu replay: cannot write plots to {args.plot}: {exc}",
                  file=sys.stderr)
            return 2
        print(f"wrote {len(files)} plot(s) to {args.plot}", file=sys.stderr)
    return 1 if report.count("mismatch") or report.count("error") else 0


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``replay`` on the ``dyntra-emu`` sub-command parser."""
    parser = subparsers.add_parser(
        "replay", help="re-run the planner on every snapshot in a diagnostics log",
        description=__doc__.split("\n\n")[0])
    parser.add_argument("log", help="log file with DyntraLB diagnostics lines")
    add_planner_options(parser)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--plot", metavar="DIR", default=None,
                        help="write PNG plots of per-rank load before/after each plan to DIR")
    parser.set_defaults(func=cmd_replay)
    return parser
