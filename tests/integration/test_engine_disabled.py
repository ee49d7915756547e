"""Issue 3, property 6: with DyntraLB disabled the engine behaves like a plain DP
engine, and no DyntraLB collective is ever issued."""

from __future__ import annotations

import dataclasses

import pytest

from emu.rank.costs import PROFILES
from emu.run import run_cluster
from tests.integration.conftest import spec

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("dp_size", [2, 4])
def test_disabled_issues_no_dyntra_lb_collectives(shared_run, kit, dp_size):
    result = shared_run("disabled", dp_size)
    for rank in range(dp_size):
        records = kit.steps(result, rank)
        assert records
        for s in records:
            assert not any(x.startswith("dyntra_lb") for x in kit.sites(s))
            assert s["plan_applied"] is None and s["plan_generated"] is None
            assert not s["lb_active"] and s["paused"] == [] and s["paused_kv_blocks"] == {}
        assert result.ranks[rank].num_plans == 0
        assert result.logs[rank].read_text() == ""  # no DyntraLB diagnostics either


def test_disabled_equals_plain_engine(shared_run, kit):
    """A config that disables DyntraLB (other keys set) and no config at all give
    byte-identical event logs."""
    disabled = shared_run("disabled", 2)
    plain = shared_run("plain", 2)
    for rank in range(2):
        assert disabled.event_log(rank) == plain.event_log(rank)


@pytest.mark.parametrize("dp_size", [2, 4])
def test_dynamic_before_activation_equals_disabled(shared_run, kit, dp_size, tmp_path):
    """Until the first long request, dynamic mode only adds its flag all-reduce: with
    DyntraLB's control plane not charged, the schedule, clock and every other record
    field equal the plain engine's. Charged (the default profile), each of those steps
    costs the one collective, and the plain engine's nothing."""
    off = dataclasses.replace(PROFILES["kv-token"], control_plane=None)
    uncharged = run_cluster(dataclasses.replace(spec("dynamic", dp_size, tmp_path),
                                                cost_model=off, transport="thread"))
    dynamic = shared_run("dynamic", dp_size)
    disabled = shared_run("disabled", dp_size)
    flag_us = PROFILES["kv-token"].control_plane.collective_us(
        "all_reduce_max", [2], "int32", dp_size)
    for rank in range(dp_size):
        dyn, plain = kit.steps(uncharged, rank), kit.steps(disabled, rank)
        activation = next(s["iter"] for s in dyn if s["lb_active"])
        assert dyn[activation]["clock_s"] >= kit.LONG_ARRIVALS["long1"]
        assert activation > 20
        for a, b in zip(dyn[:activation], plain[:activation], strict=True):
            assert _without_dyntra_lb(a) == _without_dyntra_lb(b)
            assert kit.sites(a).count("dyntra_lb.flag") == 1
            assert b["control_plane"]["charged_s"] == 0
        charged = kit.steps(dynamic, rank)
        for a in charged[:next(s["iter"] for s in charged if s["lb_active"])]:
            # the flag collective costs its terms; under async scheduling (the shared
            # runs') only what outlasts the forward in flight is charged
            assert round(a["control_plane"]["collectives_s"] * 1e6) == flag_us
            assert round(a["control_plane"]["charged_s"] * 1e6) == max(
                0, flag_us - round(a["step_time_s"] * 1e6))


def _without_dyntra_lb(record):
    """The record without DyntraLB's collectives and their control-plane charge."""
    record = {k: v for k, v in record.items() if k != "control_plane"}
    record["collectives"] = [
        {k: v for k, v in c.items() if k != "seq"}
        for c in record["collectives"] if not c["site"].startswith("dyntra_lb")
    ]
    return record
