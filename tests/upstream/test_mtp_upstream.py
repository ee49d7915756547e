"""MTP on vllm-ascend's code: with the ``kv-token-mtp3`` profile (3 draft tokens per step)
the vllm-ascend ranks run vLLM's own speculative decoding (``speculative_config``
``method="mtp"``, drafts from the emulated worker), and ``dyntra-emu diff`` of the kit
against them is identical -- every step record, request record and diagnostics line -- at
dp 2 and dp 4 on two bundled workloads, in vLLM's default mode, async scheduling
(synchronous MTP: ``test_diff_upstream.py``)."""

from __future__ import annotations

import json

import pytest

from tests.records import events
from tests.upstream.conftest import REPO, TREE
from tests.upstream.test_diff_upstream import _diff

pytestmark = pytest.mark.integration

BUNDLED = REPO / "fixtures" / "workloads"


def _first_requests(workload: str, out, n: int = 16, max_output: int = 60):
    """The first ``n`` requests of a bundled workload, outputs capped at ``max_output``."""
    requests = [json.loads(line) for line in
                (BUNDLED / f"{workload}.jsonl").read_text().splitlines()[:n]]
    out.write_text("".join(json.dumps({**r, "output_tokens": min(r["output_tokens"],
                                                                  max_output)}) + "\n"
                           for r in requests))
    return out


def _records(run_dir, dp: int, kind: str) -> list[dict]:
    return [record for rank in range(dp) for record in events(run_dir, rank)
            if record.get("kind") == kind]


@pytest.mark.parametrize("dp", [2, 4])
@pytest.mark.parametrize("workload,mode", [("uniform", "static"), ("longtail", "dynamic")])
def test_mtp_runs_identically_on_the_kit_and_on_vllm(tmp_path, workload, mode, dp):
    trace = _first_requests(workload, tmp_path / f"{workload}.jsonl")
    lb = {"enabled": True, "mode": mode, "start_step": 0, "enable_diagnostics": True,
          "long_req_block_threshold": 40}
    out = tmp_path / "diff"
    proc = _diff("--workload", trace, "--dp", dp, "--block-size", 16, "--max-num-seqs", 4,
                 "--num-gpu-blocks", 1024, "--device", "cpu", "--quiet", "--vllm-ascend",
                 TREE, "--cost-model", "kv-token-mtp3", "--additional-config",
                 json.dumps({"scheduler_config": {"dyntra_lb_config": lb}}), "--out", out,
                 "--json", "--transport", "thread")
    assert proc.returncode in (0, 1), proc.stderr
    report = json.loads(proc.stdout)
    assert proc.returncode == 0 and report["identical"], json.dumps(report["first"], indent=1)
    counts = report["counts"]
    assert counts["plans"] > 0 and counts["requests"] == 16
    assert counts["diagnostics_lines"] > 0
    for side in ("a", "b"):  # a: the kit, b: vLLM's scheduler
        requests = _records(out / side, dp, "request")
        steps = _records(out / side, dp, "step")
        # several tokens per step and request: accepted drafts ...
        per_step = [times.count(t) for r in requests
                    for times in [r["token_times_s"]] for t in set(times)]
        assert set(per_step) == {1, 2, 3, 4}
        assert all(len(r["token_times_s"]) == r["output_tokens"] for r in requests)
        # ... and rejected ones: more tokens ran than were emitted (plain decode on a
        # decode node runs exactly one token per emitted token)
        emitted = sum(r["output_tokens"] for r in requests)
        assert sum(s["scheduled_tokens"] for s in steps) > emitted
