"""Generator workloads and A/B statistics over workload seeds.

``--workload recipe:NAME[,n=N][,rate=R][,hours=H]`` makes the CLI generate its trace with a
recipe of fixtures/generate.py (``RECIPES`` there), seeded with the run's ``--seed``; a
recipe takes the parameters its function has (mooncake-like: hours and rate).
``dyntra-emu ab --seeds N`` then runs the A/B on N workload seeds and summarises each
key delta as a mean with a 95 % confidence interval (``seed_summary``);
``dyntra-emu gate`` takes such a run as its baseline (``mean_pi``).
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import math
import statistics
from functools import cache
from pathlib import Path

from emu.limits import MAX_TRACE_REQUESTS
from emu.metric_catalogue import in_order, metric

PREFIX = "recipe:"
GENERATOR = Path(__file__).resolve().parent.parent / "fixtures" / "generate.py"
_PARAMS = {"n": int, "rate": float, "hours": float}
_FORMS = {"n": "n=N", "rate": "rate=R", "hours": "hours=H"}

# Two-sided 95 % quantiles of Student's t for 1..30 degrees of freedom.
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201,
        2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069,
        2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
_Z95 = 1.960

# The deltas ab --seeds summarises (emu.metric_catalogue names, in its order) and their
# labels (ab.json's too).
_SEED_LABELS = {"throughput_tok_s": "output throughput",
                "virtual_time_s": "duration (virtual time)",
                "bubble_ratio": "DP bubble ratio (points)",
                "tpot_ms.p50": "TPOT p50",
                "tpot_ms.p99": "TPOT p99"}
# (label, metric path, relative?): a ratio's delta is in percentage points, any other's
# in percent of A.
SEED_DELTAS = tuple((_SEED_LABELS[name], tuple(name.split(".")), metric(name).unit != "ratio")
                    for name in in_order(_SEED_LABELS))


def is_recipe(value: str) -> bool:
    return value.startswith(PREFIX)


@cache
def generator():
    """fixtures/generate.py as a module (its recipes, their constants and setups)."""
    spec = importlib.util.spec_from_file_location("fixtures_generate", GENERATOR)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse_recipe(value: str) -> tuple[str, dict]:
    """``recipe:NAME[,n=N][,rate=R][,hours=H]`` -> (name, keyword arguments): the
    parameters given, among those the recipe's function takes, then those of its
    published setup (``RECIPE_SETUPS``) left out; ValueError names what is wrong."""
    name, kwargs = _given_params(value)
    return name, {**setup_params(value), **kwargs}


def setup_params(value: str) -> dict:
    """The parameters of the recipe ``value`` names that come from its published setup:
    those it does not give itself."""
    name, given = _given_params(value)
    return {key: published for key, published in recipe_setup(name).items()
            if key in _PARAMS and key not in given}


def _given_params(value: str) -> tuple[str, dict]:
    """The recipe's name and the parameters ``value`` gives itself."""
    if not GENERATOR.is_file():
        raise ValueError(f"the recipe generator {GENERATOR} is not installed")
    name, *params = value[len(PREFIX):].split(",")
    recipes = generator().RECIPES
    if name not in recipes:
        raise ValueError(f"unknown recipe {name!r}; recipes are: {', '.join(sorted(recipes))}")
    signature = inspect.signature(recipes[name]).parameters
    taken = [key for key in _PARAMS if key in signature]
    kwargs = {}
    for param in params:
        key, sep, text = param.partition("=")
        if not sep or key not in taken:
            raise ValueError(f"{param!r}: expected {' or '.join(_FORMS[k] for k in taken)}")
        try:
            kwargs[key] = _PARAMS[key](text)
        except ValueError:
            raise ValueError(f"{param!r}: {key} must be a number") from None
    if "hours" in kwargs:  # n follows from the hours and the rate
        rate = kwargs.get("rate", signature["rate"].default)
        requests = kwargs["hours"] * 3600 * rate
        if requests > MAX_TRACE_REQUESTS:
            raise ValueError(f"hours={kwargs['hours']:g}: {requests:,.0f} requests at "
                             f"{rate:g}/s, past {MAX_TRACE_REQUESTS:,}, the limit for a "
                             "trace")
    if kwargs.get("n", 0) > MAX_TRACE_REQUESTS:
        raise ValueError(f"n={kwargs['n']}: at most {MAX_TRACE_REQUESTS:,} requests, the "
                         "limit for a trace")
    return name, kwargs


def recipe_setup(name: str) -> dict:
    """The published setup of recipe ``name`` (``RECIPE_SETUPS`` in fixtures/generate.py:
    RunSpec fields, and recipe parameters such as ``rate``); empty for a recipe that
    rebuilds no published run."""
    return dict(generator().RECIPE_SETUPS.get(name, {}))


# How each setting of a recipe's published setup is given on the command line.
SETUP_FLAGS = {"max_concurrency": "--max-concurrency", "block_size": "--block-size",
               "max_num_seqs": "--max-num-seqs", "router": "--router",
               "cost_model": "--cost-model", "additional_config": "--additional-config",
               "async_scheduling": "--async-scheduling"}


