"""dyntra_lb's public API (docs/api.md): every documented name imports from the package
and is the object its module defines, every example of the page runs, importing the
package loads neither torch nor the planner, and the moved modules' old paths import."""

import importlib
import pathlib
import re
import subprocess
import sys

import pytest

import dyntra_lb

ROOT = pathlib.Path(__file__).resolve().parents[2]
API_PAGE = ROOT / "docs" / "api.md"


def documented_names() -> list[str]:
    """The names of docs/api.md's sections (``## `name` ``)."""
    return re.findall(r"^## `(\w+)`$", API_PAGE.read_text(), re.MULTILINE)


def examples() -> list[str]:
    """docs/api.md's Python code blocks, in page order."""
    return re.findall(r"^```python\n(.*?)^```$", API_PAGE.read_text(), re.MULTILINE | re.DOTALL)


def test_the_page_documents_exactly_the_public_names():
    assert sorted(documented_names()) == sorted(dyntra_lb.__all__) == sorted(dyntra_lb._HOMES)


@pytest.mark.parametrize("name", sorted(dyntra_lb.__all__))
def test_a_public_name_is_its_modules_object(name):
    home = dyntra_lb._HOMES[name]
    assert getattr(dyntra_lb, name) is getattr(importlib.import_module(home), name)
    namespace = {}
    exec(f"from dyntra_lb import {name}", namespace)
    assert namespace[name] is getattr(importlib.import_module(home), name)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'balance'"):
        dyntra_lb.balance  # noqa: B018
    with pytest.raises(ImportError):
        exec("from dyntra_lb import balance", {})


def test_every_example_of_the_page_runs():
    """Each example in a fresh namespace, all in one fresh interpreter (the coordinator's
    example makes a process group)."""
    blocks = examples()
    assert len(blocks) > len(documented_names())  # the import line, then one per name
    script = "\n".join(f"exec(compile({block!r}, 'docs/api.md example {i}', 'exec'), {{}})"
                       for i, block in enumerate(blocks))
    subprocess.run([sys.executable, "-c", script], check=True, cwd=ROOT, timeout=300)


def test_importing_the_package_loads_neither_torch_nor_the_planner():
    code = ("import sys, dyntra_lb; from dyntra_lb import DyntraLBConfig, check_deployment; "
            "print(sorted(m for m in ('torch', 'numba', 'dyntra_lb.planner.front') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


def test_the_planners_old_module_names_import():
    """dyntra_lb/planner.py and its sibling modules became the package dyntra_lb/planner/;
    the old names stay importable, as the same modules."""
    # dyntra_lb.planner was the module dyntra_lb/planner.py
    from dyntra_lb.planner import Plan, balance_load, front

    assert (balance_load, Plan) == (front.balance_load, front.Plan)
    for old, new in dyntra_lb._MOVED.items():
        module = importlib.import_module(old)
        assert module is importlib.import_module(new) and module.__spec__.name == new
    from dyntra_lb.planners import get  # was dyntra_lb/planners.py
    assert get("reference") is balance_load
