"""`dyntra-emu ab`: the same workload and seed run twice, DyntraLB off and on (or two
configs), every metric side by side; with --seeds, on several seeds of a recipe.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

from dyntra_lb.config import unknown_keys
from emu.ab_seeds import FILE_NAME as AB_FILE
from emu.ab_seeds import write_ab_json
from emu.cli.batch import (
    FILL_CORES,
    add_executor_options,
    batch_executor,
    check_executor_flags,
    describe_executor,
    jobs_filling_cores,
    run_batch,
)
from emu.cli.errors import PROG, UsageError
from emu.cli.flags import (
    Formatter,
    add_input_options,
    add_run_options,
    non_negative_pct,
    wrap,
)
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
from emu.cli.recipe_hint import print_setup_hint
from emu.cli.running import Measured, resolve_launch, run_one
from emu.cli.split import (
    Side,
    add_split_options,
    check_split_flags,
    run_split,
    stitched_line,
    window_spread,
)
from emu.impl import PLANNERS
from emu.knobs import Int
from emu.recipes import is_recipe, mean_ci, seed_table
from emu.verdict import DEFAULT_MIN_GAIN_PCT, Tail, verdict_line

RUN_DIRS = ("a", "b")
OFF_LABEL = "DyntraLB off"  # run A's label when it is DyntraLB off: the verdict applies
TREE_LABELS = ("tree A", "tree B")

EPILOG = """\
examples:
  dyntra-emu ab --workload longtail
      DyntraLB off (A) vs the default config, static mode from step 0 (B)
  dyntra-emu ab --additional-config @decode_node.json
      the config with DyntraLB disabled (A) vs as given (B)
  dyntra-emu ab --config-a @static.json --config-b @dynamic.json --out runs/modes
  dyntra-emu ab --impl vllm-ascend --vllm-ascend-a ~/src/va-base --vllm-ascend-b ~/src/va \\
      --workload recipe:pr12292,n=300 --seeds 5 --dp 8 --block-size 2048 --transport thread
      a vllm-ascend branch (B) against its base (A): same trace, config and seeds
  dyntra-emu ab --workload recipe:pr12292,n=300 --seeds 5 --executor ray
      the A/B on 5 seeds, its 10 runs as Ray tasks on a local Ray
  dyntra-emu ab --workload my_day.jsonl --split 4 --jobs 2
      one fixed trace in 4 windows per side: the gain of each window and its spread

