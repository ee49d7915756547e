"""`dyntra-emu tune` end to end on real runs (2 rank threads each, in local job
processes): a study stopped by Ctrl-C mid-study keeps its finished trials in its SQLite
file, which another process (this test, through Optuna's own API) watches while it runs,
and the same command again resumes it with --trials more; the recommendation is a config
`validate` accepts, and its A/B against DyntraLB off ran on fresh seeds. On a trace file
a single objective runs TPE on one seed. Bad input is one line, exit 2, nothing run or
written."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from emu.tune import STUDY_NAME
from tests.study_states import finished, study_states

pytestmark = pytest.mark.integration

# A generated workload of 4 requests on 2 rank threads: a run takes about a second.
TINY_RECIPE = ["--workload", "recipe:pr12292,n=4,rate=20", "--dp", "2", "--block-size", "2048",
               "--max-num-seqs", "2", "--device", "cpu"]


@pytest.mark.timeout(600)
def test_a_study_stopped_by_sigint_resumes_from_its_storage(cli, clikit, tmp_path):
    out = tmp_path / "study"
    storage = f"sqlite:///{out / 'study.db'}"
    # --min-gain 0: this workload's gains are tiny; the test is about the study, not them.
    command = [sys.executable, "-m", "emu", "tune", *TINY_RECIPE, "--seeds", "2",
               "--ab-seeds", "2", "--min-gain", "0", "--out", str(out)]
    proc = subprocess.Popen([*command, "--trials", "30"], cwd=tmp_path,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        counts: dict[str, int] = {}
        while finished(counts) < 2:  # watched through the storage while it runs
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, f"no two trials finished: {counts}"
            time.sleep(0.5)
            if (out / "study.db").exists():
                counts = study_states(storage)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, stderr
    assert "dyntra-emu tune: interrupted by SIGINT" in stderr
    assert "run the same command again to resume it" in stderr
    assert "Traceback" not in stderr
    assert not (out / "tune.json").exists()  # no report of a partial study
    stopped = study_states(storage)
    assert "RUNNING" not in stopped, stopped  # the trials under way were marked failed
    done = finished(stopped)
    assert 2 <= done < 30

    resumed = subprocess.run([*command, "--trials", "2"], cwd=tmp_path, capture_output=True,
                             text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming the study" in resumed.stderr
    after = study_states(storage)
    assert finished(after) == done + 2, (stopped, after)
    assert after.get("FAIL", 0) == stopped.get("FAIL", 0)
    report = json.loads((out / "tune.json").read_text())
    assert report["trial_counts"]["complete"] + report["trial_counts"]["pruned"] == done + 2
    # The baselines ran once, before the stop: the resumed command ran 2 trials of 2 seeds
    # (fewer if a trial was pruned or repeated one) and the A/B's 4 runs.
    assert report["runs"]["search"] <= 4 and report["runs"]["ab"] == 4
    assert report["pareto_front"] and report["recommended"]["trial"] in report["pareto_front"]

    # The A/B ran on seeds the search did not use, as `ab --seeds` lays them out.
    ab = json.loads((out / "ab" / "ab.json").read_text())
    assert ab["seeds"] == [2, 3] and report["ab"]["seeds"] == [2, 3]
    assert {r["seed"] for r in ab["runs"]} == {2, 3}
    assert sorted(p.name for p in (out / "runs").iterdir())[0] == "baseline"
    assert {p.name for p in (out / "runs" / "baseline").iterdir()} == {"seed0", "seed1"}
    assert "How sure:" in resumed.stdout and report["confidence"] in resumed.stdout
    for name in ("summary.md", "front.png", "recommended.json"):
        assert (out / name).stat().st_size > 0

    valid = cli("validate", *TINY_RECIPE, "--additional-config",
                f"@{out / 'recommended.json'}")
    assert valid.returncode == 0, valid.stdout
    recommended = json.loads((out / "recommended.json").read_text())
    lb = recommended["scheduler_config"]["dyntra_lb_config"]
    assert lb == {"enabled": True, **report["recommended"]["values"]}


def test_one_objective_on_a_trace_file(cli, clikit, tmp_path, tiny_trace):
    """A trace file is one workload: one seed per trial, TPE for the one objective, no
    fresh seeds for the A/B, and the line on how sure says the numbers are exact."""
    proc = cli("tune", "--workload", tiny_trace, *clikit.SMALL, "--objectives", "throughput",
               "--knobs", "mode,start_step", "--trials", "3", "--min-gain", "0", "--out", "t")
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "t" / "tune.json").read_text())
    assert report["seeds"] == [0] and report["ab_seeds"] == [] and report["ab"] is None
    assert len(report["trials"]) == 3
    assert all(set(t["values"]) <= {"mode", "start_step"} for t in report["trials"])
    assert report["runs"]["search"] <= 4  # the baseline and at most one run per trial
    # One objective: the front is the trials with the best mean (ties share it).
    distinct = [t for t in report["trials"] if t["same_as"] is None]
    best = max(t["estimates"]["throughput"][0] for t in distinct)
    assert sorted(report["pareto_front"]) == sorted(
        t["number"] for t in distinct if t["estimates"]["throughput"][0] == best)
    assert "How sure: exact for this trace" in proc.stdout
    assert not (tmp_path / "t" / "ab").exists()
    study = optuna.load_study(study_name=STUDY_NAME,
                              storage=f"sqlite:///{tmp_path / 't' / 'study.db'}")
    assert study.directions == [optuna.study.StudyDirection.MAXIMIZE]

    # A finished study, its report written, resumes the same way.
    again = cli("tune", "--workload", tiny_trace, *clikit.SMALL, "--objectives", "throughput",
                "--knobs", "mode,start_step", "--trials", "1", "--min-gain", "0", "--out", "t")
    assert again.returncode == 0, again.stderr
    assert len(json.loads((tmp_path / "t" / "tune.json").read_text())["trials"]) == 4


def test_no_config_worth_it_recommends_keeping_dyntra_lb_off(cli, clikit, tmp_path,
                                                              tiny_trace):
    """--min-gain above every trial's gain: the recommendation is "keep DyntraLB off", with
    the front's gains and tails that say why; no config file, no A/B. With --min-gain 0
    the same study recommends its best trial."""
    common = ["tune", "--workload", tiny_trace, *clikit.SMALL, "--knobs", "mode",
              "--trials", "2", "--out", "t"]
    proc = cli(*common, "--min-gain", "1000")
    assert proc.returncode == 0, proc.stderr
    assert "Recommended: keep DyntraLB off. No trial of the Pareto front has a mean " \
           "throughput gain of at least --min-gain 1000 %" in proc.stdout
    report = json.loads((tmp_path / "t" / "tune.json").read_text())
    assert report["recommended"] is None and report["ab"] is None
    front = [t for t in report["trials"] if t["number"] in report["pareto_front"]]
    for trial in front:  # the numbers that say why
        assert f"trial {trial['number']}: gain {trial['estimates']['throughput'][0]:+.2f} %" \
            in proc.stdout
    assert not (tmp_path / "t" / "recommended.json").exists()
    again = cli(*common, "--trials", "1", "--min-gain", "0")
    assert again.returncode == 0, again.stderr
    assert "Chosen as the highest mean throughput gain among the Pareto front's trials" \
        in again.stdout
    assert (tmp_path / "t" / "recommended.json").exists()


def _other_study(path: Path) -> str:
    """A storage holding a study of another workload, as a tune of it would leave it."""
    from emu.tune import KNOBS, OBJECTIVES, Fingerprint, Space, open_study
    from emu.workload import TraceRequest

    storage = f"sqlite:///{path}"
    fingerprint = Fingerprint.of(
        workload="longtail", traces={0: [TraceRequest("r", 0.0, 10, 2)]}, engine={},
        base_config={}, objectives=tuple(OBJECTIVES), space=Space(KNOBS, (1, 9), "dynamic"))
    open_study(storage, fingerprint, tuple(OBJECTIVES), seed=0)
    return storage


@pytest.mark.parametrize("args,fragment", [
    (["--knobs", "mode,speed"], "--knobs mode,speed: unknown name 'speed'; expected some of "
                                "mode, start_step, bubble_threshold"),
    (["--objectives", "throughput,cost"], "--objectives throughput,cost: unknown name 'cost'"),
    (["--trials", "0"], "--trials 0: an empty budget, no trial would run"),
    (["--objectives", "throughput,tpot_p99", "--max-pause-ms", "60000"],
     "--max-pause-ms: needs longest_pause among --objectives"),
    (["--seeds", "3"], "--seeds 3: needs a generated workload"),
    (["--storage", "sqlite:///{tmp}/notes.txt"], "--storage sqlite:///{tmp}/notes.txt: not an "
                                                  "Optuna storage this command can open"),
    (["--storage", "{other}"], "--storage {other}: holds a study of another workload or "
                               "settings: workload: \"longtail\" in the study"),
])
def test_bad_input_is_one_line_and_runs_nothing(cli, clikit, tmp_path, tiny_trace, args,
                                                fragment):
    (tmp_path / "notes.txt").write_text("not a database\n")
    other = _other_study(tmp_path / "other.db")
    args = [a.replace("{tmp}", str(tmp_path)).replace("{other}", other) for a in args]
    proc = cli("tune", "--workload", tiny_trace, *clikit.SMALL, *args, "--out", "never")
    clikit.assert_user_error(proc, fragment.replace("{tmp}", str(tmp_path))
                             .replace("{other}", other))
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "never").exists()
    assert study_states(other) == {}  # the other study is as it was
