"""`dyntra-emu tune`: an Optuna study of DyntraLB's knobs on one workload, kept in a
storage it resumes from; the Pareto front, the recommended config and its A/B against
DyntraLB off on fresh seeds (the study itself is emu.tune)."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from emu.cli.batch import (
    add_executor_options,
    batch_executor,
    check_executor_flags,
    describe_executor,
    run_batch,
)
from emu.cli.errors import RunInterrupted, Terminated, UsageError
from emu.cli.flags import (
    Formatter,
    add_input_options,
    add_output_options,
    non_negative_pct,
    positive_ms,
    wrap,
)
from emu.cli.inputs import (
    Inputs,
    build_spec,
    check_specs,
    checked_spec,
    read_config_arg,
    read_inputs,
)
from emu.cli.outdir import out_dir_path, prepare_out_dir
from emu.cli.progress import note
from emu.cli.running import resolve_launch
from emu.cli.split import add_split_options, check_split_flags, window_measured, window_specs
from emu.cli.tune_ab import confidence, run_ab
from emu.knobs import Int
from emu.recipes import is_recipe, seed_summary, seed_table
from emu.run import recorded_config
from emu.spec import RunSpec, SpecError, check
from emu.sweep import with_lb
from emu.tune import (
    BASELINES_ATTR,
    BUBBLE_BLOCKS,
    BUBBLE_RATIO,
    DYNAMIC_MAX_STEP,
    KNOBS,
    OBJECTIVES,
    OPT_IN_KNOBS,
    PAUSE_LIMITS_MS,
    START_STEP,
    STUDY_NAME,
    Fingerprint,
    Search,
    Space,
    StudyMismatch,
    config_label,
    delete_study,
    find_study,
    front_table,
    open_study,
    pareto_front,
    parse_names,
    plot_front,
    recommend,
    spec_fields,
    trial_rows,
)
from emu.verdict import DEFAULT_MIN_GAIN_PCT

# The files tune writes into --out besides its storage; --overwrite removes them.
TUNE_FILES = ("tune.json", "summary.md", "front.png", "recommended.json", "runs", "ab")
STORAGE_FILE = "study.db"
# Production's default config, DyntraLB on: what the knobs start from without
# --additional-config.
BASE_CONFIG = {"scheduler_config": {"dyntra_lb_config": {"enabled": True}}}
DEFAULT_SEEDS = 3
INSTALL_HINT = "pip install -e '.[tune]'"

EPILOG = """examples:
  dyntra-emu tune --workload recipe:pr12292,n=200,rate=400 --max-concurrency 128 --dp 8 \\
      --block-size 2048 --trials 20 --jobs 2 --out runs/pr-tune
      20 trials of 3 seeds each, then the recommendation's A/B on 3 fresh seeds
  dyntra-emu tune ... --out runs/pr-tune --trials 10
      the same command again resumes the study in runs/pr-tune/study.db: 10 more trials
  dyntra-emu tune --workload my_trace.jsonl --objectives throughput --knobs mode,start_step
      one objective (TPE), two knobs, on one fixed trace
  python -c "import optuna; s = optuna.load_study(study_name='dyntra-emu tune', \\
      storage='sqlite:///runs/pr-tune/study.db'); print(len(s.trials), s.best_trials)"
      watch the study from another process

