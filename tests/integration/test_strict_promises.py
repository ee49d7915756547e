"""DyntraLB's promises, each broken on purpose in the kit (a monkeypatch of one rank's
policy or coordinator, as a contributor's change would break it), and each caught in
strict mode: the run fails naming the rank, the iteration and the request (for the
collectives: the ranks and where each waits). The same promises broken in vllm-ascend's
code are tests/upstream/test_vllm_ascend_promises.py.

Real rank processes and gloo groups, dp 2, the workload of ``promise_trace``."""

from __future__ import annotations

import re

import pytest

from emu.cluster.launcher import launch
from emu.cluster.supervision import ClusterError
from emu.run import run_cluster
from emu.spec import RunSpec, check
from emu.workload import TraceRequest
from tests.integration.conftest import static_trace
from tests.records import events

pytestmark = pytest.mark.integration

STATIC = {"scheduler_config": {"dyntra_lb_config": {
    "enabled": True, "mode": "static", "start_step": 0, "bubble_threshold": 1.0}}}
BROKEN_RANK = 1
SKIPPED_AT = 12  # the step_counter at which the broken rank skips the all-gather


def promise_trace() -> list[TraceRequest]:
    """The shared static workload at dp 2 (pauses, resumes, admissions under plans, at
    ``max_num_seqs`` 2) plus one request on the broken rank long enough (1,250 blocks of
    16 tokens) that the planner drops it for throughput when no swap helps (a plan that
    pauses it and freezes the rank), and whose remote KV lands between a snapshot and
    the next step (a frozen rank must not admit it then)."""
    return [TraceRequest("huge", 0.0, 20_000, 40, rank=BROKEN_RANK), *static_trace(2)]


def promise_spec(out_dir, **fields) -> RunSpec:
    """The kit run of ``promise_trace`` in strict mode (``fields``: what differs)."""
    return RunSpec(**{
        "trace": promise_trace(), "dp_size": 2, "out_dir": out_dir,
        "additional_config": STATIC, "max_num_seqs": 2, "block_size": 16,
        "num_gpu_blocks": 4096, "device": "cpu", "strict": True,
        "collective_timeout_s": 10.0, "run_timeout_s": 240.0, **fields})


# --- the broken promises (module level: a rank unpickles the target by name) ----------


def _pause_frees_kv(engine):
    """The issue's contributor: the pause releases the request's KV (its computed tokens
    stay, so it would resume on blocks that are no longer its own)."""
    policy, kv = engine.scheduler.lb, engine.scheduler.kv_cache_manager
    pause = policy._pause_request

    def pause_request(request):
        pause(request)
        kv.free(request)

    policy._pause_request = pause_request


def _resume_recomputes(engine):
    """The pause keeps the KV, but a paused request is admitted again as a fresh prefill:
    its computed tokens are reset when the waiting loop lets it in."""
    policy = engine.scheduler.lb
    can_admit = policy.can_admit

    def admit(request):
        allowed = can_admit(request)
        if allowed and request.request_id in policy.paused_req_ids:
            request.num_computed_tokens = 0
        return allowed

    policy.can_admit = admit


def _admit_every_candidate(engine):
    """The admission set ignores ``in_blk``: every candidate may enter."""
    policy = engine.scheduler.lb
    apply_plan = policy.apply_plan

    def apply(*args):
        paused = apply_plan(*args)
        if policy.plan is not None and not policy.plan.freeze:
            policy.admit_req_ids = {r.request_id for r in policy.admission_candidates}
        return paused

    policy.apply_plan = apply


def _frozen_rank_admits(engine):
    """A frozen rank's admission is left unrestricted."""
    policy = engine.scheduler.lb
    apply_plan = policy.apply_plan

    def apply(*args):
        paused = apply_plan(*args)
        if policy.plan is not None and policy.plan.freeze:
            policy.admit_req_ids = None
        return paused

    policy.apply_plan = apply


def _plan_applied_late(engine):
    """The plan handed over after iteration k is applied at k+2 (a one-plan delay line)."""
    policy = engine.scheduler.lb
    late = [None]

    def set_plan(plan):
        policy.plan, late[0] = late[0], plan

    policy.set_plan = set_plan


def _skip_one_all_gather(engine):
    """The all-gather (and its plan) is skipped at one step."""
    coordinator = engine.coordinator
    gather = coordinator._gather_and_plan

    def gather_and_plan(candidates):
        if engine.step_counter == SKIPPED_AT:
            return False
        return gather(candidates)

    coordinator._gather_and_plan = gather_and_plan


