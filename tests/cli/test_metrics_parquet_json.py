"""The metrics of a run's Parquet records (emu/metrics.py, from numpy columns) against
the metrics main computed from the JSON Lines event logs before the records were Parquet
(tests/metrics_json.py, that code kept as the oracle), on every bundled workload: the
same metrics.json float for float, the wall-clock section included (the same records
read both ways)."""

from __future__ import annotations

import json

import pytest

from emu.records.reader import event_records, wall_records
from tests import metrics_json

pytestmark = pytest.mark.integration

BUNDLED = ("default", "uniform", "longtail", "bimodal")


def json_metrics(out, dp: int) -> dict:
    """What main's metrics.py made of the run's event and wall logs (their lines as
    ``dyntra-emu events`` prints them, parsed by json)."""
    steps, requests, wall = [], [], []
    for rank in range(dp):
        records = [json.loads(json.dumps(r)) for r in event_records(out, rank)]
        steps.append([r for r in records if r["kind"] == "step"])
        requests += [r for r in records if r["kind"] == "request"]
        wall.append(list(wall_records(out, rank)))
    run = metrics_json.Run(dp_size=dp, steps=steps, requests=requests, wall=wall,
                           state="complete")
    return metrics_json.compute_metrics(run)


@pytest.mark.parametrize("workload", BUNDLED)
def test_metrics_from_parquet_equal_those_from_json(cli, tmp_path, workload):
    out = tmp_path / workload
    proc = cli("run", "--workload", workload, "--dp", "2", "--transport", "thread",
               "--quiet", "--out", out)
    assert proc.returncode == 0, proc.stderr
    metrics = json.loads((out / "metrics.json").read_text())
    expected = json_metrics(out, 2)
    for key in ("config", "seed"):
        metrics.pop(key)
        expected.pop(key)
    assert metrics["requests_finished"] > 0 and metrics["pauses"]["total"] > 0
    assert json.dumps(metrics, sort_keys=True) == json.dumps(expected, sort_keys=True)
