"""The `dyntra-emu` entry point: the parser of every command, and `main`, which runs one
and turns its errors into a message and an exit code (see ``emu.cli.errors``)."""

from __future__ import annotations

import argparse
import difflib
import signal
import sys
from typing import NoReturn

from emu.cli import (
    ab,
    convert,
    diff,
    events,
    explain,
    fit_cost,
    gate,
    inspect,
    replay,
    run,
    sweep,
    timeline,
    tune,
    validate,
)
from emu.cli.errors import (
    EXIT_FAILED,
    EXIT_USAGE,
    PROG,
    ClusterFailed,
    RunInterrupted,
    Terminated,
    UsageError,
    raise_terminated,
)
from emu.cli.flags import Formatter, wrap
from emu.cli.recipe_hint import apply_recipe_setup, given_dests
from emu.process_exit import end_command
from emu.recipes import is_recipe

EPILOG = """\
examples:
  dyntra-emu run                                 # bundled default workload, dp=4, DyntraLB static
  dyntra-emu run --workload longtail --out runs/lt
  dyntra-emu ab --workload longtail              # DyntraLB off vs on, side by side
  dyntra-emu validate --additional-config @decode.json --dp 8
  dyntra-emu inspect --workload trace.csv        # request block counts, thresholds marked
  dyntra-emu run --cost-model planner-heuristic  # another step-cost profile
  dyntra-emu fit-cost steps.csv --out node.json  # a profile from steps measured on a node
  dyntra-emu tune --workload longtail --trials 20  # search DyntraLB's knobs (Optuna), resumable
  dyntra-emu diff --workload longtail --dp 2     # kit vs vllm-ascend's DyntraLB, step by step
  dyntra-emu gate runs/x --baseline runs/base    # regression gate for nightly jobs and CI
  dyntra-emu timeline runs/x                     # the run's timeline, for Perfetto
  dyntra-emu events runs/x --rank 0 | jq .       # a run's records as JSON Lines
  dyntra-emu <command> --help                    # options of one command

Bundled workloads: default, uniform, longtail, bimodal (fixtures/workloads/). Trace
formats --workload reads (Mooncake, Azure, BurstGPT, vllm bench custom): docs/workloads.md.
Metrics are documented in docs/metrics.md.
"""

# The subcommands, in the order --help lists them.
COMMANDS = (run, ab, validate, inspect, fit_cost, replay, explain, sweep, tune, diff, gate,
            timeline, events, convert)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, formatter_class=Formatter, allow_abbrev=False, epilog=EPILOG,
        description=wrap("Emulated vLLM data-parallel decode cluster with the DyntraLB load "
                         "balancer: run a workload on N rank processes and measure what "
                         "DyntraLB does to the DP bubble, balance and latency."))
    sub = parser.add_subparsers(dest="command", metavar="<command>", title="commands")
    for command in COMMANDS:
        subparser = command.add_parser(sub)
        subparser.set_defaults(parser=subparser)
    return parser


def console_main() -> NoReturn:
    """The ``dyntra-emu`` console script and ``python -m emu``: ``main()``, then the process
    ends without interpreter finalization (``emu.process_exit.end_command``)."""
    end_command(main())


def main(argv=None) -> int:
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    if extras:
        _unrecognized(getattr(args, "parser", parser), extras)
    if getattr(args, "func", None) is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    prog = f"{PROG} {args.command}"
    if is_recipe(getattr(args, "workload", None) or ""):
        argv = sys.argv[1:] if argv is None else list(argv)
        apply_recipe_setup(args, given_dests(args.parser, argv[argv.index(args.command) + 1:]))
    # SIGTERM (a CI runner, `timeout`) ends the command like Ctrl-C, with a message. So
    # does SIGINT when the command started with it ignored, as a script's background job
    # does: a `kill -INT` must still stop its runs (a run's launcher catches it anyway).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, raise_terminated)
    try:
        return args.func(args)
    except UsageError as exc:
        _print_problems(prog, exc.problems)
        return EXIT_USAGE
    except ClusterFailed as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except RunInterrupted as exc:
        print(f"\n{prog}: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt as exc:
        name = "SIGTERM" if isinstance(exc, Terminated) else "SIGINT"
        print(f"\n{prog}: interrupted by {name}; no cluster was running", file=sys.stderr)
        return 143 if name == "SIGTERM" else 130


def _unrecognized(parser: argparse.ArgumentParser, extras: list[str]) -> None:
    """argparse's error for unknown arguments, from the subcommand's parser (its usage),
    with the closest known flag suggested."""
    message = f"unrecognized arguments: {' '.join(extras)}"
    flags = [f for action in parser._actions for f in action.option_strings]
    unknown = next((e.split("=")[0] for e in extras if e.startswith("--")), None)
    close = difflib.get_close_matches(unknown, flags, n=1) if unknown else []
    if close:
        message += f" (did you mean {close[0]}?)"
    parser.error(message)


def _print_problems(prog: str, problems: list[str]) -> None:
    if len(problems) == 1:
        print(f"{prog}: error: {problems[0]}", file=sys.stderr)
        return
    print(f"{prog}: error: {len(problems)} problems, nothing was started:", file=sys.stderr)
    for problem in problems:
        print(f"  {problem}", file=sys.stderr)