--out DIR gets summary.md, tune.json (every trial, the front, the recommendation, the
A/B), front.png, recommended.json (for --additional-config @recommended.json), runs/
(each trial's runs) and ab/ (the A/B's runs and ab.json).
"""


def cmd_tune(args) -> int:
    if importlib.util.find_spec("optuna") is None:
        raise UsageError(f"tune: Optuna is not installed; install it with {INSTALL_HINT}")
    launch = resolve_launch(args)
    try:
        objectives = parse_names(args.objectives, tuple(OBJECTIVES), "--objectives")
        knobs = parse_names(args.knobs, KNOBS + OPT_IN_KNOBS, "--knobs")
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    check_executor_flags(args)
    check_split_flags(args, executor_flags=False)
    if args.trials == 0:
        raise UsageError("--trials 0: an empty budget, no trial would run; give 1 or more "
                         "(a resumed study adds that many)")
    limits = _limits(args, objectives)
    seeds, ab_seeds = _seeds(args)
    out_dir = out_dir_path(args.out, "tune")
    text, source = (read_config_arg(args.additional_config)
                    if args.additional_config is not None
                    else (json.dumps(BASE_CONFIG), "the default config (DyntraLB on)"))
    bases, inputs, base_checked = _base_specs(
        args, launch, text, source, [args.seed] if args.split else seeds + ab_seeds, out_dir)
    windows = []  # --split: the windows stand for the seeds, each measured part a seed's
    if args.split is not None:
        windows, runs = window_specs(args, inputs, base_checked, source, out_dir)
        bases = {window.index: run.spec for window, run in zip(windows, runs, strict=True)}
    base_config = base_checked.config.raw
    lb = base_config["scheduler_config"]["dyntra_lb_config"]
    space = Space.for_traces(knobs, [bases[s].trace for s in seeds], bases[seeds[0]].block_size,
                             lb.get("mode", "dynamic"))
    _check_space(args, inputs, bases[seeds[0]], base_config, source, space)
    engine = {k: v for k, v in recorded_config(base_checked).items()
              if k not in ("additional_config", "workload", "device")}
    fingerprint = Fingerprint.of(workload=args.workload, traces={s: bases[s].trace for s in seeds},
                                 engine=engine, base_config=base_config,
                                 objectives=objectives, space=space)
    storage = args.storage or f"sqlite:///{(out_dir / STORAGE_FILE).resolve()}"
    resuming = _check_storage(args, storage, fingerprint, out_dir)

    def spec_of(trial: int | None, seed: int, values: dict | None) -> RunSpec:
        run_dir = out_dir / "runs" / ("baseline" if trial is None else f"t{trial:03d}") \
            / f"seed{seed}"
        if values is None:
            return dataclasses.replace(bases[seed], out_dir=run_dir,
                                       additional_config=with_lb(base_config, enabled=False))
        keys, fields = spec_fields(values)
        return dataclasses.replace(bases[seed], out_dir=run_dir, **fields,
                                   additional_config=with_lb(base_config, enabled=True, **keys))

    with batch_executor(args, [bases[seeds[0]]]) as executor:
        _prepare_out(args, out_dir, storage, resuming)
        study = _open(storage, fingerprint, objectives, args.seed, space.start_params(lb))
        slots = executor.slots(bases[seeds[0]])
        where = describe_executor(args, executor, bases[seeds[0]])
        note(args, f"tune: {'resuming the study' if resuming else 'a new study'} in "
                   f"{storage}: {args.trials} more trial(s) of {len(seeds)} seed(s) each on "
                   f"{args.workload}, {launch.dp} ranks, {where}, "
                   f"{args.transport} transport, {slots} trial(s) at a time")

        def batch(runs, names):
            checked = [check(spec_of(*run)) for run in runs]  # each run's spec, once
            for run in checked:
                _fresh_dir(Path(run.spec.out_dir))
            metrics = run_batch(args, executor, checked, names, "the study",
                                f"{out_dir / 'runs'}/<trial>/seed<s>/")
            return metrics if not windows else [
                window_measured(windows[seed], windows[-1].index, Path(run.spec.out_dir))
                for (_, seed, _), run in zip(runs, checked, strict=True)]

        search = Search(study=study, space=space, objectives=objectives, seeds=tuple(seeds),
                        slots=slots, run_batch=batch, say=lambda text: note(args, text))
        with _resumable(storage, study):
            search.run(args.trials)
        rows = trial_rows(study, objectives)
        front = pareto_front(rows, objectives)
        best = recommend(rows, front, objectives, limits, args.min_gain)
        ab = None
        if best is not None and ab_seeds:
            with _resumable(storage, study):
                ab = run_ab(args, executor, bases, ab_seeds, base_config, best, out_dir)
    return _report(args, out_dir, storage, study, rows, front, best, ab, base_config,
                   objectives, limits, seeds, ab_seeds, search.runs)


# The flags that bound the recommendation, each by the objective it limits.
LIMIT_FLAGS = {"tpot_p99": "max_tpot_p99_ms", "longest_pause": "max_pause_ms"}


def _limits(args, objectives: Sequence[str]) -> dict[str, float]:
    """The recommendation's bounds given on the command line, by objective; a bound
    needs its objective among the study's."""
    limits = {name: getattr(args, flag) for name, flag in LIMIT_FLAGS.items()
              if getattr(args, flag) is not None}
    for name in limits:
        if name not in objectives:
            raise UsageError(f"--{LIMIT_FLAGS[name].replace('_', '-')}: needs {name} among "
                             "--objectives")
    return limits


