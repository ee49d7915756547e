"""The regression gate: one run's metrics against a baseline's, metric by metric.

``dyntra-emu gate RUN --baseline BASE`` (emu/cli/gate.py) reads both with ``read_run``
and ``read_baseline``, picks the checks with ``plan_checks`` (``DEFAULT_TOLERANCES``,
changed by ``--tol``), and ``evaluate`` returns one ``Check`` per metric; ``gate_table``,
``junit_xml`` and ``report_json`` turn them into what the command prints and writes.

A baseline is one run (its metrics.json), or one side of an ``ab --seeds`` record
(emu/ab_seeds.py). Then a metric's baseline value is its mean over the seeds and,
unless ``--tol`` names the metric, its limit is the 95 % prediction interval of one
more seed (``emu.recipes.mean_pi``), on the side the default tolerance guards.

Metric names are the dotted names of ``dyntra-emu ab``'s table
(``emu.report.flat_metrics``): ``throughput_tok_s``, ``tpot_ms.p99``,
``per_rank.1.utilisation``, ... (docs/metrics.md).
"""

from __future__ import annotations

import difflib
import json
import re
import socket
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from emu.ab_seeds import FILE_NAME as AB_FILE
from emu.ab_seeds import AbFileError, is_ab_json, parse_ab_json
from emu.metric_catalogue import better, default_tolerances
from emu.recipes import mean_pi
from emu.report import flat_metrics
from emu.run_status import describe_unfinished, read_status

# The checks a gate runs unless --tol changes them, in the order it reports them (the
# metric catalogue's, which says what each tolerance means).
DEFAULT_TOLERANCES = default_tolerances()

_TOLERANCE = re.compile(r"([+-]?)(\d+(?:\.\d*)?|\.\d+)(%?)")

PASS, REGRESSION, NOT_APPLICABLE = "pass", "REGRESSION", "n/a"

# How a tolerance's direction is written.
_SIGNS = {"down": "-", "up": "+", "both": "±"}


class GateInputError(ValueError):
    """A run, a baseline or a --tol the gate cannot use; the message names it."""


# ------------------------------------------------------------------ tolerances


@dataclass(frozen=True)
class Tolerance:
    """How far a metric may move from its baseline value: ``amount`` (a percentage of
    the baseline when ``relative``, else in the metric's unit) in ``direction``:
    "down" (may fall by at most the amount; any rise passes), "up" (the reverse) or
    "both"."""

    amount: float
    relative: bool
    direction: str

    def __str__(self) -> str:
        if self.amount == 0 and self.direction == "both":
            return "exact"
        return f"{_SIGNS[self.direction]}{self.amount:g}{'%' if self.relative else ''}"

    def bounds(self, base: float) -> tuple[float | None, float | None]:
        """The lowest and highest passing value around ``base`` (None: no limit). A
        relative tolerance of a zero baseline allows no move."""
        limit = self.amount * abs(base) / 100 if self.relative else self.amount
        return (base - limit if self.direction in ("down", "both") else None,
                base + limit if self.direction in ("up", "both") else None)


def parse_tolerance(text: str) -> Tolerance | None:
    """``-2%``, ``+10%``, ``+0.01``, ``5%`` (either way), ``exact`` (= ``0``), or ``off``
    (None: the metric is not checked). ValueError says what is expected."""
    if text == "off":
        return None
    if text == "exact":
        return Tolerance(0.0, False, "both")
    match = _TOLERANCE.fullmatch(text)
    if match is None:
        raise ValueError(f"tolerance {text!r}: expected -X% / +X% (may fall / rise by at "
                         "most X % of the baseline), -X / +X (by at most X, absolute), X% "
                         "or X (either way), exact, or off")
    sign, amount, percent = match.groups()
    direction = {"-": "down", "+": "up", "": "both"}[sign]
    return Tolerance(float(amount), percent == "%", direction)


