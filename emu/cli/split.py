"""``--split N`` on the commands (docs/split.md): its flags, the windows' checked runs,
the windows run as one batch on an executor (``emu.cli.batch``), and their measured
parts stitched (``emu.split.stitch``).

``run --split`` calls ``cmd_run_split``; ``ab --split`` calls ``run_split`` with its two
sides and compares them window by window.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from emu.cli.batch import (
    FILL_CORES,
    add_executor_options,
    batch_executor,
    check_executor_flags,
    describe_executor,
    jobs_filling_cores,
    run_batch,
)
from emu.cli.errors import ClusterFailed, UsageError
from emu.cli.flags import nonnegative_seconds
from emu.cli.inputs import Inputs, checked_spec
from emu.cli.outdir import prepare_out_dir
from emu.cli.progress import note
from emu.knobs import Int
from emu.spec import CheckedRun, SpecError
from emu.split.windows import MAX_WINDOWS, Window, cut

if TYPE_CHECKING:
    from emu.metrics import Run

# Where a split's windows write their runs, under the output directory.
WINDOWS_DIR = "windows"
# --split-warmup's default, in seconds of virtual time (chosen from the measured error
# of benchmarks/split_error.py: benchmarks/RESULTS.md, "Split replay").
DEFAULT_WARMUP_S = 60.0


def add_split_options(parser: argparse.ArgumentParser, what: str) -> None:
    """--split N and --split-warmup S; ``what`` says what the split measures."""
    parser.add_argument(
        "--split", type=Int(2, MAX_WINDOWS).parse, metavar="N",
        help=f"cut the trace into N consecutive windows with an equal share of its requests "
             f"and run them side by side on the executor (--executor, --jobs); {what}. An "
             "approximation, whose measured error is in benchmarks/RESULTS.md "
             "(docs/split.md)")
    parser.add_argument(
        "--split-warmup", type=nonnegative_seconds, metavar="S",
        help="with --split: each window first replays the requests that arrived in the S "
             "seconds of virtual time before it (its warm-up) and last those of the S "
             "seconds after it (its cool-down), run but not measured "
             f"(default: {DEFAULT_WARMUP_S:g})")


def warmup_s(args) -> float:
    """The warm-up in seconds, --split-warmup or its default."""
    return DEFAULT_WARMUP_S if args.split_warmup is None else args.split_warmup


def check_split_flags(args, *, executor_flags: bool) -> None:
    """--split's flags against the others, before any input is read. ``executor_flags``:
    the command has the executor flags for --split alone (``run``), which are refused
    without it."""
    if args.split is None:
        if args.split_warmup is not None:
            raise UsageError("--split-warmup: only with --split N")
        if executor_flags and (args.executor != "local" or args.jobs is not None
                               or args.ray_address is not None):
            given = ("--executor" if args.executor != "local" else
                     "--jobs" if args.jobs is not None else "--ray-address")
            raise UsageError(f"{given}: only with --split N (a whole run is one run, in "
                             "this process)")
        return
    check_executor_flags(args)
    if getattr(args, "fault", None):
        raise UsageError("--fault: not with --split (a fault's step or rank means one run, "
                         "not N windows)")
    if getattr(args, "timeline", None):
        raise UsageError("--timeline: not with --split (each window has its own timeline: "
                         "dyntra-emu timeline DIR/windows/w<k>)")


def add_run_split_options(parser: argparse.ArgumentParser) -> None:
    """``run``'s --split, --split-warmup and the executor flags the windows run on."""
    add_split_options(parser, "their measured parts are stitched into one metrics.json, "
                              "summary and plot set")
    add_executor_options(parser, "--split's windows", FILL_CORES)


def window_specs(args, inputs: Inputs, checked: CheckedRun, source: str, out_dir: Path
                 ) -> tuple[list[Window], list[CheckedRun]]:
    """``checked``'s trace cut into --split windows, and each window's run (its trace, in
    ``out_dir``/windows/w<k>), checked. UsageError when the trace cannot be cut, or when
    a window's spec is refused (naming the window)."""
    spec = checked.spec
    if spec.max_concurrency is not None:
        raise UsageError(f"--split {args.split}: not with --max-concurrency (a closed-loop "
                         "client's send times depend on every earlier request)")
    try:
        windows = cut(spec.trace, args.split, warmup_s(args))
    except ValueError as exc:
        raise UsageError(f"--split {args.split}: {exc}") from None
    runs = []
    for window in windows:
        window_spec = dataclasses.replace(spec, trace=window.trace,
                                          out_dir=out_dir / WINDOWS_DIR / window.name)
        try:
            runs.append(checked_spec(args, inputs, window_spec, source))
        except SpecError as exc:
            raise UsageError(*(f"--split {args.split}, {window.describe()}: {p}"
                               for p in exc.problems)) from None
    return windows, runs


