"""``--impl vllm-ascend`` exposes no more than the kit (tests/cli/test_security.py):
a dp=2 run with rank processes listens on loopback only, its scratch (the launcher's
/dev/shm files, the fork server's socket directory) is the user's only while it runs and
gone after; the stand-in model vLLM reads is written into the output directory, not into
TMPDIR (docs/security.md)."""

from __future__ import annotations

import getpass
import json
from pathlib import Path

import pytest

from tests.cli.conftest import SMALL, tiny_requests, write_trace
from tests.exposure import watch_run
from tests.upstream.conftest import TREE

pytestmark = pytest.mark.integration

# torch's compile cache, which `import torch._dynamo` (by vLLM) creates in TMPDIR with the
# user's umask and keeps across runs: torch's, not the run's; nothing is compiled in an
# emulated rank (docs/security.md).
TORCH_CACHE = f"torchinductor_{getpass.getuser()}"


@pytest.fixture(scope="module")
def vllm_ascend_run(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("vllm-ascend-run")
    trace = write_trace(tmp_path / "tiny.jsonl", tiny_requests())
    seen = watch_run(["--workload", trace, *SMALL, "--impl", "vllm-ascend", "--vllm-ascend",
                      TREE, "--fault", "delay:rank=1,site=engine.lockstep,step=5,seconds=2"],
                     tmp_path, tmp_path / "out", timeout=900)
    assert seen.returncode == 0, seen.stderr
    assert seen.samples_under_way > 0
    return seen


def test_a_vllm_ascend_run_listens_on_loopback_only(vllm_ascend_run):
    assert len(vllm_ascend_run.listening("rank")) == 2
    assert vllm_ascend_run.exposed() == []


def _ours(paths):
    return [p for p in paths if Path(p if isinstance(p, str) else p.top).name != TORCH_CACHE]


def test_a_vllm_ascend_run_keeps_its_scratch_private_and_leaves_none(vllm_ascend_run):
    scratch = vllm_ascend_run.scratch.values()
    tops = {Path(s.top).name.rsplit("-", 1)[0] for s in scratch}
    assert "pymp" in tops and not any(t.startswith("dyntra-emu-model") for t in tops)
    shm = {s.path.rsplit("-", 1)[1] for s in scratch if "/dyntra-emu-launch-" in s.path}
    assert {"guard", "rank0.stack", "rank1.stack"} <= shm
    assert _ours(vllm_ascend_run.shared()) == []
    assert _ours(vllm_ascend_run.left) == []


def test_the_model_directory_is_the_output_directorys_and_never_half_written(tmp_path):
    """Every rank writes the same config.json, each through a file of its own renamed
    into place: a rank stopped while it builds leaves nothing in TMPDIR, and no rank reads
    a half-written file."""
    from emu.impl.vllm_ascend.vllm_config import model_dir

    first = model_dir(tmp_path, 256)
    again = model_dir(tmp_path, 256)
    assert first == again == tmp_path / "vllm-model"
    assert [p.name for p in first.iterdir()] == ["config.json"]
    assert json.loads((first / "config.json").read_text())["max_position_embeddings"] == 256
