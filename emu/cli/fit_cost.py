"""`dyntra-emu fit-cost`: a step-cost profile fitted to step times measured on a node."""

from __future__ import annotations

import argparse

from emu.cli.errors import UsageError
from emu.cli.flags import Formatter, wrap
from emu.rank.costs import CostProfileError, add_fit_arguments, run_fit

EPILOG = """\
examples:
  dyntra-emu fit-cost steps.csv --name node-a --out node-a.json
  dyntra-emu fit-cost steps.csv --terms fixed_s,per_kv_token_s
  dyntra-emu run --cost-model node-a.json

steps.csv has a header and one row per measured step:
  running_requests,kv_tokens,scheduled_tokens,step_ms
"""


def cmd_fit_cost(args) -> int:
    try:
        return run_fit(args)
    except CostProfileError as exc:
        raise UsageError(str(exc)) from None


def add_parser(sub) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "fit-cost", help="fit a step-cost profile to step times measured on a real node",
        description=wrap("Least-squares fit of a step-cost profile (docs/cost-models.md) to "
                         "steps measured on a real decode node; prints the coefficients, "
                         "RMSE and R^2 and writes a profile file for --cost-model."),
        formatter_class=Formatter, allow_abbrev=False, epilog=EPILOG)
    add_fit_arguments(parser)
    parser.set_defaults(func=cmd_fit_cost)
    return parser
