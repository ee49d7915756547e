"""The study's search loop: each round asks trials of the study, runs their first seeds
through the command's executor, prunes those the paired intervals keep off the front,
runs the rest on the remaining seeds and tells the study, with signals held around every
write to its storage."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import signal
import threading
from collections.abc import Callable, Iterator, Sequence

from emu.tune.objectives import estimate, interval_text, objective_value, out_of_reach
from emu.tune.space import Space, config_label
from emu.tune.study import BASELINES_ATTR


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
        shown = "  ".join(f"{name} {interval_text(mean, half, name == 'throughput')}"
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

