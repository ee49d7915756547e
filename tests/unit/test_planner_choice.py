"""RunSpec.planner: which planner the ranks run; only vllm-ascend ranks can swap theirs."""

from __future__ import annotations

import pytest

from emu.cluster import RunSpec, validate
from emu.workload import TraceRequest

TRACE = [TraceRequest("r0", 0.0, 32, 4)]


@pytest.mark.parametrize("planner", [None, "kit"])
def test_the_kit_runs_its_own_planner(tmp_path, planner):
    validate(RunSpec(trace=TRACE, dp_size=2, out_dir=tmp_path, planner=planner))


def test_the_kit_cannot_run_vllm_ascends_planner(tmp_path):
    with pytest.raises(ValueError, match="RunSpec.planner 'vllm-ascend' needs impl"):
        validate(RunSpec(trace=TRACE, dp_size=2, out_dir=tmp_path, planner="vllm-ascend"))


def test_an_unknown_planner_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"RunSpec.planner must be one of \['kit', "):
        validate(RunSpec(trace=TRACE, dp_size=2, out_dir=tmp_path, impl="vllm-ascend",
                         planner="literal"))
