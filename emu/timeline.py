"""A run's timeline in the Trace Event Format (Perfetto, chrome://tracing), made after
the run from its event logs.

``dyntra-emu run --timeline FILE`` and ``dyntra-emu timeline RUN_DIR`` (emu/cli/timeline.py)
call ``write_timeline`` on a ``emu.metrics.Run``. The axis is virtual time: the event
log's clock in microseconds (``clock_s`` × 10⁶), so the same run gives the same file.

Each rank is a process (``pid`` = rank + 1, named "rank r", sorted by rank) with two
threads, as vLLM splits a step between the engine core and its scheduler:

- ``engine``: each step as a slice of the rank's own cost (``step``, or ``dummy step``
  for a forward without tokens), then a ``bubble`` slice for the wait for the slowest
  rank in the lockstep collective (``step_time - own_cost``; none when this rank was the
  slowest); at the step's end the other collectives it entered (``engine.dp_sync``,
  ``dyntra_lb.flag``, ``dyntra_lb.allgather``) and ``plan generated`` (the plan
  DyntraLB made for the next step) as instants, then a ``DyntraLB control plane`` slice
  for the virtual time its collectives and planner were charged before the next step
  (none when the cost profile has the control plane off, or it charged nothing).
- ``scheduler``: at the step's start what ``schedule()`` did: ``plan applied``,
  ``admit``, ``pause``, ``resume``, ``preempt``; at its end ``finish``. The request ids
  are in each instant's args.

Two counters per rank follow the load: ``KV blocks`` (running, waiting) and
``requests`` (running, waiting), written when they change. A wave's end is a global
instant (``wave N ends``), a line across every rank. docs/timeline.md shows how to
read it.
"""

from __future__ import annotations

import json
from pathlib import Path

from emu.metrics import Run
from emu.sites import LOCKSTEP_SITE

ENGINE, SCHEDULER = 0, 1
THREAD_NAMES = {ENGINE: "engine", SCHEDULER: "scheduler"}
# What schedule() did, in the order the scheduler thread shows it: (step record key,
# instant name).
_SCHEDULE_EVENTS = (("admitted", "admit"), ("paused", "pause"), ("resumed", "resume"),
                    ("preempted", "preempt"))


def pid_of(rank: int) -> int:
    """Rank r's process id in the trace (pid 0 is reserved by some viewers)."""
    return rank + 1


def tid_of(rank: int, thread: int) -> int:
    """A thread id unique over the whole trace: Perfetto keeps a thread per tid, so a
    tid shared by two processes would split their tracks."""
    return pid_of(rank) * 10 + thread


def us(seconds: float) -> int:
    """Virtual seconds of the event log back to the engine's integer microseconds."""
    return round(seconds * 1e6)


def timeline_events(run: Run) -> list[dict]:
    """Every trace event of ``run``: metadata, then each rank's events in time order,
    then the wave ends."""
    events = []
    for rank in range(run.dp_size):
        events += _metadata(rank)
    for rank in range(run.dp_size):
        events += _rank_events(rank, run.step_records(rank))
    finished = run.state in (None, "complete")
    first = run.step_records(0) if run.dp_size else []
    events += _wave_ends(first, finished) if first else []
    return events


def write_timeline(run: Run, path, *, source: str) -> int:
    """Write ``run``'s timeline to ``path`` as a JSON object trace; returns the number of
    events. ``source`` (the run directory) is recorded in ``otherData``."""
    events = timeline_events(run)
    document = {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"source": "dyntra-emu", "run": str(source),
                      "dp_size": str(run.dp_size),
                      "clock": "virtual time of the run, microseconds",
                      "run_state": str(run.state)},
    }
    with open(Path(path), "w", encoding="utf-8") as f:
        json.dump(document, f, separators=(",", ":"))
        f.write("\n")
    return len(events)


def _metadata(rank: int) -> list[dict]:
    pid, engine = pid_of(rank), tid_of(rank, ENGINE)
    events = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": engine,
         "args": {"name": f"rank {rank}"}},
        {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": engine,
         "args": {"sort_index": rank}},
    ]
    for thread, name in THREAD_NAMES.items():
        events += [
            {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid_of(rank, thread),
             "args": {"name": name}},
            {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid_of(rank, thread),
             "args": {"sort_index": thread}},
        ]
    return events


