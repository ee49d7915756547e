"""The regression gate's logic (emu/gate.py) on metrics dictionaries made here: tolerances,
the checks --tol picks, verdicts, an `ab --seeds` baseline's spread, the JUnit report read
back by a JUnit consumer (junitparser). Real runs: tests/cli/test_cli_gate.py."""

from __future__ import annotations

import copy
import json
import re
import statistics

import pytest
from junitparser import Failure, JUnitXml, Skipped

from emu.ab_seeds import write_ab_json
from emu.gate import (
    DEFAULT_TOLERANCES,
    REGRESSION,
    Baseline,
    GateInputError,
    Tolerance,
    evaluate,
    junit_xml,
    parse_tolerance,
    plan_checks,
    read_baseline,
    read_run,
)
from emu.recipes import mean_pi
from emu.report import flat_metrics


def _dist(p50, p99):
    return {"count": 10, "mean": p50, "p50": p50, "p90": p99, "p99": p99, "max": p99}


def metrics(**changes) -> dict:
    """A schema-1 metrics dictionary with the keys the gate checks by default."""
    m = {"schema_version": 1, "run_state": "complete", "seed": 0, "config": {"dp_size": 2},
         "requests_total": 10, "requests_finished": 10, "output_tokens": 200,
         "throughput_tok_s": 100.0, "virtual_time_s": 2.0, "bubble_ratio": 0.05,
         "balance_ratio": 0.8, "preemptions": 0, "tpot_ms": _dist(20.0, 30.0),
         "ttft_ms": _dist(50.0, 90.0), "itl_ms": _dist(20.0, 25.0),
         "e2e_ms": _dist(400.0, 900.0),
         "pauses": {"total": 4, "requests_paused_pct": 30.0, "longest_paused_ms": 800.0}}
    for name, value in changes.items():
        where, *path = name.split("__")
        target = m
        for key in [where, *path][:-1]:
            target = target[key]
        target[[where, *path][-1]] = value
    return m


def baseline_of(m: dict) -> Baseline:
    return Baseline("base", flat_metrics(m), None, [m])


def verdicts(run: dict, base: Baseline, *tols: str) -> dict:
    known = set(flat_metrics(run)) & set(base.values)
    return {c.metric: c.verdict for c in evaluate(run, base, plan_checks(list(tols), known))}


def test_tolerance_texts():
    assert parse_tolerance("-2%") == Tolerance(2.0, True, "down")
    assert parse_tolerance("+10%") == Tolerance(10.0, True, "up")
    assert parse_tolerance("+0.01") == Tolerance(0.01, False, "up")
    assert parse_tolerance("5%") == Tolerance(5.0, True, "both")
    assert parse_tolerance("exact") == parse_tolerance("0") == Tolerance(0.0, False, "both")
    assert parse_tolerance("off") is None
    for bad in ("-2 %", "2%%", "x", "--1", "+", ""):
        with pytest.raises(ValueError, match="expected -X%"):
            parse_tolerance(bad)
    assert [str(parse_tolerance(t)) for t in ("-2%", "+0.01", "5%", "exact")] == \
        ["-2%", "+0.01", "±5%", "exact"]


def test_bounds():
    assert parse_tolerance("-2%").bounds(200.0) == (196.0, None)
    assert parse_tolerance("+0.01").bounds(0.05) == (None, pytest.approx(0.06))
    assert parse_tolerance("5%").bounds(-40.0) == (-42.0, -38.0)
    assert parse_tolerance("+10%").bounds(0) == (None, 0)  # a zero baseline allows no rise


def test_a_run_against_itself_passes_every_default():
    m = metrics()
    result = verdicts(m, baseline_of(m))
    assert list(result) == list(DEFAULT_TOLERANCES)
    assert set(result.values()) == {"pass"}


@pytest.mark.parametrize(("metric", "worse", "better"), [
    ("throughput_tok_s", 97.9, 140.0),       # -2 %: 98.0 is the floor
    ("virtual_time_s", 2.05, 1.0),           # +2 %: 2.04
    ("bubble_ratio", 0.0601, 0.0),           # +0.01 absolute: 0.06
    ("balance_ratio", 0.789, 1.0),           # -0.01 absolute: 0.79
    ("tpot_ms__p99", 33.1, 20.0),            # +10 %: 33.0
    ("preemptions", 1, 0),                   # +0
])
def test_a_default_fails_only_the_worse_way(metric, worse, better):
    base = baseline_of(metrics())
    name = metric.replace("__", ".")
    assert verdicts(metrics(**{metric: worse}), base)[name] == REGRESSION
    assert verdicts(metrics(**{metric: better}), base)[name] == "pass"


def test_what_must_not_move_fails_either_way():
    base = baseline_of(metrics())
    for value in (9, 11):
        assert verdicts(metrics(requests_finished=value), base)["requests_finished"] == REGRESSION
    assert verdicts(metrics(output_tokens=201), base)["output_tokens"] == REGRESSION


def test_tol_overrides_adds_and_turns_off():
    base = baseline_of(metrics())
    run = metrics(throughput_tok_s=97.0, pauses__total=6, tpot_ms__p99=40.0)
    result = verdicts(run, base, "throughput_tok_s=-5%", "pauses.total=+20%",
                      "tpot_ms.p99=off")
    assert result["throughput_tok_s"] == "pass"       # -3 % within -5 %
    assert result["pauses.total"] == REGRESSION       # +50 % beyond +20 %
    assert "tpot_ms.p99" not in result
    assert list(result)[-1] == "pauses.total"         # added after the defaults


