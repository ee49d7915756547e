"""``ab.json``: the machine-readable record of ``dyntra-emu ab --seeds N``.

The command (emu/cli/ab.py) writes it next to its summary.md once every seed's A/B has
run; ``dyntra-emu gate --baseline`` (emu/gate.py) reads it to take one side's metrics
over the seeds as a baseline with a spread. It holds each run's whole ``metrics.json``,
so the file alone is a baseline a CI job can keep without the run directories. Layout
(docs/nightly.md):

    {"kind": "ab-seeds", "schema_version": 1, "workload": ..., "dp_size": ...,
     "labels": {"a": ..., "b": ...}, "seeds": [s, ...],
     "runs": [{"seed": s, "a": {"dir": "seed<s>/a", "metrics": {...}}, "b": {...}}, ...],
     "deltas": [{"label", "metric", "unit", "per_seed", "mean", "ci95"}, ...],
     "metrics": [{"metric", "a_mean", "b_mean", "delta", "delta_ci95", "delta_pct",
                  "delta_pct_ci95"}, ...],
     "trees": {"a": {...}, "b": {...}}}   # only for --vllm-ascend-a/-b

``metrics`` is every metric of the A/B table over the seeds (``emu.report.
seed_metric_stats``); ``trees`` says which vllm-ascend tree each side ran (path, git
commit, content hash, vLLM's version).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from emu.recipes import SEED_DELTAS, seed_summary
from emu.report import seed_metric_stats

FILE_NAME = "ab.json"
KIND = "ab-seeds"
SCHEMA_VERSION = 1
SIDES = ("a", "b")


class AbFileError(ValueError):
    """ab.json is unreadable or not the file ``ab --seeds`` writes; the message names the
    file and what is wrong."""


@dataclass
class AbSeeds:
    """What ``gate`` needs of an ab.json: the labels of both sides and, per side, each
    seed's metrics in seed order."""

    path: Path
    labels: dict[str, str]
    seeds: list[int]
    metrics: dict[str, list[dict]]


def write_ab_json(path: Path, *, workload: str, dp_size: int, labels, pairs,
                  trees: list[dict] | None = None) -> None:
    """Write ``path`` from ``pairs``: (seed, metrics of A, metrics of B) per seed, the
    metrics as each run's metrics.json holds them; ``trees`` (tree A's and B's
    description) for a tree A/B."""
    deltas = [{"label": label, "metric": ".".join(metric_path),
               "unit": "%" if relative else "pp", "per_seed": values,
               "mean": ci[0] if ci else None, "ci95": ci[1] if ci else None}
              for (label, values, ci), (_, metric_path, relative)
              in zip(seed_summary(pairs), SEED_DELTAS, strict=True)]
    record = {
        "kind": KIND, "schema_version": SCHEMA_VERSION, "workload": workload,
        "dp_size": dp_size, "labels": dict(zip(SIDES, labels, strict=True)),
        "seeds": [seed for seed, _, _ in pairs],
        "runs": [{"seed": seed, **{side: {"dir": f"seed{seed}/{side}", "metrics": m}
                                   for side, m in zip(SIDES, (a, b), strict=True)}}
                 for seed, a, b in pairs],
        "deltas": deltas,
        "metrics": seed_metric_stats(pairs),
    }
    if trees is not None:
        record["trees"] = dict(zip(SIDES, trees, strict=True))
    Path(path).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")


def is_ab_json(record) -> bool:
    """Whether a parsed JSON document is an ab.json (and not, say, a metrics.json)."""
    return isinstance(record, dict) and record.get("kind") == KIND


def parse_ab_json(record: dict, path: Path) -> AbSeeds:
    """The parsed ab.json ``record`` read from ``path``; AbFileError names a missing or
    malformed part."""
    try:
        labels = {side: str(record["labels"][side]) for side in SIDES}
        runs = record["runs"]
        seeds = [int(run["seed"]) for run in runs]
        metrics = {side: [run[side]["metrics"] for run in runs] for side in SIDES}
    except (KeyError, TypeError, ValueError) as exc:
        raise AbFileError(f"{path}: not a complete ab.json of `ab --seeds` "
                          f"({type(exc).__name__}: {exc})") from None
    if record.get("schema_version") != SCHEMA_VERSION:
        raise AbFileError(f"{path}: schema_version {record.get('schema_version')!r}; this "
                          f"version of dyntra-emu reads {SCHEMA_VERSION}")
    if len(seeds) < 2 or not all(isinstance(m, dict) for ms in metrics.values() for m in ms):
        raise AbFileError(f"{path}: needs the metrics of 2 or more seeds per side")
    return AbSeeds(path=path, labels=labels, seeds=seeds, metrics=metrics)
