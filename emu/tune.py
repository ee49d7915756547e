"""``dyntra-emu tune``: search DyntraLB's knobs for one workload with Optuna.

    dyntra-emu tune --workload recipe:pr12292,n=200,rate=400 --dp 8 --block-size 2048 \\
        --trials 20 --seeds 3 --jobs 2 --out runs/pr-tune

The DyntraLB feature guide's loop, done for the user: A/B against DyntraLB off, then adjust
``mode``, ``start_step``, ``bubble_threshold``, ``long_req_block_threshold`` and
``dynamic_max_step`` to the workload. Each trial of the study is one config (the base
``--additional-config`` with the trial's knobs set and DyntraLB on), run on ``--seeds``
workload seeds; its objectives are the means over those seeds of

- ``throughput``: the output throughput's gain over DyntraLB off on the same seed, in %
  (maximised);
- ``tpot_p99``: TPOT p99 in ms (minimised);
- ``longest_pause``: the longest pause of any request in ms, 0 without pauses (minimised).

One objective is searched with TPE, several with NSGA-II (a Pareto front). A trial whose
first seeds already keep it off the front is pruned before its last seeds run
(``out_of_reach``: against some finished trial, the 95 % confidence interval of the
difference on the same seeds is on the worse side in every objective). The study lives
in an Optuna storage (SQLite by default), with the settings that made it
(``Fingerprint``) in its user attributes, so the same command resumes it and another
workload is refused.

This module is the study below the command: the objectives, the search space, the
fingerprint, the study's storage, the search loop (``search``: each round's runs go
through the ``run_batch`` it is handed, the command's executor) and the front, the
recommendation and their table and plot. The command (``emu.cli.tune``) reads the
flags, builds and checks the runs' specs, and runs the fresh-seed A/B of the
recommendation.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import math
import os
import signal
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from dyntra_lb.blocks import num_blocks
from dyntra_lb.config import DyntraLBConfig
from emu.recipes import mean_ci

KNOBS = ("mode", "start_step", "bubble_threshold", "long_req_block_threshold",
         "dynamic_max_step")
# Knobs searched only when --knobs names them: the kit's opt-ins, not production's config
# (a RunSpec field each, split off the trial's values by ``spec_fields``).
OPT_IN_KNOBS = ("pause_limit_ms",)
PAUSE_LIMITS_MS = (0, 500, 1000, 2000, 5000)  # 0: no limit; the benchmark's (assumed)
STUDY_NAME = "dyntra-emu tune"
# The study's settings, in its user attributes (Fingerprint), and the baselines' metrics.
FINGERPRINT_ATTR = "dyntra_emu_fingerprint"
BASELINES_ATTR = "dyntra_emu_baselines"

# The search ranges. Assumed, around production's defaults (start_step 250,
# bubble_threshold 5 blocks, dynamic_max_step 256); long_req_block_threshold's range
# comes from the workload (Space.for_traces).
START_STEP = (0, 1000, 50)  # low, high, step
BUBBLE_BLOCKS = (1, 64)  # absolute form: a block imbalance, log scale
BUBBLE_RATIO = (0.05, 0.95, 0.05)  # ratio form, (max - avg) / max: low, high, step
DYNAMIC_MAX_STEP = (16, 2048)  # log scale
# NSGA-II's generation; Optuna's default (50) would make a budget of a few dozen trials
# one random generation. Assumed.
POPULATION = 8
# TPE's random trials before it models the results (Optuna's default is 10). Assumed.
STARTUP_TRIALS = 8


# ----------------------------------------------------------------------- objectives


@dataclasses.dataclass(frozen=True)
class Objective:
    name: str
    label: str
    unit: str
    direction: str  # Optuna's: "maximize" or "minimize"

    @property
    def maximize(self) -> bool:
        return self.direction == "maximize"


OBJECTIVES = {o.name: o for o in (
    Objective("throughput", "throughput gain over DyntraLB off", "%", "maximize"),
    Objective("tpot_p99", "TPOT p99", "ms", "minimize"),
    Objective("longest_pause", "longest pause", "ms", "minimize"),
)}


def parse_names(text: str, known: Sequence[str], flag: str) -> tuple[str, ...]:
    """A comma-separated list of names out of ``known``, each once, in the order given;
    ValueError names the flag and the first name that is not known."""
    names = tuple(n.strip() for n in text.split(","))
    for name in names:
        if name not in known:
            raise ValueError(f"{flag} {text}: unknown name {name!r}; expected some of "
                             f"{', '.join(known)}")
    if len(set(names)) != len(names):
        raise ValueError(f"{flag} {text}: a name is given twice")
    return names


def objective_value(name: str, metrics: dict, baseline: dict) -> float:
    """One run's value of objective ``name``; ``baseline`` is the run with DyntraLB off on
    the same seed. ValueError when the run has no such figure (no finished request)."""
    if name == "throughput":
        on, off = metrics.get("throughput_tok_s"), baseline.get("throughput_tok_s")
        if not on or not off:
            raise ValueError("no output throughput")
        return (on - off) / off * 100
    if name == "tpot_p99":
        value = (metrics.get("tpot_ms") or {}).get("p99")
        if value is None:
            raise ValueError("no TPOT (no request decoded two tokens)")
        return float(value)
    pauses = (metrics.get("pauses") or {}).get("duration_ms") or {}
    return float(pauses.get("max") or 0.0)


def estimate(values: Sequence[float]) -> tuple[float, float]:
    """Mean and half-width of the 95 % confidence interval over seeds (Student's t); a
    single seed has no interval (half-width 0: one fixed trace is exact)."""
    if len(values) == 1:
        return float(values[0]), 0.0
    return mean_ci(list(values))


# ----------------------------------------------------------------------- the space


@dataclasses.dataclass(frozen=True)
class Space:
    """Which knobs the study searches, and the range of ``long_req_block_threshold``:
    from 1 to one block below the largest prompt (a threshold at or above it never arms
    dynamic mode). ``base_mode`` decides whether the dynamic-mode knobs matter when
    ``mode`` is not searched."""

    knobs: tuple[str, ...]
    long_req_blocks: tuple[int, int]
    base_mode: str

    @classmethod
    def for_traces(cls, knobs: Sequence[str], traces: Sequence, block_size: int,
                   base_mode: str) -> Space:
        largest = max((num_blocks(r.prompt_tokens, block_size) for t in traces for r in t),
                      default=1)
        return cls(tuple(knobs), (1, max(1, largest - 1)), base_mode)

    def describe(self) -> dict:
        """The ranges, as the fingerprint records them."""
        return {"knobs": list(self.knobs), "start_step": list(START_STEP),
                **({"pause_limit_ms": list(PAUSE_LIMITS_MS)}
                   if "pause_limit_ms" in self.knobs else {}),
                "bubble_threshold_blocks": list(BUBBLE_BLOCKS),
                "bubble_threshold_ratio": list(BUBBLE_RATIO),
                "long_req_block_threshold": list(self.long_req_blocks),
                "dynamic_max_step": list(DYNAMIC_MAX_STEP), "base_mode": self.base_mode}

    def start_params(self, base: dict) -> dict | None:
        """The Optuna parameters of the base config's own values (its dyntra_lb_config,
        production's defaults for what it leaves out), so that the study tries the
        user's starting point first; None when one of them lies outside the ranges."""
        config = {**dataclasses.asdict(DyntraLBConfig()), **base}
        params: dict = {}
        if "mode" in self.knobs:
            params["mode"] = config["mode"]
        if "start_step" in self.knobs:
            params["start_step"] = config["start_step"]
            if not _on_grid(config["start_step"], *START_STEP):
                return None
        if "bubble_threshold" in self.knobs:
            value = config["bubble_threshold"]
            if value >= 1 and float(value).is_integer() and _on_grid(value, *BUBBLE_BLOCKS):
                params.update(bubble_form="blocks", bubble_threshold_blocks=int(value))
            elif value < 1 and _on_grid(value, *BUBBLE_RATIO):
                params.update(bubble_form="ratio", bubble_threshold_ratio=float(value))
            else:
                return None
        if "pause_limit_ms" in self.knobs:
            params["pause_limit_ms"] = 0  # production: no limit
        if config["mode"] == "dynamic":
            for knob, (low, high) in (("long_req_block_threshold", self.long_req_blocks),
                                      ("dynamic_max_step", DYNAMIC_MAX_STEP)):
                if knob in self.knobs:
                    if not _on_grid(config[knob], low, high):
                        return None
                    params[knob] = config[knob]
        return params

    def suggest(self, trial) -> dict:
        """The trial's dyntra_lb_config keys, asked of the Optuna trial. The dynamic-mode
        knobs are asked only of a dynamic-mode trial (static mode never reads them), and
        ``bubble_threshold`` first picks its form: blocks (>= 1) or a ratio (< 1)."""
        values: dict = {}
        if "mode" in self.knobs:
            values["mode"] = trial.suggest_categorical("mode", ["static", "dynamic"])
        if "start_step" in self.knobs:
            low, high, step = START_STEP
            values["start_step"] = trial.suggest_int("start_step", low, high, step=step)
        if "bubble_threshold" in self.knobs:
            form = trial.suggest_categorical("bubble_form", ["blocks", "ratio"])
            if form == "blocks":
                values["bubble_threshold"] = trial.suggest_int(
                    "bubble_threshold_blocks", *BUBBLE_BLOCKS, log=True)
            else:
                low, high, step = BUBBLE_RATIO
                ratio = trial.suggest_float("bubble_threshold_ratio", low, high, step=step)
                values["bubble_threshold"] = round(ratio, 2)
        if "pause_limit_ms" in self.knobs:
            values["pause_limit_ms"] = trial.suggest_categorical("pause_limit_ms",
                                                                 list(PAUSE_LIMITS_MS))
        if values.get("mode", self.base_mode) == "dynamic":
            if "long_req_block_threshold" in self.knobs:
                values["long_req_block_threshold"] = trial.suggest_int(
                    "long_req_block_threshold", *self.long_req_blocks, log=True)
            if "dynamic_max_step" in self.knobs:
                values["dynamic_max_step"] = trial.suggest_int(
                    "dynamic_max_step", *DYNAMIC_MAX_STEP, log=True)
        return values


def _on_grid(value, low, high, step=None) -> bool:
    """Whether ``value`` is in [low, high] (and on the step's grid from ``low``)."""
    if not low <= value <= high:
        return False
    return step is None or math.isclose((value - low) / step, round((value - low) / step),
                                        abs_tol=1e-9)


def spec_fields(values: dict) -> tuple[dict, dict]:
    """A trial's values split into its dyntra_lb_config keys and the RunSpec fields of
    the opt-in knobs (``pause_limit_ms`` 0 is no limit)."""
    keys = {k: v for k, v in values.items() if k not in OPT_IN_KNOBS}
    fields = {}
    if "pause_limit_ms" in values:
        fields["pause_limit_ms"] = values["pause_limit_ms"] or None
    return keys, fields


def config_label(values: dict) -> str:
    return " ".join(f"{k}={json.dumps(v)}" for k, v in values.items()) or "(the base config)"


# ----------------------------------------------------------------------- the study


@dataclasses.dataclass(frozen=True)
class Fingerprint:
    """What a study's numbers depend on: the workload (each search seed's trace, hashed),
    the engine settings, the base config, the seeds, the objectives and the space. A
    resumed study must have the same; the transport, executor and budget may differ."""

    record: dict

    @classmethod
    def of(cls, *, workload: str, traces: dict[int, Sequence], engine: dict,
           base_config: dict, objectives: Sequence[str], space: Space) -> Fingerprint:
        hashes = {str(seed): _trace_sha256(trace) for seed, trace in traces.items()}
        return cls({"workload": workload, "seeds": sorted(traces), "traces_sha256": hashes,
                    "engine": engine, "base_additional_config": base_config,
                    "objectives": list(objectives), "space": space.describe()})

    def differences(self, stored: dict) -> list[str]:
        """The top-level keys in which ``stored`` differs, each with both values."""
        return [f"{key}: {_short(stored.get(key))} in the study, {_short(value)} here"
                for key, value in self.record.items()
                if json.loads(json.dumps(value)) != stored.get(key)]


def _trace_sha256(trace: Sequence) -> str:
    rows = [[r.request_id, r.arrival_s, r.prompt_tokens, r.output_tokens, r.rank,
             r.priority] for r in trace]
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()


def _short(value) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."


class StudyMismatch(ValueError):
    """The storage holds a study made with other settings; the message lists them."""


def find_study(storage_url: str, fingerprint: Fingerprint) -> bool:
    """Whether the storage holds this command's study, made with ``fingerprint``
    (StudyMismatch when it holds one made otherwise). Problems with the storage itself
    are raised as they come (the command names the flag)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    summaries = optuna.get_all_study_summaries(_storage(storage_url))
    study = next((s for s in summaries if s.study_name == STUDY_NAME), None)
    if study is None:
        return False
    stored = study.user_attrs.get(FINGERPRINT_ATTR)
    if stored is None:
        raise StudyMismatch(f"holds a study named {STUDY_NAME!r} that dyntra-emu tune did "
                            "not make")
    problems = fingerprint.differences(stored)
    if problems:
        raise StudyMismatch("holds a study of another workload or settings: "
                            + "; ".join(problems))
    return True


def open_study(storage_url: str, fingerprint: Fingerprint, objectives: Sequence[str],
               seed: int, first: dict | None = None):
    """The study in ``storage_url``: loaded when there is one (``find_study``), else
    created with ``fingerprint`` and ``first`` (Optuna parameters, ``Space.start_params``)
    as its first trial. The sampler is TPE for one objective, NSGA-II for several, seeded
    with ``seed`` and the number of trials already in the study (a resumed study does not
    draw its first trials again). Trials a stopped process left running are marked
    failed."""
    import optuna

    found = find_study(storage_url, fingerprint)
    storage = _storage(storage_url)
    trials = len(optuna.load_study(study_name=STUDY_NAME, storage=storage).trials) \
        if found else 0
    study = optuna.create_study(storage=storage, study_name=STUDY_NAME,
                                directions=[OBJECTIVES[n].direction for n in objectives],
                                load_if_exists=True,
                                sampler=_sampler(len(objectives), seed + trials))
    if not found:
        study.set_user_attr(FINGERPRINT_ATTR, json.loads(json.dumps(fingerprint.record)))
        if first is not None:
            study.enqueue_trial(first)
    for trial in study.get_trials(deepcopy=False,
                                  states=(optuna.trial.TrialState.RUNNING,)):
        study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
    return study


def delete_study(storage_url: str) -> None:
    """Remove this command's study from the storage, if it is there (--overwrite)."""
    import optuna

    storage = _storage(storage_url)
    if STUDY_NAME in {s.study_name for s in optuna.get_all_study_summaries(storage)}:
        optuna.delete_study(study_name=STUDY_NAME, storage=storage)


def _storage(url: str):
    """The study's storage. A SQLite file that does not exist yet is made whole beside
    its path and moved into place, so a watcher that opens the path as soon as it
    appears never meets a half-made schema (its own schema creation would then collide
    with ours on Optuna's version row)."""
    import optuna

    if not url.startswith("sqlite"):
        return optuna.storages.RDBStorage(url)
    # SQLite: wait for a watcher's read instead of failing with "database is locked".
    kwargs = {"connect_args": {"timeout": 60}}
    path = Path(url.removeprefix("sqlite:///"))
    if url.startswith("sqlite:///") and path.name and not path.exists():
        fresh = path.with_name(f".{path.name}.{os.getpid()}.new")
        optuna.storages.RDBStorage(f"sqlite:///{fresh}", engine_kwargs=kwargs).engine.dispose()
        try:
            os.link(fresh, path)  # fails if another process put its file there first
        except FileExistsError:
            pass
        finally:
            fresh.unlink()
    return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)


