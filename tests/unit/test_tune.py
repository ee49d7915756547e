"""emu.tune's pure parts and its search loop on a real Optuna study in SQLite, with the
runs replaced by a function of the config and the seed (the runs themselves are
tests/cli/test_cli_tune.py's): the objectives, the paired pruning rule, the space, the
fingerprint that refuses another workload's study, pruned trials that stop after their
first seeds, repeated configs that run nothing, and resuming a study."""

from __future__ import annotations

import optuna
import pytest

from emu.tune import (
    KNOBS,
    OBJECTIVES,
    STUDY_NAME,
    Fingerprint,
    Search,
    Space,
    StudyMismatch,
    dominates,
    find_study,
    objective_value,
    open_study,
    out_of_reach,
    pareto_front,
    parse_names,
    recommend,
    trial_rows,
)
from emu.workload import TraceRequest

ALL = tuple(OBJECTIVES)


def _metrics(throughput: float, tpot_p99: float | None = 50.0, pause: float | None = None):
    return {"throughput_tok_s": throughput, "tpot_ms": {"p99": tpot_p99},
            "pauses": {"duration_ms": {"max": pause}}}


def test_objective_values_against_the_baseline_of_the_seed():
    base = _metrics(1000.0, 40.0)
    run = _metrics(1030.0, 42.5, 120.0)
    assert objective_value("throughput", run, base) == pytest.approx(3.0)
    assert objective_value("tpot_p99", run, base) == 42.5
    assert objective_value("longest_pause", run, base) == 120.0
    assert objective_value("longest_pause", _metrics(1.0), base) == 0.0  # no pause
    with pytest.raises(ValueError, match="no TPOT"):
        objective_value("tpot_p99", _metrics(1.0, None), base)


def test_parse_names_refuses_an_unknown_or_repeated_name():
    assert parse_names("mode, start_step", KNOBS, "--knobs") == ("mode", "start_step")
    with pytest.raises(ValueError, match="--knobs mode,speed: unknown name 'speed'"):
        parse_names("mode,speed", KNOBS, "--knobs")
    with pytest.raises(ValueError, match="given twice"):
        parse_names("mode,mode", KNOBS, "--knobs")


def test_dominates_in_each_objectives_direction():
    objectives = ("throughput", "tpot_p99")
    assert dominates([2.0, 40.0], [1.0, 40.0], objectives)
    assert not dominates([2.0, 41.0], [1.0, 40.0], objectives)
    assert not dominates([1.0, 40.0], [1.0, 40.0], objectives)  # equal is not better


def _seeds(**per_seed):
    """{"0": {"throughput": x, ...}, ...} from throughput=[...], tpot_p99=[...]."""
    names = list(per_seed)
    return {str(s): {n: per_seed[n][s] for n in names} for s in range(len(per_seed[names[0]]))}


def test_out_of_reach_is_a_paired_interval_on_the_worse_side():
    objectives = ("throughput", "tpot_p99")
    front = [_seeds(throughput=[3.0, 3.1, 2.9], tpot_p99=[40.0, 60.0, 50.0])]
    # 2 points less throughput on both seeds, the same TPOT: out of reach although the
    # seeds' TPOT p99 differ by 20 ms (shared by every config, paired away).
    worse = _seeds(throughput=[1.0, 1.1], tpot_p99=[40.0, 60.0])
    assert out_of_reach(worse, front, objectives)
    # Better TPOT on one seed: its interval reaches below the front's, so it may be on it.
    mixed = _seeds(throughput=[1.0, 1.1], tpot_p99=[30.0, 60.0])
    assert not out_of_reach(mixed, front, objectives)
    # Throughput that may be higher (wide interval): not pruned.
    noisy = _seeds(throughput=[0.0, 6.0], tpot_p99=[40.0, 60.0])
    assert not out_of_reach(noisy, front, objectives)
    assert not out_of_reach(worse, [], objectives)


def _trace(prompts):
    return [TraceRequest(f"r{i}", 0.0, p, 4) for i, p in enumerate(prompts)]


