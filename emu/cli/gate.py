"""`dyntra-emu gate`: whether a run is worse than a stored baseline, for nightly jobs and CI.

Reads the run and the baseline (emu/gate.py), checks each metric against its tolerance,
prints the table (or ``--json``), writes ``--junit FILE``, and exits 0 when no metric
regressed, 1 when one did, 2 on bad input (an unreadable or partial run, an unknown
metric or a malformed tolerance in ``--tol``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from emu.cli.errors import EXIT_FAILED, UsageError
from emu.cli.flags import Formatter, wrap
from emu.gate import (
    DEFAULT_TOLERANCES,
    GateInputError,
    config_notes,
    evaluate,
    failed,
    gate_table,
    junit_xml,
    plan_checks,
    read_baseline,
    read_run,
    report_json,
    verdict_line,
)
from emu.report import flat_metrics

EPILOG = """\
examples:
  dyntra-emu gate runs/tonight --baseline runs/baseline
  dyntra-emu gate runs/tonight --baseline baseline/metrics.json --junit gate.xml
  dyntra-emu gate runs/tonight --baseline runs/seeds --baseline-side b
      against the B runs of `ab --seeds` (their ab.json): mean over the seeds, limits
      from the 95 % prediction interval of one more seed
  dyntra-emu gate runs/tonight --baseline runs/baseline \\
      --tol throughput_tok_s=-1% --tol tpot_ms.p99=+5% --tol ttft_ms.p99=off --tol pauses.total=+20%

Tolerances: -X% / +X% may fall / rise by at most X % of the baseline (the other way
passes), -X / +X the same in the metric's unit, X% or X either way, exact (= 0), off
(do not check). Defaults:
""" + "\n".join(f"  {metric:<18} {tol}" for metric, tol in DEFAULT_TOLERANCES.items()) + """

Metric names are the dotted names of `dyntra-emu ab`'s table (docs/metrics.md).
Exit code 0 no regression, 1 a metric regressed, 2 bad input (nothing checked).
Recipe for a nightly job: docs/nightly.md.
"""


def cmd_gate(args) -> int:
    try:
        run = read_run(args.run)
        baseline = read_baseline(args.baseline, args.baseline_side)
        known = set(flat_metrics(run)) & set(baseline.values)
        checks = evaluate(run, baseline, plan_checks(args.tol, known))
    except GateInputError as exc:
        raise UsageError(str(exc)) from None
    notes = config_notes(run, baseline)
    if args.junit is not None:
        _write(args.junit, junit_xml(checks, args.run, baseline))
    if args.json:
        print(json.dumps(report_json(checks, args.run, baseline, notes), indent=2))
    else:
        print(f"run:      {args.run}\nbaseline: {baseline.source}\n")
        print(gate_table(checks))
        print()
        for note in notes:
            print(f"note: {note}")
        for check in failed(checks):
            print(f"regression: {check.reason}")
        print(verdict_line(checks))
    return EXIT_FAILED if failed(checks) else 0


def _write(path: str, text: str) -> None:
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"--junit {path}: cannot write it: {exc.strerror or exc}") from None


def add_parser(sub) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "gate", help="check a run against a baseline, metric by metric (nightly jobs, CI)",
        description=wrap("Regression gate: compare a run's metrics with a baseline (a run, its "
                         "metrics.json, or the runs of `ab --seeds`) within per-metric "
                         "tolerances; print every checked metric with both values, the "
                         "change, the tolerance and the verdict."),
        formatter_class=Formatter, allow_abbrev=False, epilog=EPILOG)
    parser.add_argument("run", metavar="RUN",
                        help="the run to check: a run directory or its metrics.json")
    parser.add_argument("--baseline", required=True, metavar="BASE",
                        help="a run directory, a metrics.json, or an `ab --seeds` output "
                             "directory or its ab.json")
    parser.add_argument("--baseline-side", choices=("a", "b"), metavar="a|b",
                        help="with an `ab --seeds` baseline: which of its runs is the "
                             "baseline (default: b)")
    parser.add_argument("--tol", action="append", default=[], metavar="METRIC=TOL",
                        help="the tolerance of a metric (repeatable): -2%%, +10%%, +0.01, "
                             "5%%, exact, off; adds the metric when it is not a default")
    parser.add_argument("--junit", metavar="FILE",
                        help="also write a JUnit XML report: one test case per metric, a "
                             "failure per regression")
    parser.add_argument("--json", action="store_true",
                        help="print the report as JSON instead of the table")
    parser.set_defaults(func=cmd_gate)
    return parser
