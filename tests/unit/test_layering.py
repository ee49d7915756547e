"""The architecture's one-way arrows (design.md): dyntra_lb never imports emu, and
inside dyntra_lb only coordinator.py may import torch."""

import ast
import pathlib
import subprocess
import sys

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "dyntra_lb"
PURE_MODULES = ["blocks", "config", "diagnostics", "payload", "planner", "planner_native",
                "planners", "policy"]


def _imported_roots(path: pathlib.Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("path", sorted(PACKAGE.glob("*.py")), ids=lambda p: p.name)
def test_dyntra_lb_never_imports_emu(path):
    assert "emu" not in _imported_roots(path)


@pytest.mark.parametrize("path", sorted(PACKAGE.glob("*.py")), ids=lambda p: p.name)
def test_only_the_coordinator_imports_torch(path):
    if path.name != "coordinator.py":
        assert "torch" not in _imported_roots(path)


def test_importing_the_pure_modules_loads_no_torch():
    modules = ", ".join(f"dyntra_lb.{name}" for name in PURE_MODULES)
    code = f"import sys, {modules}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_sweep_runner_imports_first_in_a_fresh_interpreter():
    # A sweep job process unpickles its task, importing emu.sweep before anything of the
    # CLI: emu.sweep imports emu.cli.errors, which must not load the commands (emu.cli.sweep
    # imports emu.sweep back).
    subprocess.run([sys.executable, "-c", "import emu.sweep"], check=True)