def test_null_values():
    base = baseline_of(metrics(tpot_ms__p99=None))
    result = {c.metric: c for c in evaluate(metrics(), base, plan_checks([], set()))}
    assert result["tpot_ms.p99"].verdict == "n/a"
    both = {c.metric: c for c in evaluate(metrics(tpot_ms__p99=None), base,
                                          plan_checks([], set()))}
    assert both["tpot_ms.p99"].verdict == "n/a"
    lost = {c.metric: c for c in evaluate(metrics(tpot_ms__p99=None), baseline_of(metrics()),
                                          plan_checks([], set()))}
    assert lost["tpot_ms.p99"].verdict == REGRESSION
    assert "no value in the run" in lost["tpot_ms.p99"].reason


@pytest.mark.parametrize(("tol", "message"), [
    ("throughput=-2%", "unknown metric 'throughput' (did you mean throughput_tok_s?)"),
    ("tpot_ms.p99", "expected METRIC=TOLERANCE"),
    ("tpot_ms.p99=10", None),
    ("tpot_ms.p99=ten%", "tolerance 'ten%': expected"),
    ("throughput_tok_s=+2%", "higher is better for throughput_tok_s, so +2% would fail an "
                             "improvement and pass any fall; did you mean -2%?"),
    ("tpot_ms.p99=-10%", "lower is better for tpot_ms.p99, so -10% would fail an improvement "
                         "and pass any rise; did you mean +10%?"),
])
def test_bad_tol(tol, message):
    known = set(flat_metrics(metrics()))
    if message is None:
        plan_checks([tol], known)  # unsigned: either way, allowed for any metric
        return
    with pytest.raises(GateInputError, match=re.escape(f"--tol {tol}") + ".*"
                       + re.escape(message)):
        plan_checks([tol], known)


def test_a_metric_given_twice():
    with pytest.raises(GateInputError, match="--tol pauses.total=2: pauses.total is given "
                                             "twice"):
        plan_checks(["pauses.total=1", "pauses.total=2"], set(flat_metrics(metrics())))


def test_ab_baseline_uses_the_prediction_interval(tmp_path):
    throughputs = [100.0, 104.0, 96.0, 101.0]
    pairs = [(seed, metrics(seed=seed), metrics(seed=seed, throughput_tok_s=t,
                                                config={"workload": f"r (seed {seed})"}))
             for seed, t in enumerate(throughputs)]
    write_ab_json(tmp_path / "ab.json", workload="r", dp_size=2, labels=("off", "on"),
                  pairs=pairs)
    base = read_baseline(tmp_path, None)  # the directory: its ab.json, side b
    assert base.samples["throughput_tok_s"] == throughputs
    mean, half = mean_pi(throughputs)
    assert half == pytest.approx(3.182 * statistics.stdev(throughputs) * (1 + 1 / 4) ** 0.5)
    inside = metrics(throughput_tok_s=mean - half * 0.99)
    outside = metrics(throughput_tok_s=mean - half * 1.01)
    assert verdicts(inside, base)["throughput_tok_s"] == "pass"
    assert verdicts(outside, base)["throughput_tok_s"] == REGRESSION
    # Much above the mean passes: the default guards the lower side only.
    high = metrics(throughput_tok_s=mean + 3 * half)
    assert verdicts(high, base)["throughput_tok_s"] == "pass"
    # Equal in every seed: no spread, so it must not move.
    assert verdicts(metrics(requests_finished=9), base)["requests_finished"] == REGRESSION
    # --tol names a fixed tolerance around the mean instead (outside is 11.8 % below it).
    assert verdicts(outside, base, "throughput_tok_s=-15%")["throughput_tok_s"] == "pass"
    assert verdicts(outside, base, "throughput_tok_s=-10%")["throughput_tok_s"] == REGRESSION
    side_a = read_baseline(tmp_path / "ab.json", "a")
    assert side_a.values["throughput_tok_s"] == 100.0


def test_inputs_refused(tmp_path):
    with pytest.raises(GateInputError, match="no such file or directory"):
        read_run(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{nope")
    with pytest.raises(GateInputError, match="bad.json: not valid JSON"):
        read_run(tmp_path / "bad.json")
    (tmp_path / "other.json").write_text('{"a": 1}')
    with pytest.raises(GateInputError, match="not a run's metrics.json"):
        read_run(tmp_path / "other.json")
    (tmp_path / "partial.json").write_text(json.dumps(metrics(run_state="interrupted")))
    with pytest.raises(GateInputError, match="partial run .*'interrupted'"):
        read_run(tmp_path / "partial.json")
    (tmp_path / "m.json").write_text(json.dumps(metrics()))
    with pytest.raises(GateInputError, match="--baseline-side a: only for an `ab --seeds`"):
        read_baseline(tmp_path / "m.json", "a")


def test_junit_report_reads_back(tmp_path):
    base = baseline_of(metrics())
    run = metrics(throughput_tok_s=90.0, tpot_ms__p99=None)
    checks = evaluate(run, base, plan_checks(["pauses.total=exact"], set(flat_metrics(run))))
    path = tmp_path / "gate.xml"
    path.write_text(junit_xml(checks, "runs/x", copy.deepcopy(base)))

    suites = list(JUnitXml.fromfile(str(path)))
    assert len(suites) == 1
    suite = suites[0]
    cases = {case.name: case for case in suite}
    assert list(cases) == [c.metric for c in checks]
    assert suite.tests == len(checks) and suite.failures == 2 and suite.errors == 0
    failures = {name for name, case in cases.items()
                if any(isinstance(r, Failure) for r in case.result)}
    assert failures == {"throughput_tok_s", "tpot_ms.p99"}
    message = next(r for r in cases["throughput_tok_s"].result).message
    assert "throughput_tok_s is 90, baseline 100" in message and ">= 98" in message
    assert not any(isinstance(r, Skipped) for case in cases.values() for r in case.result)
    assert cases["pauses.total"].is_passed