def _rank_events(rank: int, steps: list[dict]) -> list[dict]:
    pid, engine, scheduler = pid_of(rank), tid_of(rank, ENGINE), tid_of(rank, SCHEDULER)
    events: list[dict] = []
    counters: dict[str, dict] = {}
    for s in steps:
        start, own, step = us(s["clock_s"]), us(s["own_cost_s"]), us(s["step_time_s"])
        end = start + step
        events += _counters(pid, engine, start, s, counters)
        if s["plan_applied"] is not None:
            events.append(_instant("plan applied", "dyntra_lb", pid, scheduler, start,
                                   {"iter": s["iter"], **s["plan_applied"]}))
        for key, name in _SCHEDULE_EVENTS:
            if s[key]:
                events.append(_instant(name, "request", pid, scheduler, start,
                                       {"iter": s["iter"], "requests": s[key]}))
        events.append(_step_slice(pid, engine, start, own, s))
        lockstep = [c for c in s["collectives"] if c["site"] == LOCKSTEP_SITE]
        if step > own:
            events.append({"ph": "X", "name": "bubble", "cat": "bubble", "pid": pid,
                           "tid": engine, "ts": start + own, "dur": step - own,
                           "cname": "terrible",
                           "args": {"iter": s["iter"], "wait_us": step - own,
                                    "collective": _collective_names(lockstep)}})
        if s["finished"]:
            events.append(_instant("finish", "request", pid, scheduler, end,
                                   {"iter": s["iter"], "requests": s["finished"]}))
        for c in s["collectives"]:
            if c["site"] != LOCKSTEP_SITE:
                events.append(_instant(c["site"], "collective", pid, engine, end,
                                       {"iter": s["iter"], "op": c["op"], "seq": c["seq"],
                                        "shape": c["shape"], "dtype": c["dtype"]}))
        if s["plan_generated"] is not None:
            events.append(_instant("plan generated", "dyntra_lb", pid, engine, end,
                                   {"iter": s["iter"], **s["plan_generated"]}))
        control = s.get("control_plane")
        if control is not None and control["charged_s"] > 0:
            events.append({"ph": "X", "name": "DyntraLB control plane", "cat": "dyntra_lb",
                           "pid": pid, "tid": engine, "ts": end, "dur": us(control["charged_s"]),
                           "cname": "yellow", "args": {"iter": s["iter"], **control}})
    return events


def _step_slice(pid: int, tid: int, start: int, own: int, s: dict) -> dict:
    """The rank's own part of the step: the forward the cost profile priced."""
    return {"ph": "X", "name": "dummy step" if s["dummy"] else "step", "cat": "step",
            "pid": pid, "tid": tid, "ts": start, "dur": own,
            **({"cname": "grey"} if s["dummy"] else {}),
            "args": {"iter": s["iter"], "wave": s["wave"], "step_counter": s["step_counter"],
                     "own_cost_us": own, "step_time_us": us(s["step_time_s"]),
                     "num_running": s["num_running"], "num_waiting": s["num_waiting"],
                     "running_blocks": s["running_blocks"],
                     "scheduled_tokens": s["scheduled_tokens"],
                     "kv_free_blocks": s["kv_free_blocks"],
                     "collectives": _collective_names(s["collectives"])}}


def _counters(pid: int, tid: int, ts: int, s: dict, last: dict) -> list[dict]:
    """The rank's load counters at the step's start, when they changed."""
    values = {
        "KV blocks": {"running": s["running_blocks"], "waiting": s["waiting_blocks"]},
        "requests": {"running": s["num_running"], "waiting": s["num_waiting"]},
    }
    out = []
    for name, args in values.items():
        if last.get(name) != args:
            last[name] = args
            out.append({"ph": "C", "name": name, "cat": "load", "pid": pid, "tid": tid,
                        "ts": ts, "args": args})
    return out


def _wave_ends(steps: list[dict], finished: bool) -> list[dict]:
    """A global instant at the end of each wave's last step (every rank runs the same
    steps, so rank 0's tell): the step before the wave number changes, and the last
    step of a run that finished (a partial run's last step ended no wave)."""
    out = []
    for s, following in zip(steps, [*steps[1:], None], strict=True):
        if (following["wave"] != s["wave"]) if following is not None else finished:
            out.append({"ph": "i", "s": "g", "name": f"wave {s['wave']} ends", "cat": "wave",
                        "pid": pid_of(0), "tid": tid_of(0, ENGINE),
                        "ts": us(s["clock_s"]) + us(s["step_time_s"]),
                        "args": {"wave": s["wave"], "last_iter": s["iter"]}})
    return out


def _instant(name: str, cat: str, pid: int, tid: int, ts: int, args: dict) -> dict:
    return {"ph": "i", "s": "t", "name": name, "cat": cat, "pid": pid, "tid": tid, "ts": ts,
            "args": args}


def _collective_names(collectives: list[dict]) -> list[str]:
    return [f"{c['site']} {c['op']} #{c['seq']}" for c in collectives]