def _sampler(objectives: int, seed: int):
    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if objectives == 1:
            return optuna.samplers.TPESampler(seed=seed, n_startup_trials=STARTUP_TRIALS,
                                              multivariate=True, group=True,
                                              constant_liar=True)
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=POPULATION)


# ----------------------------------------------------------------------- the search


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM that arrive inside wait for its end, then act as they would
    have. A study's storage writes in transactions: a stop that cut one in half left the
    SQLite file locked for the clean-up that marks the trials under way as failed, and
    a trial asked for but not yet recorded as under way stayed RUNNING. Only the main
    thread can hold signals; elsewhere the block runs as is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []
    previous = {signum: signal.signal(signum, lambda signum, _: arrived.append(signum))
                for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if arrived and callable(previous[arrived[0]]):
            previous[arrived[0]](arrived[0], None)


def _uninterrupted(method):
    """A method of the search that reads or writes the study, run with signals held."""
    @functools.wraps(method)
    def held(*args, **kwargs):
        with _signals_held():
            return method(*args, **kwargs)
    return held


@dataclasses.dataclass
class Candidate:
    """One trial under way: its number, its knobs and, per seed run so far, the run's
    metrics."""

    trial: object  # optuna.trial.Trial
    values: dict
    metrics: dict[int, dict] = dataclasses.field(default_factory=dict)

    @property
    def number(self) -> int:
        return self.trial.number


# run_batch(runs, names) -> each run's metrics, where a run is (trial number or None for
# the baseline, seed); it raises what the command's batch raises (a failed run, SIGINT).
RunBatch = Callable[[list[tuple[int | None, int, dict]], list[str]], list[dict]]


@dataclasses.dataclass
class Search:
    """One invocation's search: ``trials`` more trials of ``study`` on ``seeds``, ``slots``
    trials at a time, each run through ``run_batch`` (a list of (trial number or None for
    the baseline, seed, dyntra_lb_config keys or None for DyntraLB off)); ``say`` prints a
    status line. ``runs`` counts the runs it made."""

    study: object
    space: Space
    objectives: tuple[str, ...]
    seeds: tuple[int, ...]
    slots: int
    run_batch: RunBatch
    say: Callable[[str], None]
    runs: int = 0
    _under_way: list = dataclasses.field(default_factory=list)

    @property
    def first_seeds(self) -> tuple[int, ...]:
        """The seeds every trial runs before pruning is considered: half of them, at
        least 2 (a confidence interval needs two), and at least one fewer than all."""
        if len(self.seeds) < 3:
            return self.seeds
        return self.seeds[:max(2, math.ceil(len(self.seeds) / 2))]

    def baselines(self) -> dict[int, dict]:
        """DyntraLB off on every seed: from the study, or run now and stored there."""
        with _signals_held():
            stored = self.study.user_attrs.get(BASELINES_ATTR)
        if stored is not None:
            return {int(seed): m for seed, m in stored.items()}
        runs = [(None, seed, None) for seed in self.seeds]
        metrics = self._run(runs, [f"baseline/seed{seed} (DyntraLB off)" for seed in self.seeds])
        baselines = {seed: _kept(m) for seed, m in zip(self.seeds, metrics, strict=True)}
        with _signals_held():
            self.study.set_user_attr(BASELINES_ATTR, {str(s): m for s, m in baselines.items()})
        return baselines

    def run(self, trials: int) -> None:
        """``trials`` more trials, ``slots`` at a time. SIGINT or SIGTERM (or a failed
        run) marks the trials under way as failed and goes on up."""
        import optuna

        baselines = self.baselines()
        try:
            left = trials
            while left > 0:
                batch = [self._ask() for _ in range(min(self.slots, left))]
                left -= len(batch)
                fresh = [c for c in batch if not self._repeat(c)]
                self._run_seeds(fresh, self.first_seeds)
                survivors = [c for c in fresh if not self._pruned(c, baselines)]
                self._run_seeds(survivors, self.seeds[len(self.first_seeds):])
                for candidate in survivors:
                    self._complete(candidate, baselines)
        except BaseException:
            with _signals_held():
                for candidate in self._under_way:
                    self.study.tell(candidate.number, state=optuna.trial.TrialState.FAIL)
                self._under_way.clear()
            raise

    @_uninterrupted
    def _ask(self) -> Candidate:
        trial = self.study.ask()
        candidate = Candidate(trial, self.space.suggest(trial))
        trial.set_user_attr("config", candidate.values)
        self._under_way.append(candidate)
        return candidate

    @_uninterrupted
    def _repeat(self, candidate: Candidate) -> bool:
        """A config an earlier trial ran (the samplers may draw one again from a discrete
        range) takes that trial's outcome without running again."""
        import optuna

        for earlier in self.study.get_trials(deepcopy=False):
            if earlier.number == candidate.number or earlier.user_attrs.get(
                    "config") != candidate.values or "seeds" not in earlier.user_attrs:
                continue
            if earlier.state == optuna.trial.TrialState.COMPLETE:
                self._finish(candidate, earlier.user_attrs, optuna.trial.TrialState.COMPLETE,
                             earlier.values, same_as=earlier.number)
                return True
            if earlier.state == optuna.trial.TrialState.PRUNED:
                self._finish(candidate, earlier.user_attrs, optuna.trial.TrialState.PRUNED,
                             None, same_as=earlier.number)
                return True
        return False

    def _run_seeds(self, candidates: list[Candidate], seeds: Sequence[int]) -> None:
        runs = [(c, seed) for c in candidates for seed in seeds]
        if not runs:
            return
        names = [f"t{c.number:03d}/seed{seed} ({config_label(c.values)})" for c, seed in runs]
        metrics = self._run([(c.number, seed, c.values) for c, seed in runs], names)
        for (candidate, seed), m in zip(runs, metrics, strict=True):
            candidate.metrics[seed] = _kept(m)

    def _run(self, runs: list, names: list[str]) -> list[dict]:
        metrics = self.run_batch(runs, names)
        self.runs += len(runs)
        return metrics

    @_uninterrupted
    def _pruned(self, candidate: Candidate, baselines: dict[int, dict]) -> bool:
        """Prune the candidate when its first seeds' intervals keep it off the front."""
        import optuna

        if len(candidate.metrics) == len(self.seeds):
            return False
        attrs = _attrs(self.objectives, candidate.metrics, baselines)
        finished = [t.user_attrs["seeds"] for t in self.study.get_trials(
            deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))]
        if not out_of_reach(attrs["seeds"], finished, self.objectives):
            return False
        self._finish(candidate, attrs, optuna.trial.TrialState.PRUNED, None)
        return True

    def _complete(self, candidate: Candidate, baselines: dict[int, dict]) -> None:
        import optuna

        attrs = _attrs(self.objectives, candidate.metrics, baselines)
        values = [mean for mean, _ in attrs["estimates"].values()]
        self._finish(candidate, attrs, optuna.trial.TrialState.COMPLETE, values)

    @_uninterrupted
    def _finish(self, candidate: Candidate, attrs: dict, state, values, same_as=None) -> None:
        for key in ("seeds", "estimates"):
            candidate.trial.set_user_attr(key, attrs[key])
        if same_as is not None:
            candidate.trial.set_user_attr("same_as", same_as)
        self.study.tell(candidate.number, values, state=state)
        self._under_way.remove(candidate)
        what = "pruned" if values is None else "done"
        again = "" if same_as is None else f", as trial {same_as} (same config)"
        shown = "  ".join(f"{name} {_interval(mean, half, name == 'throughput')}"
                          for name, (mean, half) in attrs["estimates"].items())
        self.say(f"tune: trial {candidate.number} {what}{again}: "
                 f"{config_label(candidate.values)}: {shown}")


