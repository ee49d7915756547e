"""`dyntra-emu sweep`: a grid of DyntraLB configs and a baseline on one workload, ranked
(the grid, the runs, the table and the plots are emu.sweep)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import time
from pathlib import Path

from dyntra_lb.config import DyntraLBConfig
from emu.cli.batch import (
    FILL_CORES,
    add_executor_options,
    batch_executor,
    check_executor_flags,
    describe_executor,
    jobs_filling_cores,
    run_batch,
)
from emu.cli.errors import UsageError
from emu.cli.flags import (
    Formatter,
    add_input_options,
    add_output_options,
    positive_ms,
    wrap,
)
from emu.cli.inputs import (
    build_spec,
    check_specs,
    checked_spec,
    default_config,
    read_config_arg,
    read_inputs,
)
from emu.cli.outdir import out_dir_path, prepare_out_dir
from emu.cli.progress import note
from emu.cli.running import resolve_launch
from emu.spec import SpecError
from emu.sweep import (
    GRID_KEYS,
    MAX_POINTS,
    OBJECTIVES,
    best_row,
    build_points,
    make_rows,
    markdown_table,
    pareto_front,
    parse_grid,
    plot_kv_blocks,
    plot_pareto,
    point_spec,
    with_lb,
    write_csv,
)

SWEEP_FILES = ("sweep.json", "sweep.csv", "summary.md", "pareto.png", "kv_blocks.png")

EPILOG = """examples:
  dyntra-emu sweep --workload longtail --dp 8 --grid bubble_threshold=1,2,5,10 \\
      --grid mode=static,dynamic --jobs 2
  dyntra-emu sweep --additional-config @node.json --grid long_req_block_threshold=8,16,32 \\
      --grid mode=dynamic --objective tpot_p99
  dyntra-emu sweep --grid bubble_threshold=1,3,5 --max-tpot-p99-ms 60
  dyntra-emu sweep --grid bubble_threshold=1,3,5 --grid mode=static,dynamic --executor ray \\
      --ray-address 10.0.0.1:6379
"""


def _check_out(out: Path, overwrite: bool) -> Path:
    """As ``prepare_out_dir``, for the sweep's own files and its runs/ tree (removed
    whole; a symbolic link is removed, never followed)."""
    prepare_out_dir(out, overwrite)
    stale = [out / f for f in (*SWEEP_FILES, "runs") if os.path.lexists(out / f)]
    if stale and not overwrite:
        raise UsageError(f"--out {out}: already holds a sweep ({stale[0].name}); choose "
                         "a new directory or pass --overwrite to replace it")
    for p in stale:
        shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    return out


def _check_flags(args) -> None:
    """The sweep's own flags, before any input is read."""
    if not args.grid:
        raise UsageError("--grid: required (e.g. --grid bubble_threshold=1,2,5)")
    check_executor_flags(args)
    if args.device == "npu":
        raise UsageError("--device npu: sweep runs on the thread transport, CPU only")
    if args.max_tpot_p99_ms is not None and args.objective not in (None, "throughput"):
        raise UsageError(f"--max-tpot-p99-ms: picks the highest throughput under a TPOT "
                         f"p99 limit; it does not combine with --objective "
                         f"{args.objective}")


def _specs(args, launch, out_dir: Path):
    """The grid, its points and their checked runs (the base spec from the flags on the
    thread transport, each point's config in it), every one checked before any runs:
    the base config and the workload first, then each --grid value on its own (the
    first one refused is named), then every point. Each config is checked once: a point
    whose config was checked already (the base's, a --grid value's) takes that checked
    run, moved to its own directory."""
    try:
        grid = parse_grid(args.grid)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    text, source = (read_config_arg(args.additional_config)
                    if args.additional_config is not None else default_config())
    inputs = read_inputs(args, launch.dp)
    base = build_spec(args, launch.dp, inputs, text, out_dir, transport="thread")
    [checked] = check_specs(args, inputs, [(base, source)], local_ranks=launch.dp)
    config = checked.config
    try:
        singles = [(f"--grid {key}={value}", with_lb(config.raw, enabled=True, **{key: value}))
                   for key, values in grid.items() for value in values]
        points = build_points(config.raw, grid)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    by_config = {json.dumps(config.raw, sort_keys=True): checked}
    checks = [*((name, dataclasses.replace(base, additional_config=point_config))
                for name, point_config in singles),
              *((p.source, point_spec(base, p, out_dir)) for p in points)]
    runs = []
    for name, spec in checks:
        key = json.dumps(spec.additional_config, sort_keys=True)
        if key not in by_config:
            try:
                by_config[key] = checked_spec(args, inputs, spec, name)
            except SpecError as exc:
                raise UsageError(*(str(p) for p in exc.problems)) from None
        runs.append(by_config[key].at(spec.out_dir))
    return grid, config, base, points, runs[len(singles):]


