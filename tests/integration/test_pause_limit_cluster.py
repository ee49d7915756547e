"""The kit's opt-in pause limit on a real cluster (dp 2, rank processes over gloo, strict
mode): the workload of the strict-promise tests pauses a request past 500 ms with
production's DyntraLB, and with ``pause_limit_ms=500`` no request's paused time (read
from the request records of the event logs) passes 500 ms plus one step. A rank whose
policy forgets to resume a request at its limit is caught by strict mode, named."""

from __future__ import annotations

import re

import pytest

from emu.cluster.launcher import launch
from emu.cluster.supervision import ClusterError
from emu.run import run
from emu.spec import check
from tests.integration.test_strict_promises import BROKEN_RANK, promise_spec
from tests.records import events

pytestmark = pytest.mark.integration

LIMIT_MS = 500


def _paused_ms(out_dir) -> tuple[dict[str, float], float]:
    """Each request's total paused time (ms) from the ranks' request records, and the
    longest step (ms) of any rank, from consecutive step records."""
    paused, longest_step = {}, 0.0
    for rank in (0, 1):
        records = events(out_dir, rank)
        for r in records:
            if r["kind"] == "request":
                paused[r["request_id"]] = sum(  # a pause open at the finish ends there
                    ((r["finish_s"] if stop is None else stop) - start) * 1e3
                    for start, stop in r["pauses"])
        clocks = [r["clock_s"] for r in records if r["kind"] == "step"]
        longest_step = max([longest_step, *((b - a) * 1e3
                                            for a, b in zip(clocks, clocks[1:], strict=False))])
    return paused, longest_step


def test_production_pauses_past_the_limit_and_the_limit_keeps_every_request_within_it(
        tmp_path):
    production = run(promise_spec(tmp_path / "production"))
    paused, _ = _paused_ms(production.out_dir)
    assert max(paused.values()) > LIMIT_MS  # what the limit is for

    limited = run(promise_spec(tmp_path / "limited", pause_limit_ms=LIMIT_MS))
    assert sum(r.num_finished for r in limited.ranks) == len(paused)
    paused, step_ms = _paused_ms(limited.out_dir)
    assert any(ms > 0 for ms in paused.values())  # it still pauses
    worst = max(paused, key=paused.get)
    assert paused[worst] <= LIMIT_MS + step_ms, (worst, paused[worst], step_ms)
    assert limited.metrics["config"]["pause_limit"] == {"limit_ms": LIMIT_MS, "victim": "next"}
    assert "pause_limit" not in production.metrics["config"]


def _never_resumes_first(engine):
    """A contributor's change drops the limit's resume: a request at its limit waits in
    the queue like any other."""
    policy = engine.scheduler.lb
    policy._resume_first = lambda due: None


def broken_target(ctx, args):
    implementation, engine_spec = args
    engine = implementation.make_engine(ctx, engine_spec)
    if ctx.rank == BROKEN_RANK:
        _never_resumes_first(engine)
    return engine.run()


def test_a_request_left_paused_past_its_limit_is_named_by_strict_mode(tmp_path):
    spec = promise_spec(tmp_path, pause_limit_ms=LIMIT_MS)
    checked = check(spec)
    with pytest.raises(ClusterError) as info:
        launch(broken_target, (checked.implementation, checked.engine_spec),
               dp_size=spec.dp_size, device="cpu", out_dir=spec.out_dir,
               collective_timeout_s=spec.collective_timeout_s,
               run_timeout_s=spec.run_timeout_s)
    err = info.value
    print(err.message)  # docs/strict-mode.md quotes it
    assert err.rank == BROKEN_RANK
    assert re.fullmatch(
        rf"emu\.rank\.invariants\.InvariantError: strict invariant violated on rank "
        rf"{BROKEN_RANK} at iteration \d+ \(wave \d+, step_counter \d+\): request "
        rf"'(b\d-r\d-\d|huge)' has been paused \d+\.\d ms in total, at its pause limit of "
        rf"{LIMIT_MS} ms, but iteration \d+ did not resume it: it stays paused past the "
        rf"limit plus one step", err.message), err.message
