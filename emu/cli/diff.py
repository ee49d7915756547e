"""`dyntra-emu diff`: our DyntraLB against vllm-ascend's (or one vllm-ascend tree against
another), step by step.

Three ways in, one comparison (``emu.offline.diff``):

- ``diff [run flags]``: runs the trace twice with the same config, engine flags and
  seed, ``--impl kit`` (A) and ``--impl vllm-ascend`` (B; ``--planner reference``, or
  another of ours, runs that planner in both, which isolates the planner from the rest
  of the step);
- ``diff --vllm-ascend-a PATH --vllm-ascend-b PATH [run flags]``: both runs on
  vllm-ascend, from two trees (a contributor's before and after);
- ``diff DIR_A DIR_B``: two run directories that already exist.

A run that fails (a stalled rank, a strict-mode violation, a fault) is compared as far
as every rank of it logged, its failure reason being the outcome compared first: whether
the other side fails the same way is part of the answer.

Exit codes: 0 identical (also when both runs failed the same way), 1 divergent, 2 bad
input (one message, nothing started), 3 a run failed leaving nothing to compare (its
report is in ``DIR/a|b/error.txt``).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from emu.cli.errors import ClusterFailed, UsageError
from emu.cli.flags import Formatter, add_input_options, add_run_options, wrap
from emu.cli.inputs import build_spec, check_specs, config_source, read_inputs
from emu.cli.outdir import out_dir_path, prepare_out_dir
from emu.cli.running import resolve_launch, run_one
from emu.knobs import Int
from emu.offline.diff import DiffInputError, compare, format_report, plot_load, read_run

EXIT_DIVERGENT = 1

EXIT_RUN_FAILED = 3

RUN_DIRS = ("a", "b")

PLOT = "load_diff.png"

REPORT = "diff.json"

_EPILOG = """\
examples:
  dyntra-emu diff --workload longtail --dp 2 --vllm-ascend ~/src/vllm-ascend
      kit (A) against vllm-ascend's DyntraLB (B), DyntraLB static from step 0
  dyntra-emu diff --vllm-ascend-a ~/src/vllm-ascend-main --vllm-ascend-b ~/src/vllm-ascend \\
      --workload uniform --dp 2 --block-size 16 --out runs/my-change
      a vllm-ascend branch (B) against its base (A), same trace, config and seed
  dyntra-emu diff runs/a runs/b --json
      two runs made before (any impl); --out DIR writes the plot and diff.json there

Prints "identical" with what was compared, or the first divergence (rank, iteration,
both sides' differing fields, every rank's plan and queue state there, the steps
before it) and every divergence grouped by kind (outcome, plan, schedule, snapshot,
counter, collectives, kv, time, request, diagnostics). --out DIR gets a/ and b/ (the
runs), diff.json and load_diff.png (per-rank load of both runs, divergences marked).
A run that fails is compared as far as every rank logged, its failure first (kind
outcome).
Exit code 0 identical (also when both failed the same way), 1 divergent, 2 bad input,
3 a run failed leaving nothing to compare.
"""


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``diff`` on the ``dyntra-emu`` sub-command parser."""
    parser = subparsers.add_parser(
        "diff", help="run kit and vllm-ascend (or two vllm-ascend trees) on the same "
                     "trace, or read two run directories; compare step by step",
        description=wrap(
            "Compare two runs of the same trace, config and seed step by step: what "
            "DyntraLB planned and what the scheduler did on every rank at every "
            "iteration, the collectives, the request records and the diagnostics "
            "lines. Without DIR_A DIR_B it makes both runs itself."),
        formatter_class=Formatter, allow_abbrev=False, epilog=_EPILOG)
    parser.add_argument("dirs", nargs="*", metavar="DIR_A DIR_B",
                        help="two existing run directories to compare (then no run flags)")
    add_input_options(parser, single_config=True, impl=False)
    parser.add_argument("--vllm-ascend-a", metavar="PATH",
                        help="run A on this vllm-ascend tree instead of the kit (with "
                             "--vllm-ascend-b)")
    parser.add_argument("--vllm-ascend-b", metavar="PATH",
                        help="run B on this vllm-ascend tree (with --vllm-ascend-a)")
    add_run_options(parser)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--context", type=Int(0).parse, default=3, metavar="N",
                        help="steps shown before the first divergence (default: 3)")
    parser.set_defaults(func=cmd_diff)
    return parser


# Flags that only make sense when diff makes the runs itself.
_REPORT_FLAGS = {"dirs", "json", "context", "out", "func", "parser", "command"}


def _given_run_flags(args, parser: argparse.ArgumentParser) -> list[str]:
    given = []
    for action in parser._actions:
        if (action.dest in _REPORT_FLAGS or not action.option_strings
                or action.default == argparse.SUPPRESS):
            continue
        if getattr(args, action.dest, None) != action.default:
            given.append(action.option_strings[0])
    return given


def cmd_diff(args) -> int:
    try:
        if args.dirs:
            return _diff_dirs(args)
        return _diff_runs(args)
    except DiffInputError as exc:
        raise UsageError(str(exc)) from None