def _kept(metrics: dict) -> dict:
    """What the study keeps of a run's metrics: the objectives' figures."""
    return {"throughput_tok_s": metrics.get("throughput_tok_s"),
            "tpot_ms": {"p99": (metrics.get("tpot_ms") or {}).get("p99")},
            "pauses": {"duration_ms": {"max": ((metrics.get("pauses") or {}).get(
                "duration_ms") or {}).get("max")}}}


def seed_estimates(objectives: Sequence[str], metrics: dict[int, dict],
                   baselines: dict[int, dict]) -> dict[str, tuple[float, float]]:
    """Per objective, the mean and 95 % half-width over the seeds run so far."""
    return {name: estimate([objective_value(name, m, baselines[seed])
                            for seed, m in sorted(metrics.items())])
            for name in objectives}


def _attrs(objectives, metrics: dict[int, dict], baselines: dict[int, dict]) -> dict:
    """A finished trial's user attributes: each seed's objective values and the
    estimates."""
    return {"seeds": {str(seed): {name: objective_value(name, m, baselines[seed])
                                  for name in objectives}
                      for seed, m in sorted(metrics.items())},
            "estimates": seed_estimates(objectives, metrics, baselines)}


def dominates(a: Sequence[float], b: Sequence[float], objectives: Sequence[str]) -> bool:
    """Whether point ``a`` is at least as good as ``b`` in every objective and better in
    one (each objective in its direction)."""
    signs = [1.0 if OBJECTIVES[name].maximize else -1.0 for name in objectives]
    better = [s * x for s, x in zip(signs, a, strict=True)]
    worse = [s * y for s, y in zip(signs, b, strict=True)]
    return (all(x >= y for x, y in zip(better, worse, strict=True))
            and any(x > y for x, y in zip(better, worse, strict=True)))