def prepare_windows(out_dir: Path, overwrite: bool, runs: Sequence[CheckedRun]) -> None:
    """The output directory and an empty directory per window: a previous split's
    windows/ is refused, or with --overwrite removed whole (a symbolic link is removed,
    never followed)."""
    prepare_out_dir(out_dir, overwrite)
    stale = out_dir / WINDOWS_DIR
    if os.path.lexists(stale):
        if not overwrite:
            raise UsageError(f"--out {out_dir}: already holds a split ({WINDOWS_DIR}/); "
                             "choose a new directory or pass --overwrite to replace it")
        shutil.rmtree(stale) if stale.is_dir() and not stale.is_symlink() else stale.unlink()
    for checked in runs:
        Path(checked.spec.out_dir).mkdir(parents=True)


@dataclass(frozen=True)
class Side:
    """One run a split cuts into windows: its checked run (whose out_dir gets the
    stitched metrics.json and the windows/ directory), the name of its config in
    messages, and its label in the batch's messages (``ab``'s "A (DyntraLB off)")."""

    checked: CheckedRun
    source: str
    label: str | None = None


@dataclass(frozen=True)
class Stitched:
    """A side's stitched answer: its metrics (written to its metrics.json), the stitched
    run (for plots) and each window's measured metrics, in window order."""

    metrics: dict
    run: Run
    windows: list[dict]


def run_split(args, inputs: Inputs, sides: Sequence[Side], out_dir: Path, what: str
              ) -> tuple[list[Window], list[Stitched]]:
    """Every side cut into the same windows (``window_specs``), all their runs one batch
    on the executor, each side stitched and its metrics.json written. The executor is
    entered, then ``out_dir`` (and each side's directory) prepared, before anything
    runs. A failed window is ClusterFailed naming it, SIGINT or SIGTERM RunInterrupted
    (``run_batch``); nothing is stitched or written then."""
    from emu.metrics import RunError, load_run, write_metrics
    from emu.run import recorded_config

    cut_sides = [window_specs(args, inputs, side.checked, side.source,
                              Path(side.checked.spec.out_dir)) for side in sides]
    windows = cut_sides[0][0]
    runs = [run for _, side_runs in cut_sides for run in side_runs]
    names = [f"{side.label} {w.describe()}" if side.label else w.describe()
             for side in sides for w in windows]
    specs = [run.spec for run in runs]
    spec = sides[0].checked.spec
    with batch_executor(args, specs, jobs_filling_cores(specs)) as executor:
        prepare_out_dir(out_dir, args.overwrite)
        for side, (_, side_runs) in zip(sides, cut_sides, strict=True):
            prepare_windows(Path(side.checked.spec.out_dir), args.overwrite, side_runs)
        note(args, f"{args.command}: {spec.workload} ({len(spec.trace)} requests) in "
                   f"{len(windows)} windows of ~{len(spec.trace) // len(windows)} requests"
                   f"{f' x {len(sides)} runs' if len(sides) > 1 else ''}, "
                   f"{warmup_s(args):g} s warm-up, {spec.dp_size} ranks each, "
                   f"{describe_executor(args, executor, specs[0])}; writing {out_dir}")
        start = time.monotonic()
        run_batch(args, executor, runs, names, what, f"{out_dir}/.../{WINDOWS_DIR}/w<k>/")
        wall = time.monotonic() - start
    note(args, f"{args.command}: {len(runs)} window runs finished in {wall:.1f} s "
               "wall-clock")
    stitched = []
    for i, (side, (_, side_runs)) in enumerate(zip(sides, cut_sides, strict=True)):
        loaded = []
        side_names = names[i * len(windows):(i + 1) * len(windows)]
        for name, checked in zip(side_names, side_runs, strict=True):
            try:
                loaded.append(load_run(checked.spec.out_dir))
            except RunError as exc:
                raise ClusterFailed(f"{name}: its records cannot be read: {exc}") from None
        answer = split_record(windows, loaded, warmup_s(args))
        answer.metrics["config"] = recorded_config(side.checked)
        answer.metrics["seed"] = side.checked.spec.seed
        stitched.append(answer)
    for side, answer in zip(sides, stitched, strict=True):
        write_metrics(answer.metrics, Path(side.checked.spec.out_dir) / "metrics.json")
    return windows, stitched