def plan_checks(tol_args: list[str], known: set[str]) -> list[tuple[str, Tolerance, bool]]:
    """The checks to run: (metric, tolerance, given by --tol) for each default not
    turned off, then each metric --tol adds. ``known``: the metric names both the run and
    the baseline have. GateInputError names a bad --tol."""
    given: dict[str, Tolerance | None] = {}
    for arg in tol_args:
        metric, sep, text = arg.partition("=")
        if not sep or not metric:
            raise GateInputError(f"--tol {arg}: expected METRIC=TOLERANCE, e.g. "
                                 "throughput_tok_s=-2%")
        if metric in given:
            raise GateInputError(f"--tol {arg}: {metric} is given twice")
        if metric not in known:
            close = difflib.get_close_matches(metric, sorted(known), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise GateInputError(f"--tol {arg}: unknown metric {metric!r}{hint}; metrics are "
                                 "the dotted names of `dyntra-emu ab`'s table that both the "
                                 "run and the baseline have (docs/metrics.md)")
        try:
            tolerance = parse_tolerance(text)
        except ValueError as exc:
            raise GateInputError(f"--tol {arg}: {exc}") from None
        _check_sign(arg, metric, tolerance)
        given[metric] = tolerance
    checks = []
    for metric, text in DEFAULT_TOLERANCES.items():
        user = metric in given
        tolerance = given.pop(metric) if user else parse_tolerance(text)
        if tolerance is not None:
            checks.append((metric, tolerance, user))
    checks += [(metric, t, True) for metric, t in given.items() if t is not None]
    return checks


def _check_sign(arg: str, metric: str, tolerance: Tolerance | None) -> None:
    """Refuse a one-sided tolerance that would fail improvements and pass any worsening."""
    way = better(metric)
    if tolerance is None or way is None or tolerance.direction == "both":
        return
    if (way == "higher") == (tolerance.direction == "up"):
        worse = "fall" if way == "higher" else "rise"
        flipped = Tolerance(tolerance.amount, tolerance.relative,
                            "down" if tolerance.direction == "up" else "up")
        raise GateInputError(f"--tol {arg}: {way} is better for {metric}, so {tolerance} "
                             f"would fail an improvement and pass any {worse}; did you mean "
                             f"{flipped}?")


# ------------------------------------------------------------------ inputs


@dataclass
class Baseline:
    """What a run is compared with. ``values``: metric -> baseline value (for an ab
    record the mean over its seeds); ``samples``: metric -> each seed's value (ab
    record only, else None); ``runs``: the metrics dictionary of each run (their
    configs and seeds are compared with the run's)."""

    source: str
    values: dict
    samples: dict | None
    runs: list[dict]


def read_run(path) -> dict:
    """The metrics of the run at ``path``: a run directory (its metrics.json, or metrics
    computed from its event logs when it has none) or a metrics.json file. A run that
    did not finish is refused, as emu.metrics.load_run refuses it."""
    path = _existing(path)
    if path.is_dir():
        return _read_run_dir(path)
    record = _read_json(path)
    if is_ab_json(record):
        raise GateInputError(f"{path}: an `ab --seeds` record; RUN is one run (a run "
                             "directory or its metrics.json, e.g. DIR/seed<s>/b)")
    return _checked_metrics(record, path)


def read_baseline(path, side: str | None) -> Baseline:
    """The baseline at ``path``: a run directory or metrics.json (``side`` must be None),
    or an ``ab --seeds`` directory or its ab.json (``side`` a or b; None means b)."""
    path = _existing(path)
    record = None
    if path.is_dir() and (path / AB_FILE).is_file():
        path = path / AB_FILE
    if path.is_file():
        record = _read_json(path)
    if record is not None and is_ab_json(record):
        return _ab_baseline(record, path, side or "b")
    if side is not None:
        raise GateInputError(f"--baseline-side {side}: only for an `ab --seeds` baseline; "
                             f"{path} is one run")
    metrics = _checked_metrics(record, path) if record is not None else _read_run_dir(path)
    return Baseline(str(path), flat_metrics(metrics), None, [metrics])


def _ab_baseline(record: dict, path: Path, side: str) -> Baseline:
    try:
        ab = parse_ab_json(record, path)
    except AbFileError as exc:
        raise GateInputError(str(exc)) from None
    runs = [_checked_metrics(m, f"{path} (seed {seed}, run {side})")
            for seed, m in zip(ab.seeds, ab.metrics[side], strict=True)]
    flats = [flat_metrics(m) for m in runs]
    names = [n for n in flats[0] if all(n in f for f in flats)]
    samples = {n: [f[n] for f in flats] for n in names}
    values = {n: (None if None in v else sum(v) / len(v)) for n, v in samples.items()}
    source = (f"{path}, run {side} ({ab.labels[side]}) over seeds "
              f"{', '.join(map(str, ab.seeds))}")
    return Baseline(source, values, samples, runs)


def _existing(path) -> Path:
    path = Path(path)
    if not path.exists():
        raise GateInputError(f"{path}: no such file or directory")
    return path


def _read_run_dir(path: Path) -> dict:
    status = read_status(path)
    if status is not None and status.get("state") != "complete":
        raise GateInputError(f"{describe_unfinished(path, status)}; a partial run cannot "
                             "be gated")
    if (path / "metrics.json").is_file():
        return _checked_metrics(_read_json(path / "metrics.json"), path / "metrics.json")
    from emu.metrics import RunError, compute_metrics, load_run

    try:
        return compute_metrics(load_run(path))
    except RunError as exc:
        raise GateInputError(str(exc)) from None


def _read_json(path: Path):
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise GateInputError(f"{path}: cannot read it: {exc}") from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise GateInputError(f"{path}: not valid JSON: {exc}") from None


def _checked_metrics(record, where) -> dict:
    """``record`` when it is a finished run's metrics (docs/metrics.md), else
    GateInputError."""
    if not isinstance(record, dict) or "throughput_tok_s" not in record \
            or "schema_version" not in record:
        raise GateInputError(f"{where}: not a run's metrics.json (docs/metrics.md)")
    if record["schema_version"] != 1:
        raise GateInputError(f"{where}: metrics schema_version {record['schema_version']!r}; "
                             "this version of dyntra-emu reads 1")
    state = record.get("run_state")
    if state not in (None, "complete"):
        raise GateInputError(f"{where}: the metrics of a partial run (run_state "
                             f"{state!r}); a partial run cannot be gated")
    return record


# ------------------------------------------------------------------ the checks


@dataclass
class Check:
    """One metric's verdict. ``low`` / ``high``: the passing range (None: unbounded on
    that side); ``tolerance``: as the report shows it; ``reason``: why it failed or was
    not applicable ("" when it passed)."""

    metric: str
    baseline: float | None
    run: float | None
    tolerance: str
    low: float | None
    high: float | None
    verdict: str
    reason: str

    @property
    def change(self) -> float | None:
        if self.baseline is None or self.run is None:
            return None
        return self.run - self.baseline

    @property
    def change_pct(self) -> float | None:
        change = self.change
        return None if change is None or not self.baseline else change / abs(self.baseline) * 100


def evaluate(run: dict, baseline: Baseline, checks) -> list[Check]:
    """One Check per (metric, tolerance, given by --tol) of ``checks`` (``plan_checks``)
    for the metrics ``run`` against ``baseline``."""
    flat = flat_metrics(run)
    out = []
    for metric, tolerance, given in checks:
        base, shown = baseline.values.get(metric), str(tolerance)
        if baseline.samples is not None and not given:
            tolerance, shown = _spread_tolerance(baseline.samples.get(metric), tolerance)
        out.append(_check(metric, base, flat.get(metric), tolerance, shown))
    return out


def _spread_tolerance(samples, default: Tolerance) -> tuple[Tolerance | None, str]:
    """For an ab baseline: the default's direction, the 95 % prediction interval's
    half-width as the amount (None when a seed has no value)."""
    if not samples or None in samples:
        return None, "95 % PI"
    _, half = mean_pi(samples)
    tolerance = Tolerance(half, False, default.direction)
    return tolerance, f"{_SIGNS[default.direction]}95 % PI of {len(samples)} seeds"


def _check(metric, base, value, tolerance: Tolerance | None, shown: str) -> Check:
    """The verdict of one metric; ``tolerance`` is None only when ``base`` is (an ab
    baseline with a seed that has no value)."""
    if base is None:
        reason = ("no value in the run or the baseline" if value is None
                  else "no value in the baseline to compare with")
        return Check(metric, base, value, shown, None, None, NOT_APPLICABLE, reason)
    low, high = tolerance.bounds(base)
    if value is None:
        return Check(metric, base, value, shown, low, high, REGRESSION,
                     f"no value in the run (the baseline has {_num(base)})")
    if (low is not None and value < low) or (high is not None and value > high):
        return Check(metric, base, value, shown, low, high, REGRESSION,
                     f"{metric} is {_num(value)}, baseline {_num(base)} "
                     f"({_signed(value - base)}); allowed: {_limit(low, high)} "
                     f"(tolerance {shown})")
    return Check(metric, base, value, shown, low, high, PASS, "")


def config_notes(run: dict, baseline: Baseline) -> list[str]:
    """What differs between how the run and the baseline were made: the config keys
    (except the device) on which every baseline run agrees and the run does not (the
    seeds of an ab baseline differ in their workload label), and, for a one-run
    baseline, the seed. The gate compares them anyway, and says so."""
    configs = [m.get("config") or {} for m in baseline.runs]
    mine = run.get("config") or {}
    differ = sorted(k for k in {*mine, *configs[0]} if k != "device"
                    and all(c.get(k) == configs[0].get(k) for c in configs)
                    and mine.get(k) != configs[0].get(k))
    notes = []
    if differ:
        notes.append(f"the run and the baseline differ in config {', '.join(differ)}")
    seed = baseline.runs[0].get("seed")
    if baseline.samples is None and run.get("seed") != seed:
        notes.append(f"the run's seed is {run.get('seed')}, the baseline's {seed}")
    return notes


# ------------------------------------------------------------------ reports


def failed(checks: list[Check]) -> list[Check]:
    return [c for c in checks if c.verdict == REGRESSION]


def gate_table(checks: list[Check]) -> str:
    """Every checked metric: both values, the change, the tolerance, the passing range,
    the verdict."""
    header = ("metric", "baseline", "run", "change", "change %", "tolerance", "allowed",
              "verdict")
    rows = [(c.metric, _num(c.baseline), _num(c.run),
             "-" if c.change is None else _signed(c.change),
             "-" if c.change_pct is None else f"{c.change_pct:+.2f}%",
             c.tolerance, _limit(c.low, c.high), c.verdict) for c in checks]
    widths = [max(len(str(r[i])) for r in (header, *rows)) for i in range(len(header))]
    lines = ["  ".join(f"{cell:<{w}}" if i == 0 else f"{cell:>{w}}"
                       for i, (cell, w) in enumerate(zip(row, widths, strict=True))).rstrip()
             for row in (header, *rows)]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def verdict_line(checks: list[Check]) -> str:
    bad = failed(checks)
    skipped = sum(c.verdict == NOT_APPLICABLE for c in checks)
    na = f" ({skipped} not applicable)" if skipped else ""
    if not bad:
        return f"PASS: {len(checks)} metrics checked, none regressed{na}"
    return (f"REGRESSION: {len(bad)} of {len(checks)} metrics regressed{na}: "
            f"{', '.join(c.metric for c in bad)}")


def report_json(checks: list[Check], run_source: str, baseline: Baseline,
                notes: list[str]) -> dict:
    """The report ``--json`` prints."""
    return {
        "run": run_source, "baseline": baseline.source, "passed": not failed(checks),
        "notes": notes,
        "checks": [{**asdict(c), "change": c.change, "change_pct": c.change_pct}
                   for c in checks],
    }


def junit_xml(checks: list[Check], run_source: str, baseline: Baseline) -> str:
    """A JUnit XML report as pytest writes one: a testsuites root with one testsuite,
    one testcase per metric, a failure element for a regression and a skipped element
    for a metric without values to compare."""
    suite_attrs = {
        "name": "dyntra-emu gate", "tests": str(len(checks)),
        "failures": str(len(failed(checks))), "errors": "0",
        "skipped": str(sum(c.verdict == NOT_APPLICABLE for c in checks)), "time": "0",
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "hostname": socket.gethostname(),
    }
    root = ET.Element("testsuites", {"name": "dyntra-emu gate"})
    suite = ET.SubElement(root, "testsuite", suite_attrs)
    properties = ET.SubElement(suite, "properties")
    for name, value in (("run", run_source), ("baseline", baseline.source)):
        ET.SubElement(properties, "property", {"name": name, "value": value})
    for c in checks:
        case = ET.SubElement(suite, "testcase",
                             {"classname": "dyntra-emu.gate", "name": c.metric, "time": "0"})
        if c.verdict == REGRESSION:
            failure = ET.SubElement(case, "failure", {"message": c.reason, "type": "regression"})
            failure.text = (f"baseline {_num(c.baseline)}, run {_num(c.run)}, tolerance "
                            f"{c.tolerance}, allowed {_limit(c.low, c.high)}")
        elif c.verdict == NOT_APPLICABLE:
            ET.SubElement(case, "skipped", {"message": c.reason})
        else:
            ET.SubElement(case, "system-out").text = (
                f"baseline {_num(c.baseline)}, run {_num(c.run)}, allowed "
                f"{_limit(c.low, c.high)}")
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def _num(value) -> str:
    if value is None:
        return "-"
    return str(value) if isinstance(value, int) else f"{value:.6g}"


def _signed(value) -> str:
    return f"{value:+d}" if isinstance(value, int) else f"{value:+.6g}"


def _limit(low, high) -> str:
    if low is None and high is None:
        return "-"
    if low is not None and high is not None:
        return f"= {_num(low)}" if low == high else f"{_num(low)} .. {_num(high)}"
    return f">= {_num(low)}" if low is not None else f"<= {_num(high)}"