BREAKS = {"pause_frees_kv": _pause_frees_kv, "resume_recomputes": _resume_recomputes,
          "admit_every_candidate": _admit_every_candidate,
          "frozen_rank_admits": _frozen_rank_admits, "plan_applied_late": _plan_applied_late,
          "skip_one_all_gather": _skip_one_all_gather}


def broken_target(ctx, args):
    implementation, engine_spec, kind = args
    engine = implementation.make_engine(ctx, engine_spec)
    if ctx.rank == BROKEN_RANK:
        BREAKS[kind](engine)
    return engine.run()


def _run_broken(tmp_path, kind: str) -> ClusterError:
    spec = promise_spec(tmp_path)
    checked = check(spec)
    with pytest.raises(ClusterError) as info:
        launch(broken_target, (checked.implementation, checked.engine_spec, kind),
               dp_size=spec.dp_size,
               device="cpu", out_dir=spec.out_dir,
               collective_timeout_s=spec.collective_timeout_s,
               run_timeout_s=spec.run_timeout_s)
    print(f"{kind}: {info.value.message}")  # the note's "message it produced"
    return info.value


# What each broken promise is reported as, after "strict invariant violated on rank 1 at
# iteration N (wave W, step_counter S): ".
REQ = r"'(b\d-r\d-\d|huge)'"
PLAN = r"the plan generated at iteration \d+ \(out_blk \[[\d, ]*\], in_blk \[[\d, ]*\], " \
       r"freeze (True|False)\)"
BROKEN = {
    "pause_frees_kv": rf"paused request {REQ} held KV blocks \[[\d, .()a-z]+\] before "
                      rf"iteration \d+ paused it, now \[\]",
    "resume_recomputes": rf"request {REQ}, paused at iteration \d+ with \d+ computed tokens, "
                         rf"resumed from 0: it recomputes instead of continuing",
    "admit_every_candidate": rf"request {REQ} was admitted at iteration \d+ outside the "
                             rf"admission set \[[' \w,-]*\] of {PLAN}",
    "frozen_rank_admits": rf"{PLAN} freezes this rank, yet request {REQ} was admitted at "
                          rf"iteration \d+",
    "plan_applied_late": rf"request {REQ} (still runs at iteration \d+, but {PLAN} pauses it"
                         rf"|stopped running at iteration \d+ without a KV preemption, but "
                         rf"{PLAN} does not pause it)",
}


def assert_exercises_every_promise(steps: list[dict]) -> None:
    """The event log of an unbroken run shows what the promises are about: pauses,
    resumes, admissions under plans that admit, and frozen plans applied while requests
    waited."""
    assert any(s["paused"] for s in steps)
    assert any(s["resumed"] for s in steps)
    assert any((s["admitted"] or s["resumed"]) and s["plan_applied"] is not None
               and not s["plan_applied"]["freeze"] for s in steps)
    assert any(s["plan_applied"] is not None and s["plan_applied"]["freeze"]
               and s["num_waiting"] for s in steps)


def test_the_unbroken_kit_runs_the_workload_clean(kit, tmp_path):
    result = run_cluster(promise_spec(tmp_path))
    assert sum(r.num_finished for r in result.ranks) == len(promise_trace())
    assert_exercises_every_promise([s for r in (0, 1) for s in kit.steps(result, r)])


@pytest.mark.parametrize("kind", sorted(BROKEN))
def test_a_broken_promise_is_named_with_its_rank_iteration_and_request(tmp_path, kind):
    err = _run_broken(tmp_path, kind)
    assert err.rank == BROKEN_RANK
    head = (rf"emu\.rank\.invariants\.InvariantError: strict invariant violated on rank "
            rf"{BROKEN_RANK} at iteration (\d+) \(wave \d+, step_counter \d+\): ")
    match = re.fullmatch(head + BROKEN[kind], err.message)
    assert match, err.message
    # named where it happened: that iteration is the broken rank's last step record
    steps = [r for r in events(tmp_path, BROKEN_RANK) if r["kind"] == "step"]
    assert steps[-1]["iter"] == int(match.group(1))
    assert "emu/impl/kit/invariants.py" in err.details[BROKEN_RANK]


def test_a_rank_skipping_an_all_gather_is_named_by_the_guard(tmp_path):
    err = _run_broken(tmp_path, "skip_one_all_gather")
    assert err.rank is None and err.message.startswith("collective mismatch")
    entered = {r: c["entered"] for r, c in err.collectives.items()}
    assert entered[0]["site"] == "dyntra_lb.allgather"
    assert entered[0]["step_counter"] == SKIPPED_AT
    assert entered[BROKEN_RANK]["site"] == "engine.lockstep"
    assert f"rank 0 waits in seq {entered[0]['seq']}" in err.message
    assert f"rank {BROKEN_RANK} waits in seq" in err.message