def out_of_reach(partial: dict[str, dict[str, float]],
                 finished: Sequence[dict[str, dict[str, float]]],
                 objectives: Sequence[str]) -> bool:
    """Whether a trial's first seeds keep it off the front: against some finished trial,
    on the same seeds, the 95 % confidence interval of the difference in every objective
    lies on the side of "no better" (the trial's most favourable end at best equal, and
    worse in one). ``partial`` and each of ``finished`` map a seed (as text) to that
    seed's objective values. Paired by seed, the intervals leave out what the seeds
    share (one seed's traffic is heavier for every config)."""
    for other in finished:
        best_case = []
        for name in objectives:
            diffs = [values[name] - other[seed][name] for seed, values in partial.items()]
            mean, half = estimate(diffs)
            best_case.append(mean + half if OBJECTIVES[name].maximize else mean - half)
        if dominates([0.0] * len(objectives), best_case, objectives):
            return True
    return False


# ----------------------------------------------------------------------- the front


def trial_rows(study, objectives: Sequence[str]) -> list[dict]:
    """One row per finished trial (complete or pruned), in trial order: its knobs, state,
    seeds run and the estimate of each objective."""
    import optuna

    rows = []
    for trial in study.get_trials(deepcopy=False):
        if trial.state not in (optuna.trial.TrialState.COMPLETE,
                               optuna.trial.TrialState.PRUNED):
            continue
        estimates = trial.user_attrs.get("estimates", {})
        rows.append({"number": trial.number, "state": trial.state.name.lower(),
                     "values": trial.user_attrs.get("config", {}),
                     "seeds_run": len(trial.user_attrs.get("seeds", {})),
                     "same_as": trial.user_attrs.get("same_as"),
                     "estimates": {name: list(estimates[name]) for name in objectives
                                   if name in estimates}})
    return rows


