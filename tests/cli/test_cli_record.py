"""One spec, one record: a run made by `dyntra-emu sweep`, by `dyntra-emu run` and by the
`dyntra_cluster` fixture from the same RunSpec records the same config in metrics.json
(everything that produced the run: the additional config, the workload's name, the
engine settings, the cost model, the impl and its planner, the device) and measures the
same run. All three go through `emu.run.run`."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.integration

# Everything below but the wall-clock section is a function of the spec.
WALL_CLOCK = ("wall",)


def _measured(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if k not in WALL_CLOCK}


@pytest.mark.dp(2)
def test_sweep_cli_and_fixture_record_the_same_spec_the_same_way(cli, clikit, tmp_path,
                                                                  dyntra_cluster):
    trace = clikit.write_trace(tmp_path / "t.jsonl", clikit.tiny_requests())
    base = clikit.STATIC
    sweep = cli("sweep", "--workload", trace, *clikit.SMALL, "--additional-config",
                json.dumps(base), "--grid", "bubble_threshold=2", "--planner", "fill-protect",
                "--out", "sw", "--quiet", process=True, timeout=600)
    assert sweep.returncode == 0, sweep.stderr
    swept = json.loads((tmp_path / "sw" / "runs" / "p01" / "metrics.json").read_text())
    point = swept["config"]["additional_config"]
    assert point["scheduler_config"]["dyntra_lb_config"]["bubble_threshold"] == 2

    # The same spec on the command line: the sweep's point config on the thread transport.
    run = cli("run", "--workload", trace, *clikit.SMALL, "--additional-config",
              json.dumps(point), "--planner", "fill-protect", "--transport", "thread",
              "--out", "run", "--quiet")
    assert run.returncode == 0, run.stderr
    ran = json.loads((tmp_path / "run" / "metrics.json").read_text())

    # And through the fixture (strict off, as the command line's default).
    fixture = dyntra_cluster(workload=str(trace), additional_config=point,
                             planner="fill-protect", max_num_seqs=4, block_size=16,
                             num_gpu_blocks=512, device="cpu", transport="thread",
                             strict=False)
    written = json.loads((fixture.out_dir / "metrics.json").read_text())

    assert swept["config"] == ran["config"] == fixture.metrics["config"] == written["config"]
    config = ran["config"]
    assert (config["impl"], config["planner"], config["workload"]) == (
        "kit", "fill-protect", str(trace))
    assert config["cost_model"]["name"] == "kv-token"
    assert config["device"] == "cpu"
    assert _measured(swept) == _measured(ran) == _measured(fixture.metrics)
