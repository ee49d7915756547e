"""`dyntra-emu inspect`: the request block-count distribution of a workload in any
trace format, with DyntraLB's thresholds placed on it (the expected shares are counted
here from the sample file itself)."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

BURSTGPT = Path(__file__).resolve().parents[1] / "data" / "traces" / "burstgpt.csv"


def prompt_blocks(block_size: int) -> list[int]:
    """The sample's prompts in blocks, its failed rows (Response tokens 0) left out."""
    with BURSTGPT.open(newline="") as f:
        return [math.ceil(int(row["Request tokens"]) / block_size)
                for row in csv.DictReader(f) if row["Response tokens"] != "0"]


def config(**keys) -> str:
    return json.dumps({"scheduler_config": {"dyntra_lb_config": {"enabled": True, **keys}}})


def test_thresholds_placed_on_the_distribution(cli, tmp_path):
    blocks = prompt_blocks(16)
    assert 30 in blocks  # a request with exactly the threshold does not arm
    arming = sum(b > 30 for b in blocks)
    small = sum(b <= 5 for b in blocks)
    proc = cli("inspect", "--workload", BURSTGPT, "--block-size", "16", "--additional-config",
               config(long_req_block_threshold=30, bubble_threshold=5), "--out", tmp_path / "i")
    assert proc.returncode == 0, proc.stderr
    n = len(blocks)
    assert (f"long_req_block_threshold = 30 blocks: {arming} of {n} requests "
            f"({100 * arming / n:.1f} %) arrive with more, and each would arm dynamic mode;"
            in proc.stdout), proc.stdout
    assert (f"bubble_threshold = 5 blocks (absolute): the planner stops once the fullest "
            f"rank holds less than that above the ranks' mean; {small} of {n} requests"
            in proc.stdout), proc.stdout
    assert "max\n  at arrival (prompt) " in proc.stdout
    assert proc.stdout.count("<- ") == 2  # both thresholds marked in the histogram
    assert "note: " in proc.stdout and "skipped 1 row(s): failed request" in proc.stdout
    png = (tmp_path / "i" / "block_counts.png").read_bytes()
    assert png.startswith(b"\x89PNG")


def test_defaults_and_the_forms_a_threshold_takes(cli, tmp_path):
    proc = cli("inspect", "--workload", BURSTGPT, "--block-size", "16", "--out", tmp_path / "a")
    assert proc.returncode == 0, proc.stderr
    assert "long_req_block_threshold = 700 blocks: 0 of 10 requests" in proc.stdout
    assert "is above every request: the largest has 37 blocks" in proc.stdout
    proc = cli("inspect", "--workload", BURSTGPT, "--block-size", "16", "--additional-config",
               config(mode="static", bubble_threshold=0.25), "--out", tmp_path / "b")
    assert proc.returncode == 0, proc.stderr
    assert "bubble_threshold = 0.25 (a ratio)" in proc.stdout
    assert "the config runs static mode, which never arms" in proc.stdout


@pytest.mark.parametrize("flags,fragment", [
    (["--additional-config", config(bubble_threshold=0)],
     "--additional-config: dyntra_lb_config.bubble_threshold must be > 0"),
    (["--workload", "nope.csv"], "--workload nope.csv: no such file"),
    (["--block-size", "0"], "expected an integer >= 1"),
])
def test_bad_input(cli, tmp_path, clikit, flags, fragment):
    proc = cli("inspect", "--workload", BURSTGPT, *flags, "--out", tmp_path / "out")
    clikit.assert_user_error(proc, fragment)
    assert not (tmp_path / "out").exists()