def pareto_front(rows: list[dict], objectives: Sequence[str]) -> list[int]:
    """The complete trials no other complete trial dominates (on the means), by trial
    number; a trial that repeats an earlier one's config is left to the earlier one."""
    done = [r for r in rows if r["state"] == "complete" and r["same_as"] is None]
    means = {r["number"]: [r["estimates"][n][0] for n in objectives] for r in done}
    return [n for n, v in means.items()
            if not any(dominates(o, v, objectives) for m, o in means.items() if m != n)]


def recommend(rows: list[dict], front: list[int], objectives: Sequence[str],
              limits: Mapping[str, float], min_gain: float | None = None) -> dict | None:
    """The front's trial with the highest mean throughput gain, or the best by the first
    objective when throughput is not one, among those whose mean of each objective in
    ``limits`` is at most its limit (``--max-tpot-p99-ms``, ``--max-pause-ms``) and whose
    mean gain is at least ``min_gain`` % (``--min-gain``, when throughput is an
    objective); None when no trial qualifies: keep DyntraLB off."""
    gain_floor = min_gain if min_gain is not None and "throughput" in objectives else None
    candidates = [r for r in rows if r["number"] in front and
                  all(r["estimates"][name][0] <= limit for name, limit in limits.items())
                  and (gain_floor is None or r["estimates"]["throughput"][0] >= gain_floor)]
    if not candidates:
        return None
    name = "throughput" if "throughput" in objectives else objectives[0]
    sign = 1.0 if OBJECTIVES[name].maximize else -1.0
    return max(candidates, key=lambda r: (sign * r["estimates"][name][0], -r["number"]))


