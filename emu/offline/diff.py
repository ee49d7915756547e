"""Two runs' event logs (and DyntraLB diagnostics logs), compared step by step.

``dyntra-emu diff`` (``emu/cli/diff.py``) calls this after running the same trace,
config and seed twice — our DyntraLB (``--impl kit``) against vllm-ascend's, or two
vllm-ascend trees — or on two existing run directories. Everything here is pure:
``read_run`` loads a directory, ``compare`` aligns the two runs per rank and iteration
(lockstep iterations are numbered the same on every rank and in both runs) and lists
every divergence, ``format_report`` / ``DiffReport.to_dict`` print it, ``plot_load``
draws both runs' per-rank load with the divergences marked.

What is compared, per rank and iteration (the kinds of ``STEP_FIELDS``): the plan
DyntraLB generated and the one the scheduler applied, what the scheduler did (paused,
resumed, admitted, preempted, finished, tokens, dummy step), the snapshot (running and
waiting counts and block sums), ``step_counter`` and the wave, the collective sequence
(site, op, shape, dtype), the KV pool and virtual time (with DyntraLB's control-plane
charge); then every request record; then
the diagnostics lines of ``rank<r>.log`` with the prefixes removed
(``emu.offline.logscan.clean_line``).

A run that failed (run.json "failed": a rank stalled, broke a strict invariant, or was
killed by a fault) is compared too, as far as every rank of it logged: a failure is
behaviour, and whether the other side fails the same way is the question. The outcomes
(complete, or the failure's reason) are compared first, as kind "outcome"; two failed
runs are compared on the iterations both logged (the launcher stops the other ranks at
different points, so their step counts are not compared).

Normalised before comparing (both are orders vLLM does not define): ``preempted`` is
compared as a sorted list (vLLM's ``preempted_req_ids`` is a set), and the emulator's
own ``emulated engine: ...`` line of a rank log is skipped (the vllm-ascend ranks always
write it, the kit only with diagnostics).
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from emu.metrics import RunError, load_run
from emu.offline.logscan import clean_line
from emu.run_status import read_status

# Step-record field -> divergence kind. A field not listed is compared as kind "other".
STEP_FIELDS = {
    "plan_generated": "plan", "plan_applied": "plan", "lb_active": "plan",
    "paused": "schedule", "resumed": "schedule", "admitted": "schedule",
    "preempted": "schedule", "finished": "schedule", "scheduled_tokens": "schedule",
    "dummy": "schedule",
    "num_running": "snapshot", "num_waiting": "snapshot", "running_blocks": "snapshot",
    "waiting_blocks": "snapshot",
    "step_counter": "counter", "wave": "counter",
    "collectives": "collectives",
    "kv_free_blocks": "kv", "kv_held_blocks": "kv", "paused_kv_blocks": "kv",
    "clock_s": "time", "own_cost_s": "time", "step_time_s": "time", "control_plane": "time",
}
# Kinds in the order a reader looks at them (what DyntraLB decided first).
KINDS = ("outcome", "steps", "plan", "schedule", "snapshot", "counter", "collectives", "kv", "time",
         "other", "request", "diagnostics")
_IGNORED = {"iter", "kind", "rank"}
# The fields shown for each side in a divergence's "state" and "before" context.
_STATE_FIELDS = ("iter", "step_counter", "wave", "num_running", "running_blocks",
                 "num_waiting", "waiting_blocks", "plan_applied", "plan_generated",
                 "paused", "resumed", "admitted", "preempted", "finished")
_EMULATOR_LINE = re.compile(r"^emulated engine: ")
_STEP_LINE = re.compile(r"^_has_global_unfinished_reqs \| step_counter: ")
# Differing stretches of two rank logs longer than this are not aligned line by line.
_MATCH_LIMIT = 5000


class DiffInputError(ValueError):
    """A run directory cannot be compared (missing, unreadable, inconsistent)."""


@dataclass
class RunLogs:
    """One run directory: step records per rank, request records per rank (by id), and
    the cleaned diagnostics messages per rank as (line number, message); ``failure`` is
    the reason of a failed run (None: it completed)."""

    label: str
    directory: Path
    steps: list[list[dict]]
    requests: list[dict[str, dict]]
    logs: list[list[tuple[int, str]]]
    failure: str | None = None

    @property
    def dp_size(self) -> int:
        return len(self.steps)


def read_run(directory, label: str) -> RunLogs:
    """The run in ``directory`` (its records, optional ``rank<r>.log``), a
    failed one as far as every rank logged. Raises DiffInputError naming the directory."""
    directory = Path(directory)
    status = read_status(directory) if directory.is_dir() else None
    failure = None
    if status is not None and status.get("state") == "failed":
        failure = status.get("reason") or "failed (no reason recorded)"
    try:
        run = load_run(directory, allow_partial=failure is not None)
    except RunError as exc:
        raise DiffInputError(str(exc)) from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DiffInputError(f"{directory}: cannot read the records: {exc}") from None
    requests: list[dict[str, dict]] = [{} for _ in range(run.dp_size)]
    for record in run.request_records():
        requests[record["rank"]][record["request_id"]] = record
    logs = []
    for rank in range(run.dp_size):
        path = directory / f"rank{rank}.log"
        try:
            text = path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""
        except OSError as exc:
            raise DiffInputError(f"{path}: cannot read: {exc.strerror or exc}") from None
        messages = diagnostics_messages(text.splitlines())
        if failure is not None:
            messages = _first_iterations(messages, len(run.steps[rank]))
        logs.append(messages)
    steps = [run.step_records(rank) for rank in range(run.dp_size)]
    return RunLogs(label, directory, steps, requests, logs, failure)


def _first_iterations(messages: list[tuple[int, str]], count: int) -> list[tuple[int, str]]:
    """The diagnostics messages of the first ``count`` iterations (each begins with its
    ``_has_global_unfinished_reqs | step_counter:`` line): what a failed run logged on the
    iterations kept of its event logs."""
    seen = 0
    for index, (_, message) in enumerate(messages):
        if _STEP_LINE.match(message):
            seen += 1
            if seen > count:
                return messages[:index]
    return messages


def diagnostics_messages(lines) -> list[tuple[int, str]]:
    """(line number, message) of a rank log's lines, prefixes removed, without the
    emulator's ``emulated engine:`` line."""
    out = []
    for number, raw in enumerate(lines, start=1):
        _, message = clean_line(raw)
        if not _EMULATOR_LINE.match(message):
            out.append((number, message))
    return out


