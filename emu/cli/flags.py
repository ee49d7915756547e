"""The flags shared by the commands that run clusters (run, ab, validate, diff, sweep).

Every engine knob is a flag made from its ``RunSpec`` field (``emu.spec``): name, type,
choices, default and help come from the field's ``emu.knobs.Knob``. The flags written out here are
the inputs that are not a RunSpec field as they are: the workload, the DP size (torchrun
sets it), the configs, the cost model (a name or a file), faults and the output options.
``emu.cli.inputs.spec_kwargs`` reads the parsed knob values back by field name, and
``flag_of`` says which flag sets a field, for messages.
"""

from __future__ import annotations

import argparse
import textwrap
from collections.abc import Callable

from emu.faults import parse_fault
from emu.knobs import Choice, Int, Switch
from emu.limits import MAX_DP_SIZE
from emu.rank.costs import DEFAULT_PROFILE, PROFILES
from emu.sites import COLLECTIVE_SITES
from emu.spec import knobs
from emu.traces import FORMATS
from emu.traces.replay import parse_time_scale, parse_window
from emu.workload import bundled_workloads

DEFAULT_DP = 4

DEFAULT_WORKLOAD = "default"


def wrap(text: str) -> str:
    """A command's description, wrapped for --help."""
    return textwrap.fill(text, 88)


class Formatter(argparse.RawDescriptionHelpFormatter):
    """--help layout of every command: epilogs as written, option help in a wide column."""

    def __init__(self, prog):
        super().__init__(prog, max_help_position=34)


def flag_of(field: str) -> str | None:
    """The flag that sets RunSpec field ``field`` (None: no flag sets it)."""
    if field == "dp_size":
        return "--dp"
    if field == "faults":
        return "--fault"
    for name, _, knob in knobs():
        if name == field and knob.help is not None:
            return knob.flag or "--" + name.replace("_", "-")
    return None


def add_spec_flags(parser: argparse.ArgumentParser, section: str, *,
                   exclude: tuple[str, ...] = ()) -> None:
    """One flag per RunSpec knob of ``section`` ("input" or "run", see emu.knobs) that
    has a help text, except the fields in ``exclude``."""
    for name, default, knob in knobs():
        if knob.help is None or knob.section != section or name in exclude:
            continue
        flag = flag_of(name)
        help_text = f"{knob.help} (default: {_shown(default, knob)})"
        if isinstance(knob.kind, Switch):
            both = knob.kind.both
            parser.add_argument(
                flag, dest=name, default=default,
                action=argparse.BooleanOptionalAction if both else "store_true",
                help=f"{knob.help} (default: {_shown(default, knob)})" if both else knob.help)
            continue
        options = _value_options(knob.kind)
        if knob.metavar is not None:
            options["metavar"] = knob.metavar
        parser.add_argument(flag, dest=name, default=default, help=help_text, **options)


def _value_options(kind) -> dict:
    """How argparse reads the value: from a set of choices, or through the kind."""
    if isinstance(kind, Choice):
        return {"choices": kind.values}
    return {"type": kind.parse, "metavar": kind.metavar}


def _shown(default, knob) -> str:
    if knob.shown_default is not None:
        return knob.shown_default
    return f"{default:g}" if isinstance(default, float) else str(default)


def add_input_options(parser: argparse.ArgumentParser, *, single_config: bool,
                      impl: bool = True) -> None:
    """The flags that define a run; ``impl`` False leaves out --impl (diff picks the
    impl of each of its two runs itself)."""
    add_workload_options(parser)
    parser.add_argument("--dp", type=Int(1, MAX_DP_SIZE, "rank processes").parse, metavar="N",
                        help=f"number of DP ranks (default: {DEFAULT_DP}; "
                             "under torchrun: WORLD_SIZE)")
    if single_config:
        group = parser.add_mutually_exclusive_group()
        group.add_argument(
            "--additional-config", metavar="JSON|@FILE",
            help="vllm-ascend's --additional-config for the decode node, as JSON or @file "
                 "(default: DyntraLB static mode from step 0)")
        group.add_argument("--no-dyntra-lb", action="store_true",
                           help="plain DP without DyntraLB (same as --additional-config '{}')")
    add_spec_flags(parser, "input", exclude=() if impl else ("impl",))
    parser.add_argument("--cost-model", metavar="NAME|FILE.json",
                        help="step-cost profile: a bundled one ("
                             f"{', '.join(PROFILES)}) or a profile file, e.g. from "
                             f"`dyntra-emu fit-cost` (default: {DEFAULT_PROFILE}; "
                             "docs/cost-models.md)")


