"""A vllm-ascend tree in the newer layout (vllm-ascend PR #16598): the engine-core patch
installed from ``vllm_ascend/patch/platform/patch_engine_core.py`` rather than at the end
of ``patch_dyntra_lb_core.py``, and DyntraLB's config built from keywords,
``DyntraLBConfig(**cfg)``. The test rearranges a copy of the shared tree that way and runs
it with ``--impl vllm-ascend``: ``dyntra-emu diff`` against the kit is identical."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from tests.upstream.conftest import TREE, dyntra_emu

pytestmark = pytest.mark.integration

PLATFORM = "vllm_ascend/patch/platform"
# Where the shared tree's core patch starts installing itself into vLLM's engine core.
INSTALL_START = "_PreviousRunEngineCore = EngineCoreProc.run_engine_core"
# What the moved block reads from the module it left.
MOVED_IMPORTS = """\
import vllm.v1.engine.core as _engine_core_mod
from vllm.v1.engine.core import DPEngineCoreProc, EngineCoreProc

import vllm_ascend.patch.platform.patch_balance_schedule as _balance_patch
from vllm_ascend.patch.platform.patch_dyntra_lb_core import (
    DyntraLBDPEngineCoreProc,
    _get_dyntra_lb_config,
    _print_rank_0,
)

"""
POSITIONAL_CONFIG = re.compile(r"DyntraLBConfig\(((?:[^()]|\([^()]*\))+)\)")


def rearrange(tree, out):
    """A copy of ``tree`` in PR #16598's layout, at ``out``."""
    shutil.copytree(tree / "vllm_ascend", out / "vllm_ascend",
                    ignore=shutil.ignore_patterns("__pycache__"))
    core = out / PLATFORM / "patch_dyntra_lb_core.py"
    text = core.read_text()
    start = text.index(INSTALL_START)
    core.write_text(text[:start])
    (out / PLATFORM / "patch_engine_core.py").write_text(MOVED_IMPORTS + text[start:])
    init = out / PLATFORM / "__init__.py"
    init.write_text(init.read_text().replace("patch_dyntra_lb_core", "patch_engine_core"))
    for path in (out / "vllm_ascend").rglob("*.py"):
        source = path.read_text()
        changed = POSITIONAL_CONFIG.sub(r"DyntraLBConfig(**(\1 or {}))", source)
        if "class DyntraLBConfig" in changed:  # keyword construction, this class only
            head, _, body = changed.partition("class DyntraLBConfig")
            body = body.replace("def __init__(self, user_config: dict | None = None):",
                                "def __init__(self, **user_config):", 1)
            changed = f"{head}class DyntraLBConfig{body}"
        if changed != source:
            path.write_text(changed)
    return out


def test_a_tree_in_the_newer_layout_runs_and_matches_the_kit(tmp_path):
    tree = rearrange(TREE, tmp_path / "tree")
    core = (tree / PLATFORM / "patch_dyntra_lb_core.py").read_text()
    assert "run_engine_core =" not in core  # the install moved out
    assert "DyntraLBConfig(**" in (tree / "vllm_ascend" / "ascend_config.py").read_text()
    assert "def __init__(self, **user_config)" in (
        tree / "vllm_ascend" / "ascend_config.py").read_text()
    # rank processes: a process that hosts rank threads holds one tree, and this
    # worker may have imported the shared one already
    proc = dyntra_emu("diff", "--workload", "longtail", "--limit", "24", "--dp", "2",
                      "--device", "cpu", "--transport", "process", "--quiet",
                      "--vllm-ascend", tree, "--out", tmp_path / "diff", "--json")
    report = json.loads(proc.stdout)
    assert proc.returncode == 0 and report["identical"], proc.stderr
    assert report["counts"]["plans"] > 0
    config = json.loads((tmp_path / "diff" / "b" / "metrics.json").read_text())["config"]
    assert config["vllm_ascend"] == str(tree)