def test_space_takes_long_req_block_threshold_from_the_largest_prompt():
    space = Space.for_traces(KNOBS, [_trace([100, 4000]), _trace([9000])], 1000, "dynamic")
    assert space.long_req_blocks == (1, 8)  # 9 blocks: a threshold of 9 never arms


class _Trial:
    """What Space.suggest asks of an Optuna trial, answering from ``answers``."""

    def __init__(self, answers):
        self.answers = answers
        self.asked = []

    def _answer(self, name, *args, **kwargs):
        self.asked.append(name)
        return self.answers[name]

    suggest_categorical = suggest_int = suggest_float = _answer


def test_static_mode_asks_no_dynamic_knob_and_the_ratio_form_is_rounded():
    space = Space(KNOBS, (1, 40), "dynamic")
    trial = _Trial({"mode": "static", "start_step": 250, "bubble_form": "ratio",
                    "bubble_threshold_ratio": 0.30000000000000004})
    assert space.suggest(trial) == {"mode": "static", "start_step": 250,
                                    "bubble_threshold": 0.3}
    assert "long_req_block_threshold" not in trial.asked
    trial = _Trial({"bubble_form": "blocks", "bubble_threshold_blocks": 7,
                    "long_req_block_threshold": 12, "dynamic_max_step": 64})
    assert Space(("bubble_threshold", "long_req_block_threshold", "dynamic_max_step"),
                 (1, 40), "dynamic").suggest(trial) == {
        "bubble_threshold": 7, "long_req_block_threshold": 12, "dynamic_max_step": 64}


def _fingerprint(workload="recipe:x", space=None, seeds=(0, 1, 2)):
    return Fingerprint.of(workload=workload, traces={s: _trace([100 + s]) for s in seeds},
                          engine={"dp_size": 2}, base_config={}, objectives=ALL,
                          space=space or Space(KNOBS, (1, 40), "dynamic"))