def split_record(windows: Sequence[Window], loaded: Sequence[Run], warmup: float
                 ) -> Stitched:
    """The stitched answer of the windows' runs (``emu.split.stitch.measured_metrics``)
    with ``split`` recorded in its metrics: the windows, the warm-up, and per window its
    bounds, requests and measured figures (``window_figures``)."""
    from emu.split.stitch import StitchError, measured_metrics

    last = windows[-1].index
    parts = list(zip(windows, loaded, strict=True))
    try:
        metrics, run = measured_metrics(parts, last)
        each = [measured_metrics([part], last)[0] for part in parts]
    except StitchError as exc:
        raise ClusterFailed(str(exc)) from None
    metrics["split"] = {
        "windows": len(windows), "warmup_s": warmup, "stitched": True,
        "per_window": [{"window": w.index, "start_s": w.start_s, "end_s": w.end_s,
                        "requests": len(w.owned), "warmup_requests": len(w.warmup),
                        "cooldown_requests": len(w.cooldown),
                        **window_figures(m)} for w, m in zip(windows, each, strict=True)],
    }
    return Stitched(metrics, run, each)


def window_figures(metrics: dict) -> dict:
    """What metrics.json's ``split.per_window`` keeps of a window's measured metrics."""
    return {"throughput_tok_s": metrics["throughput_tok_s"],
            "bubble_ratio": metrics["bubble_ratio"],
            "tpot_p50_ms": metrics["tpot_ms"]["p50"], "tpot_p99_ms": metrics["tpot_ms"]["p99"],
            "ttft_p99_ms": metrics["ttft_ms"]["p99"],
            "requests_paused_pct": metrics["pauses"]["requests_paused_pct"]}


def window_measured(window: Window, last: int, out_dir: Path) -> dict:
    """The measured metrics of ``window``'s run in ``out_dir`` (``last``: the split's last
    window): what ``tune --split`` takes as a trial's metrics on that window, as it takes
    a seed's."""
    from emu.metrics import load_run
    from emu.split.stitch import measured_metrics

    return measured_metrics([(window, load_run(out_dir))], last)[0]


def split_confidence(search: tuple[float, float] | None, windows: int) -> str:
    """``tune --split``'s line on how sure the recommendation is: its throughput gain
    over the trace's windows (``search``: mean and 95 % half-width, the search's
    estimate), a spread over time."""
    if search is None:
        return "How sure: not measured (throughput is not among the objectives)."
    mean, half = search
    verdict = ("sure it wins on this trace: the 95 % CI lies above 0" if mean - half > 0
               else "it loses on this trace: the 95 % CI lies below 0" if mean + half < 0
               else "not sure: the 95 % CI includes 0")
    return (f"How sure: {verdict}, {mean:+.2f} ± {half:.2f} % throughput over the "
            f"{windows} windows of the trace (a spread over time, one trace; not over seeds: "
            "how it carries over to other traffic is not measured).")


def window_spread(windows: list[tuple[int, dict, dict]], labels) -> str:
    """``ab --split``'s table: each key delta of B against A in every window (its
    measured part) and their mean with a 95 % CI over the windows, headed as what it
    is: a spread over the trace's time, not over seeds."""
    from emu.recipes import seed_table

    return (f"{labels[1]} vs {labels[0]} in each of the {len(windows)} windows of the trace "
            "(a spread over time, one trace; not over seeds):\n\n"
            + seed_table(windows, column="window"))


def stitched_line(metrics: dict) -> str:
    """The sentence that says an answer is stitched, above its summary."""
    split = metrics["split"]
    return (f"Stitched from {split['windows']} windows of the trace run apart, each "
            f"between a {split['warmup_s']:g} s warm-up and a cool-down as long "
            "(docs/split.md): an approximation of the whole run; its measured error is in "
            "benchmarks/RESULTS.md, \"Split replay\".")


def cmd_run_split(args, inputs: Inputs, checked: CheckedRun, source: str,
                  out_dir: Path) -> int:
    """``run --split N``: the windows run on the executor, stitched into the output
    directory's metrics.json, summary.md and plots (written only once every window has
    finished and been stitched)."""
    spec = checked.spec
    _, [answer] = run_split(args, inputs, [Side(checked, source)], out_dir, "the split")
    # Imported only now: matplotlib costs a refused input or a failed run half a second.
    from emu.plots import write_plots
    from emu.report import summary_table, write_summary_md

    metrics = answer.metrics
    plots = write_plots(answer.run, out_dir)
    write_summary_md(out_dir / "summary.md", metrics,
                     title=f"dyntra-emu run --split {args.split}: {spec.workload}, "
                           f"dp={spec.dp_size}", plots=plots, about=[stitched_line(metrics)])
    print(stitched_line(metrics) + "\n")
    print(summary_table(metrics))
    print(f"\nOutputs in {out_dir}/: summary.md, metrics.json, "
          f"{', '.join(p.name for p in plots)}; each window's run in {WINDOWS_DIR}/w<k>/")
    return 0
