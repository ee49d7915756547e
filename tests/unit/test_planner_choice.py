"""RunSpec.planner: which planner the ranks run; the kit runs ours (dyntra_lb.planner.registry),
vllm-ascend ranks either theirs or one of ours in its place."""

from __future__ import annotations

import pytest

from emu.impl import planner_name
from emu.spec import RunSpec, check
from emu.workload import TraceRequest

TRACE = [TraceRequest("r0", 0.0, 32, 4)]


@pytest.mark.parametrize("planner", [None, "reference", "fill-protect"])
def test_the_kit_runs_the_registry_planners(tmp_path, planner):
    check(RunSpec(trace=TRACE, dp_size=2, out_dir=tmp_path, planner=planner))


def test_the_impl_own_planner_is_the_default():
    assert planner_name(None, "kit") == "reference"
    assert planner_name(None, "vllm-ascend") == "vllm-ascend"
    assert planner_name("fill-protect", "vllm-ascend") == "fill-protect"


def test_the_old_kit_name_is_gone(tmp_path):
    with pytest.raises(ValueError, match="RunSpec.planner: must be one of"):
        check(RunSpec(trace=TRACE, dp_size=2, out_dir=tmp_path, impl="vllm-ascend",
                         planner="kit"))


def test_the_kit_cannot_run_vllm_ascends_planner(tmp_path):
    with pytest.raises(ValueError, match="RunSpec.planner='vllm-ascend': only with "
                                         "impl='vllm-ascend'"):
        check(RunSpec(trace=TRACE, dp_size=2, out_dir=tmp_path, planner="vllm-ascend"))


def test_an_unknown_planner_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"RunSpec.planner: must be one of \['reference', "
                                   r"'fill-protect', 'vllm-ascend'\]"):
        check(RunSpec(trace=TRACE, dp_size=2, out_dir=tmp_path, impl="vllm-ascend",
                         planner="literal"))
