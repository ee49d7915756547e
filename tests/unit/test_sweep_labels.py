"""The sweep's Pareto plot labels (``emu.sweep._label_groups``): runs whose points would
print their labels over each other share one label; runs apart keep their own."""

from __future__ import annotations

from emu.sweep import _label_groups


def point(name: str, tpot: float, throughput: float) -> dict:
    return {"name": name, "tpot_p99_ms": tpot, "throughput_tok_s": throughput}


def test_points_closer_than_two_percent_of_the_spans_share_a_label():
    points = [point("baseline", 23.38, 877.14), point("p01", 24.7470, 878.4111),
              point("p02", 24.7470, 878.4084), point("p03", 24.7454, 878.3698),
              point("p05", 24.8148, 878.2545), point("p07", 24.7470, 878.4111)]
    assert _label_groups(points) == [
        ((23.38, 877.14), ["baseline"]),
        ((24.7470, 878.4111), ["p01", "p02", "p07"]),
        ((24.7454, 878.3698), ["p03"]),
        ((24.8148, 878.2545), ["p05"]),
    ]


def test_one_point_and_no_points():
    assert _label_groups([point("baseline", 1.0, 2.0)]) == [((1.0, 2.0), ["baseline"])]
    assert _label_groups([]) == []