def _seeds(args) -> tuple[list[int], list[int]]:
    """The search's workload seeds and the A/B's fresh ones after them (none for a
    trace file: it is one workload whatever the seed); with --split, the windows'
    indices, and no A/B."""
    if args.split is not None:
        if args.seeds is not None or args.ab_seeds is not None:
            raise UsageError(f"--split {args.split}: not with --seeds or --ab-seeds (its "
                             "spread is over the windows of one trace, not over seeds)")
        return list(range(args.split)), []
    recipe = is_recipe(args.workload)
    count = args.seeds if args.seeds is not None else (DEFAULT_SEEDS if recipe else 1)
    if not recipe:
        for flag, value in (("--seeds", args.seeds), ("--ab-seeds", args.ab_seeds)):
            if value is not None and value > 1:
                raise UsageError(f"{flag} {value}: needs a generated workload (--workload "
                                 f"recipe:NAME[,n=N][,rate=R]); {args.workload!r} is one "
                                 "fixed trace, the same run on every seed")
        return [args.seed], []
    search = list(range(args.seed, args.seed + count))
    fresh = args.ab_seeds if args.ab_seeds is not None else DEFAULT_SEEDS
    return search, list(range(search[-1] + 1, search[-1] + 1 + fresh))


def _base_specs(args, launch, text: str, source: str, seeds: list[int], out_dir: Path):
    """Each seed's RunSpec with the base config, checked; the first seed's inputs and
    checked run; and the base config parsed. Every problem of every seed is listed at
    once."""
    bases, problems, first, first_checked = {}, [], None, None
    for seed in seeds:
        inputs = read_inputs(args, launch.dp, seed=seed)
        first = first or inputs
        spec = build_spec(args, launch.dp, inputs, text, out_dir, seed=seed,
                          transport=args.transport)
        try:
            [checked] = check_specs(args, inputs, [(spec, source)], local_ranks=launch.dp)
        except UsageError as exc:
            problems += exc.problems
            continue
        bases[seed] = spec
        first_checked = first_checked or checked
    if problems:
        raise UsageError(*dict.fromkeys(problems))
    try:
        with_lb(first_checked.config.raw)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return bases, first, first_checked


def _check_space(args, inputs: Inputs, base: RunSpec, base_config: dict, source: str,
                 space: Space) -> None:
    """Every knob at both ends of its range, on the base config, must be a config the
    checks accept (the base's end_step, say, may leave no room for a late start_step)."""
    ends = {"mode": ["static", "dynamic"], "start_step": [START_STEP[0], START_STEP[1]],
            "bubble_threshold": [BUBBLE_BLOCKS[0], BUBBLE_BLOCKS[1], BUBBLE_RATIO[0]],
            "long_req_block_threshold": list(space.long_req_blocks),
            "dynamic_max_step": list(DYNAMIC_MAX_STEP),
            "pause_limit_ms": [PAUSE_LIMITS_MS[-1]]}
    for knob in space.knobs:
        for value in ends[knob]:
            keys, fields = spec_fields({knob: value})
            spec = dataclasses.replace(
                base, additional_config=with_lb(base_config, enabled=True, **keys), **fields)
            try:
                checked_spec(args, inputs, spec, f"{source} with {knob}={json.dumps(value)}")
            except SpecError as exc:
                raise UsageError(f"--knobs {knob}: the search range reaches {knob}="
                                 f"{json.dumps(value)}, which {source} does not allow: "
                                 f"{exc.problems[0].message}") from None


