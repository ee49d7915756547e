"""The metric catalogue (emu.metric_catalogue) is the one place the commands read a
metric's facts from: every metric gate checks by default, sweep tabulates, ab --seeds
summarises and tune optimises is a catalogue entry, listed in the catalogue's order, and
each takes its way (better higher or lower) from there. That the names are real metrics
of a run is tests/cli/test_cli_metric_catalogue.py's."""

import pytest

from emu import gate, sweep
from emu.metric_catalogue import better, default_tolerances, in_order, metric
from emu.recipes import SEED_DELTAS
from emu.tune import OBJECTIVES

SHOWN = {
    "gate": list(gate.DEFAULT_TOLERANCES),
    "sweep": [name for _, name, _ in sweep.COLUMNS],
    "ab --seeds": [".".join(path) for _, path, _ in SEED_DELTAS],
    "tune": [o.metric for o in OBJECTIVES.values()],
}


@pytest.mark.parametrize("command", SHOWN)
def test_every_metric_a_command_shows_is_in_the_catalogue_and_in_its_order(command):
    names = SHOWN[command]
    assert names and in_order(names) == names  # in_order raises for a name it lacks


def test_a_name_outside_the_catalogue_is_named():
    with pytest.raises(KeyError, match="'tpot_ms.p42' is not in the metric catalogue"):
        in_order(["throughput_tok_s", "tpot_ms.p42"])


def test_gate_checks_what_the_catalogue_says_and_refuses_by_its_ways():
    assert gate.DEFAULT_TOLERANCES == default_tolerances()
    assert better("per_rank.3.utilisation") == "higher" and better("steps.total") is None
    for name in gate.DEFAULT_TOLERANCES:
        assert gate.better(name) == metric(name).better


def test_the_commands_take_their_ways_from_the_catalogue():
    for o in OBJECTIVES.values():
        assert o.maximize == (metric(o.metric).better == "higher")
    assert OBJECTIVES["throughput"].direction == "maximize"
    assert OBJECTIVES["tpot_p99"].direction == OBJECTIVES["longest_pause"].direction \
        == "minimize"
    rows = [{"name": "p1", "throughput_tok_s": 10.0, "tpot_p99_ms": 9.0, "bubble_ratio": 0.3},
            {"name": "p2", "throughput_tok_s": 20.0, "tpot_p99_ms": 12.0, "bubble_ratio": 0.1},
            {"name": "p3", "throughput_tok_s": None, "tpot_p99_ms": None, "bubble_ratio": None}]
    assert sweep.best_row(rows, "throughput", None)["name"] == "p2"
    assert sweep.best_row(rows, "tpot_p99", None)["name"] == "p1"
    assert sweep.best_row(rows, "bubble", None)["name"] == "p2"
    relative = {label: rel for label, _, rel in SEED_DELTAS}
    assert relative == {"output throughput": True, "duration (virtual time)": True,
                        "DP bubble ratio (points)": False, "TPOT p50": True,
                        "TPOT p99": True}
