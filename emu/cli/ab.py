"""`dyntra-emu ab`: the same workload and seed run twice, DyntraLB off and on (or two
configs), every metric side by side; with --seeds, on several seeds of a recipe.
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

from dyntra_lb.config import unknown_keys
from emu.ab_seeds import FILE_NAME as AB_FILE
from emu.ab_seeds import write_ab_json
from emu.cli.batch import (
    add_executor_options,
    batch_executor,
    check_executor_flags,
    describe_executor,
    run_batch,
)
from emu.cli.errors import UsageError
from emu.cli.flags import Formatter, add_input_options, add_run_options, wrap
from emu.cli.inputs import (
    build_spec,
    check_specs,
    default_config,
    ignored_keys,
    read_config_arg,
    read_inputs,
    warn_ignored_keys,
)
from emu.cli.outdir import out_dir_path, prepare_out_dir
from emu.cli.progress import note
from emu.cli.running import resolve_launch, run_one
from emu.impl import PLANNERS
from emu.knobs import Int
from emu.recipes import is_recipe, seed_table

RUN_DIRS = ("a", "b")

EPILOG = """\
examples:
  dyntra-emu ab --workload longtail
      DyntraLB off (A) vs the default config, static mode from step 0 (B)
  dyntra-emu ab --additional-config @decode_node.json
      the config with DyntraLB disabled (A) vs as given (B)
  dyntra-emu ab --config-a @static.json --config-b @dynamic.json --out runs/modes
  dyntra-emu ab --workload recipe:pr12292,n=300 --seeds 5 --executor ray
      the A/B on 5 seeds, its 10 runs as Ray tasks on a local Ray