def _check_storage(args, url: str, fingerprint: Fingerprint, out_dir: Path) -> bool:
    """Whether the storage already holds this study (the command resumes it). Another
    study there, or a storage that cannot be read, is refused before anything starts;
    with --overwrite nothing is read (the study is removed once the executor is up)."""
    default = url == f"sqlite:///{(out_dir / STORAGE_FILE).resolve()}"
    if args.overwrite or (default and not (out_dir / STORAGE_FILE).exists()):
        return False
    try:
        return find_study(url, fingerprint)
    except StudyMismatch as exc:
        raise UsageError(f"--storage {url}: {exc}; choose another --out or --storage, or "
                         "pass --overwrite to start the study again") from None
    except Exception as exc:  # SQLAlchemy's and Optuna's errors: the URL or the file
        raise UsageError(f"--storage {url}: not an Optuna storage this command can open: "
                         f"{_first_line(exc)}") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _prepare_out(args, out_dir: Path, storage: str, resuming: bool) -> None:
    """--out DIR made. A resumed study rewrites its own files there at the end. Else an
    earlier run's or study's files are refused, or with --overwrite removed with the
    study in the storage."""
    if resuming:
        out_dir.mkdir(parents=True, exist_ok=True)
        return
    prepare_out_dir(out_dir, args.overwrite)
    ours = [out_dir / name for name in TUNE_FILES if os.path.lexists(out_dir / name)]
    if args.overwrite:
        for path in ours:
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
        try:
            delete_study(storage)
        except Exception as exc:
            raise UsageError(f"--storage {storage}: cannot remove the study: "
                             f"{_first_line(exc)}") from None
    elif ours:
        raise UsageError(f"--out {out_dir}: holds the files of a study ({ours[0].name}) "
                         f"but --storage {storage} holds no study to resume; choose a new "
                         "directory or pass --overwrite to start again")


def _open(storage: str, fingerprint: Fingerprint, objectives, seed: int, first):
    try:
        return open_study(storage, fingerprint, objectives, seed, first)
    except StudyMismatch as exc:
        raise UsageError(f"--storage {storage}: {exc}") from None
    except Exception as exc:
        raise UsageError(f"--storage {storage}: cannot open or create the study: "
                         f"{_first_line(exc)}") from None


def _fresh_dir(path: Path) -> None:
    """A run's directory, empty: a run a stopped command left half done is run again."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    path.mkdir(parents=True)


class _resumable:
    """A stop (SIGINT, SIGTERM) while the study runs says how to resume it: the
    interrupted batch's message, or for a signal between batches one of its own."""

    def __init__(self, storage: str, study):
        self.storage = storage
        self.study = study

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if exc is None or not isinstance(exc, (RunInterrupted, KeyboardInterrupt)):
            return False
        finished = _counts(self.study)
        hint = (f" The study keeps its {finished['complete'] + finished['pruned']} finished "
                f"trial(s) in {self.storage}; run the same command again to resume it.")
        if isinstance(exc, RunInterrupted):
            raise RunInterrupted(str(exc) + hint, exc.exit_code) from None
        name, code = (("SIGTERM", 143) if isinstance(exc, Terminated)
                      else ("SIGINT", 130))
        raise RunInterrupted(f"interrupted by {name}; no run was under way; no table or "
                             f"plots were written.{hint}", code) from None


def _counts(study) -> dict[str, int]:
    counts = {"complete": 0, "pruned": 0, "fail": 0, "running": 0, "waiting": 0}
    for trial in study.get_trials(deepcopy=False):
        counts[trial.state.name.lower()] += 1
    return counts


# ----------------------------------------------------------------------- the report


def _baseline_tpot(study, seeds) -> float | None:
    """TPOT p99 of DyntraLB off, the mean over the search's seeds (the tail a gain is
    paid against)."""
    stored = study.user_attrs.get(BASELINES_ATTR) or {}
    values = [((stored.get(str(s)) or {}).get("tpot_ms") or {}).get("p99") for s in seeds]
    return None if not values or None in values else sum(values) / len(values)


