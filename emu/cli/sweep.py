"""`dyntra-emu sweep`: a grid of DyntraLB configs and a baseline on one workload, ranked
(the grid, the runs, the table and the plots are emu.sweep)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

from dyntra_lb.config import DyntraLBConfig, load_additional_config
from emu.cli.errors import UsageError
from emu.cli.flags import DEFAULT_DP, Formatter, add_input_options, add_output_options, wrap
from emu.cli.inputs import (
    DEFAULT_ADDITIONAL_CONFIG,
    build_spec,
    check_config,
    prepare,
    read_config_arg,
)
from emu.cli.outdir import prepare_out_dir
from emu.cli.progress import note
from emu.knobs import Int
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
    run_points,
    write_csv,
)

SWEEP_FILES = ("sweep.json", "sweep.csv", "summary.md", "pareto.png", "kv_blocks.png")

EPILOG = """examples:
  dyntra-emu sweep --workload longtail --dp 8 --grid bubble_threshold=1,2,5,10 \\
      --grid mode=static,dynamic --jobs 2
  dyntra-emu sweep --additional-config @node.json --grid long_req_block_threshold=8,16,32 \\
      --grid mode=dynamic --objective tpot_p99
  dyntra-emu sweep --grid bubble_threshold=1,3,5 --max-tpot-p99-ms 60
