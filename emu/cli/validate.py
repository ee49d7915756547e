"""`dyntra-emu validate`: what `run` with the same flags would run, checked, nothing started."""

from __future__ import annotations

import argparse
from pathlib import Path

from emu.cli.errors import EXIT_FAILED, UsageError
from emu.cli.flags import Formatter, add_fault_option, add_input_options, wrap
from emu.cli.inputs import (
    build_spec,
    check_specs,
    config_source,
    describe_config,
    ignored_keys,
    read_inputs,
)
from emu.cli.recipe_hint import recipe_note
from emu.cli.running import resolve_launch

EPILOG = """\
examples:
  dyntra-emu validate                            # the defaults `dyntra-emu run` would use
  dyntra-emu validate --additional-config @decode_node.json --dp 8
  dyntra-emu validate --workload my_trace.jsonl --dp 2 --block-size 16

Exit code 0 and an "OK" line when everything is valid; 1 and one "problem:" line per
problem otherwise; 2 for a bad flag.
"""


def cmd_validate(args) -> int:
    launch = resolve_launch(args)
    text, source, problems = config_source(args)
    inputs = read_inputs(args, launch.dp)
    spec = build_spec(args, launch.dp, inputs, text, Path("."))
    config = None
    try:
        [checked] = check_specs(args, inputs, [(spec, source)],
                                local_ranks=launch.local_ranks, problems=problems)
    except UsageError as exc:
        problems = exc.problems
    else:
        config = checked.config
        problems = ignored_keys([(config, source)])
    if problems:
        for problem in problems:
            print(f"problem: {problem}")
        print(f"{len(problems)} problem(s) found")
        return EXIT_FAILED
    from emu.no_effect import trace_warnings

    for warning in trace_warnings(config.dyntra_lb, spec.trace, spec.block_size):
        print(f"warning: {warning}")
    impl = "" if spec.impl == "kit" else f" with --impl {spec.impl}"
    print(f"OK: {source} ({describe_config(config)}) and workload {spec.workload} "
          f"({len(spec.trace)} requests) are valid for dp={spec.dp_size}{impl}"
          f"{recipe_note(args)}")
    return 0


def add_parser(sub) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "validate", help="check a config and a trace for a DP size; list every problem",
        description=wrap("Check what `dyntra-emu run` with the same flags would run, without "
                         "starting anything: the additional config (including vllm-ascend's "
                         "deployment checks for a decode node), every line of the trace, and "
                         "how both fit the DP size and KV settings."),
        formatter_class=Formatter, allow_abbrev=False, epilog=EPILOG)
    add_input_options(parser, single_config=True)
    add_fault_option(parser)
    parser.set_defaults(func=cmd_validate)
    return parser