def recommendation_text(rows, front, best, recommended, objectives, limits,
                        min_gain: float, tpot_off: float | None) -> str:
    """What tune recommends and why: the chosen trial, how it was chosen and its tail cost
    next to its gain; or "keep DyntraLB off" with the front's numbers that say why."""
    by_number = {r["number"]: r for r in rows}

    def tail(row) -> str:
        est = row["estimates"]
        parts = []
        if "tpot_p99" in est:
            off = "" if tpot_off is None else (f" against DyntraLB off's {tpot_off:.1f} ms "
                                               f"({est['tpot_p99'][0] / tpot_off:.2f}x)")
            parts.append(f"TPOT p99 {est['tpot_p99'][0]:.1f} ms{off}")
        if "longest_pause" in est:
            parts.append(f"longest pause {est['longest_pause'][0]:.0f} ms")
        return ", ".join(parts) or "tails not among the objectives"

    def gain(row) -> str:
        value = row["estimates"].get("throughput")
        return "gain not an objective" if value is None else f"gain {value[0]:+.2f} %"

    rules = [f"a mean throughput gain of at least --min-gain {min_gain:g} %"
             if "throughput" in objectives else None,
             *(f"{OBJECTIVES[name].label} at most {limit:g} {OBJECTIVES[name].unit}"
               for name, limit in limits.items())]
    rules = " and ".join(r for r in rules if r)
    if best is None:
        ranked = sorted((by_number[n] for n in front),
                        key=lambda r: -r["estimates"].get("throughput", (0.0,))[0])[:3]
        why = "; ".join(f"trial {r['number']}: {gain(r)}, {tail(r)}" for r in ranked)
        return (f"Recommended: keep DyntraLB off. No trial of the Pareto front has {rules}. "
                f"The front's best: {why}.")
    fields = spec_fields(best["values"])[1]
    flag = ("" if not fields.get("pause_limit_ms") else
            f" --pause-limit-ms {fields['pause_limit_ms']} (--impl kit only: not in "
            "production)")
    chosen = ("the highest mean throughput gain" if "throughput" in objectives
              else f"the best {OBJECTIVES[objectives[0]].label}")
    return (f"Recommended: trial {best['number']} ({config_label(best['values'])}): "
            f"{gain(best)} at a tail cost of {tail(best)}.\n"
            f"Chosen as {chosen} among the Pareto front's trials with {rules or 'no limit'}."
            f"\n--additional-config '{json.dumps(recommended)}'{flag}")


def _report(args, out_dir: Path, storage: str, study, rows, front, best, ab, base_config,
            objectives, limits, seeds, ab_seeds, runs: int) -> int:
    counts = _counts(study)
    table = front_table(rows, front, objectives, None if best is None else best["number"])
    recommended = None if best is None else with_lb(base_config, enabled=True,
                                                    **spec_fields(best["values"])[0])
    plot_front(rows, front, None if best is None else best["number"], out_dir / "front.png")
    if recommended is not None:
        (out_dir / "recommended.json").write_text(json.dumps(recommended, indent=1) + "\n")
    elif (out_dir / "recommended.json").exists():
        (out_dir / "recommended.json").unlink()
    sure = confidence(best, ab, not is_recipe(args.workload), args.split)
    ab_table = None if ab is None else seed_table(ab["pairs"])
    ab_runs = 0 if ab is None else 2 * len(ab["seeds"])
    study_line = (f"Study: {sum(counts.values())} trials ({counts['complete']} complete, "
                  f"{counts['pruned']} pruned, {counts['fail']} failed) in {storage}; this "
                  f"command ran {runs + ab_runs} runs ({runs} for the search, {ab_runs} for "
                  "the A/B)")
    (out_dir / "tune.json").write_text(json.dumps({
        "workload": args.workload, "study_name": STUDY_NAME, "storage": storage,
        "seeds": seeds, "ab_seeds": ab_seeds, "objectives": list(objectives),
        "limits": limits, "trial_counts": counts, "runs": {"search": runs, "ab": ab_runs},
        "trials": rows, "pareto_front": front,
        "recommended": None if best is None else {
            "trial": best["number"], "values": best["values"], "estimates": best["estimates"],
            "additional_config": recommended},
        "ab": None if ab is None else {
            "seeds": ab["seeds"], "labels": list(ab["labels"]),
            "deltas": [{"label": label, "per_seed": values,
                        "mean": None if ci is None else ci[0],
                        "ci95": None if ci is None else ci[1]}
                       for label, values, ci in seed_summary(ab["pairs"])]},
        "confidence": sure}, indent=1, sort_keys=True) + "\n")
    rec_text = recommendation_text(rows, front, best, recommended, objectives, limits,
                                   args.min_gain, _baseline_tpot(study, seeds))
    ab_intro = "" if ab is None else (
        f"A/B of trial {best['number']} against DyntraLB off on {len(ab['seeds'])} fresh "
        f"seeds ({', '.join(map(str, ab['seeds']))}), runs in {out_dir / 'ab'}:")
    md = [f"# dyntra-emu tune: {args.workload}", f"{study_line}.",
          f"The Pareto front (* the recommendation), means over {len(seeds)} "
          f"{'windows' if args.split else 'seed(s)'}:", table,
          f"```\n{rec_text}\n```\n\n(`recommended.json` holds the config.)"]
    if ab is not None:
        md += [ab_intro, f"```\n{ab_table}\n```"]
    md += [sure, "![front](front.png)"]
    (out_dir / "summary.md").write_text("\n\n".join(md) + "\n")
    print(table)
    print()
    print(rec_text)
    print()
    if ab is not None:
        print(f"{ab_intro}\n\n{ab_table}\n")
    print(sure)
    print(f"{study_line}.")
    print(f"\nOutputs in {out_dir}/: summary.md, tune.json, front.png, recommended.json, "
          "runs/<trial>/seed<s>/, ab/")
    return 0


