"""The study's objectives: what a trial is measured by, how a run's metrics become an
objective's value, the estimate over seeds, and when one point dominates another."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from emu.metric_catalogue import metric
from emu.recipes import mean_ci


@dataclasses.dataclass(frozen=True)
class Objective:
    """An objective of the study: the catalogue's ``metric`` (emu.metric_catalogue) it
    is measured by, its way and unit from there; a ``gain`` is the metric's change over
    DyntraLB off on the same seed, in percent. ``missing``: why a run without the figure
    has no value (ValueError), or None where no figure counts as 0 (no pause)."""

    name: str
    label: str
    metric: str
    missing: str | None
    gain: bool = False

    @property
    def maximize(self) -> bool:
        return metric(self.metric).better == "higher"

    @property
    def direction(self) -> str:
        """Optuna's: "maximize" or "minimize"."""
        return "maximize" if self.maximize else "minimize"

    @property
    def unit(self) -> str:
        return "%" if self.gain else metric(self.metric).unit


# In the catalogue's order.
OBJECTIVES = {o.name: o for o in (
    Objective("throughput", "throughput gain over DyntraLB off", "throughput_tok_s",
              "no output throughput", gain=True),
    Objective("tpot_p99", "TPOT p99", "tpot_ms.p99", "no TPOT (no request decoded two tokens)"),
    Objective("longest_pause", "longest pause", "pauses.duration_ms.max", None),
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
    objective = OBJECTIVES[name]
    value = _figure(metrics, objective.metric)
    if objective.gain:
        off = _figure(baseline, objective.metric)
        if not value or not off:
            raise ValueError(objective.missing)
        return (value - off) / off * 100
    if value is None and objective.missing is not None:
        raise ValueError(objective.missing)
    return float(value or 0.0)


def _figure(metrics: dict, name: str):
    """The figure a catalogue name (``tpot_ms.p99``) names in a run's metrics, or None."""
    value = metrics
    for part in name.split("."):
        value = (value or {}).get(part)
    return value


def estimate(values: Sequence[float]) -> tuple[float, float]:
    """Mean and half-width of the 95 % confidence interval over seeds (Student's t); a
    single seed has no interval (half-width 0: one fixed trace is exact)."""
    if len(values) == 1:
        return float(values[0]), 0.0
    return mean_ci(list(values))


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



def interval_text(mean: float, half: float, signed: bool) -> str:
    """An estimate as the status lines and the front's table show it: the mean, and its
    95 % half-width unless it is 0 (one seed)."""
    text = f"{mean:+.2f}" if signed else f"{mean:.2f}"
    return text if half == 0 else f"{text} ± {half:.2f}"

