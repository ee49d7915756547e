"""The bundled workloads (fixtures/workloads/): their names, a ``--workload`` value
resolved to a trace file, and what a run calls the workload it read."""

from __future__ import annotations

import os
from pathlib import Path

# The bundled workloads, next to the package (a source checkout or an editable install).
WORKLOADS_DIR = Path(__file__).resolve().parents[2] / "fixtures" / "workloads"


def bundled_workloads() -> list[str]:
    """Names of the traces under fixtures/workloads/ (empty when not installed)."""
    if not WORKLOADS_DIR.is_dir():
        return []
    return sorted(p.stem for p in WORKLOADS_DIR.glob("*.jsonl"))


def resolve_workload(value: str) -> Path:
    """A workload given as FILE or NAME -> its trace file. An existing path wins; a bare
    name (no directory part, no suffix such as .jsonl or .csv) is a bundled workload.
    Raises ValueError starting with the value, e.g. ``'longtale': no such file and not a bundled
    workload; ...`` (the CLI puts ``--workload`` in front)."""
    path = Path(value)
    if path.exists():
        return path
    is_name = value and "/" not in value and os.sep not in value and not path.suffix
    if not is_name:
        raise ValueError(f"{value}: no such file")
    bundled = WORKLOADS_DIR / f"{value}.jsonl"
    if bundled.is_file():
        return bundled
    names = bundled_workloads()
    if not names:
        raise ValueError(f"{value!r}: no such file, and the bundled workloads are not "
                         f"installed (looked in {WORKLOADS_DIR}); pass a trace file")
    raise ValueError(f"{value!r}: no such file and not a bundled workload; bundled "
                     f"workloads are: {', '.join(names)}")


def workload_label(value: str, path: Path) -> str:
    """What ``RunSpec.workload`` (and so metrics.json's ``config.workload``) calls the
    workload ``value`` resolved to ``path``: a bundled workload's name, else the file."""
    return value if path.parent == WORKLOADS_DIR else str(path)