# ----------------------------------------------------------------------- the parser


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``tune`` on the ``dyntra-emu`` sub-command parser."""
    parser = subparsers.add_parser(
        "tune", help="search DyntraLB's knobs for a workload (Optuna); resumable",
        description=wrap(
            "Search DyntraLB's knobs (mode, start_step, bubble_threshold in blocks or as a "
            "ratio, long_req_block_threshold, dynamic_max_step) for one workload with "
            "Optuna: TPE for one objective, NSGA-II for several. Each trial runs on "
            "--seeds workload seeds against DyntraLB off on the same seeds; a trial whose "
            "confidence interval keeps it off the front is pruned early. The study lives "
            "in --storage (default: study.db in --out), so the same command resumes it. "
            "Prints the Pareto front, the recommended config and its A/B against DyntraLB "
            "off on fresh seeds."),
        formatter_class=Formatter, allow_abbrev=False, epilog=EPILOG)
    add_input_options(parser, single_config=False)
    parser.add_argument("--additional-config", metavar="JSON|@FILE",
                        help="base config the trials modify (default: production's, "
                             "{\"enabled\": true}); the baseline is it with DyntraLB off")
    parser.add_argument("--transport", choices=("thread", "process"), default="thread",
                        help="how each run's ranks run (default: thread; the same results)")
    parser.add_argument("--trials", type=Int(0, 10_000).parse, default=20, metavar="N",
                        help="trials this command adds to the study (default: 20)")
    parser.add_argument("--seeds", type=Int(1, 100).parse, metavar="N",
                        help=f"workload seeds per trial, --seed on (a recipe: default "
                             f"{DEFAULT_SEEDS}; a trace file: 1, its only workload)")
    parser.add_argument("--ab-seeds", type=Int(0, 100).parse, metavar="N",
                        help="fresh seeds (after the search's) of the recommendation's A/B "
                             f"against DyntraLB off (a recipe only; default {DEFAULT_SEEDS})")
    parser.add_argument("--objectives", default=",".join(OBJECTIVES), metavar="LIST",
                        help="what the study optimises, comma-separated, of "
                             f"{', '.join(OBJECTIVES)} (default: all)")
    parser.add_argument("--knobs", default=",".join(KNOBS), metavar="LIST",
                        help=f"the dyntra_lb_config keys searched, of {', '.join(KNOBS)} "
                             "(default: all), and the kit's opt-in pause_limit_ms (--impl "
                             "kit only; searched over "
                             f"{', '.join(map(str, PAUSE_LIMITS_MS))} ms, 0 = no limit; only "
                             "when named)")
    parser.add_argument("--storage", metavar="URL",
                        help="the study's Optuna storage (default: sqlite:///DIR/study.db "
                             "in --out); the same storage again resumes the study")
    parser.add_argument("--min-gain", type=non_negative_pct, default=DEFAULT_MIN_GAIN_PCT,
                        metavar="PCT",
                        help="recommend only a config whose mean throughput gain over "
                             "DyntraLB off is at least PCT %% (with its tails within "
                             "--max-tpot-p99-ms and --max-pause-ms); when none on the front "
                             "is, the recommendation is \"keep DyntraLB off\", with the "
                             f"numbers (default: {DEFAULT_MIN_GAIN_PCT:g}; emu/verdict.py "
                             "says why)")
    parser.add_argument("--max-tpot-p99-ms", type=positive_ms, metavar="MS",
                        help="recommend the front's best throughput with TPOT p99 <= MS")
    parser.add_argument("--max-pause-ms", type=positive_ms, metavar="MS",
                        help="recommend the front's best throughput whose longest pause "
                             "(mean over the seeds) is <= MS")
    add_split_options(parser, "each trial is measured on each window's measured part, "
                              "which pruning and \"How sure\" take as they take seeds (a "
                              "spread over time)")
    add_executor_options(parser, "the trials' runs",
                         "1: a study's trials depend on how many are asked at once")
    add_output_options(parser)
    parser.set_defaults(func=cmd_tune)
    return parser