class _Fake:
    """The runs of a study, as a function of the config and the seed: a later start_step
    costs throughput and TPOT, a higher bubble threshold longer pauses (so some configs
    are clearly worse than others in every objective); each seed adds an offset that
    every config shares, and a little noise of its own."""

    def __init__(self):
        self.runs = []

    def __call__(self, runs, names):
        self.runs += runs
        return [self.metrics(seed, values) for _, seed, values in runs]

    @staticmethod
    def metrics(seed, values):
        if values is None:
            return _metrics(1000.0 + seed, 50.0 + seed, None)
        start = values.get("start_step", 250)
        threshold = values.get("bubble_threshold", 5.0)
        noise = 0.05 * ((seed * 7 + start // 50) % 3)
        return _metrics(1000.0 + seed + 40.0 - start / 10.0 + noise,
                        50.0 + seed + start / 100.0, 100.0 * threshold)


def _search(study, fake, seeds=(0, 1, 2), trials=0):
    search = Search(study=study, space=Space(KNOBS, (1, 40), "dynamic"), objectives=ALL,
                    seeds=seeds, slots=2, run_batch=fake, say=lambda text: None)
    search.run(trials)
    return search


def test_a_study_prunes_runs_repeats_and_resumes(tmp_path):
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    fingerprint = _fingerprint()
    assert not find_study(storage, fingerprint)
    study = open_study(storage, fingerprint, ALL, seed=0)
    fake = _Fake()
    search = _search(study, fake, trials=12)
    assert search.runs == len(fake.runs)
    rows = trial_rows(study, ALL)
    assert len(rows) == 12
    by_state = {state: [r for r in rows if r["state"] == state] for state in ("complete",
                                                                             "pruned")}
    assert by_state["pruned"], "no trial was pruned"
    # A pruned trial stopped after its first two seeds; a complete one ran all three.
    ran = {}
    for trial, seed, _ in fake.runs:
        ran.setdefault(trial, set()).add(seed)
    assert ran.pop(None) == {0, 1, 2}  # the baselines, once
    for row in rows:
        seeds = {"pruned": {0, 1}, "complete": {0, 1, 2}}[row["state"]]
        if row["same_as"] is None:
            assert ran[row["number"]] == seeds, row
            assert row["seeds_run"] == len(seeds)
        else:
            assert row["number"] not in ran  # a repeated config ran nothing
    front = pareto_front(rows, ALL)
    best = recommend(rows, front, ALL, {})
    assert best["number"] in front
    assert best["estimates"]["throughput"][0] == max(
        r["estimates"]["throughput"][0] for r in by_state["complete"])

    # Resumed with the same settings: the baselines are not run again, 3 more trials.
    assert find_study(storage, fingerprint)
    again = open_study(storage, fingerprint, ALL, seed=0)
    fake_again = _Fake()
    _search(again, fake_again, trials=3)
    assert all(trial is not None for trial, _, _ in fake_again.runs)
    assert len(trial_rows(again, ALL)) == 15


def test_a_stopped_search_leaves_its_trials_failed_and_a_resume_adds_more(tmp_path):
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    fingerprint = _fingerprint()
    study = open_study(storage, fingerprint, ALL, seed=0)

    class Stop(_Fake):
        def __call__(self, runs, names):
            if len(self.runs) >= 9:  # the baselines and a round of two trials' first seeds
                raise KeyboardInterrupt
            return super().__call__(runs, names)

    with pytest.raises(KeyboardInterrupt):
        _search(study, Stop(), trials=10)
    states = [t.state.name for t in study.trials]
    assert "RUNNING" not in states and states.count("FAIL") >= 1
    finished = len(trial_rows(study, ALL))
    again = open_study(storage, fingerprint, ALL, seed=0)
    _search(again, _Fake(), trials=2)
    assert len(trial_rows(again, ALL)) == finished + 2


@pytest.mark.parametrize("change,key", [
    ({"workload": "recipe:y"}, "workload"),
    ({"seeds": (0, 1)}, "seeds"),
    ({"space": Space(("mode",), (1, 40), "dynamic")}, "space"),
])
def test_a_study_of_other_settings_is_refused(tmp_path, change, key):
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    open_study(storage, _fingerprint(), ALL, seed=0)
    with pytest.raises(StudyMismatch, match=f"another workload or settings: {key}: "):
        find_study(storage, _fingerprint(**change))


def test_a_config_drawn_again_runs_nothing(tmp_path):
    """Searching mode alone leaves two configs: of six trials, those after the first of
    each config take its outcome and run nothing."""
    space = Space(("mode",), (1, 40), "dynamic")
    study = open_study(f"sqlite:///{tmp_path / 'study.db'}", _fingerprint(space=space), ALL,
                       seed=0)
    fake = _Fake()
    search = Search(study=study, space=space, objectives=ALL, seeds=(0, 1, 2), slots=1,
                    run_batch=fake, say=lambda text: None)
    search.run(6)
    rows = trial_rows(study, ALL)
    assert len(rows) == 6
    firsts = [r for r in rows if r["same_as"] is None]
    assert sorted(r["values"]["mode"] for r in firsts) == ["dynamic", "static"]
    assert {r["number"] for r in firsts} == {
        trial for trial, _, _ in fake.runs if trial is not None}
    assert search.runs == 3 + 2 * 3  # the baselines and each config's three seeds


def test_the_base_config_is_the_first_trial(tmp_path):
    """The user's starting point (here production's defaults but for two keys) is tried
    first, so the recommendation is measured against it; a value off the ranges is not."""
    space = Space(KNOBS, (1, 40), "dynamic")
    first = space.start_params({"enabled": True, "long_req_block_threshold": 40,
                                "bubble_threshold": 0.25})
    assert first == {"mode": "dynamic", "start_step": 250, "bubble_form": "ratio",
                     "bubble_threshold_ratio": 0.25, "long_req_block_threshold": 40,
                     "dynamic_max_step": 256}
    assert space.start_params({"start_step": 260}) is None  # off the 50-step grid
    assert space.start_params({"long_req_block_threshold": 700}) is None  # above the range
    study = open_study(f"sqlite:///{tmp_path / 'study.db'}", _fingerprint(), ALL, seed=0,
                       first=first)
    fake = _Fake()
    Search(study=study, space=space, objectives=ALL, seeds=(0, 1, 2), slots=1,
           run_batch=fake, say=lambda text: None).run(1)
    assert trial_rows(study, ALL)[0]["values"] == {
        "mode": "dynamic", "start_step": 250, "bubble_threshold": 0.25,
        "long_req_block_threshold": 40, "dynamic_max_step": 256}


def test_a_new_sqlite_storage_appears_with_its_schema_whole(tmp_path, monkeypatch):
    """A watcher may open the study's file the moment it appears: the file must never be
    one whose schema the command is still making (the watcher would make it too, and one
    of the two would fail on Optuna's version row)."""
    import sqlite3

    import optuna

    path = tmp_path / "study.db"
    opened_at_path = []

    class Watched(optuna.storages.RDBStorage):
        def __init__(self, url, *args, **kwargs):
            if url == f"sqlite:///{path}":
                tables = ({row[0] for row in sqlite3.connect(path).execute(
                    "SELECT name FROM sqlite_master WHERE type='table'")}
                          if path.exists() else set())
                opened_at_path.append("alembic_version" in tables)
            super().__init__(url, *args, **kwargs)

    monkeypatch.setattr(optuna.storages, "RDBStorage", Watched)
    storage = f"sqlite:///{path}"
    assert not find_study(storage, _fingerprint())
    open_study(storage, _fingerprint(), ALL, seed=0)
    assert opened_at_path and all(opened_at_path), opened_at_path
    assert [p.name for p in tmp_path.iterdir()] == ["study.db"]  # no scratch file left


def test_the_recommendation_keeps_within_every_limit():
    """--max-tpot-p99-ms and --max-pause-ms bound the recommendation by the trials' means:
    the best throughput among the front's trials within both, or none."""
    def row(number, gain, tpot, pause):
        return {"number": number, "state": "complete", "same_as": None,
                "estimates": {"throughput": [gain, 1.0], "tpot_p99": [tpot, 1.0],
                              "longest_pause": [pause, 1.0]}}

    rows = [row(0, 6.0, 40.0, 300_000.0), row(1, 4.0, 45.0, 20_000.0),
            row(2, 2.0, 35.0, 0.0)]
    front = pareto_front(rows, ALL)
    assert front == [0, 1, 2]
    assert recommend(rows, front, ALL, {})["number"] == 0
    assert recommend(rows, front, ALL, {"longest_pause": 60_000.0})["number"] == 1
    assert recommend(rows, front, ALL, {"longest_pause": 60_000.0,
                                        "tpot_p99": 40.0})["number"] == 2
    assert recommend(rows, front, ALL, {"longest_pause": 60_000.0,
                                        "tpot_p99": 30.0}) is None


@pytest.mark.parametrize("where", ["ask", "tell"])
def test_a_stop_inside_a_storage_write_waits_for_it_and_leaves_no_trial_running(
        tmp_path, monkeypatch, where):
    """SIGINT delivered in the middle of the study's own storage calls (a trial just
    asked for, a trial being told its result) acts once the call is done: the search
    stops with KeyboardInterrupt and every trial is finished or failed, none RUNNING."""
    import os
    import signal

    storage = f"sqlite:///{tmp_path / 'study.db'}"
    study = open_study(storage, _fingerprint(), ALL, seed=0)
    real = getattr(study, where)
    calls = []

    def interrupted(*args, **kwargs):
        result = real(*args, **kwargs)
        calls.append(where)
        if len(calls) == 3:  # past the first trials, so the stop lands mid-study
            os.kill(os.getpid(), signal.SIGINT)
        return result

    monkeypatch.setattr(study, where, interrupted)
    with pytest.raises(KeyboardInterrupt):
        _search(study, _Fake(), trials=10)
    states = [t.state.name for t in optuna.load_study(
        study_name=STUDY_NAME, storage=storage).trials]
    assert "RUNNING" not in states, states
    assert len(calls) >= 3 and len(states) >= 3
