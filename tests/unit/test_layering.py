"""The architecture's one-way arrows (docs/architecture.md): dyntra_lb never imports emu; inside
dyntra_lb only coordinator.py may import torch; and inside emu every import runs down
its floors (``FLOORS``) and no import circle exists.

Every import counts: at module level, inside functions and under ``TYPE_CHECKING``, each
read with ``ast`` from the source, so an import made late to save start-up time is still
an arrow."""

import ast
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "dyntra_lb"
PURE_MODULES = ["blocks", "config", "diagnostics", "payload", "planner.front",
                "planner.registry", "planner.python", "planner.python_card",
                "planner.compiled", "planner.compiled_steps", "planner.compiled_card",
                "policy", "pause_rule", "pause_limit"]


def _imported_roots(path: pathlib.Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


DYNTRA_LB_FILES = sorted(PACKAGE.rglob("*.py"))


def _file_id(path: pathlib.Path) -> str:
    return str(path.relative_to(PACKAGE))


@pytest.mark.parametrize("path", DYNTRA_LB_FILES, ids=_file_id)
def test_dyntra_lb_never_imports_emu(path):
    assert "emu" not in _imported_roots(path)


@pytest.mark.parametrize("path", DYNTRA_LB_FILES, ids=_file_id)
def test_only_the_coordinator_imports_torch(path):
    if path.name != "coordinator.py":
        assert "torch" not in _imported_roots(path)


def test_importing_the_pure_modules_loads_no_torch():
    modules = ", ".join(f"dyntra_lb.{name}" for name in PURE_MODULES)
    code = f"import sys, {modules}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("module", ["emu.executors.local", "emu.executors.ray_task"])
def test_the_batch_runners_import_first_in_a_fresh_interpreter(module):
    # A local job process or a Ray worker unpickles its task, importing the task's module
    # before anything else.
    subprocess.run([sys.executable, "-c", f"import {module}"], check=True)


# --------------------------------------------------------------------------- emu's floors

# emu's modules by floor, top to bottom: a module may import its own floor's modules and
# those of the floors below, never one above. An entry names a module or a package (then
# every module in it). Every module must be on a floor, so a new one is placed here.
FLOORS = [
    ("the front ends: the command line, python -m emu, the pytest plugin",
     ["emu.cli", "emu.__main__", "emu.pytest_plugin"]),
    ("a batch of runs searched: a grid (dyntra-emu sweep), an Optuna study (dyntra-emu tune)",
     ["emu.sweep", "emu.tune"]),
    ("where a batch of runs executes: local job processes, Ray", ["emu.executors"]),
    ("one run: run(spec), measured and recorded; in a fresh process",
     ["emu.run", "emu.run_apart"]),
    ("RunSpec and every rule that refuses one", ["emu.spec"]),
    ("the transports: rank processes, rank threads, torchrun; supervision, devices",
     ["emu.cluster"]),
    ("reading runs and logs afterwards: replay, explain, diff", ["emu.offline"]),
    ("what runs inside a rank: the kit, vllm-ascend", ["emu.impl"]),
    ("what every rank has: context, harness, clock, costs, logs, recorder",
     ["emu.rank"]),
    ("the ground every floor stands on: traces and their formats and routers, faults, metrics "
     "and their reports, plots, block-count distributions, timelines, the gate and ab.json, "
     "recipes, settings' kinds and limits, collective sites, run status, the bytecode cache, "
     "the collector's pace, how a process ends, the run's records, split windows and their "
     "stitch, the passes over a run's steps and the lines they draw",
     ["emu.workload", "emu.traces", "emu.routers", "emu.vllm_dp_lb", "emu.block_counts",
      "emu.faults", "emu.metrics", "emu.metric_catalogue", "emu.report", "emu.plots",
      "emu.timeline", "emu.gate", "emu.ab_seeds",
      "emu.recipes", "emu.no_effect", "emu.run_status", "emu.knobs", "emu.limits", "emu.sites",
      "emu.bytecode", "emu.collector", "emu.process_exit", "emu.records", "emu.verdict",
      "emu.split", "emu.step_passes", "emu.lines"]),
]


def emu_modules(root: pathlib.Path) -> dict[str, pathlib.Path]:
    """Every module of the emu package under ``root`` by dotted name (a package by its
    own name, for its __init__)."""
    modules = {}
    for path in (root / "emu").rglob("*.py"):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def import_graph(root: pathlib.Path) -> dict[str, set[str]]:
    """module -> the emu modules it imports, wherever in the module the import is."""
    modules = emu_modules(root)

    def resolve(name: str) -> str | None:  # the module a dotted name lives in
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(resolve(a.name) for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                # `from emu.x import y` imports emu.x.y when that is a module
                targets.update(resolve(f"{base}.{a.name}") or resolve(base)
                               for a in node.names)
        graph[module] = {t for t in targets if t is not None and t != module}
    return graph


def floor_of(module: str) -> int | None:
    """The index in FLOORS of ``module``'s floor (its longest matching entry); the
    package ``emu`` itself (a docstring) is ground."""
    if module == "emu":
        return len(FLOORS) - 1
    best, floor = "", None
    for index, (_, entries) in enumerate(FLOORS):
        for entry in entries:
            if (module == entry or module.startswith(entry + ".")) and len(entry) > len(best):
                best, floor = entry, index
    return floor


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return [f"{a} (floor {floor_of(a)}: {FLOORS[floor_of(a)][0]}) imports {b} "
            f"(floor {floor_of(b)}: {FLOORS[floor_of(b)][0]})"
            for a in sorted(graph) for b in sorted(graph[a]) if floor_of(b) < floor_of(a)]


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle of imports per strongly connected group of modules (Tarjan), each as
    the path that closes it, e.g. [a, b, a]."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(_closing_path(graph, sorted(group)))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _closing_path(graph: dict[str, set[str]], group: list[str]) -> list[str]:
    """A path from the group's first module back to itself, inside the group."""
    start, members = group[0], set(group)
    paths = {start: [start]}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph[v] & members):
            if w == start:
                return paths[v] + [start]
            if w not in paths:
                paths[w] = paths[v] + [w]
                queue.append(w)
    raise AssertionError(f"no circle through {start}")


def test_every_emu_module_is_on_a_floor():
    assert [m for m in sorted(emu_modules(ROOT)) if floor_of(m) is None] == []


def test_no_emu_import_runs_up_a_floor():
    assert upward_imports(import_graph(ROOT)) == []


def test_no_circle_of_imports_in_emu():
    assert circles(import_graph(ROOT)) == []


def _tree_with(tmp_path: pathlib.Path, module: str, line: str) -> pathlib.Path:
    """A copy of emu/ in which ``module`` ends with a function holding ``line``."""
    shutil.copytree(ROOT / "emu", tmp_path / "emu")
    path = tmp_path / (module.replace(".", "/") + ".py")
    path.write_text(path.read_text() + f"\n\ndef _added():\n    {line}\n")
    return tmp_path


def test_an_import_added_inside_a_function_is_seen(tmp_path):
    """The checks fail on a copy of emu/ with one more import: upward (the clock
    reaching for the command line) or closing a circle (the trace format needing the
    faults, which need the trace format)."""
    upward = import_graph(_tree_with(tmp_path / "up", "emu.rank.clock",
                                     "from emu.cli.main import main"))
    assert upward_imports(upward) == [
        "emu.rank.clock (floor 8: what every rank has: context, harness, clock, costs, "
        "logs, recorder) imports emu.cli.main (floor 0: the front ends: the command line, "
        "python -m emu, the pytest plugin)"]
    circle = import_graph(_tree_with(tmp_path / "circle", "emu.workload.request",
                                     "import emu.faults"))
    assert upward_imports(circle) == []  # same floor: only the circle check sees it
    assert circles(circle) == [["emu.faults", "emu.workload.request", "emu.faults"]]
