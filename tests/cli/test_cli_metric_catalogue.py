"""The metric catalogue against real runs (the four of the session's ``ab --seeds``):
each of its names is a metric those runs' metrics.json hold, and each section of
metrics.json has its place in the A/B tables' order (or is named as no metric)."""

import json

from emu.metric_catalogue import CATALOGUE, NOT_METRICS, SECTIONS
from emu.report import flat_metrics


def test_the_catalogue_names_real_metrics_and_places_every_section(ab_over_seeds):
    proc, out = ab_over_seeds
    assert proc.returncode == 0, proc.stderr
    runs = [json.loads(p.read_text()) for p in sorted(out.rglob("metrics.json"))]
    assert len(runs) == 4
    names = {name for m in runs for name in flat_metrics(m)}
    assert [m.name for m in CATALOGUE if not any(m.matches(n) for n in names)] == []
    sections = {key for m in runs for key in m}
    assert sorted(sections - set(SECTIONS) - set(NOT_METRICS)) == []