def setup_fields(value: str) -> dict:
    """For ``--workload recipe:NAME...``: the RunSpec fields of the recipe's published
    setup, by field name (empty for another workload or a recipe without one). A command
    runs them wherever its own flags leave a setting out (``emu.cli.recipe_hint``)."""
    if not is_recipe(value):
        return {}
    name, _ = _given_params(value)
    return {field: published for field, published in recipe_setup(name).items()
            if field in SETUP_FLAGS}


def setup_flag(field: str, published) -> str:
    """A setting of a published setup as the flag that gives it."""
    flag = SETUP_FLAGS[field]
    if field == "async_scheduling":
        return flag if published else "--no-async-scheduling"
    if field == "additional_config":
        return f"{flag} '{json.dumps(published)}'"
    return f"{flag} {published}"


def setup_hint(value: str, spec) -> str | None:
    """For ``--workload recipe:NAME`` of a recipe that rebuilds a published run
    (``RECIPE_SETUPS`` in fixtures/generate.py): one line naming the flags that run it as
    published, when ``spec`` (a RunSpec) differs from that setup; None otherwise."""
    flags = []
    for field, published in setup_fields(value).items():
        actual = getattr(spec, field)
        if field == "cost_model":
            actual = actual.name
        elif field == "additional_config":
            actual = json.loads(actual) if isinstance(actual, str) else actual
        if actual != published:
            flags.append(setup_flag(field, published))
    if not flags:
        return None
    name, _ = _given_params(value)
    return (f"hint: {PREFIX}{name} rebuilds a published run; its setup adds "
            f"{' '.join(flags)} (docs/fidelity.md: what is published, cited or assumed)")


def write_recipe_trace(value: str, seed: int, path: Path) -> Path:
    """Generate the recipe's trace with ``seed`` into ``path`` (JSON Lines)."""
    name, kwargs = parse_recipe(value)
    module = generator()
    module.write_trace(module.RECIPES[name](seed=seed, **kwargs), path)
    return path


def _value(metrics: dict, path: tuple):
    for key in path:
        metrics = metrics.get(key) if isinstance(metrics, dict) else None
    return metrics


def _t95(n: int) -> float:
    """The two-sided 95 % quantile of Student's t for a sample of n (n - 1 degrees of
    freedom; the normal quantile beyond 30)."""
    return _T95[n - 2] if n - 1 <= len(_T95) else _Z95


def mean_ci(values: list[float]) -> tuple[float, float]:
    """Mean and half-width of its 95 % confidence interval (Student's t); needs 2+."""
    n = len(values)
    return statistics.fmean(values), _t95(n) * statistics.stdev(values) / math.sqrt(n)


def mean_pi(values: list[float]) -> tuple[float, float]:
    """Mean and half-width of the 95 % prediction interval of one more sample from the
    same population (Student's t; needs 2+): where a single new run's value falls 95 %
    of the time. ``dyntra-emu gate`` compares one run against an ``ab --seeds``
    baseline with it; the confidence interval of the mean (``mean_ci``) narrows with
    more seeds and would flag an ordinary seed."""
    n = len(values)
    return (statistics.fmean(values),
            _t95(n) * statistics.stdev(values) * math.sqrt(1 + 1 / n))


def seed_summary(pairs: list[tuple[int, dict, dict]]) -> list[tuple[str, list, tuple]]:
    """Per key delta: (label, the delta of each seed, (mean, half-width)). A delta is
    in percent of A (relative metrics) or in percentage points (the bubble)."""
    rows = []
    for label, path, relative in SEED_DELTAS:
        deltas = []
        for _, a, b in pairs:
            va, vb = _value(a, path), _value(b, path)
            if va is None or vb is None or (relative and not va):
                deltas = []
                break
            deltas.append((vb - va) / abs(va) * 100 if relative else (vb - va) * 100)
        rows.append((label, deltas, mean_ci(deltas) if len(deltas) >= 2 else None))
    return rows


def seed_table(pairs: list[tuple[int, dict, dict]], column: str = "seed") -> str:
    """The table ``ab --seeds`` prints: each seed's delta and the mean with its CI
    (``ab --split``: each window's, ``column`` "window")."""
    seeds = [seed for seed, _, _ in pairs]
    header = ["B vs A", *(f"{column} {s}" for s in seeds), "mean ± 95 % CI"]
    rows = []
    for label, deltas, ci in seed_summary(pairs):
        unit = " pp" if "points" in label else " %"
        cells = [f"{d:+.2f}{unit}" for d in deltas] or ["-"] * len(seeds)
        rows.append([label, *cells,
                     "-" if ci is None else f"{ci[0]:+.2f} ± {ci[1]:.2f}{unit}"])
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(f"{c:<{w}}" if i == 0 else f"{c:>{w}}"
                       for i, (c, w) in enumerate(zip(row, widths, strict=True))).rstrip()
             for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
