"""The DP sync cadence on vllm-ascend's code (emu/rank/dp_sync.py): the installed vLLM
decides it. On vLLM >= 0.30 (step 1 and every ``dp_sync_interval`` steps) the kit and
vllm-ascend are identical step by step under the default interval and another one; on
vLLM < 0.30 (every 32 steps) ``--dp-sync-interval`` is refused in one line, naming the
vLLM installed. The tox environments of other vLLM releases run this file
(docs/upstream-findings.md, "vLLM releases")."""

from __future__ import annotations

import json

import pytest

from emu.impl.vllm_ascend.tree import installed_vllm
from emu.rank.dp_sync import DEFAULT_INTERVAL, has_configurable_cadence
from tests.records import events
from tests.upstream.conftest import TREE, dyntra_emu

pytestmark = pytest.mark.integration

VERSION = installed_vllm() or "0"
CONFIGURABLE = has_configurable_cadence(VERSION)
INPUTS = ["--workload", "longtail", "--limit", "24", "--dp", "2", "--device", "cpu",
          "--vllm-ascend", TREE]
RUN = [*INPUTS, "--transport", "thread", "--quiet"]
# The intervals a diff runs at: the default cadence, and on vLLM >= 0.30 another interval
# too (an older vLLM refuses the flag, as the test above checks), so that no case skips.
INTERVALS = [None, 4] if CONFIGURABLE else [None]


@pytest.mark.skipif(CONFIGURABLE, reason=f"vLLM {VERSION} has --dp-sync-interval")
def test_an_interval_the_installed_vllm_has_not_is_refused(tmp_path):
    proc = dyntra_emu("validate", *INPUTS, "--impl", "vllm-ascend", "--dp-sync-interval", "16")
    assert proc.returncode == 1
    problems = [line for line in proc.stdout.splitlines() if line.startswith("problem:")]
    assert problems == [f"problem: --dp-sync-interval 16: the installed vLLM {VERSION} "
                        "syncs the DP group every 32 steps and has no --dp-sync-interval "
                        "(vLLM >= 0.30 has): leave the flag out, or run a vLLM >= 0.30"]


@pytest.mark.parametrize("interval", INTERVALS)
def test_kit_and_vllm_ascend_are_identical_at_the_installed_cadence(tmp_path, interval):
    flags = [] if interval is None else ["--dp-sync-interval", str(interval)]
    proc = dyntra_emu("diff", *RUN, *flags, "--out", tmp_path, "--json")
    report = json.loads(proc.stdout)
    assert proc.returncode == 0 and report["identical"], proc.stderr
    expected = ({"interval": 32, "first_step": False} if not CONFIGURABLE else
                {"interval": interval or DEFAULT_INTERVAL, "first_step": True})
    for side in ("a", "b"):
        config = json.loads((tmp_path / side / "metrics.json").read_text())["config"]
        assert config["dp_sync"] == expected
        assert config.get("vllm_version", VERSION) == VERSION
    # the cadence ran: a wave ended on a step only the installed cadence syncs
    records = events(tmp_path / "b", 0)
    steps = [r for r in records if r["kind"] == "step"]
    ends = [s["step_counter"] for i, s in enumerate(steps)
            if i + 1 == len(steps) or steps[i + 1]["wave"] != s["wave"]]
    assert ends and all(c % expected["interval"] == 0 or (expected["first_step"] and c == 1)
                        for c in ends)