# --------------------------------------------------------------------------- compare


@dataclass
class Divergence:
    """One difference. ``iter`` is the iteration (None for a request record, or a
    diagnostics line before the first step); ``fields`` maps each differing field to
    ``[A's value, B's value]``; ``context`` holds the state around it (only the first
    step divergence has one: the later ones are mostly its consequences)."""

    kind: str
    rank: int | None  # None: the run as a whole (kind "outcome")
    iter: int | None
    fields: dict
    what: str = ""
    context: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "rank": self.rank, "iter": self.iter,
                "what": self.what, "fields": self.fields, "context": self.context}


@dataclass
class DiffReport:
    """Both runs, what was compared (``counts``) and every divergence, first first."""

    labels: tuple[str, str]
    directories: tuple[str, str]
    counts: dict
    divergences: list[Divergence]
    failures: tuple[str | None, str | None] = (None, None)  # each run's, None: completed

    @property
    def identical(self) -> bool:
        return not self.divergences

    @property
    def first(self) -> Divergence | None:
        """The first divergence of the steps, requests or logs (the outcome, printed in
        the report's head, only when nothing else differs)."""
        return next((d for d in self.divergences if d.kind != "outcome"),
                    self.divergences[0] if self.divergences else None)

    def by_kind(self) -> dict[str, dict]:
        """Per kind: how many, on which ranks, the first iteration, which fields."""
        groups: dict[str, dict] = {}
        for d in self.divergences:
            g = groups.setdefault(d.kind, {"count": 0, "ranks": set(), "first_iter": None,
                                           "fields": set()})
            g["count"] += 1
            if d.rank is not None:
                g["ranks"].add(d.rank)
            g["fields"].update(d.fields)
            if d.iter is not None and (g["first_iter"] is None or d.iter < g["first_iter"]):
                g["first_iter"] = d.iter
        return {k: {**groups[k], "ranks": sorted(groups[k]["ranks"]),
                    "fields": sorted(groups[k]["fields"])}
                for k in KINDS if k in groups}

    def to_dict(self) -> dict:
        return {"identical": self.identical, "labels": list(self.labels),
                "directories": list(self.directories), "counts": self.counts,
                "failures": list(self.failures),
                "first": self.first.to_dict() if self.first else None,
                "by_kind": self.by_kind(),
                "divergences": [d.to_dict() for d in self.divergences]}


