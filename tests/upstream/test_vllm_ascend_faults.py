"""A failed remote-KV load (``kv_fail``) on vllm-ascend's DyntraLB: the emulated worker
reports the request's blocks invalid, vLLM's scheduler recomputes the prompt
(``kv_load_failure_policy="recompute"``), and the run is the kit's, step for step."""

from __future__ import annotations

import dataclasses

import pytest

from emu.offline.diff import compare, read_run
from emu.run import run_cluster
from tests.integration.test_faults import FAILING, assert_nothing_lost, make_spec, two_wave_trace
from tests.upstream.conftest import TREE

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def failed_load(tmp_path_factory):
    """(kit run, vllm-ascend run, vllm-ascend run without the fault) of the two-wave
    trace with FAILING's load failing on rank 1."""
    root = tmp_path_factory.mktemp("upstream-kv-fail")
    kit = make_spec(root / "kit", faults=[f"kv_fail:request={FAILING}"])
    upstream = dataclasses.replace(kit, out_dir=root / "vllm-ascend", impl="vllm-ascend",
                                   vllm_ascend=str(TREE), run_timeout_s=600.0)
    clean = dataclasses.replace(upstream, out_dir=root / "clean", faults=None)
    return tuple(run_cluster(s) for s in (kit, upstream, clean))


def _admission(result, request_id: str) -> dict:
    return next(s for s in result.events(1) if s["kind"] == "step"
                and request_id in s["admitted"])


def test_the_failed_load_is_recomputed_and_every_request_finishes(failed_load):
    _, upstream, clean = failed_load
    prompt = {r.request_id: r.prompt_tokens for r in two_wave_trace()}[FAILING]
    # a good load leaves one token to compute at admission; after the failure the rank
    # prefills the whole prompt itself
    assert _admission(clean, FAILING)["scheduled_tokens"] < prompt
    assert _admission(upstream, FAILING)["scheduled_tokens"] >= prompt
    assert_nothing_lost(upstream, two_wave_trace())


def test_the_kit_and_vllm_ascend_handle_the_failure_identically(failed_load):
    kit, upstream, _ = failed_load
    report = compare(read_run(kit.out_dir, "kit"), read_run(upstream.out_dir, "vllm-ascend"))
    assert report.identical, report.first
