"""Speculative decoding (MTP) through the real `dyntra-emu`: a profile with draft tokens
emits several tokens per step, finishes the same tokens in fewer steps, gives
byte-identical event logs on rank processes and rank threads at dp=2, and a bad MTP
profile is one clear error before anything starts. (MTP on vllm-ascend's code:
tests/upstream/test_mtp_upstream.py.)"""

from __future__ import annotations

import json
from itertools import pairwise

import pytest

from tests.records import event_log, events

pytestmark = pytest.mark.integration

STATIC = json.dumps({"scheduler_config": {"dyntra_lb_config": {
    "enabled": True, "mode": "static", "start_step": 0}}})


def _events(out, rank):
    return events(out, rank)


def test_mtp_run_emits_several_tokens_per_step_on_both_transports(cli, clikit, tmp_path,
                                                                   tiny_trace):
    runs = {}
    for profile, transport in (("kv-token", "thread"), ("kv-token-mtp3", "process"),
                               ("kv-token-mtp3", "thread")):
        out = tmp_path / f"{profile}-{transport}"
        proc = cli("run", "--workload", tiny_trace, *clikit.SMALL, "--additional-config",
                   STATIC, "--cost-model", profile, "--transport", transport, "--quiet",
                   "--out", out)
        assert proc.returncode == 0, proc.stderr
        runs[profile, transport] = out
    mtp, plain = runs["kv-token-mtp3", "process"], runs["kv-token", "thread"]
    for rank in range(2):
        logs = [event_log(runs["kv-token-mtp3", t], rank) for t in ("process", "thread")]
        assert logs[0] and logs[0] == logs[1]

    m_mtp, m_plain = (json.loads((out / "metrics.json").read_text()) for out in (mtp, plain))
    assert m_mtp["requests_finished"] == m_plain["requests_finished"] == 10
    assert m_mtp["output_tokens"] == m_plain["output_tokens"]
    assert m_mtp["config"]["cost_model"]["num_speculative_tokens"] == 3
    assert "num_speculative_tokens" not in m_plain["config"]["cost_model"]
    assert m_mtp["steps"] < m_plain["steps"]

    records = [e for rank in range(2) for e in _events(mtp, rank)
               if e.get("kind") == "request"]
    assert len(records) == 10
    per_step = [times.count(t) for r in records
                for times in [r["token_times_s"]] for t in sorted(set(times))]
    assert max(per_step) == 4 and min(per_step) == 1  # 1 .. k + 1 tokens per step
    for r in records:
        times = r["token_times_s"]
        assert len(times) == r["output_tokens"]  # never past the output length
    # TPOT per output token, ITL per step (one streamed chunk), as vLLM's benchmark
    tpots = sorted((r["token_times_s"][-1] - r["token_times_s"][0]) * 1e3
                   / (len(r["token_times_s"]) - 1) for r in records)
    assert m_mtp["tpot_ms"]["max"] == pytest.approx(tpots[-1])
    gaps = [b - a for r in records for a, b in pairwise(r["token_times_s"]) if b != a]
    assert m_mtp["itl_ms"]["count"] == len(gaps)
    assert m_mtp["itl_ms"]["count"] < m_mtp["output_tokens"] - 10


def test_bad_mtp_profile_is_a_usage_error(cli, clikit, tmp_path, tiny_trace):
    bad = tmp_path / "mtp.json"
    bad.write_text(json.dumps({"name": "x", "fixed_s": 0.02, "num_speculative_tokens": 3,
                               "draft_acceptance_rate": 1.2}))
    out = tmp_path / "out"
    proc = cli("run", "--workload", tiny_trace, *clikit.SMALL, "--out", out,
               "--cost-model", bad)
    clikit.assert_user_error(proc, f"--cost-model {bad}: cost model draft_acceptance_rate "
                                   "must be a number from 0 to 1")
    assert not out.exists()