def _normalised(name: str, value):
    if name == "preempted" and isinstance(value, list):
        return sorted(value)
    if name == "collectives" and isinstance(value, list):
        return [[c.get("site"), c.get("op"), c.get("shape"), c.get("dtype")] for c in value]
    return value


def compare_steps(a: dict, b: dict) -> dict[str, dict]:
    """The differing fields of two step records of the same rank and iteration, by
    kind: ``{kind: {field: [a, b]}}``."""
    out: dict[str, dict] = {}
    for name in sorted((a.keys() | b.keys()) - _IGNORED):
        va, vb = _normalised(name, a.get(name)), _normalised(name, b.get(name))
        if va != vb:
            out.setdefault(STEP_FIELDS.get(name, "other"), {})[name] = [va, vb]
    return out


def _state(record: dict | None) -> dict | None:
    if record is None:
        return None
    return {k: record.get(k) for k in _STATE_FIELDS}


def _context(a: RunLogs, b: RunLogs, rank: int, index: int, before: int) -> dict:
    """Both sides' plan and queue state at iteration ``index`` (the position in the
    step list: iterations are numbered from 0 without gaps) on every rank, and the
    ``before`` steps of ``rank`` that precede it."""
    def at(run: RunLogs, r: int, i: int):
        steps = run.steps[r]
        return steps[i] if 0 <= i < len(steps) else None

    return {
        "state": {run.label: _state(at(run, rank, index)) for run in (a, b)},
        "ranks": {run.label: [_state(at(run, r, index)) for r in range(run.dp_size)]
                  for run in (a, b)},
        "before": [{run.label: _state(at(run, rank, i)) for run in (a, b)}
                   for i in range(max(0, index - before), index)],
    }


def compare(a: RunLogs, b: RunLogs, *, before: int = 3) -> DiffReport:
    """Every divergence between runs ``a`` and ``b``: step records first (ordered by
    iteration, then rank, then kind), then request records, then diagnostics lines.
    Raises DiffInputError when the runs have different DP sizes."""
    if a.dp_size != b.dp_size:
        raise DiffInputError(f"the runs have different DP sizes: {a.directory} has "
                             f"{a.dp_size} ranks, {b.directory} has {b.dp_size}")
    steps: list[Divergence] = []
    requests: list[Divergence] = []
    logs: list[Divergence] = []
    outcome = _compare_outcomes(a, b)
    both_failed = a.failure is not None and b.failure is not None
    counts = {"ranks": a.dp_size, "steps": 0, "collectives": 0, "plans": 0,
              "requests": 0, "diagnostics_lines": 0}
    for rank in range(a.dp_size):
        sa, sb = a.steps[rank], b.steps[rank]
        for index in range(min(len(sa), len(sb))):
            counts["steps"] += 1
            counts["collectives"] += len(sa[index].get("collectives") or ())
            counts["plans"] += sa[index].get("plan_generated") is not None
            for kind, fields in compare_steps(sa[index], sb[index]).items():
                steps.append(Divergence(kind, rank, sa[index].get("iter", index), fields))
        if len(sa) != len(sb) and not both_failed:
            index = min(len(sa), len(sb))
            steps.append(Divergence(
                "steps", rank, index, {"steps": [len(sa), len(sb)]},
                what=f"{a.label} logged {len(sa)} steps, {b.label} {len(sb)}"))
        requests += _compare_requests(a, b, rank, counts)
        logs += _compare_logs(a, b, rank, counts)
    steps.sort(key=lambda d: (d.iter, d.rank, KINDS.index(d.kind)))
    if steps:
        steps[0].context = _context(a, b, steps[0].rank, steps[0].iter, before)
    return DiffReport((a.label, b.label), (str(a.directory), str(b.directory)), counts,
                      outcome + steps + requests + logs, (a.failure, b.failure))


def _compare_outcomes(a: RunLogs, b: RunLogs) -> list[Divergence]:
    """An "outcome" divergence when one run failed and the other did not, or both failed
    for different reasons."""
    if a.failure == b.failure:
        return []
    if a.failure is not None and b.failure is not None:
        what = "both runs failed, for different reasons"
    else:
        failed, completed = (a, b) if a.failure is not None else (b, a)
        what = f"{failed.label} failed, {completed.label} completed"
    return [Divergence("outcome", None, None, {"outcome": [
        a.failure or "complete", b.failure or "complete"]}, what=what)]