def add_workload_options(parser: argparse.ArgumentParser) -> None:
    """--workload and how its trace is read and replayed (docs/workloads.md)."""
    parser.add_argument(
        "--workload", metavar="FILE|NAME", default=DEFAULT_WORKLOAD,
        help="trace file in any format --workload-format lists, detected by its content "
             "(docs/workloads.md), the name of a bundled "
             f"workload: {', '.join(bundled_workloads()) or 'none installed'}, or a "
             "generated one, recipe:NAME[,n=N][,rate=R][,hours=H] (fixtures/generate.py "
             "recipes, e.g. recipe:pr12292,n=200 or recipe:mooncake-like,hours=4; seeded "
             f"with --seed) (default: {DEFAULT_WORKLOAD})")
    formats = "; ".join(f"{f.name}: {f.about}" for f in FORMATS.values())
    parser.add_argument(
        "--workload-format", choices=list(FORMATS), metavar="NAME",
        help=f"read the trace file as this format instead of detecting it ({formats})")
    parser.add_argument(
        "--window", type=_parsed(parse_window), metavar="START:END",
        help="replay only the requests arriving from START to END seconds on the trace's "
             "clock (either may be left out), starting the replay at START")
    parser.add_argument("--limit", type=Int(1).parse, metavar="N",
                        help="replay only the first N requests (of the window)")
    parser.add_argument(
        "--time-scale", type=_parsed(parse_time_scale), default=1.0, metavar="F",
        help="multiply every arrival time by F: 0.5 replays twice as fast, 2 half as fast "
             "(default: 1)")
    parser.add_argument(
        "--tokenizer", metavar="NAME|DIR",
        help="the model's tokenizer (a Hugging Face name or directory, as given to vllm "
             "bench serve) that counts the prompt tokens of a vllm-custom trace; needs "
             "transformers")


def _parsed(parse):
    """An argparse type from a parser that raises ValueError with its message."""
    def parse_flag(text: str):
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return parse_flag


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """The flags of commands that start ranks: the run knobs and where outputs go."""
    add_spec_flags(parser, "run")
    add_output_options(parser)


def add_output_options(parser: argparse.ArgumentParser) -> None:
    """--out, --overwrite and --quiet (sweep has these without the run knobs)."""
    parser.add_argument("--out", metavar="DIR",
                        help="output directory (default: runs/<date>-<time>-<command>)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace a previous run's files in --out DIR")
    parser.add_argument("--quiet", action="store_true",
                        help="no progress bar or status lines on stderr")


def add_fault_option(parser: argparse.ArgumentParser) -> None:
    """--fault, repeatable (run and validate)."""
    parser.add_argument(
        "--fault", type=_fault, action="append", metavar="KIND:KEY=VALUE,...",
        help="inject a fault (repeatable; emu/faults.py): kill:rank=R,step=S | "
             "slow:rank=R,extra_ms=X | kv_fail:request=ID | kv_never:request=ID"
             "[,timeout_s=T] | not_ready:request=ID,lookups=N | "
             f"delay:rank=R,site=SITE,step=S,seconds=X with SITE one of "
             f"{', '.join(COLLECTIVE_SITES)}")


def positive_ms(text: str) -> float:
    """argparse's type of a limit in milliseconds (sweep's and tune's --max-tpot-p99-ms)."""
    return _finite(text, "milliseconds > 0", lambda value: value > 0)


def nonnegative_seconds(text: str) -> float:
    """argparse's type of a length of virtual time (``--split-warmup``)."""
    return _finite(text, "seconds >= 0", lambda value: value >= 0)


def _finite(text: str, expected: str, within: Callable[[float], bool]) -> float:
    """``text`` as a finite float for which ``within`` holds; else argparse's error
    "expected <expected>, got <text>"."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
    if not (within(value) and value < float("inf")):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return value


def non_negative_pct(text: str) -> float:
    """argparse's type of a percentage >= 0 (ab's and tune's --min-gain)."""
    return _finite(text, "a percentage >= 0", lambda value: value >= 0)


def _fault(text: str):
    try:
        return parse_fault(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