def front_table(rows: list[dict], front: list[int], objectives: Sequence[str],
                recommended: int | None) -> str:
    """The front as a Markdown table, best throughput first; * marks the recommendation."""
    header = ["trial", "config", *(f"{OBJECTIVES[n].label} ({OBJECTIVES[n].unit}), "
                                   "mean ± 95 % CI" for n in objectives), "seeds"]
    lines = ["| " + " | ".join(header) + " |", "|---|---|" + "---:|" * (len(header) - 2)]
    by_number = {r["number"]: r for r in rows}
    first = objectives[0]
    sign = 1.0 if OBJECTIVES[first].maximize else -1.0
    for number in sorted(front, key=lambda n: -sign * by_number[n]["estimates"][first][0]):
        row = by_number[number]
        cells = [_interval(*row["estimates"][n], signed=n == "throughput") for n in objectives]
        mark = " *" if number == recommended else ""
        lines.append(f"| {number}{mark} | {config_label(row['values'])} | "
                     + " | ".join(cells) + f" | {row['seeds_run']} |")
    return "\n".join(lines)


def _interval(mean: float, half: float, signed: bool) -> str:
    text = f"{mean:+.2f}" if signed else f"{mean:.2f}"
    return text if half == 0 else f"{text} ± {half:.2f}"