"""


def _check_out(value: str | None, overwrite: bool) -> Path:
    """As ``prepare_out_dir``, for the sweep's own files and its runs/ tree (removed
    whole; a symbolic link is removed, never followed)."""
    out = prepare_out_dir(value, overwrite, "sweep")
    stale = [out / f for f in (*SWEEP_FILES, "runs") if os.path.lexists(out / f)]
    if stale and not overwrite:
        raise UsageError(f"--out {out}: already holds a sweep ({stale[0].name}); choose "
                             "a new directory or pass --overwrite to replace it")
    for p in stale:
        shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    return out


def cmd_sweep(args) -> int:
    """The ``sweep`` command (cli.main handles UsageError / ClusterFailed exit codes)."""
    if args.dp is None:
        args.dp = DEFAULT_DP
    args.torchrun = None
    args.transport = "thread"
    if not args.grid:
        raise UsageError("--grid: required (e.g. --grid bubble_threshold=1,2,5)")
    cores = os.cpu_count() or 1
    if args.jobs > cores:
        raise UsageError(f"--jobs {args.jobs}: more than the {cores} cores of this "
                             "machine (each job is a busy process of its own)")
    if args.device == "npu":
        raise UsageError("--device npu: sweep runs on the thread transport, CPU only")
    if args.max_tpot_p99_ms is not None and args.objective not in (None, "throughput"):
        raise UsageError(f"--max-tpot-p99-ms: picks the highest throughput under a TPOT "
                             f"p99 limit; it does not combine with --objective "
                             f"{args.objective}")
    args.objective = args.objective or "throughput"
    grid = parse_grid(args.grid)
    base_text, source = (read_config_arg(args.additional_config)
                         if args.additional_config is not None
                         else (json.dumps(DEFAULT_ADDITIONAL_CONFIG), "the default config"))
    base, problems = check_config(base_text, source, args)
    if problems:
        raise UsageError(problems[0])
    points = build_points(base.raw, grid, args)
    n = len(points) - 1
    if n > MAX_POINTS and not args.yes:
        sizes = " x ".join(str(len(v)) for v in grid.values())
        raise UsageError(f"--grid: {n} points ({sizes}) is more than {MAX_POINTS}; "
                             f"with the baseline that is {n + 1} runs. Pass --yes to run "
                             "them all")
    prepared = prepare(args, [(json.dumps(p.config), p.name) for p in points[:1]])
    for p in points:  # the last gate: the same checks as a run's RunSpec
        build_spec(args, prepared, load_additional_config(json.dumps(p.config)),
                       Path("."))
    out_dir = _check_out(args.out, args.overwrite)

    note(args, f"sweep: {n} configs + baseline on workload {prepared.workload_label} "
                    f"({len(prepared.trace)} requests), {args.dp} ranks, {args.jobs} "
                    f"job(s) at a time, thread transport; writing {out_dir}")
    start = time.monotonic()
    results = run_points(args, points, prepared, out_dir)
    wall = time.monotonic() - start
    note(args, f"sweep: {n + 1} runs finished in {wall:.1f} s wall-clock")

    rows = make_rows(points, results, out_dir)
    front = pareto_front(rows)
    best = best_row(rows, args.objective, args.max_tpot_p99_ms)
    objective = (f"highest throughput with TPOT p99 <= {args.max_tpot_p99_ms:g} ms"
                 if args.max_tpot_p99_ms is not None else
                 {"throughput": "highest throughput", "tpot_p99": "lowest TPOT p99",
                  "bubble": "lowest DP bubble"}[args.objective])
    thresholds = grid.get("long_req_block_threshold",
                          [points[1].config["scheduler_config"]["dyntra_lb_config"].get(
                              "long_req_block_threshold",
                              DyntraLBConfig.long_req_block_threshold)])
    plot_pareto(rows, front, best["name"] if best else None, out_dir / "pareto.png")
    plot_kv_blocks(prepared.trace, args.block_size, thresholds,
                   out_dir / "kv_blocks.png")
    table = markdown_table(rows, front)
    best_json = json.dumps(best["additional_config"]) if best else None
    (out_dir / "sweep.json").write_text(json.dumps({
        "workload": prepared.workload_label, "dp_size": args.dp, "seed": args.seed or 0,
        "base_additional_config": base.raw, "grid": grid, "objective": objective,
        "best": best["name"] if best else None, "best_additional_config":
        best["additional_config"] if best else None, "pareto_front": front,
        "wall_s": wall, "rows": rows}, indent=1, sort_keys=True) + "\n")
    write_csv(rows, grid, out_dir / "sweep.csv")
    best_text = (f"Best for {objective}: **{best['name']}** ({best['label']})\n\n"
                 f"```\n--additional-config '{best_json}'\n```" if best else
                 f"No grid point meets the objective ({objective}).")
    (out_dir / "summary.md").write_text(
        f"# dyntra-emu sweep: {prepared.workload_label}, dp={args.dp}\n\n"
        f"{n} configs and the baseline, seed {args.seed or 0}, "
        f"{wall:.1f} s wall-clock. Changes against the baseline in brackets; * marks the "
        f"Pareto front (throughput against TPOT p99).\n\n{table}\n\n{best_text}\n\n"
        "![Pareto](pareto.png)\n\n![KV blocks](kv_blocks.png)\n")
    print(table)
    print()
    if best is None:
        print(f"No grid point meets the objective ({objective}).")
    else:
        print(f"Best for {objective}: {best['name']} ({best['label']}):")
        print(f"--additional-config '{best_json}'")
    print(f"\nOutputs in {out_dir}/: summary.md, sweep.json, sweep.csv, pareto.png, "
          "kv_blocks.png, runs/<name>/ (metrics.json and event logs of each run)")
    return 0


def _positive_ms(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected milliseconds > 0, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected milliseconds > 0, got {text!r}")
    return value


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``sweep`` on the ``dyntra-emu`` sub-command parser."""
    parser = subparsers.add_parser(
        "sweep", help="run a grid of DyntraLB configs on one workload; rank them",
        description=wrap(
            "Run a grid of DyntraLB configs (the product of every --grid KEY=V1,V2,...) and "
            "a baseline with DyntraLB off on one workload, --jobs at a time on the thread "
            "transport; write a table of throughput, bubble, balance and latency with the "
            "change against the baseline, a Pareto plot, and print the best config."),
        formatter_class=Formatter, allow_abbrev=False, epilog=EPILOG)
    add_input_options(parser, single_config=False)
    parser.add_argument("--additional-config", metavar="JSON|@FILE",
                        help="base config the grid modifies (default: DyntraLB static mode "
                             "from step 0); the baseline is it with DyntraLB disabled")
    parser.add_argument("--grid", action="append", metavar="KEY=V1,V2,...",
                        help="a dyntra_lb_config key and its values (repeatable; the grid "
                             f"is the product). Keys: {', '.join(GRID_KEYS)}")
    parser.add_argument("--jobs", type=Int(1).parse, default=1, metavar="N",
                        help="runs at a time, one process each (default: 1; at most the "
                             "number of cores)")
    parser.add_argument("--objective", choices=OBJECTIVES,
                        help="what the best config optimises (default: throughput)")
    parser.add_argument("--max-tpot-p99-ms", type=_positive_ms, metavar="MS",
                        help="best = highest throughput among configs with TPOT p99 <= MS")
    parser.add_argument("--yes", action="store_true",
                        help=f"run a grid of more than {MAX_POINTS} points")
    add_output_options(parser)
    parser.set_defaults(func=cmd_sweep)
    return parser
