"""``--impl vllm-ascend`` refused before any rank starts, one line each, exit 2: a path
that is not a vllm-ascend tree, a tree without DyntraLB, a vLLM that is missing or not
the release the tree pins, torch_npu without CANN, a config the startup checks reject,
and a fault the vllm-ascend ranks cannot inject. These run in the default tier (no vLLM
needed); the runs themselves are in tests/upstream."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from emu.impl.vllm_ascend.tree import DYNTRA_LB_FILES, SUPPORTED_VLLM, installed_vllm

SHARED_TREE = pathlib.Path(__file__).resolve().parents[3] / "shared" / "upstream" / "vllm-ascend"


def fake_tree(root: pathlib.Path, *, dyntra_lb: bool = True,
              pins: str | None = None) -> pathlib.Path:
    """A minimal tree layout: the package and (optionally) DyntraLB's two files."""
    (root / "vllm_ascend").mkdir(parents=True)
    (root / "vllm_ascend" / "__init__.py").write_text("")
    if dyntra_lb:
        for name in DYNTRA_LB_FILES:
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text("")
    if pins is not None:
        (root / ".github").mkdir()
        (root / ".github" / "vllm-release-tag.commit").write_text(pins + "\n")
    return root


def _run(cli, tmp_path, tiny_trace, clikit, *flags):
    out = tmp_path / "out"
    proc = cli("run", "--workload", tiny_trace, *clikit.SMALL, "--out", out,
               "--impl", "vllm-ascend", *flags)
    assert not out.exists()  # nothing half-ran
    return proc


def cli_with_env(tmp_path, env, *args):
    """The CLI in a subprocess with its own environment."""
    script = pathlib.Path(sys.executable).with_name("dyntra-emu")
    return subprocess.run([str(script), *map(str, args)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=240,
                          stdin=subprocess.DEVNULL)


def test_a_path_that_is_not_a_tree(cli, tmp_path, tiny_trace, clikit):
    proc = _run(cli, tmp_path, tiny_trace, clikit, "--vllm-ascend", tmp_path)
    clikit.assert_user_error(proc, f"--impl vllm-ascend: {tmp_path} is not a vllm-ascend "
                                   "source tree")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_a_missing_path(cli, tmp_path, tiny_trace, clikit):
    proc = _run(cli, tmp_path, tiny_trace, clikit, "--vllm-ascend", tmp_path / "nope")
    clikit.assert_user_error(proc, "no such directory")


def test_a_tree_without_dyntra_lb(cli, tmp_path, tiny_trace, clikit):
    tree = fake_tree(tmp_path / "old", dyntra_lb=False)
    proc = _run(cli, tmp_path, tiny_trace, clikit, "--vllm-ascend", tree)
    clikit.assert_user_error(proc, "this vllm-ascend has no DyntraLB (missing "
                                   "vllm_ascend/core/dyntra_lb_scheduler.py",
                             "ffa55704fb")


def test_the_environment_variable_names_the_tree(cli, tmp_path, tiny_trace, clikit,
                                                monkeypatch):
    tree = fake_tree(tmp_path / "old", dyntra_lb=False)
    monkeypatch.setenv("DYNTRA_VLLM_ASCEND", str(tree))
    proc = cli("run", "--workload", tiny_trace, *clikit.SMALL, "--out", tmp_path / "out",
               "--impl", "vllm-ascend")
    clikit.assert_user_error(proc, "this vllm-ascend has no DyntraLB")
    assert not (tmp_path / "out").exists()


def test_a_vllm_other_than_the_one_the_tree_pins(cli, tmp_path, tiny_trace, clikit):
    tree = fake_tree(tmp_path / "pinned", pins="v0.26.0")
    installed = installed_vllm()
    if installed is None:
        proc = _run(cli, tmp_path, tiny_trace, clikit, "--vllm-ascend", tree)
        clikit.assert_user_error(proc, "vLLM 0.26.0 is not installed")
        return
    # tried on the vLLM installed; the tree's (empty) DyntraLB fails there: one line
    # naming both releases and what failed, no traceback
    proc = cli("run", "--workload", tiny_trace, *clikit.SMALL, "--out", tmp_path / "out",
               "--impl", "vllm-ascend", "--vllm-ascend", tree, "--transport", "thread")
    assert proc.returncode == 1
    error = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(error) == 1 and (f"this vllm-ascend pins vLLM 0.26.0 and does not run on the "
                                f"installed vLLM {installed}: ") in error[0], proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.skipif(installed_vllm() is not None, reason="vLLM is installed here")
def test_vllm_missing(cli, tmp_path, tiny_trace, clikit):
    tree = fake_tree(tmp_path / "t")
    proc = _run(cli, tmp_path, tiny_trace, clikit, "--vllm-ascend", tree)
    clikit.assert_user_error(proc, f"vLLM {SUPPORTED_VLLM} is not installed")


def test_torch_npu_without_cann(cli, tmp_path, tiny_trace, clikit):
    fake = tmp_path / "site"
    (fake / "torch_npu").mkdir(parents=True)
    (fake / "torch_npu" / "__init__.py").write_text("raise ImportError('no CANN')\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME")}
    env["PYTHONPATH"] = str(fake)
    proc = cli_with_env(tmp_path, env, "run", "--workload", tiny_trace, *clikit.SMALL,
                        "--out", tmp_path / "out", "--impl", "vllm-ascend",
                        "--vllm-ascend", fake_tree(tmp_path / "t"))
    clikit.assert_user_error(proc, "torch_npu is installed but CANN is not set up")
    assert not (tmp_path / "out").exists()


def test_a_config_the_startup_checks_reject(cli, tmp_path, tiny_trace, clikit):
    config = ('{"scheduler_config": {"enable_balance_scheduling": true, '
              '"dyntra_lb_config": {"enabled": true}}}')
    proc = _run(cli, tmp_path, tiny_trace, clikit, "--vllm-ascend", fake_tree(tmp_path / "t"),
                "--additional-config", config)
    clikit.assert_user_error(proc, "enable_balance_scheduling only supports PD-mixed mode")


@pytest.mark.skipif(not SHARED_TREE.is_dir(), reason="no shared vllm-ascend tree beside the repo")
def test_validate_names_the_shared_tree_problem_or_accepts_it(cli, tmp_path, tiny_trace):
    proc = cli("validate", "--workload", tiny_trace, "--dp", "2", "--block-size", "16",
               "--impl", "vllm-ascend", "--vllm-ascend", SHARED_TREE)
    if installed_vllm() is None:
        assert proc.returncode == 1
        assert f"problem: --impl vllm-ascend: vLLM {SUPPORTED_VLLM} is not installed" in proc.stdout
    else:
        assert proc.returncode == 0, proc.stdout
        assert "vllm-ascend" in proc.stdout
