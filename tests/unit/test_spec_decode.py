"""Speculative decoding (MTP): the profile fields (emu/rank/costs.py), the acceptance rule
(emu/rank/spec_decode.py) and the kit scheduler's draft tokens
(emu/impl/kit/scheduler.py)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from emu.impl.kit.request import Request, RequestStatus
from emu.impl.kit.scheduler import Scheduler
from emu.rank.costs import PROFILES, CostProfileError, StepCostModel, load_profile, write_profile
from emu.rank.remote_kv import RemoteKVConnector
from emu.rank.spec_decode import DraftAcceptance
from tests.kit_steps import forward, use_drafts

BS = 4
MTP = StepCostModel(name="mtp", num_speculative_tokens=3, draft_acceptance_rate=0.6,
                    draft_step_s=0.002)


# ------------------------------------------------------------------ profile fields


def test_mtp_profile_file_round_trips(tmp_path):
    path = tmp_path / "mtp.json"
    write_profile(MTP, path)
    data = json.loads(path.read_text())
    assert (data["num_speculative_tokens"], data["draft_acceptance_rate"],
            data["draft_step_s"]) == (3, 0.6, 0.002)
    assert load_profile(str(path)) == MTP
    assert load_profile("kv-token-mtp3").num_speculative_tokens == 3


def test_profile_without_drafts_writes_no_mtp_keys():
    # metrics.json's config.cost_model has no MTP keys without drafts (the control
    # plane's terms are there whatever the drafts)
    assert set(StepCostModel().to_dict()) == {
        "name", "description", "fixed_s", "per_kv_token_s", "per_scheduled_token_s",
        "per_running_request_s", "per_kv_block_s", "control_plane"}
    for name, profile in PROFILES.items():
        assert ("num_speculative_tokens" in profile.to_dict()) == (name == "kv-token-mtp3")


def test_draft_forwards_are_charged_on_real_steps_only():
    plain = replace(MTP, num_speculative_tokens=0, draft_acceptance_rate=0.0,
                    draft_step_s=0.0)
    assert MTP.cost(10, 5000, 4, 16, False) == plain.cost(10, 5000, 4, 16, False) + 6000
    assert MTP.cost(0, 0, 0, 0, True) == plain.cost(0, 0, 0, 0, True) == 20000
    assert "3 draft tokens, acceptance 0.6" in MTP.formula()
    assert "draft" not in plain.formula()


@pytest.mark.parametrize("data, message", [
    ({"num_speculative_tokens": -1}, "num_speculative_tokens must be an integer from 0"),
    ({"num_speculative_tokens": 2.0}, "num_speculative_tokens must be an integer"),
    ({"num_speculative_tokens": True}, "num_speculative_tokens must be an integer"),
    ({"num_speculative_tokens": 17}, "num_speculative_tokens must be an integer from 0 to 16"),
    ({"num_speculative_tokens": 3, "draft_acceptance_rate": 1.5},
     "draft_acceptance_rate must be a number from 0 to 1"),
    ({"num_speculative_tokens": 3, "draft_acceptance_rate": "0.7"},
     "draft_acceptance_rate must be a number"),
    ({"num_speculative_tokens": 3, "draft_step_s": -0.001},
     "draft_step_s must be a finite number >= 0"),
    ({"draft_acceptance_rate": 0.7}, "draft_acceptance_rate is set but "
                                     "num_speculative_tokens is 0"),
    ({"draft_step_s": 0.002}, "draft_step_s is set but num_speculative_tokens is 0"),
])
def test_bad_mtp_field_in_a_profile_file_names_file_and_field(tmp_path, data, message):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"name": "x", "fixed_s": 0.02, **data}))
    with pytest.raises(CostProfileError, match=message) as info:
        load_profile(str(path))
    assert str(info.value).startswith(f"{path}: ")


# ---------------------------------------------------------------- acceptance rule


def test_acceptance_rate_zero_and_one():
    never, always = DraftAcceptance(3, 0.0, seed=0), DraftAcceptance(3, 1.0, seed=0)
    for position in range(200):
        assert never.num_accepted("r", position, 3) == 0
        assert always.num_accepted("r", position, 3) == 3


def test_acceptance_is_a_pure_function_of_seed_request_and_position():
    a, b = DraftAcceptance(3, 0.5, seed=7), DraftAcceptance(3, 0.5, seed=7)
    positions = list(range(300))
    forward = [a.accepted("req-1", p) for p in positions]
    a.forget("req-1")
    # another instance, another order, other requests asked in between
    backward = []
    for p in reversed(positions):
        b.accepted("req-2", p)
        backward.append(b.accepted("req-1", p))
    assert forward == backward[::-1]
    other_seed = DraftAcceptance(3, 0.5, seed=8)
    assert forward != [other_seed.accepted("req-1", p) for p in positions]


def test_accepted_drafts_are_a_prefix_and_the_rate_holds():
    rule = DraftAcceptance(4, 0.7, seed=1)
    draws = [rule.accepted(f"req-{i}", p) for i in range(50) for p in range(400)]
    assert abs(sum(draws) / len(draws) - 0.7) < 0.01
    for p in range(400):
        n = rule.num_accepted("req-0", p, 4)
        assert all(rule.accepted("req-0", p + j) for j in range(n))
        assert n == 4 or not rule.accepted("req-0", p + n)


# ------------------------------------------------------------------- scheduler


def make_scheduler(rate: float | None, k: int = 3, **kwargs):
    args = dict(max_num_seqs=8, max_num_batched_tokens=256, block_size=BS,
                num_gpu_blocks=200)
    args.update(kwargs)
    spec = DraftAcceptance(k, rate, seed=0) if rate is not None else None
    scheduler = Scheduler(num_speculative_tokens=k if spec is not None else 0, **args)
    use_drafts(scheduler, spec)
    return scheduler


def run_to_end(scheduler, requests, max_steps=500):
    """Step until every request finished; per step the tokens each request emitted and
    the tokens scheduled. Checks the KV and token accounting after every step."""
    for r in requests:
        scheduler.add_request(r)
    emitted_per_step, scheduled_per_step = [], []
    now = 0.0
    for _ in range(max_steps):
        if not scheduler.has_unfinished_requests():
            break
        before = {r.request_id: r.num_output_tokens for r in requests}
        output = scheduler.schedule(now)
        now += 1.0
        forward(scheduler, output, now)
        emitted_per_step.append({r.request_id: r.num_output_tokens - before[r.request_id]
                                 for r in requests
                                 if r.num_output_tokens > before[r.request_id]})
        scheduled_per_step.append(dict(output.num_scheduled_tokens))
        kv = scheduler.kv_cache_manager
        for r in requests:
            assert r.num_tokens == r.prompt_tokens + r.num_output_tokens
            assert r.num_output_tokens <= r.output_tokens
            if r.status == RequestStatus.RUNNING and r.num_output_tokens:
                # KV grew by the emitted tokens: the rejected drafts were rolled back
                assert r.num_computed_tokens == r.num_tokens - 1
                assert kv.num_blocks_of(r) * BS >= r.num_computed_tokens
    else:
        raise AssertionError("did not finish")
    return emitted_per_step, scheduled_per_step


def requests(n=4, prompt=10, output=23):
    return [Request(f"req-{i}", prompt + 3 * i, output + 5 * i) for i in range(n)]


def test_rate_one_emits_k_plus_one_per_step_until_the_output_ends():
    reqs = [Request("r", 10, 10)]
    emitted, scheduled = run_to_end(make_scheduler(1.0), reqs)
    # prefill samples 1, then 4 + 4, then the last one (the stop check truncates)
    assert [e["r"] for e in emitted] == [1, 4, 4, 1]
    assert [s["r"] for s in scheduled] == [10, 4, 4, 4]
    assert reqs[0].token_times_s == [1.0, 2.0, 2.0, 2.0, 2.0, 3.0, 3.0, 3.0, 3.0, 4.0]
    assert reqs[0].status == RequestStatus.FINISHED_LENGTH_CAPPED


def test_rate_zero_gives_the_token_timeline_of_plain_decode():
    plain, zero = requests(), requests()
    _, plain_sched = run_to_end(make_scheduler(None), plain)
    _, zero_sched = run_to_end(make_scheduler(0.0), zero)
    assert [r.token_times_s for r in zero] == [r.token_times_s for r in plain]
    # ... but every decode step verified 3 drafts
    decode_steps = [s for s in zero_sched[1:] if s]
    assert all(n == 4 for step in decode_steps for n in step.values())
    assert all(n == 1 for step in plain_sched[1:] for n in step.values())


def test_a_step_emits_between_one_and_k_plus_one_tokens():
    reqs = requests(n=6, output=60)
    emitted, _ = run_to_end(make_scheduler(0.7), reqs)
    counts = [n for step in emitted for n in step.values()]
    assert set(counts) <= {1, 2, 3, 4}
    assert {2, 3, 4} <= set(counts)  # some drafts accepted, some chains complete
    assert all(r.num_output_tokens == r.output_tokens for r in reqs)
    # fewer steps than tokens: about 1 + .7 + .49 + .343 = 2.5 tokens per decode step
    assert len(emitted) < sum(r.output_tokens for r in reqs) / len(reqs) / 1.8


def test_drafts_are_cut_to_the_token_budget():
    reqs = [Request("a", 4, 30), Request("b", 4, 30)]
    scheduler = make_scheduler(1.0, max_num_batched_tokens=6)
    for r in reqs:
        scheduler.add_request(r)
    out = scheduler.schedule(0.0)
    forward(scheduler, out, 1.0)  # both prefills (4 + 4 > 6: b gets 2)
    for t in range(1, 6):
        out = scheduler.schedule(float(t))
        assert out.total_num_scheduled_tokens <= 6
        for rid, n in out.num_scheduled_tokens.items():
            assert out.scheduled_spec_decode_tokens.get(rid, 0) <= max(n - 1, 0)
        forward(scheduler, out, t + 1.0)
    assert all(r.num_tokens == r.prompt_tokens + r.num_output_tokens for r in reqs)


def test_preemption_drops_the_drafts():
    # 6 blocks of 4 tokens: two requests growing by 4 tokens a step run out of KV
    scheduler = make_scheduler(1.0, num_gpu_blocks=6)
    reqs = [Request("a", 6, 40), Request("b", 6, 40)]
    for r in reqs:
        scheduler.add_request(r)
    preempted = []
    for t in range(12):
        out = scheduler.schedule(float(t))
        preempted += out.preempted_req_ids
        for rid in out.preempted_req_ids:
            victim = next(r for r in reqs if r.request_id == rid)
            assert victim.num_spec_tokens == 0 and victim.num_computed_tokens == 0
        forward(scheduler, out, t + 1.0)
    assert preempted


def step(scheduler, t):
    output = scheduler.schedule(float(t))
    forward(scheduler, output, t + 1.0)
    return output


def test_a_request_from_the_waiting_queue_is_padded_while_only_decodes_run():
    """vLLM 0.27.1: a request that leaves the waiting queue with one token to compute (on
    a decode node: its prompt's KV has landed) is scheduled with k placeholder drafts
    when the running requests scheduled in the same step are all decodes. The
    placeholders are never accepted, even at acceptance rate 1, and its KV slots
    include the drafter's k lookahead slots."""
    scheduler = make_scheduler(1.0, connector=RemoteKVConnector(0.0, 0.0))
    a, b = Request("a", 8, 40), Request("b", 8, 40)
    scheduler.add_request(a)
    step(scheduler, 0)  # a's prompt KV loads
    alone = step(scheduler, 1)
    assert alone.num_scheduled_tokens == {"a": 1}  # nothing else runs: no padding
    assert not alone.padded_spec_decode_req_ids
    scheduler.add_request(b)
    step(scheduler, 2)  # a verifies 3 drafts; b's KV loads
    out = step(scheduler, 3)
    assert out.num_scheduled_tokens == {"a": 4, "b": 4}
    assert out.scheduled_spec_decode_tokens == {"a": 3, "b": 3}
    assert out.padded_spec_decode_req_ids == {"b"}
    assert (a.num_output_tokens, b.num_output_tokens) == (1 + 4 + 4, 1)
    assert b.num_computed_tokens == b.num_tokens - 1  # the 3 placeholders rolled back
    kv = scheduler.kv_cache_manager
    # computed 7 + scheduled 4 + lookahead 3 = 14 tokens of slots, 4 blocks of 4
    assert kv.num_blocks_of(b) == 4
    assert kv.num_blocks_of(a) == -(-(12 + 4 + 3) // BS)
    out = step(scheduler, 4)  # b's own drafts now: all accepted
    assert b.num_output_tokens == 5 and not out.padded_spec_decode_req_ids


def test_no_padding_in_a_step_whose_running_requests_include_a_prompt_chunk():
    scheduler = make_scheduler(1.0, max_num_batched_tokens=30)
    d, p = Request("d", 4, 40), Request("p", 30, 5)
    scheduler.add_request(d)
    step(scheduler, 0)  # d's prompt
    scheduler.add_request(p)
    assert step(scheduler, 1).num_scheduled_tokens == {"d": 4, "p": 26}  # p: a chunk
    scheduler.add_request(Request("q", 1, 5))
    out = step(scheduler, 2)  # p's last chunk runs: q is scheduled unpadded
    assert out.num_scheduled_tokens == {"d": 4, "p": 4, "q": 1}
    assert not out.padded_spec_decode_req_ids
    scheduler.add_request(Request("r", 1, 5))
    out = step(scheduler, 3)  # only decodes run: r is padded
    assert out.num_scheduled_tokens == {"d": 4, "p": 4, "q": 4, "r": 4}
    assert out.padded_spec_decode_req_ids == {"r"}


def test_a_request_whose_padding_does_not_fit_the_budget_waits():
    scheduler = make_scheduler(1.0, max_num_batched_tokens=6)
    d = Request("d", 4, 40)
    scheduler.add_request(d)
    step(scheduler, 0)
    scheduler.add_request(Request("q", 1, 5))
    out = step(scheduler, 1)  # d takes 4 of 6: q's 1 + 3 does not fit, 1 alone would
    assert out.num_scheduled_tokens == {"d": 4}
    assert [r.request_id for r in scheduler.waiting] == ["q"]


def _splitmix64(x: int) -> int:
    """SplitMix64's finaliser, written out: the oracle of the acceptance rule."""
    mask = (1 << 64) - 1
    x = (x + 0x9E3779B97F4A7C15) & mask
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
    return x ^ (x >> 31)


@pytest.mark.parametrize("rate", [0.0, 0.3, 0.7, 1.0])
def test_decisions_are_the_hash_of_seed_request_and_position(rate):
    # The rule computes a request's decisions in chunks with numpy; every one must be
    # the 64-bit hash of (seed, request, position) under the rate's share of 2**64, the
    # rule runs recorded before it were made with (a run's tokens depend on it).
    import zlib

    seed = 12345
    rule = DraftAcceptance(3, rate, seed=seed)
    threshold = int(round(rate * (1 << 64)))
    for request_id in ("req-0", "pr12292-0040", "ü-7"):
        key = _splitmix64((seed << 32) ^ zlib.crc32(request_id.encode()))
        for position in [*range(0, 40), 255, 256, 257, 600, 5000]:
            expected = _splitmix64(
                key ^ (position * 0xD1B54A32D192ED03 & ((1 << 64) - 1))) < threshold
            assert rule.accepted(request_id, position) == expected, (request_id, position)
        # a fresh rule asked far ahead first decides the same
        fresh = DraftAcceptance(3, rate, seed=seed)
        assert fresh.num_accepted(request_id, 4998, 3) == rule.num_accepted(request_id, 4998, 3)
