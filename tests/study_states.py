"""A `dyntra-emu tune` study's trials by state, read from its storage as another process
watching it would (tests/cli/test_cli_tune.py, tests/cli/test_cli_ray_cluster.py)."""

from __future__ import annotations

import optuna

from emu.tune import STUDY_NAME


def study_states(storage: str) -> dict[str, int]:
    """The number of trials in each state (``COMPLETE``, ``RUNNING``, ...); empty while
    the study is still being created."""
    try:
        study = optuna.load_study(study_name=STUDY_NAME, storage=storage)
    except (KeyError, optuna.exceptions.StorageInternalError):
        return {}
    counts: dict[str, int] = {}
    for trial in study.get_trials(deepcopy=False):
        counts[trial.state.name] = counts.get(trial.state.name, 0) + 1
    return counts


def finished(counts: dict[str, int]) -> int:
    """Trials that ended with a result: complete or pruned."""
    return counts.get("COMPLETE", 0) + counts.get("PRUNED", 0)
