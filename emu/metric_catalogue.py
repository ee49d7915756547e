"""The metric catalogue: what every command that judges or lists a run's metrics knows
about them, written once. A metric is named as ``emu.report.flat_metrics`` names it
(``tpot_ms.p99``, ``per_rank.2.utilisation``; ``*`` in a catalogue name stands for one
part, a rank's index); each has its unit, the way that is plainly better, if any, and the
tolerance ``dyntra-emu gate`` checks it with by default, if any.

Read by ``emu.report`` (the order of metrics.json's sections in the A/B tables),
``emu.gate`` (the default checks and the better way, which refuses a one-sided ``--tol``
that would fail improvements), ``emu.sweep`` (its table's metrics and the better way of
its ``--objective``), ``emu.recipes`` (the deltas ``ab --seeds`` summarises) and
``emu.tune`` (each objective's metric and direction). Each of them lists the metrics it
shows in the catalogue's order (``in_order``).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable


@dataclasses.dataclass(frozen=True)
class Metric:
    """One metric: ``name`` (flat, dotted), ``unit`` ("ratio" is a fraction in 0..1),
    ``better`` ("higher", "lower" or None when neither is plainly better) and the gate's
    default ``tolerance`` (its ``--tol`` syntax; None: not checked unless asked)."""

    name: str
    unit: str
    better: str | None
    tolerance: str | None = None

    def matches(self, name: str) -> bool:
        return _pattern(self.name).fullmatch(name) is not None


_LATENCIES = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "queue_ms")
_LATENCY_STATS = ("mean", "p50", "p90", "p99", "max")

# The order every consumer lists metrics in. The gate's default checks come first (their
# tolerances: "exact" must not move; "-X%" may fall by at most X % of the baseline;
# "+X" may rise by at most X in the metric's unit: the bubble and balance ratios' 0.01 is
# one percentage point, the share of requests paused is in percent, so +5 is five points).
_CHECKED = (
    Metric("requests_total", "requests", None, "exact"),
    Metric("requests_finished", "requests", None, "exact"),
    Metric("output_tokens", "tokens", None, "exact"),
    Metric("throughput_tok_s", "tok/s", "higher", "-2%"),
    Metric("virtual_time_s", "s", "lower", "+2%"),
    Metric("bubble_ratio", "ratio", "lower", "+0.01"),
    Metric("balance_ratio", "ratio", "higher", "-0.01"),
    Metric("tpot_ms.p50", "ms", "lower", "+5%"),
    Metric("tpot_ms.p99", "ms", "lower", "+10%"),
    Metric("ttft_ms.p50", "ms", "lower", "+10%"),
    Metric("ttft_ms.p99", "ms", "lower", "+10%"),
    Metric("itl_ms.p99", "ms", "lower", "+10%"),
    Metric("e2e_ms.p99", "ms", "lower", "+10%"),
    Metric("preemptions", "count", "lower", "+0"),
    Metric("pauses.requests_paused_pct", "%", None, "+5"),
    Metric("pauses.longest_paused_ms", "ms", None, "+10%"),
)
CATALOGUE: tuple[Metric, ...] = (
    *_CHECKED,
    Metric("ttft_ms.p90", "ms", "lower"),
    Metric("pauses.total", "pauses", None),
    Metric("pauses.duration_ms.max", "ms", "lower"),
    *(Metric(f"{latency}.{stat}", "ms", "lower") for latency in _LATENCIES
      for stat in _LATENCY_STATS
      if f"{latency}.{stat}" not in {m.name for m in _CHECKED} | {"ttft_ms.p90"}),
    Metric("busy_time_s", "s", "lower"),
    Metric("headroom.cost_balance_ratio", "ratio", "higher"),
    Metric("per_rank.*.utilisation", "ratio", "higher"),
)

# metrics.json's sections in the order the A/B tables list them (every flat metric of a
# section together); a section not named here would follow in sorted order.
SECTIONS = (
    "throughput_tok_s", "bubble_ratio", "balance_ratio", "balance_steps", "headroom",
    "control_plane", "steps",
    "virtual_time_s", "busy_time_s", "requests_finished", "requests_total",
    "output_tokens", "ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "queue_ms", "pauses",
    "plan_churn", "per_rank", "lb_activity", "preemptions", "requests_unfinished", "run_state",
)
# Sections of metrics.json that are no metric: the run's settings, and ``wall``
# (measured wall-clock time, noise between two runs of the same virtual-time work, shown
# side by side by ``emu.report.ab_wall_table`` without deltas).
NOT_METRICS = ("config", "seed", "schema_version", "dp_size", "wall")


def _pattern(name: str) -> re.Pattern:
    return re.compile(r"[^.]+".join(re.escape(part) for part in name.split("*")))


def metric(name: str) -> Metric | None:
    """The catalogue's entry for a flat metric name, None when it has none."""
    return next((m for m in CATALOGUE if m.matches(name)), None)


def better(name: str) -> str | None:
    """"higher" or "lower" when that way is plainly better for metric ``name``."""
    entry = metric(name)
    return None if entry is None else entry.better


def default_tolerances() -> dict[str, str]:
    """The checks ``gate`` runs unless ``--tol`` changes them, in the order it reports
    them: metric name -> tolerance."""
    return {m.name: m.tolerance for m in CATALOGUE if m.tolerance is not None}


def in_order(names: Iterable[str]) -> list[str]:
    """``names``, each a catalogue entry's, in the catalogue's order (KeyError names one
    that is not in the catalogue)."""
    position = {m.name: i for i, m in enumerate(CATALOGUE)}
    for name in names:
        if name not in position:
            raise KeyError(f"{name!r} is not in the metric catalogue (emu.metric_catalogue)")
    return sorted(names, key=position.__getitem__)