The output directory gets summary.md, load_ab.png, bubble_ab.png, tpot_ab.png, and
a/ and b/ with each run's records and metrics.json. With --seeds: summary.md,
ab.json (every run's metrics and the deltas; a baseline for `dyntra-emu gate`) and
seed<s>/a, seed<s>/b with each seed's plots. With --vllm-ascend-a/-b, summary.md and
ab.json say which tree is which (path, git commit, content hash).
"""


def _ab_sources(args, trees) -> tuple[list[tuple[str, str]], tuple[str, str]]:
    """The two configs of `ab` as (JSON text, name) and their labels."""
    same_config = trees is not None or (
        args.planner_b is not None and args.config_a is None and args.config_b is None)
    if same_config:
        # A planner or tree A/B: both runs with the config, DyntraLB on.
        on = (read_config_arg(args.additional_config, _config_flag(args))
              if args.additional_config is not None else default_config())
        if trees is not None:
            return [on, on], TREE_LABELS
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
        on_text, source = read_config_arg(args.additional_config, _config_flag(args))
    try:
        on = json.loads(on_text)
    except ValueError:
        on = None  # emu.spec.check names the JSON error
    if not isinstance(on, dict):
        return [(on_text, source), (on_text, source)], (OFF_LABEL, "DyntraLB on")
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
            (OFF_LABEL, "DyntraLB on"))


def _verdict(min_gain: float, pairs: list[tuple], samples: str = "seeds") -> str:
    """The closing verdict of an A/B against DyntraLB off (``emu.verdict``): the
    throughput gain (mean ± 95 % CI over the seeds, or over ``ab --split``'s windows:
    ``samples``), TPOT p99 of both sides (means) and the longest pause of B (the worst
    seed or window)."""
    gains = [(b["throughput_tok_s"] / a["throughput_tok_s"] - 1) * 100 for _, a, b in pairs]
    gain, ci = (gains[0], None) if len(gains) == 1 else mean_ci(gains)

    def mean(side: int, *path):
        values = []
        for pair in pairs:
            value = pair[side]
            for key in path:
                value = (value or {}).get(key)
            if value is None:
                return None
            values.append(value)
        return sum(values) / len(values)

    longest = [(b.get("pauses") or {}).get("longest_paused_ms") for _, _, b in pairs]
    tail = Tail(mean(1, "tpot_ms", "p99"), mean(2, "tpot_ms", "p99"),
                None if None in longest else max(longest))
    return verdict_line(gain, ci, min_gain, tail, seeds=len(pairs), samples=samples)


def _config_flag(args) -> str:
    """What messages call --additional-config's value: the flag, or the recipe's config
    (``emu.cli.recipe_hint``)."""
    return getattr(args, "config_flag", "--additional-config")


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


def _pairs(args, launch, sources, seeds, out_dir: Path, trees) -> list[list]:
    """Every run of the A/B, checked before the first starts: per seed, the checked runs
    (``emu.spec.CheckedRun``) of A and of B. Each seed of a recipe is a trace of its own;
    run B takes --planner-b; with ``trees``, each run its own tree."""
    a_fields, b_fields = {}, {} if args.planner_b is None else {"planner": args.planner_b}
    b_flags = {} if args.planner_b is None else {"planner": "--planner-b"}
    if trees is not None:
        a_fields, b_fields = ({"vllm_ascend": str(tree.root)} for tree in trees)
    pairs, problems = [], []
    for seed in seeds:
        inputs = read_inputs(args, launch.dp, seed=seed)
        base = out_dir if args.seeds is None else out_dir / f"seed{seed}"
        pair = [build_spec(args, launch.dp, inputs, text, base / name, seed=seed, **fields)
                for (text, _), name, fields in zip(sources, RUN_DIRS, (a_fields, b_fields),
                                                   strict=True)]
        runs = [(pair[0], sources[0][1]), (pair[1], sources[1][1], b_flags)]
        try:
            pairs.append(check_specs(args, inputs, runs, local_ranks=launch.local_ranks))
        except UsageError as exc:
            problems += exc.problems
    if problems:
        raise UsageError(*dict.fromkeys(problems))
    return pairs


def cmd_ab(args) -> int:
    launch = resolve_launch(args)
    _check_combinations(args)
    trees = check_trees(args)
    sources, labels = _ab_sources(args, trees)
    seeds = _seeds(args)
    out_dir = out_dir_path(args.out, "ab")
    pairs = _pairs(args, launch, sources, seeds, out_dir, trees)
    warn_ignored_keys("ab", ignored_keys(
        [(checked.config, source) for checked, (_, source) in zip(pairs[0], sources,
                                                                  strict=True)]))
    print_setup_hint(args.workload, pairs[0][1].spec)  # B: the side the published setup ran
    about = [] if trees is None else tree_lines(trees)
    if args.split is not None:
        return _run_split(args, launch, pairs[0], sources, labels, out_dir, about)
    if args.seeds is not None:
        # Each run of the batch has a fresh process of its own (a local job, or one a
        # Ray task starts): two trees on rank threads never meet in one process.
        results = _run_seeds(args, seeds, pairs, labels, out_dir)
        return _report_seeds(args, seeds, results, labels, launch.dp, out_dir, about, trees)
    prepare_out_dir(out_dir, args.overwrite, RUN_DIRS)
    # Rank threads import their tree into the process that hosts them, which can hold
    # one tree: with two trees, each run gets a fresh process of its own.
    apart = trees is not None and args.transport == "thread"
    measured = [run_one(args, checked, launch, f"{name.upper()} ({label})", apart=apart)
                for checked, name, label in zip(pairs[0], RUN_DIRS, labels, strict=True)]
    return _report(pairs[0], measured, labels, out_dir, about, args.min_gain)


def _run_seeds(args, seeds, pairs, labels, out_dir: Path) -> list[list[dict]]:
    """Every run of ``ab --seeds`` as one batch on the executor (``emu.cli.batch``);
    returns [metrics of A, metrics of B] per seed."""
    runs = [checked for pair in pairs for checked in pair]
    specs = [checked.spec for checked in runs]
    names = [f"seed{seed}/{name} ({label})" for seed in seeds
             for name, label in zip(RUN_DIRS, labels, strict=True)]
    with batch_executor(args, specs, jobs_filling_cores(specs)) as executor:
        prepare_out_dir(out_dir, args.overwrite,
                        tuple(f"seed{s}/{name}" for s in seeds for name in RUN_DIRS))
        where = describe_executor(args, executor, specs[0])
        note(args, f"ab: {len(seeds)} seeds x 2 runs of {args.workload}, {specs[0].dp_size} "
                   f"ranks, {where}, {specs[0].transport} transport; "
                   f"writing {out_dir}")
        metrics = run_batch(args, executor, runs, names, "ab --seeds",
                            f"{out_dir}/seed<s>/a and b/")
    return [metrics[i:i + 2] for i in range(0, len(metrics), 2)]


def _run_split(args, launch, pair, sources, labels, out_dir: Path, about: list[str]) -> int:
    """``ab --split N``: both sides cut into the same windows, their 2N runs one batch
    (``emu.cli.split.run_split``), each side stitched into a/ and b/; reported as one
    A/B of the stitched answers, with the gain of each window and its 95 % CI over the
    windows (a spread over time, not over seeds)."""
    inputs = read_inputs(args, launch.dp, seed=args.seed)
    sides = [Side(checked, source, f"{name.upper()} ({label})")
             for checked, (_, source), name, label
             in zip(pair, sources, RUN_DIRS, labels, strict=True)]
    prepare_out_dir(out_dir, args.overwrite, RUN_DIRS)
    _, stitched = run_split(args, inputs, sides, out_dir, "ab --split")
    spread = [(index, a, b) for index, (a, b)
              in enumerate(zip(stitched[0].windows, stitched[1].windows, strict=True))]
    return _report(pair, [Measured(s.metrics, s.run) for s in stitched], labels, out_dir,
                   [*about, stitched_line(stitched[0].metrics)], args.min_gain,
                   windows=spread)


def _report(pair, measured, labels, out_dir: Path, about: list[str], min_gain: float,
            windows: list[tuple] | None = None) -> int:
    """One A/B: both runs' metrics side by side, the key metrics, the headroom, notes,
    summary.md and the overlay plots; ``about`` lines (which tree is which) first. With
    ``windows`` (``ab --split``: (index, metrics of A, metrics of B) per window), each
    window's key deltas and their mean with its 95 % CI over the windows, which the
    verdict takes as ``ab --seeds`` takes its seeds'."""
    from emu.no_effect import no_effect_notes
    from emu.report import (
        ab_table,
        ab_wall_table,
        headroom_summary,
        scheduling_line,
        write_ab_summary_md,
    )

    spec = pair[0].spec
    metrics = [m.metrics for m in measured]
    runs = [m.run for m in measured]
    from emu.plots import write_ab_plots  # matplotlib: only once both runs are done

    plots = write_ab_plots(runs[0], runs[1], labels, out_dir)
    write_ab_summary_md(out_dir / "summary.md", metrics[0], metrics[1], labels,
                        title=f"dyntra-emu ab: {spec.workload}, dp={spec.dp_size}",
                        plots=plots, about=about)
    for line in about:
        print(line)
    print(scheduling_line(metrics[0], metrics[1], labels))
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
    if windows is not None:
        spread = window_spread(windows, labels)
        print(f"\n{spread}")
        with (out_dir / "summary.md").open("a") as summary:
            summary.write(f"\n## The gain per window\n\n```\n{spread}\n```\n")
    if labels[0] == OFF_LABEL:
        print(_verdict(min_gain, windows or [(None, *metrics)],
                       "windows" if windows else "seeds"))
    print(f"\nOutputs in {out_dir}/: summary.md, {', '.join(p.name for p in plots)}, "
          f"a/ and b/ (metrics.json and records of each run)")
    return 0


def _report_seeds(args, seeds, results, labels, dp: int, out_dir: Path, about: list[str],
                  trees) -> int:
    """``ab --seeds N``: each key delta per seed and its mean with a 95 % confidence
    interval, every metric's mean over the seeds with its change and CI, the headroom
    over the seeds; printed, in summary.md and ab.json; each seed's overlay plots in its
    directory."""
    from emu.metrics import load_run
    from emu.no_effect import no_effect_notes
    from emu.plots import write_ab_plots  # matplotlib: only once every run is done
    from emu.report import (
        scheduling_line,
        seed_metric_stats,
        seeds_ab_table,
        seeds_headroom,
        write_ab_seeds_summary_md,
    )

    pairs = [(seed, a, b) for seed, (a, b) in zip(seeds, results, strict=True)]
    table = seed_table(pairs)
    stats = seed_metric_stats(pairs)
    headroom = seeds_headroom(pairs, labels)
    notes = [f"(seed {seed}, {label}) {text}" for seed, *metrics in pairs
             for label, m in zip(labels, metrics, strict=True) for text in no_effect_notes(m)]
    plots = []
    for seed in seeds:
        seed_dir = out_dir / f"seed{seed}"
        plots += write_ab_plots(*(load_run(seed_dir / name) for name in RUN_DIRS), labels,
                                seed_dir)
    about = [*about, scheduling_line(*results[0], labels)]
    for line in about:
        print(line)
    print(f"{labels[1]} vs {labels[0]} on {len(seeds)} seeds of {args.workload}:\n")
    print(table)
    print(f"\nEvery metric, mean over the {len(seeds)} seeds, and the change of "
          f"{labels[1]} against {labels[0]} (mean ± 95 % CI over the seeds):\n")
    print(seeds_ab_table(stats, labels))
    print()
    for line in headroom:
        print(line)
    for text in notes:
        print(f"note {text}")
    if labels[0] == OFF_LABEL:
        print(_verdict(args.min_gain, pairs))
    write_ab_seeds_summary_md(
        out_dir / "summary.md", title=f"dyntra-emu ab --seeds {args.seeds}: "
        f"{args.workload}, dp={dp}", labels=labels, about=about, key_table=table,
        stats=stats, headroom=headroom, notes=notes, plots=plots)
    write_ab_json(out_dir / AB_FILE, workload=args.workload, dp_size=args.dp, labels=labels,
                  pairs=pairs,
                  trees=None if trees is None else [tree.describe() for tree in trees])
    print(f"\nOutputs in {out_dir}/: summary.md, {AB_FILE} (every run's metrics, for "
          "`dyntra-emu gate --baseline`), seed<s>/a and seed<s>/b (metrics.json and event "
          "logs of each run), seed<s>/*_ab.png (each seed's overlay plots)")
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
        ("requests paused (% of requests)", a["pauses"].get("requests_paused_pct"),
         b["pauses"].get("requests_paused_pct"), 1, " %"),
        ("longest time one request paused (s)", a["pauses"].get("longest_paused_ms"),
         b["pauses"].get("longest_paused_ms"), 1e-3, ""),
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
    if args.split is not None and args.seeds is not None:
        raise UsageError(f"--split {args.split}: not with --seeds (the spread of --split is "
                         "over the windows of one trace, that of --seeds over its seeds)")
    if args.seeds is None and args.split is None:
        given = [flag for flag, value in (("--executor ray", args.executor == "ray"),
                                          ("--jobs", args.jobs is not None),
                                          ("--ray-address", args.ray_address is not None))
                 if value]
        if given:
            raise UsageError(f"{given[0]}: only with --seeds N or --split N (their runs are "
                             "a batch; a single A/B runs its two runs here, one after the "
                             "other)")
    check_split_flags(args, executor_flags=False)
    check_executor_flags(args)


def check_trees(args):
    """The two vllm-ascend trees of ``--vllm-ascend-a/-b`` (``emu.impl.vllm_ascend.tree.
    Tree``), checked as a run checks its tree, or None without them. Refused in one line:
    one without the other, either without --impl vllm-ascend, with --vllm-ascend (they
    name both trees) or with what makes the two runs differ otherwise (--config-a/-b,
    --planner-b), and a path that is not a vllm-ascend tree. The same code twice (equal
    content hashes) is allowed, with a warning: an A-A run is how a user checks that
    the A/B itself adds no difference."""
    given = {flag: path for flag, path in (("--vllm-ascend-a", args.vllm_ascend_a),
                                           ("--vllm-ascend-b", args.vllm_ascend_b))
             if path is not None}
    if not given:
        return None
    if len(given) == 1:
        [(flag, _)] = given.items()
        other = "--vllm-ascend-b" if flag == "--vllm-ascend-a" else "--vllm-ascend-a"
        raise UsageError(f"{other}: required with {flag} (a tree A/B runs one vllm-ascend "
                         "tree per side)")
    if args.impl != "vllm-ascend":
        raise UsageError(f"--vllm-ascend-a: needs --impl vllm-ascend (the trees are "
                         f"vllm-ascend's code; --impl {args.impl} runs ours)")
    for flag, value in (("--vllm-ascend", args.vllm_ascend), ("--config-a", args.config_a),
                        ("--config-b", args.config_b), ("--planner-b", args.planner_b)):
        if value is not None:
            raise UsageError(f"{flag}: not allowed with --vllm-ascend-a/--vllm-ascend-b (a "
                             "tree A/B runs the same config and planner on both trees; "
                             "compare configs or planners on one tree with --vllm-ascend)")
    from emu.impl.vllm_ascend.tree import TreeError, resolve

    trees = []
    for flag, path in given.items():
        try:
            trees.append(resolve(path))
        except TreeError as exc:
            raise UsageError(f"{flag}: {exc}") from None
    hashes = [tree.describe()["vllm_ascend_sha256"] for tree in trees]
    if hashes[0] == hashes[1]:
        print(f"{PROG} ab: warning: --vllm-ascend-a and --vllm-ascend-b hold the same "
              f"vllm-ascend (content sha256 {hashes[0][:16]}): an A-A run, whose every "
              "change should be 0", file=sys.stderr, flush=True)
    return tuple(trees)


def tree_lines(trees) -> list[str]:
    """Which tree is which: the lines ab prints and summary.md starts with."""
    lines = []
    for label, tree in zip(TREE_LABELS, trees, strict=True):
        about = tree.describe()
        commit = about["vllm_ascend_commit"]
        lines.append(f"{label}: {about['vllm_ascend']} ("
                     f"{'git ' + commit[:12] if commit else 'not a git checkout'}, content "
                     f"sha256 {about['vllm_ascend_sha256'][:16]})")
    return lines


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
    parser.add_argument("--vllm-ascend-a", metavar="PATH",
                        help="with --impl vllm-ascend: run A on this vllm-ascend tree (your "
                             "branch's base; with --vllm-ascend-b). Both runs take the same "
                             "trace, config, planner and seeds; with --transport thread each "
                             "run has a process of its own")
    parser.add_argument("--vllm-ascend-b", metavar="PATH",
                        help="run B on this vllm-ascend tree (your branch; with "
                             "--vllm-ascend-a)")
    parser.add_argument("--seeds", type=Int(2, 100).parse, metavar="N",
                        help="with --workload recipe:NAME: run the A/B on N workload seeds "
                             "(--seed, --seed + 1, ...) and report each delta as a mean with a "
                             "95 %% confidence interval")
    parser.add_argument("--min-gain", type=non_negative_pct, default=DEFAULT_MIN_GAIN_PCT,
                        metavar="PCT",
                        help="against DyntraLB off, the closing verdict calls DyntraLB worth "
                             "it when its throughput gain is at least PCT %% (over --seeds, "
                             "with its 95 %% CI above 0), and quotes its tail cost either way "
                             f"(default: {DEFAULT_MIN_GAIN_PCT:g}; emu/verdict.py says why)")
    add_split_options(parser, "each side is stitched from their measured parts, and the "
                              "gain of each window reported with its 95 %% CI over the "
                              "windows (a spread over time, not over seeds)")
    add_executor_options(parser, "the runs of --seeds or --split", FILL_CORES)
    add_run_options(parser)
    parser.set_defaults(func=cmd_ab)
    return parser