def cmd_sweep(args) -> int:
    """The ``sweep`` command (cli.main handles UsageError / ClusterFailed exit codes)."""
    launch = resolve_launch(args)
    _check_flags(args)
    objective_name = args.objective or "throughput"
    out_dir = out_dir_path(args.out, "sweep")
    grid, base_config, base, points, runs = _specs(args, launch, out_dir)
    n = len(points) - 1
    if n > MAX_POINTS and not args.yes:
        sizes = " x ".join(str(len(v)) for v in grid.values())
        raise UsageError(f"--grid: {n} points ({sizes}) is more than {MAX_POINTS}; "
                         f"with the baseline that is {n + 1} runs. Pass --yes to run "
                         "them all")
    specs = [checked.spec for checked in runs]
    mode = "async" if base.async_scheduling else "synchronous"
    with batch_executor(args, specs, jobs_filling_cores(specs)) as executor:
        _check_out(out_dir, args.overwrite)
        for spec in specs:
            Path(spec.out_dir).mkdir(parents=True)
        where = describe_executor(args, executor, specs[0])
        note(args, f"sweep: {n} configs + baseline on workload {base.workload} "
                   f"({len(base.trace)} requests), {base.dp_size} ranks, {mode} scheduling, "
                   f"{where}, thread transport; writing {out_dir}")
        start = time.monotonic()
        metrics = run_batch(args, executor, runs,
                            [f"{p.name} ({p.label})" for p in points], "the sweep",
                            f"{out_dir / 'runs'}/<name>/")
        wall = time.monotonic() - start
    results = {p.name: m for p, m in zip(points, metrics, strict=True)}
    note(args, f"sweep: {n + 1} runs finished in {wall:.1f} s wall-clock")

    rows = make_rows(points, results, out_dir)
    front = pareto_front(rows)
    best = best_row(rows, objective_name, args.max_tpot_p99_ms)
    objective = (f"highest throughput with TPOT p99 <= {args.max_tpot_p99_ms:g} ms"
                 if args.max_tpot_p99_ms is not None else
                 {"throughput": "highest throughput", "tpot_p99": "lowest TPOT p99",
                  "bubble": "lowest DP bubble"}[objective_name])
    thresholds = grid.get("long_req_block_threshold",
                          [points[1].config["scheduler_config"]["dyntra_lb_config"].get(
                              "long_req_block_threshold",
                              DyntraLBConfig.long_req_block_threshold)])
    plot_pareto(rows, front, best["name"] if best else None, out_dir / "pareto.png")
    plot_kv_blocks(base.trace, base.block_size, thresholds, out_dir / "kv_blocks.png")
    table = markdown_table(rows, front)
    best_json = json.dumps(best["additional_config"]) if best else None
    (out_dir / "sweep.json").write_text(json.dumps({
        "workload": base.workload, "dp_size": base.dp_size, "seed": base.seed,
        "base_additional_config": base_config.raw, "async_scheduling": base.async_scheduling,
        "grid": grid, "objective": objective,
        "best": best["name"] if best else None, "best_additional_config":
        best["additional_config"] if best else None, "pareto_front": front,
        "wall_s": wall, "rows": rows}, indent=1, sort_keys=True) + "\n")
    write_csv(rows, grid, out_dir / "sweep.csv")
    best_text = (f"Best for {objective}: **{best['name']}** ({best['label']})\n\n"
                 f"```\n--additional-config '{best_json}'\n```" if best else
                 f"No grid point meets the objective ({objective}).")
    (out_dir / "summary.md").write_text(
        f"# dyntra-emu sweep: {base.workload}, dp={base.dp_size}\n\n"
        f"{n} configs and the baseline, seed {base.seed}, {mode} scheduling, "
        f"{wall:.1f} s wall-clock. Changes against the baseline in brackets; * marks the "
        f"Pareto front (throughput against TPOT p99).\n\n{table}\n\n{best_text}\n\n"
        "![Pareto](pareto.png)\n\n![KV blocks](kv_blocks.png)\n")
    print(f"Scheduling: {mode} in every run")
    print(table)
    print()
    if best is None:
        print(f"No grid point meets the objective ({objective}).")
    else:
        print(f"Best for {objective}: {best['name']} ({best['label']}):")
        print(f"--additional-config '{best_json}'")
    print(f"\nOutputs in {out_dir}/: summary.md, sweep.json, sweep.csv, pareto.png, "
          "kv_blocks.png, runs/<name>/ (metrics.json and records of each run)")
    return 0


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``sweep`` on the ``dyntra-emu`` sub-command parser."""
    parser = subparsers.add_parser(
        "sweep", help="run a grid of DyntraLB configs on one workload; rank them",
        description=wrap(
            "Run a grid of DyntraLB configs (the product of every --grid KEY=V1,V2,...) and "
            "a baseline with DyntraLB off on one workload, on the thread transport, --jobs at "
            "a time here or as Ray tasks (--executor ray); write a table of throughput, "
            "bubble, balance and latency with the change against the baseline, a Pareto "
            "plot, and print the best config."),
        formatter_class=Formatter, allow_abbrev=False, epilog=EPILOG)
    add_input_options(parser, single_config=False)
    parser.add_argument("--additional-config", metavar="JSON|@FILE",
                        help="base config the grid modifies (default: DyntraLB static mode "
                             "from step 0); the baseline is it with DyntraLB disabled")
    parser.add_argument("--grid", action="append", metavar="KEY=V1,V2,...",
                        help="a dyntra_lb_config key and its values (repeatable; the grid "
                             f"is the product). Keys: {', '.join(GRID_KEYS)}")
    add_executor_options(parser, "runs", FILL_CORES)
    parser.add_argument("--objective", choices=OBJECTIVES,
                        help="what the best config optimises (default: throughput)")
    parser.add_argument("--max-tpot-p99-ms", type=positive_ms, metavar="MS",
                        help="best = highest throughput among configs with TPOT p99 <= MS")
    parser.add_argument("--yes", action="store_true",
                        help=f"run a grid of more than {MAX_POINTS} points")
    add_output_options(parser)
    parser.set_defaults(func=cmd_sweep)
    return parser