def plot_front(rows: list[dict], front: list[int], recommended: int | None,
               path: Path) -> None:
    """Throughput gain against TPOT p99 of every complete trial, with their 95 %
    intervals; the front joined, the recommendation starred, the longest pause as the
    colour."""
    from matplotlib.figure import Figure

    done = [r for r in rows if r["state"] == "complete" and r["same_as"] is None
            and {"throughput", "tpot_p99"} <= set(r["estimates"])]
    fig = Figure(figsize=(9, 6), layout="constrained")
    ax = fig.add_subplot()
    if done:
        xs = [r["estimates"]["tpot_p99"][0] for r in done]
        ys = [r["estimates"]["throughput"][0] for r in done]
        ax.errorbar(xs, ys, xerr=[r["estimates"]["tpot_p99"][1] for r in done],
                    yerr=[r["estimates"]["throughput"][1] for r in done], fmt="none",
                    ecolor="lightgray", zorder=1)
        pauses = [r["estimates"].get("longest_pause", [0.0])[0] for r in done]
        dots = ax.scatter(xs, ys, c=pauses, cmap="viridis", vmin=0.0,
                          vmax=max(max(pauses), 1.0), zorder=2, label="trial")
        fig.colorbar(dots, ax=ax, label="longest pause (ms)")
        line = sorted((r for r in done if r["number"] in front),
                      key=lambda r: r["estimates"]["tpot_p99"][0])
        ax.plot([r["estimates"]["tpot_p99"][0] for r in line],
                [r["estimates"]["throughput"][0] for r in line], color="tab:red",
                marker="o", markerfacecolor="none", markersize=12, label="Pareto front",
                zorder=3)
        for r in line:
            ax.annotate(str(r["number"]), (r["estimates"]["tpot_p99"][0],
                                           r["estimates"]["throughput"][0]),
                        textcoords="offset points", xytext=(6, 4), fontsize="x-small")
        star = next((r for r in done if r["number"] == recommended), None)
        if star is not None:
            ax.scatter([star["estimates"]["tpot_p99"][0]], [star["estimates"]["throughput"][0]],
                       color="gold", edgecolor="black", marker="*", s=260,
                       label=f"recommended (trial {recommended})", zorder=4)
    ax.axhline(0.0, color="black", linewidth=0.8, linestyle="--", label="DyntraLB off")
    ax.set_xlabel("TPOT p99 (ms), mean over the seeds  - lower is better")
    ax.set_ylabel("throughput gain over DyntraLB off (%)  - higher is better")
    ax.set_title("Tune: the trials and their Pareto front")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.savefig(path, dpi=110)
