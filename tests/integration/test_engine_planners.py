"""RunSpec.planner in real clusters (rank processes, gloo): the ranks run the planner the
run names. The trace is the starvation of spec H.5 in miniature: on rank 0 a long
request shares two slots with a short one; rank 1 holds two short ones. The reference
planner pauses the long request and, while the short ones run, takes it back out every
time the fill step re-admits it, so it waits for the others. ``fill-protect`` lets the
fill's admission stand, so each of its pauses lasts one step."""

import pytest

from tests.integration.conftest import lb_config

LONG_PROMPT = 800 * 16  # 800 blocks at block size 16
TRACE = [
    {"request_id": "long", "arrival_s": 0.0, "prompt_tokens": LONG_PROMPT,
     "output_tokens": 30, "rank": 0},
    {"request_id": "short-0", "arrival_s": 0.0, "prompt_tokens": 160, "output_tokens": 150,
     "rank": 0},
    {"request_id": "short-1", "arrival_s": 0.0, "prompt_tokens": 320, "output_tokens": 150,
     "rank": 1},
    {"request_id": "short-2", "arrival_s": 0.0, "prompt_tokens": 320, "output_tokens": 150,
     "rank": 1},
]
CONFIG = lb_config(mode="static", start_step=0)


def _run(dyntra_cluster, planner):
    return dyntra_cluster(TRACE, additional_config=CONFIG, planner=planner, max_num_seqs=2,
                          block_size=16, num_gpu_blocks=2048)


def _long_pauses_in_steps(run):
    """Each pause of the long request, as the number of rank-0 steps it lasted."""
    starts = {s["iter"]: s for s in run.steps(0)}
    paused_at = [s["iter"] for s in starts.values() if "long" in s["paused"]]
    resumed_at = [s["iter"] for s in starts.values() if "long" in s["resumed"]]
    assert len(resumed_at) == len(paused_at)  # it finished, so every pause ended
    return [stop - start for start, stop in zip(paused_at, resumed_at, strict=True)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from emu.pytest_plugin import ClusterFactory

    factory = ClusterFactory(2, tmp_path_factory.mktemp("planners"))
    return {name: _run(factory, name) for name in ("reference", "fill-protect")}


def test_every_request_finishes_under_both_planners(runs):
    for run in runs.values():
        records = {r["request_id"]: r for r in run.requests()}
        assert sorted(records) == sorted(r["request_id"] for r in TRACE)
        assert all(len(r["token_times_s"]) == r["output_tokens"] for r in records.values())


def test_the_reference_starves_the_long_request(runs):
    pauses = _long_pauses_in_steps(runs["reference"])
    assert max(pauses) > 50


def test_fill_protect_pauses_it_one_step_at_a_time(runs):
    pauses = _long_pauses_in_steps(runs["fill-protect"])
    assert pauses and max(pauses) == 1
    reference = runs["reference"].requests(0)
    protected = runs["fill-protect"].requests(0)
    finish = {r["request_id"]: r["finish_s"] for r in reference}
    assert {r["request_id"]: r["finish_s"] for r in protected}["long"] < finish["long"]


def test_the_plans_are_the_named_planners(runs):
    # Same snapshots early on, different plans where the drop meets a filled request.
    def plans(run):
        return [s["plan_generated"] for s in run.steps(0)]

    assert plans(runs["reference"]) != plans(runs["fill-protect"])