def _compare_requests(a: RunLogs, b: RunLogs, rank: int, counts: dict) -> list[Divergence]:
    ra, rb = a.requests[rank], b.requests[rank]
    out = []
    for rid in sorted(ra.keys() | rb.keys()):
        if rid not in ra or rid not in rb:
            where = a.label if rid in ra else b.label
            out.append(Divergence("request", rank, None, {"request_id": [
                rid if rid in ra else None, rid if rid in rb else None]},
                what=f"request {rid} is on rank {rank} only in {where}"))
            continue
        counts["requests"] += 1
        fields = {k: [ra[rid].get(k), rb[rid].get(k)]
                  for k in sorted((ra[rid].keys() | rb[rid].keys()) - _IGNORED)
                  if ra[rid].get(k) != rb[rid].get(k)}
        if fields:
            out.append(Divergence("request", rank, None, fields, what=f"request {rid}"))
    return out


def _iteration_of(messages: list[tuple[int, str]], index: int) -> int | None:
    """The iteration a diagnostics message belongs to: each non-idle iteration logs one
    ``_has_global_unfinished_reqs | step_counter:`` line first (None: before it)."""
    seen = sum(1 for _, m in messages[:index + 1] if _STEP_LINE.match(m))
    return seen - 1 if seen else None


def _compare_logs(a: RunLogs, b: RunLogs, rank: int, counts: dict) -> list[Divergence]:
    la, lb = a.logs[rank], b.logs[rank]
    counts["diagnostics_lines"] += len(la)
    out = []
    for tag, i1, i2, j1, j2 in _line_opcodes([m for _, m in la], [m for _, m in lb]):
        if tag == "equal":
            continue
        lines_a = [f"{n}: {m}" for n, m in la[i1:i2]]
        lines_b = [f"{n}: {m}" for n, m in lb[j1:j2]]
        iteration = _iteration_of(la, i1) if i1 < len(la) else _iteration_of(lb, j1)
        out.append(Divergence("diagnostics", rank, iteration, {"lines": [lines_a, lines_b]},
                              what=f"rank{rank}.log {tag}"))
    return out


def _line_opcodes(xs: list[str], ys: list[str]) -> list[tuple]:
    """difflib's opcodes of two message lists, on the part between their common prefix and
    suffix only. Logs of long runs repeat a few lines thousands of times, which makes
    difflib's matcher quadratic; a differing middle longer than ``_MATCH_LIMIT`` lines is
    reported as one replaced block."""
    head = 0
    while head < min(len(xs), len(ys)) and xs[head] == ys[head]:
        head += 1
    tail = 0
    while (tail < min(len(xs), len(ys)) - head
           and xs[len(xs) - 1 - tail] == ys[len(ys) - 1 - tail]):
        tail += 1
    mid_x, mid_y = xs[head:len(xs) - tail], ys[head:len(ys) - tail]
    if not mid_x and not mid_y:
        return []
    if max(len(mid_x), len(mid_y)) > _MATCH_LIMIT:
        tag = "replace" if mid_x and mid_y else ("delete" if mid_x else "insert")
        return [(tag, head, head + len(mid_x), head, head + len(mid_y))]
    matcher = difflib.SequenceMatcher(None, mid_x, mid_y, autojunk=False)
    return [(tag, i1 + head, i2 + head, j1 + head, j2 + head)
            for tag, i1, i2, j1, j2 in matcher.get_opcodes()]


# --------------------------------------------------------------------------- report


def _value(value) -> str:
    text = json.dumps(value, separators=(",", ":")) if not isinstance(value, str) else value
    return text if len(text) <= 70 else text[:67] + "..."


def _plan(plan) -> str:
    if plan is None:
        return "-"
    return f"out{plan['out_blk']} in{plan['in_blk']}{' freeze' if plan['freeze'] else ''}"


def _state_line(state: dict | None) -> str:
    if state is None:
        return "(no step)"
    moves = "".join(f" {k}={state[k]}" for k in ("paused", "resumed", "admitted",
                                                  "preempted", "finished") if state.get(k))
    return (f"sc={state['step_counter']} wave={state['wave']} "
            f"run={state['num_running']}/{state['running_blocks']}blk "
            f"wait={state['num_waiting']}/{state['waiting_blocks']}blk "
            f"applied={_plan(state['plan_applied'])} "
            f"generated={_plan(state['plan_generated'])}{moves}")


