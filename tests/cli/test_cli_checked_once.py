"""A batch hands each job the run its command checked: every run's spec is checked once,
in the command's process, and the jobs check nothing again (``emu.spec.check``, the one
judge of a spec, counted wherever a module holds it)."""

import dataclasses
import json
import sys

import pytest

import emu.spec
from dyntra_lb import load_additional_config

pytestmark = pytest.mark.integration


@pytest.fixture
def checks(monkeypatch) -> list:
    """Each spec ``emu.spec.check`` judges in this process, in order."""
    judged, original = [], emu.spec.check

    def counted(spec, *args, **kwargs):
        judged.append(spec)
        return original(spec, *args, **kwargs)

    for module in list(sys.modules.values()):
        if getattr(module, "check", None) is original:
            monkeypatch.setattr(module, "check", counted)
    return judged


def test_a_sweeps_runs_are_each_checked_once(cli, tiny_trace, clikit, checks, tmp_path):
    out = tmp_path / "sw"
    proc = cli("sweep", "--workload", tiny_trace, *clikit.SMALL, "--grid",
               "bubble_threshold=1,5", "--grid", "mode=static,dynamic", "--jobs", "2",
               "--quiet", "--out", out)
    assert proc.returncode == 0, proc.stderr
    runs = sorted(out.glob("runs/*/metrics.json"))
    assert len(runs) == 5  # the baseline and four points
    # No spec judged twice, whatever directory it was to run in (a point whose config
    # was judged as the base or as a --grid value on its own is not judged again) ...
    unplaced = [dataclasses.replace(spec, out_dir=None) for spec in checks]
    assert all(unplaced.count(spec) == 1 for spec in unplaced)
    # ... and every run's config was judged.
    judged = [load_additional_config(spec.additional_config).raw for spec in checks]
    for metrics in runs:
        assert json.loads(metrics.read_text())["config"]["additional_config"] in judged
