"""The upstream tier: vllm-ascend's own DyntraLB (``--impl vllm-ascend``) in real rank
processes on vLLM 0.27.1, against the shared vllm-ascend tree (or the tree named by
``DYNTRA_VLLM_ASCEND``).

Without vLLM 0.27.1 the tier is skipped with the reason in the summary; with
``DYNTRA_UPSTREAM_REQUIRED=1`` (what ``.ci/run`` sets) that is an error instead, so CI
can never pass on a tier that did not run.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import subprocess

import pytest

from emu.impl.vllm_ascend.tree import ENV_VAR, SUPPORTED_VLLM, installed_vllm
from emu.spec import RunSpec
from tests.in_process import run_in_process
from tests.integration.conftest import (  # noqa: F401 - fixtures shared with this tier
    STATIC_CONFIG,
    kit,
    no_leftover_processes,
    shared_runs,
    spec,
)

REPO = pathlib.Path(__file__).resolve().parents[2]
TREE = pathlib.Path(os.environ.get(ENV_VAR) or REPO.parent / "shared" / "upstream" /
                    "vllm-ascend")


def _why_not() -> str | None:
    version = installed_vllm()
    if version is None:
        return (f"vLLM {SUPPORTED_VLLM} is not installed (see docs/vllm-ascend.md: the "
                "upstream tier)")
    if not (TREE / "vllm_ascend" / "__init__.py").is_file():
        return f"no vllm-ascend tree at {TREE} (set {ENV_VAR})"
    return None


WHY_NOT = _why_not()


def pytest_collection_modifyitems(config, items):
    mine = [item for item in items if pathlib.Path(item.fspath).parent == REPO / "tests" /
            "upstream"]
    if WHY_NOT is None or not mine:
        return
    if os.environ.get("DYNTRA_UPSTREAM_REQUIRED") == "1":
        raise pytest.UsageError(f"the upstream tier cannot run: {WHY_NOT}")
    for item in mine:
        item.add_marker(pytest.mark.skip(reason=f"upstream tier not run: {WHY_NOT}"))


# Scheduler variants of the static run (which runs vLLM's default, async scheduling):
# vLLM's synchronous scheduling, vllm-ascend's recompute scheduler (each with DyntraLB,
# so the DyntraLB and the AsyncRecompute DyntraLB classes run).
VARIANTS = {
    "static-sync": {"async_scheduling": False},
    "static-recompute": {"additional_config": {"scheduler_config": {
        **STATIC_CONFIG["scheduler_config"], "recompute_scheduler_enable": True}}},
}


def upstream_spec(name: str, dp_size: int, out_dir: pathlib.Path, **fields) -> RunSpec:
    """The integration tier's named run (or a scheduler variant of the static one), on
    vllm-ascend's DyntraLB. The shared runs are rank threads, which give the event logs
    of rank processes byte for byte (``test_vllm_ascend_threads.py``); "static-again",
    the static run again, is rank processes, so the tests that compare the two check
    that too."""
    transport = "process" if name == "static-again" else "thread"
    fields = {"vllm_ascend": str(TREE), "run_timeout_s": 600.0, "transport": transport,
              **VARIANTS.get(name, {}), **fields}
    base = spec("static" if name in VARIANTS else name, dp_size, out_dir)
    return dataclasses.replace(base, impl="vllm-ascend", **fields)


@pytest.fixture(scope="session")
def upstream_run(tmp_path_factory):
    """``upstream_run(name, dp_size) -> RunResult``: each named vllm-ascend run once per
    session, shared by every test and xdist worker that asks for it."""
    return shared_runs(tmp_path_factory, "upstream", upstream_spec)


def dyntra_emu(*args) -> subprocess.CompletedProcess:
    """``dyntra-emu args`` in this process (``tests/in_process.py``): the fork servers that
    one command starts for vLLM and a tree serve this worker's later commands."""
    return run_in_process([*map(str, args)], pathlib.Path.cwd())
