"""`dyntra-emu fit-cost`: a step-cost profile fitted to step times measured on a node
(the fit is ``emu.rank.costs.fit``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from emu.cli.errors import UsageError
from emu.cli.flags import Formatter, wrap
from emu.rank.costs import (
    FIT_COLUMNS,
    FIT_TERMS,
    CostProfileError,
    fit,
    fit_report,
    read_measurements,
    write_profile,
)

EPILOG = """\
examples:
  dyntra-emu fit-cost steps.csv --name node-a --out node-a.json
  dyntra-emu fit-cost steps.csv --terms fixed_s,per_kv_token_s
  dyntra-emu run --cost-model node-a.json

steps.csv has a header and one row per measured step:
  running_requests,kv_tokens,scheduled_tokens,step_ms
"""


def cmd_fit_cost(args) -> int:
    """Fit, print the fit, write the profile file."""
    terms = [t.strip() for t in args.terms.split(",") if t.strip()]
    try:
        result = fit(read_measurements(args.csv), args.name, terms,
                     description=f"fitted by fit-cost to {args.csv}")
    except CostProfileError as exc:
        raise UsageError(str(exc)) from None
    out = Path(args.out or f"{args.name}.json")
    write_profile(result.profile, out)
    print(fit_report(result))
    print(f"wrote {out}; use it with --cost-model {out}")
    return 0


def add_parser(sub) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "fit-cost", help="fit a step-cost profile to step times measured on a real node",
        description=wrap("Least-squares fit of a step-cost profile (docs/cost-models.md) to "
                         "steps measured on a real decode node; prints the coefficients, "
                         "RMSE and R^2 and writes a profile file for --cost-model."),
        formatter_class=Formatter, allow_abbrev=False, epilog=EPILOG)
    parser.add_argument("csv", metavar="CSV",
                        help=f"measured steps, one per row, with columns "
                             f"{', '.join(FIT_COLUMNS)} (step time in milliseconds)")
    parser.add_argument("--name", default="fitted", help="the profile's name (default: fitted)")
    parser.add_argument("--terms", default=",".join(FIT_TERMS),
                        help="comma-separated terms to fit, the others are 0 "
                             f"(default: {','.join(FIT_TERMS)})")
    parser.add_argument("--out", metavar="FILE.json",
                        help="write the profile here (default: <name>.json)")
    parser.set_defaults(func=cmd_fit_cost)
    return parser