The output directory gets summary.md, load_ab.png, bubble_ab.png, tpot_ab.png, and
a/ and b/ with each run's event logs and metrics.json. With --seeds: summary.md,
ab.json (every run's metrics and the deltas; a baseline for `dyntra-emu gate`) and
seed<s>/a, seed<s>/b.
"""


def _ab_sources(args) -> tuple[list[tuple[str, str]], tuple[str, str]]:
    """The two configs of `ab` as (JSON text, name) and their labels."""
    if args.planner_b is not None and args.config_a is None and args.config_b is None:
        # A planner A/B: both runs with the config, DyntraLB on.
        on = (read_config_arg(args.additional_config) if args.additional_config is not None
              else default_config())
        return [on, on], tuple(f"planner {p}" for p in _planners(args))
    if args.config_a is not None or args.config_b is not None:
        if args.config_a is None or args.config_b is None:
            missing = "--config-b" if args.config_a is not None else "--config-a"
            raise UsageError(f"{missing}: required when the other of --config-a/--config-b "
                             "is given (ab compares two configs)")
        return ([read_config_arg(args.config_a, "--config-a"),
                 read_config_arg(args.config_b, "--config-b")], ("A", "B"))
    if args.additional_config is None:
        on_text, source = default_config()
    else:
        on_text, source = read_config_arg(args.additional_config)
    try:
        on = json.loads(on_text)
    except ValueError:
        on = None  # emu.spec.check names the JSON error
    if not isinstance(on, dict):
        return [(on_text, source), (on_text, source)], ("DyntraLB off", "DyntraLB on")
    off = copy.deepcopy(on)
    scheduler = off.get("scheduler_config")
    lb = scheduler.get("dyntra_lb_config") if isinstance(scheduler, dict) else None
    if not isinstance(lb, dict) or lb.get("enabled") is not True:
        ignored = "".join(f"; {message}" for message in unknown_keys(on))
        raise UsageError(f"{source}: does not enable DyntraLB "
                         "(scheduler_config.dyntra_lb_config.enabled is not true), so both "
                         "runs of ab would be the same; enable it, or compare two configs "
                         f"with --config-a and --config-b{ignored}")
    lb["enabled"] = False
    return ([(json.dumps(off), f"{source} with DyntraLB disabled"), (on_text, source)],
            ("DyntraLB off", "DyntraLB on"))


def _planners(args) -> tuple[str, str]:
    """The planner of run A (--planner, else the impl's own) and of run B (--planner-b,
    else A's)."""
    from emu.impl import planner_name

    a = planner_name(args.planner, args.impl)
    return a, args.planner_b or a


def _seeds(args) -> list[int]:
    """The workload seeds of the A/B: --seed, or with --seeds N, N of them from --seed."""
    if args.seeds is None:
        return [args.seed]
    if not is_recipe(args.workload):
        raise UsageError(f"--seeds {args.seeds}: needs a generated workload "
                         "(--workload recipe:NAME[,n=N][,rate=R]), whose trace changes with "
                         f"the seed; {args.workload!r} is one fixed trace")
    return list(range(args.seed, args.seed + args.seeds))


def _pairs(args, launch, sources, seeds, out_dir: Path) -> list[list]:
    """Every run of the A/B, checked before the first starts: per seed, [(spec, parsed
    config)] of A and of B. Each seed of a recipe is a trace of its own; run B takes
    --planner-b."""
    b_fields = {} if args.planner_b is None else {"planner": args.planner_b}
    b_flags = {} if args.planner_b is None else {"planner": "--planner-b"}
    pairs, problems = [], []
    for seed in seeds:
        inputs = read_inputs(args, launch.dp, seed=seed)
        base = out_dir if args.seeds is None else out_dir / f"seed{seed}"
        pair = [build_spec(args, launch.dp, inputs, text, base / name, seed=seed, **fields)
                for (text, _), name, fields in zip(sources, RUN_DIRS, ({}, b_fields),
                                                   strict=True)]
        runs = [(pair[0], sources[0][1]), (pair[1], sources[1][1], b_flags)]
        try:
            configs = check_specs(args, inputs, runs, local_ranks=launch.local_ranks)
        except UsageError as exc:
            problems += exc.problems
            continue
        pairs.append(list(zip(pair, configs, strict=True)))
    if problems:
        raise UsageError(*dict.fromkeys(problems))
    return pairs


def cmd_ab(args) -> int:
    launch = resolve_launch(args)
    _check_combinations(args)
    sources, labels = _ab_sources(args)
    seeds = _seeds(args)
    out_dir = out_dir_path(args.out, "ab")
    pairs = _pairs(args, launch, sources, seeds, out_dir)
    warn_ignored_keys("ab", ignored_keys(
        [(config, source) for (_, config), (_, source) in zip(pairs[0], sources, strict=True)]))
    if args.seeds is not None:
        results = _run_seeds(args, seeds, pairs, labels, out_dir)
        return _report_seeds(args, seeds, results, labels, launch.dp, out_dir)
    prepare_out_dir(out_dir, args.overwrite, RUN_DIRS)
    metrics = [run_one(args, spec, config, launch, f"{name.upper()} ({label})")
               for (spec, config), name, label in zip(pairs[0], RUN_DIRS, labels, strict=True)]
    return _report(pairs[0], metrics, labels, out_dir)


def _run_seeds(args, seeds, pairs, labels, out_dir: Path) -> list[list[dict]]:
    """Every run of ``ab --seeds`` as one batch on the executor (``emu.cli.batch``);
    returns [metrics of A, metrics of B] per seed."""
    specs = [spec for pair in pairs for spec, _ in pair]
    names = [f"seed{seed}/{name} ({label})" for seed in seeds
             for name, label in zip(RUN_DIRS, labels, strict=True)]
    with batch_executor(args, specs) as executor:
        prepare_out_dir(out_dir, args.overwrite,
                        tuple(f"seed{s}/{name}" for s in seeds for name in RUN_DIRS))
        note(args, f"ab: {len(seeds)} seeds x 2 runs of {args.workload}, {specs[0].dp_size} "
                   f"ranks, {describe_executor(args)}, {specs[0].transport} transport; "
                   f"writing {out_dir}")
        metrics = run_batch(args, executor, specs, names, "ab --seeds",
                            f"{out_dir}/seed<s>/a and b/")
    return [metrics[i:i + 2] for i in range(0, len(metrics), 2)]


def _report(pair, metrics, labels, out_dir: Path) -> int:
    """One A/B: both runs' metrics side by side, the key metrics, the headroom, notes,
    summary.md and the overlay plots."""
    from emu.metrics import load_run
    from emu.no_effect import no_effect_notes
    from emu.report import ab_table, ab_wall_table, headroom_summary, write_ab_summary_md

    spec = pair[0][0]
    runs = [load_run(out_dir / name) for name in RUN_DIRS]
    from emu.plots import write_ab_plots  # matplotlib: only once both runs are done

    plots = write_ab_plots(runs[0], runs[1], labels, out_dir)
    write_ab_summary_md(out_dir / "summary.md", metrics[0], metrics[1], labels,
                        title=f"dyntra-emu ab: {spec.workload}, dp={spec.dp_size}",
                        plots=plots)
    print(ab_table(metrics[0], metrics[1], labels))
    print()
    wall = ab_wall_table(metrics[0], metrics[1], labels)
    if wall is not None:
        print(wall)
        print()
    print(_ab_headline(metrics[0], metrics[1], labels))
    for line in headroom_summary(metrics[0], metrics[1], labels):
        print(line)
    for label, m in zip(labels, metrics, strict=True):
        for text in no_effect_notes(m):
            print(f"note ({label}): {text}")
    print(f"\nOutputs in {out_dir}/: summary.md, {', '.join(p.name for p in plots)}, "
          f"a/ and b/ (metrics.json and event logs of each run)")
    return 0


def _report_seeds(args, seeds, results, labels, dp: int, out_dir: Path) -> int:
    """``ab --seeds N``: each key delta per seed and its mean with a 95 % confidence
    interval, printed and in summary.md."""
    from emu.no_effect import no_effect_notes

    pairs = [(seed, a, b) for seed, (a, b) in zip(seeds, results, strict=True)]
    table = seed_table(pairs)
    print(f"{labels[1]} vs {labels[0]} on {len(seeds)} seeds of {args.workload}:\n")
    print(table)
    for seed, *metrics in pairs:
        for label, m in zip(labels, metrics, strict=True):
            for text in no_effect_notes(m):
                print(f"note (seed {seed}, {label}): {text}")
    (out_dir / "summary.md").write_text(
        f"# dyntra-emu ab --seeds {args.seeds}: {args.workload}, dp={dp}\n\n"
        f"A = `{labels[0]}`, B = `{labels[1]}`; deltas of B against A, per seed and as the "
        "mean with its 95 % confidence interval (Student's t)\n\n```\n" + table + "\n```\n")
    write_ab_json(out_dir / AB_FILE, workload=args.workload, dp_size=args.dp, labels=labels,
                  pairs=pairs)
    print(f"\nOutputs in {out_dir}/: summary.md, {AB_FILE} (every run's metrics, for "
          "`dyntra-emu gate --baseline`), seed<s>/a and seed<s>/b (metrics.json and event "
          "logs of each run)")
    return 0


def _ab_headline(a: dict, b: dict, labels) -> str:
    """The few numbers a reader looks at first, A -> B."""
    rows = [
        ("DP bubble ratio", a["bubble_ratio"], b["bubble_ratio"], 100, " %"),
        ("balance ratio", a["balance_ratio"], b["balance_ratio"], 1, ""),
        ("bubble-free bound (tok/s)", a["headroom"]["sol_throughput_tok_s"],
         b["headroom"]["sol_throughput_tok_s"], 1, ""),
        ("throughput (tok/s)", a["throughput_tok_s"], b["throughput_tok_s"], 1, ""),
        ("TPOT p50 (ms)", a["tpot_ms"]["p50"], b["tpot_ms"]["p50"], 1, ""),
        ("TPOT p99 (ms)", a["tpot_ms"]["p99"], b["tpot_ms"]["p99"], 1, ""),
        ("virtual time (s)", a["virtual_time_s"], b["virtual_time_s"], 1, ""),
    ]
    if "control_plane" in a or "control_plane" in b:
        rows.append(("DyntraLB control plane (s)", (a.get("control_plane") or {}).get("total_s"),
                     (b.get("control_plane") or {}).get("total_s"), 1, ""))
    width = max(len(r[0]) for r in rows)
    lines = [f"Key metrics, {labels[0]} -> {labels[1]}:"]
    for name, va, vb, scale, unit in rows:
        if va is None or vb is None:
            lines.append(f"  {name:<{width}}  -")
            continue
        rel = f" ({(vb - va) / abs(va) * 100:+.1f} %)" if va else ""
        lines.append(f"  {name:<{width}}  {va * scale:.3f}{unit} -> {vb * scale:.3f}{unit}"
                     f"{rel}")
    return "\n".join(lines)


def _check_combinations(args) -> None:
    if args.additional_config is not None and (args.config_a or args.config_b):
        raise UsageError("--additional-config: not allowed with --config-a/--config-b "
                         "(give either one config for B, or both A and B)")
    if args.seeds is None:
        given = [flag for flag, value in (("--executor ray", args.executor == "ray"),
                                          ("--jobs", args.jobs is not None),
                                          ("--ray-address", args.ray_address is not None))
                 if value]
        if given:
            raise UsageError(f"{given[0]}: only with --seeds N (the runs of the seeds are "
                             "a batch; a single A/B runs its two runs here, one after the "
                             "other)")
    check_executor_flags(args)


def add_parser(sub) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "ab", help="run a workload with DyntraLB off and on (or two configs), compare",
        description=wrap("A/B comparison: the same workload and seed, run once per config, one "
                         "after the other; every metric side by side with its absolute and "
                         "relative change, and plots overlaying both runs."),
        formatter_class=Formatter, allow_abbrev=False, epilog=EPILOG)
    add_input_options(parser, single_config=False)
    parser.add_argument("--additional-config", metavar="JSON|@FILE",
                        help="config of run B; run A is the same config with DyntraLB disabled "
                             "(default: DyntraLB static mode from step 0)")
    parser.add_argument("--config-a", metavar="JSON|@FILE",
                        help="config of run A (with --config-b; instead of --additional-config)")
    parser.add_argument("--config-b", metavar="JSON|@FILE", help="config of run B")
    parser.add_argument("--planner-b", choices=PLANNERS, metavar="NAME",
                        help="run B with this planner (run A: --planner, else the impl's "
                             "own); without --config-a/--config-b both runs use the config "
                             f"with DyntraLB on, so the A/B compares planners. One of "
                             f"{', '.join(PLANNERS)}")
    parser.add_argument("--seeds", type=Int(2, 100).parse, metavar="N",
                        help="with --workload recipe:NAME: run the A/B on N workload seeds "
                             "(--seed, --seed + 1, ...) and report each delta as a mean with a "
                             "95 %% confidence interval")
    add_executor_options(parser, "the runs of --seeds")
    add_run_options(parser)
    parser.set_defaults(func=cmd_ab)
    return parser
