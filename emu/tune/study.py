"""The study's storage: the fingerprint of the settings its numbers depend on, finding,
opening (with its sampler) and deleting the study in an Optuna storage."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import warnings
from collections.abc import Sequence
from pathlib import Path

from emu.tune.objectives import OBJECTIVES
from emu.tune.space import Space

STUDY_NAME = "dyntra-emu tune"
# The study's settings, in its user attributes (Fingerprint), and the baselines' metrics.
FINGERPRINT_ATTR = "dyntra_emu_fingerprint"
BASELINES_ATTR = "dyntra_emu_baselines"
# NSGA-II's generation; Optuna's default (50) would make a budget of a few dozen trials
# one random generation. Assumed.
POPULATION = 8
# TPE's random trials before it models the results (Optuna's default is 10). Assumed.
STARTUP_TRIALS = 8


@dataclasses.dataclass(frozen=True)
class Fingerprint:
    """What a study's numbers depend on: the workload (each search seed's trace, hashed),
    the engine settings, the base config, the seeds, the objectives and the space. A
    resumed study must have the same; the transport, executor and budget may differ."""

    record: dict

    @classmethod
    def of(cls, *, workload: str, traces: dict[int, Sequence], engine: dict,
           base_config: dict, objectives: Sequence[str], space: Space) -> Fingerprint:
        hashes = {str(seed): _trace_sha256(trace) for seed, trace in traces.items()}
        return cls({"workload": workload, "seeds": sorted(traces), "traces_sha256": hashes,
                    "engine": engine, "base_additional_config": base_config,
                    "objectives": list(objectives), "space": space.describe()})

    def differences(self, stored: dict) -> list[str]:
        """The top-level keys in which ``stored`` differs, each with both values."""
        return [f"{key}: {_short(stored.get(key))} in the study, {_short(value)} here"
                for key, value in self.record.items()
                if json.loads(json.dumps(value)) != stored.get(key)]


def _trace_sha256(trace: Sequence) -> str:
    rows = [[r.request_id, r.arrival_s, r.prompt_tokens, r.output_tokens, r.rank,
             r.priority] for r in trace]
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()


def _short(value) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."


class StudyMismatch(ValueError):
    """The storage holds a study made with other settings; the message lists them."""


def find_study(storage_url: str, fingerprint: Fingerprint) -> bool:
    """Whether the storage holds this command's study, made with ``fingerprint``
    (StudyMismatch when it holds one made otherwise). Problems with the storage itself
    are raised as they come (the command names the flag)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    summaries = optuna.get_all_study_summaries(_storage(storage_url))
    study = next((s for s in summaries if s.study_name == STUDY_NAME), None)
    if study is None:
        return False
    stored = study.user_attrs.get(FINGERPRINT_ATTR)
    if stored is None:
        raise StudyMismatch(f"holds a study named {STUDY_NAME!r} that dyntra-emu tune did "
                            "not make")
    problems = fingerprint.differences(stored)
    if problems:
        raise StudyMismatch("holds a study of another workload or settings: "
                            + "; ".join(problems))
    return True


def open_study(storage_url: str, fingerprint: Fingerprint, objectives: Sequence[str],
               seed: int, first: dict | None = None):
    """The study in ``storage_url``: loaded when there is one (``find_study``), else
    created with ``fingerprint`` and ``first`` (Optuna parameters, ``Space.start_params``)
    as its first trial. The sampler is TPE for one objective, NSGA-II for several, seeded
    with ``seed`` and the number of trials already in the study (a resumed study does not
    draw its first trials again). Trials a stopped process left running are marked
    failed."""
    import optuna

    found = find_study(storage_url, fingerprint)
    storage = _storage(storage_url)
    trials = len(optuna.load_study(study_name=STUDY_NAME, storage=storage).trials) \
        if found else 0
    study = optuna.create_study(storage=storage, study_name=STUDY_NAME,
                                directions=[OBJECTIVES[n].direction for n in objectives],
                                load_if_exists=True,
                                sampler=_sampler(len(objectives), seed + trials))
    if not found:
        study.set_user_attr(FINGERPRINT_ATTR, json.loads(json.dumps(fingerprint.record)))
        if first is not None:
            study.enqueue_trial(first)
    for trial in study.get_trials(deepcopy=False,
                                  states=(optuna.trial.TrialState.RUNNING,)):
        study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
    return study


def delete_study(storage_url: str) -> None:
    """Remove this command's study from the storage, if it is there (--overwrite)."""
    import optuna

    storage = _storage(storage_url)
    if STUDY_NAME in {s.study_name for s in optuna.get_all_study_summaries(storage)}:
        optuna.delete_study(study_name=STUDY_NAME, storage=storage)


def _storage(url: str):
    """The study's storage. A SQLite file that does not exist yet is made whole beside
    its path and moved into place, so a watcher that opens the path as soon as it
    appears never meets a half-made schema (its own schema creation would then collide
    with ours on Optuna's version row)."""
    import optuna

    if not url.startswith("sqlite"):
        return optuna.storages.RDBStorage(url)
    # SQLite: wait for a watcher's read instead of failing with "database is locked".
    kwargs = {"connect_args": {"timeout": 60}}
    path = Path(url.removeprefix("sqlite:///"))
    if url.startswith("sqlite:///") and path.name and not path.exists():
        fresh = path.with_name(f".{path.name}.{os.getpid()}.new")
        optuna.storages.RDBStorage(f"sqlite:///{fresh}", engine_kwargs=kwargs).engine.dispose()
        try:
            os.link(fresh, path)  # fails if another process put its file there first
        except FileExistsError:
            pass
        finally:
            fresh.unlink()
    return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)


def _sampler(objectives: int, seed: int):
    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if objectives == 1:
            return optuna.samplers.TPESampler(seed=seed, n_startup_trials=STARTUP_TRIALS,
                                              multivariate=True, group=True,
                                              constant_liar=True)
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=POPULATION)