def format_report(report: DiffReport) -> str:
    """The text ``dyntra-emu diff`` prints."""
    la, lb = report.labels
    c = report.counts
    compared = (f"{c['ranks']} ranks, {c['steps']} step records ({c['plans']} plans, "
                f"{c['collectives']} collectives), {c['requests']} requests, "
                f"{c['diagnostics_lines']} diagnostics lines")
    head = [f"A = {la}: {report.directories[0]}", f"B = {lb}: {report.directories[1]}"]
    for label, failure in zip(report.labels, report.failures, strict=True):
        if failure is not None:
            head.append(f"{label} FAILED: {failure}")
    if report.identical:
        same = ("; both runs failed the same way, compared as far as every rank logged"
                if report.failures[0] is not None else "")
        return "\n".join([*head, f"identical: {compared} compared{same}"])
    first = report.first
    where = "the whole run" if first.rank is None else f"rank {first.rank}" + (
        f", iteration {first.iter}" if first.iter is not None else "")
    lines = [*head, f"DIVERGENT: first divergence at {where}: {first.kind}"
             + (f" ({first.what})" if first.what else "")]
    width = max(len(n) for n in first.fields)
    for name, (va, vb) in first.fields.items():
        if first.kind == "diagnostics":
            lines.append(f"  {la}:")
            lines += [f"    {line}" for line in va[:8]] or ["    (nothing)"]
            lines.append(f"  {lb}:")
            lines += [f"    {line}" for line in vb[:8]] or ["    (nothing)"]
            continue
        show = str if first.kind == "outcome" else _value
        lines.append(f"  {name:<{width}}  {la}: {show(va)}")
        lines.append(f"  {'':<{width}}  {lb}: {show(vb)}")
    ctx = first.context
    if ctx:
        lines.append(f"plan and queue state at iteration {first.iter}, every rank:")
        for label in report.labels:
            for rank, state in enumerate(ctx["ranks"][label]):
                lines.append(f"  {label:<12} rank {rank}: {_state_line(state)}")
        if ctx["before"]:
            lines.append(f"the {len(ctx['before'])} steps before it on rank {first.rank}:")
            for entry in ctx["before"]:
                for label in report.labels:
                    state = entry[label]
                    it = state["iter"] if state else "?"
                    lines.append(f"  {label:<12} iter {it}: {_state_line(state)}")
    lines.append(f"divergences by kind ({len(report.divergences)} in all; {compared} "
                 "compared):")
    for kind, g in report.by_kind().items():
        first_at = f", first at iteration {g['first_iter']}" if g["first_iter"] is not None \
            else ""
        lines.append(f"  {kind:<12} {g['count']:>6} on rank(s) "
                     f"{','.join(map(str, g['ranks']))}{first_at} "
                     f"(fields: {', '.join(g['fields'])})")
    return "\n".join(lines)


def plot_load(a: RunLogs, b: RunLogs, report: DiffReport, path) -> Path:
    """``path`` (PNG): running KV blocks per rank and iteration of both runs, one panel
    per rank, each divergent iteration ticked and the first one drawn as a line."""
    from matplotlib.figure import Figure

    dp = a.dp_size
    fig = Figure(figsize=(11, 2.6 * dp + 0.8), layout="constrained")
    axes = fig.subplots(dp, 1, sharex=True, squeeze=False)[:, 0]
    first = report.first
    for rank, ax in enumerate(axes):
        for run, style in ((a, dict(color="tab:blue", lw=1.2)),
                           (b, dict(color="tab:orange", lw=1.0, ls="--"))):
            steps = run.steps[rank]
            ax.plot([s["iter"] for s in steps], [s["running_blocks"] for s in steps],
                    label=run.label, **style)
        marked = sorted({d.iter for d in report.divergences
                         if d.rank == rank and d.iter is not None})
        if marked:
            ax.plot(marked, [0] * len(marked), "|", color="tab:red", ms=10,
                    label="divergent iteration")
        if first is not None and first.rank == rank and first.iter is not None:
            ax.axvline(first.iter, color="tab:red", lw=1.2,
                       label=f"first divergence ({first.kind})")
        ax.set_title(f"rank {rank}: KV blocks of running requests")
        ax.set_ylabel("KV blocks")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper right", fontsize=8)
    axes[-1].set_xlabel("iteration")
    if report.identical:
        verdict = "identical" + (", both failed the same way"
                                 if report.failures[0] is not None else "")
    elif first.rank is None:
        verdict = f"the outcome differs ({first.what})"
    else:
        verdict = f"first divergence: rank {first.rank}, iteration {first.iter} ({first.kind})"
    fig.suptitle(f"{a.label} vs {b.label}: {verdict}")
    path = Path(path)
    fig.savefig(path, dpi=100)
    return path