def _diff_dirs(args) -> int:
    if len(args.dirs) != 2:
        raise UsageError(f"DIR_A DIR_B: expected two run directories, got "
                             f"{len(args.dirs)} ({' '.join(args.dirs)}); or none, to make "
                             "both runs")
    flags = _given_run_flags(args, args.parser)
    if flags:
        raise UsageError(f"{flags[0]}: not allowed with DIR_A DIR_B (the runs exist "
                             "already; only --json, --context and --out apply)")
    labels = _labels(*(Path(d) for d in args.dirs))
    a, b = (read_run(d, label) for d, label in zip(args.dirs, labels, strict=True))
    out = None
    if args.out is not None:
        out = Path(args.out)
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"--out {out}: cannot create the directory: "
                                 f"{exc.strerror or exc}") from None
    return _report(args, a, b, out)


def _labels(dir_a: Path, dir_b: Path) -> tuple[str, str]:
    """Each run's impl from its metrics.json ("A" / "B" when unknown or the same)."""
    impls = []
    for d in (dir_a, dir_b):
        try:
            config = json.loads((d / "metrics.json").read_text())["config"]
            impl = config["impl"]
        except (OSError, ValueError, KeyError, TypeError):
            impls.append(None)
            continue
        planner = config.get("planner")
        own = "reference" if impl == "kit" else "vllm-ascend"
        impls.append(impl if planner in (None, own) else f"{impl} ({planner} planner)")
    if None in impls or impls[0] == impls[1]:
        return ("A", "B") if None in impls else (f"A:{impls[0]}", f"B:{impls[1]}")
    return impls[0], impls[1]


def _sides(args) -> list[tuple[str, str, str | None]]:
    """(label, impl, tree) of runs A and B."""
    tree_a, tree_b = args.vllm_ascend_a, args.vllm_ascend_b
    if tree_a is None and tree_b is None:
        return [("kit", "kit", None), ("vllm-ascend", "vllm-ascend", args.vllm_ascend)]
    if tree_a is None or tree_b is None:
        missing = "--vllm-ascend-b" if tree_a is not None else "--vllm-ascend-a"
        raise UsageError(f"{missing}: required with the other of --vllm-ascend-a/"
                             "--vllm-ascend-b (both runs use a vllm-ascend tree)")
    if args.vllm_ascend is not None:
        raise UsageError("--vllm-ascend: not allowed with --vllm-ascend-a/"
                             "--vllm-ascend-b (they name both trees)")
    return [("A", "vllm-ascend", tree_a), ("B", "vllm-ascend", tree_b)]


def _diff_runs(args) -> int:
    launch = resolve_launch(args)
    sides = _sides(args)
    text, source, problems = config_source(args)
    inputs = read_inputs(args, launch.dp)
    out = out_dir_path(args.out, "diff")
    runs = []  # (label, spec) of A and B, both checked before anything starts
    for (label, impl, tree), name in zip(sides, RUN_DIRS, strict=True):
        planner = args.planner
        if impl == "kit":
            # --planner chooses the planner of the vllm-ascend runs; the kit runs the
            # same one when it is ours, else the reference.
            planner = None if args.planner == "vllm-ascend" else args.planner
        elif args.planner not in (None, "vllm-ascend"):
            label += f" ({args.planner} planner)"
        runs.append((label, build_spec(args, launch.dp, inputs, text, out / name, impl=impl,
                                       vllm_ascend=tree, planner=planner)))
    checked = check_specs(args, inputs, [(spec, source) for _, spec in runs],
                          local_ranks=launch.local_ranks, problems=problems)
    cadence = checked[1].engine_spec.dp_sync_interval
    if checked[0].engine_spec.dp_sync_interval != cadence:
        # No --dp-sync-interval: the kit runs the installed vLLM's cadence, which the
        # vllm-ascend run resolved (emu.rank.dp_sync).
        runs[0] = (runs[0][0], replace(runs[0][1], dp_sync_interval=cadence))
        checked[0] = check_specs(args, inputs, [(runs[0][1], source)],
                                 local_ranks=launch.local_ranks)[0]
    prepare_out_dir(out, args.overwrite, RUN_DIRS)
    # One process holds one tree on rank threads: two trees, each run in its own process.
    apart = args.vllm_ascend_a is not None and args.transport == "thread"
    for (label, _), run, name in zip(runs, checked, RUN_DIRS, strict=True):
        try:
            run_one(args, run, launch, f"{name.upper()} ({label})", apart=apart)
        except ClusterFailed as exc:
            # A failure is behaviour too: the other run is made and compared with it.
            print(f"dyntra-emu diff: run {name.upper()} ({label}) "
                  f"{str(exc).splitlines()[0]}; its report: {out / name}/error.txt; "
                  "comparing it as far as every rank logged", file=sys.stderr)
    try:
        a, b = (read_run(out / name, label)
                for (label, _), name in zip(runs, RUN_DIRS, strict=True))
    except DiffInputError as exc:
        print(f"dyntra-emu diff: error: nothing to compare: {exc}", file=sys.stderr)
        return EXIT_RUN_FAILED
    return _report(args, a, b, out)


def _report(args, a, b, out: Path | None) -> int:
    report = compare(a, b, before=args.context)
    text = json.dumps(report.to_dict(), indent=1) if args.json else format_report(report)
    if out is not None:
        (out / REPORT).write_text(json.dumps(report.to_dict(), indent=1) + "\n")
        plot_load(a, b, report, out / PLOT)
    try:
        print(text, flush=True)
        if out is not None and not args.json:
            print(f"\nOutputs in {out}/: {REPORT}, {PLOT}"
                  + (", a/ and b/ (the runs)" if not args.dirs else ""))
    except BrokenPipeError:
        pass
    return 0 if report.identical else EXIT_DIVERGENT
