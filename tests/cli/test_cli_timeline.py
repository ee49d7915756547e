"""`dyntra-emu run --timeline` and `dyntra-emu timeline`: the timeline of a real dp 4 run
(rank threads) in the Trace Event Format. Every event passes a schema check written
here from the format's rules (the JSON object format of Google's "Trace Event Format"
document, as Perfetto's and chrome://tracing's importers read it), and the trace, read
the way a viewer reads it (processes and threads by their metadata names), shows exactly
the steps, bubbles, pauses, resumes, plans and wave ends of the run's event logs."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest

from tests.records import events as records

pytestmark = pytest.mark.integration

# Chrome DevTools' trace engine (npm @paulirish/trace_engine), the parser behind its
# Performance panel: a real consumer of the format, installed by `npm ci --prefix
# tests/js`. Without it (or node) its test is skipped with the reason, unless
# DYNTRA_TRACE_ENGINE_REQUIRED=1 (what .ci/run sets) makes that an error.
JS = Path(__file__).resolve().parent.parent / "js"
TRACE_ENGINE = JS / "node_modules" / "@paulirish" / "trace_engine"

STATIC = json.dumps({"scheduler_config": {"dyntra_lb_config": {
    "enabled": True, "mode": "static", "start_step": 0}}})

DP4 = ["--dp", "4", "--block-size", "16", "--num-gpu-blocks", "512", "--max-num-seqs", "2",
       "--device", "cpu", "--transport", "thread", "--quiet"]

# Phases the format defines (duration, complete, instant, counter, async, flow, sample,
# object, metadata, memory dump, mark, clock sync, context).
PHASES = {"B", "E", "X", "i", "I", "C", "b", "n", "e", "S", "T", "p", "F", "s", "t", "f",
          "P", "N", "O", "D", "M", "V", "v", "R", "c", "(", ")"}
# Colour names the catapult viewer (chrome://tracing) reserves for "cname".
RESERVED_COLOURS = {
    "thread_state_uninterruptible", "thread_state_iowait", "thread_state_running",
    "thread_state_runnable", "thread_state_sleeping", "thread_state_unknown",
    "background_memory_dump", "light_memory_dump", "detailed_memory_dump",
    "vsync_highlight_color", "generic_work", "good", "bad", "terrible", "black", "grey",
    "white", "yellow", "olive", "rail_response", "rail_animation", "rail_idle", "rail_load",
    "startup", "heap_dump_stack_frame", "heap_dump_object_type",
    "heap_dump_child_node_highlight", "cq_build_running", "cq_build_passed",
    "cq_build_failed", "cq_build_abandoned", "cq_build_attempt_runnig",
    "cq_build_attempt_passed", "cq_build_attempt_failed"}
METADATA = {"process_name": ("name", str), "process_labels": ("labels", str),
            "process_sort_index": ("sort_index", int), "thread_name": ("name", str),
            "thread_sort_index": ("sort_index", int)}


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)


def schema_problems(document) -> list[str]:
    """Every way ``document`` breaks the Trace Event Format's rules, one line each."""
    if not isinstance(document, dict) or not isinstance(document.get("traceEvents"), list):
        return ["not a JSON object with a traceEvents list"]
    problems = []
    if document.get("displayTimeUnit", "ms") not in ("ms", "ns"):
        problems.append(f"displayTimeUnit {document['displayTimeUnit']!r}")
    open_slices: dict[tuple, list[str]] = defaultdict(list)
    complete: dict[tuple, list[tuple]] = defaultdict(list)
    named_processes, named_threads, used = set(), set(), set()
    for i, e in enumerate(document["traceEvents"]):
        where = f"event {i} {e!r:.120}"
        if not isinstance(e, dict):
            problems.append(f"{where}: not an object")
            continue
        ph = e.get("ph")
        if ph not in PHASES:
            problems.append(f"{where}: ph {ph!r}")
        if not isinstance(e.get("name"), str) or not e["name"]:
            problems.append(f"{where}: name")
        if not (_is_int(e.get("pid")) and _is_int(e.get("tid"))):
            problems.append(f"{where}: pid/tid must be integers")
        if "args" in e and not isinstance(e["args"], dict):
            problems.append(f"{where}: args must be an object")
        if "cat" in e and not isinstance(e["cat"], str):
            problems.append(f"{where}: cat must be a string")
        if "cname" in e and e["cname"] not in RESERVED_COLOURS:
            problems.append(f"{where}: cname {e['cname']!r} is not a reserved colour")
        key = (e.get("pid"), e.get("tid"))
        if ph == "M":
            field, kind = METADATA.get(e.get("name"), (None, None))
            value = e.get("args", {}).get(field) if field else None
            if field is None or not (_is_int(value) if kind is int else isinstance(value, kind)):
                problems.append(f"{where}: metadata name/args")
            if e.get("name") == "process_name":
                named_processes.add(e.get("pid"))
            if e.get("name") == "thread_name":
                named_threads.add(key)
            continue
        used.add(key)
        if not _is_number(e.get("ts")) or e["ts"] < 0:
            problems.append(f"{where}: ts must be a number >= 0")
            continue
        if ph == "X":
            if not _is_number(e.get("dur")) or e["dur"] < 0:
                problems.append(f"{where}: an X event needs dur >= 0")
            else:
                complete[key].append((e["ts"], e["ts"] + e["dur"], i))
        elif ph in ("i", "I") and e.get("s", "t") not in ("g", "p", "t"):
            problems.append(f"{where}: instant scope {e.get('s')!r}")
        elif ph == "C" and not (e.get("args") and all(_is_number(v)
                                                      for v in e["args"].values())):
            problems.append(f"{where}: a counter needs numeric args")
        elif ph == "B":
            open_slices[key].append(e["name"])
        elif ph == "E" and not open_slices[key]:
            problems.append(f"{where}: E without a B on its thread")
        elif ph == "E":
            open_slices[key].pop()
    problems += [f"thread {key}: {len(names)} B without E" for key, names in
                 open_slices.items() if names]
    problems += _nesting_problems(complete)
    problems += [f"pid {pid}: no process_name" for pid in {p for p, _ in used} - named_processes]
    problems += [f"thread {key}: no thread_name" for key in used - named_threads]
    return problems


def _nesting_problems(complete: dict[tuple, list[tuple]]) -> list[str]:
    """X slices of a thread must nest or be disjoint (viewers draw a stack per thread)."""
    problems = []
    for key, slices in complete.items():
        stack: list[tuple] = []
        for start, end, i in sorted(slices, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1][1] <= start:
                stack.pop()
            if stack and end > stack[-1][1]:
                problems.append(f"thread {key}: event {i} overlaps event {stack[-1][2]}")
            stack.append((start, end, i))
    return problems


def read_as_viewer(document) -> dict:
    """The trace as a viewer shows it: rank -> thread name -> its events in ts order,
    processes and threads found by their metadata names; "global" holds the global
    instants."""
    events = document["traceEvents"]
    rank_of = {e["pid"]: int(e["args"]["name"].removeprefix("rank "))
               for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    thread_of = {(e["pid"], e["tid"]): e["args"]["name"]
                 for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    tracks: dict = defaultdict(lambda: defaultdict(list))
    for e in sorted((e for e in events if e["ph"] != "M"), key=lambda e: e["ts"]):
        if e["ph"] == "i" and e["s"] == "g":
            tracks["global"]["instants"].append(e)
        elif e["ph"] == "C":
            tracks[rank_of[e["pid"]]]["counters"].append(e)
        else:
            tracks[rank_of[e["pid"]]][thread_of[(e["pid"], e["tid"])]].append(e)
    return tracks


def _steps(run_dir, rank) -> list[dict]:
    return [r for r in records(run_dir, rank) if r["kind"] == "step"]


def _us(seconds: float) -> int:
    return round(seconds * 1e6)


def test_timeline_of_a_dp4_run(cli, tmp_path, clikit):
    trace = clikit.write_trace(tmp_path / "trace.jsonl", [
        {"request_id": f"req-{i}", "arrival_s": round(0.01 * i, 3),
         "prompt_tokens": 40 + 300 * (i % 5), "output_tokens": 10 + 7 * (i % 6)}
        for i in range(16)])
    # The timeline into the run's output directory, which the run creates.
    run_dir = tmp_path / "run"
    path = run_dir / "lockstep.json"
    proc = cli("run", "--workload", trace, *DP4, "--cost-model", "planner-heuristic",
               "--additional-config", STATIC, "--out", run_dir, "--timeline", path)
    assert proc.returncode == 0, proc.stderr
    assert f"timeline in {path}" in proc.stdout

    document = json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(c))
    assert schema_problems(document) == []
    tracks = read_as_viewer(document)
    assert sorted(k for k in tracks if k != "global") == [0, 1, 2, 3]
    # Perfetto keeps one thread per tid: a tid in two processes would split their tracks.
    threads = {(e["pid"], e["tid"]) for e in document["traceEvents"]}
    assert len({tid for _, tid in threads}) == len(threads) == 8
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["pauses"]["total"] > 0  # something for the scheduler tracks to show

    for rank in range(4):
        steps = _steps(run_dir, rank)
        engine, scheduler = tracks[rank]["engine"], tracks[rank]["scheduler"]
        # One step slice per step record: its own cost, at its virtual start.
        slices = [e for e in engine if e["ph"] == "X" and e["cat"] == "step"]
        assert [(e["ts"], e["dur"], e["args"]["iter"], e["name"]) for e in slices] == [
            (_us(s["clock_s"]), _us(s["own_cost_s"]), s["iter"],
             "dummy step" if s["dummy"] else "step") for s in steps]
        # The bubble apart: the wait for the slowest rank, right after the own cost.
        bubbles = [(e["ts"], e["dur"]) for e in engine if e["name"] == "bubble"]
        assert bubbles == [(_us(s["clock_s"] + s["own_cost_s"]),
                            _us(s["step_time_s"]) - _us(s["own_cost_s"]))
                           for s in steps if s["step_time_s"] > s["own_cost_s"]]
        assert sum(d for _, d in bubbles) == sum(
            _us(s["step_time_s"]) - _us(s["own_cost_s"]) for s in steps)
        # What schedule() did at the step's start; finishes and plans at its end.
        start = {s["iter"]: _us(s["clock_s"]) for s in steps}
        end = {s["iter"]: _us(s["clock_s"]) + _us(s["step_time_s"]) for s in steps}
        for name, key, at in (("pause", "paused", start), ("resume", "resumed", start),
                              ("admit", "admitted", start), ("finish", "finished", end)):
            shown = [(e["ts"], e["args"]["iter"], e["args"]["requests"])
                     for e in scheduler if e["name"] == name]
            assert shown == [(at[s["iter"]], s["iter"], s[key]) for s in steps if s[key]], name
        for name, key, events, at in (("plan generated", "plan_generated", engine, end),
                                      ("plan applied", "plan_applied", scheduler, start)):
            shown = [(e["ts"], e["args"]["iter"], e["args"]["out_blk"], e["args"]["in_blk"])
                     for e in events if e["name"] == name]
            assert shown == [(at[s["iter"]], s["iter"], s[key]["out_blk"], s[key]["in_blk"])
                             for s in steps if s[key] is not None], name
        collectives = [(e["ts"], e["args"]["seq"], e["name"])
                       for e in engine if e["cat"] == "collective"]
        assert collectives == [(end[s["iter"]], c["seq"], c["site"]) for s in steps
                               for c in s["collectives"] if c["site"] != "engine.lockstep"]
        load = [(e["ts"], e["args"]["running"]) for e in tracks[rank]["counters"]
                if e["name"] == "KV blocks"]
        assert load[0] == (0, steps[0]["running_blocks"])
        assert {v for _, v in load} == {s["running_blocks"] for s in steps}
    waves = tracks["global"]["instants"]
    assert len(waves) == metrics["lb_activity"]["waves"]
    assert waves[-1]["ts"] == _us(metrics["virtual_time_s"])

    # The same timeline from the run directory.
    proc = cli("timeline", run_dir)
    assert proc.returncode == 0, proc.stderr
    assert (run_dir / "timeline.json").read_bytes() == path.read_bytes()


def test_timeline_of_a_failed_run_and_bad_paths(cli, tiny_trace, tmp_path, clikit):
    killed = tmp_path / "killed"
    proc = cli("run", "--workload", tiny_trace, *clikit.SMALL, "--transport", "thread",
               "--quiet", "--fault", "kill:rank=1,step=5", "--out", killed)
    assert proc.returncode == 1
    proc = cli("timeline", killed, "--out", tmp_path / "killed.json")
    assert proc.returncode == 0, proc.stderr
    assert "the run did not finish (run.json says 'failed'" in proc.stderr
    document = json.loads((tmp_path / "killed.json").read_text())
    assert schema_problems(document) == []
    tracks = read_as_viewer(document)
    logged = min(len(_steps(killed, rank)) for rank in (0, 1))
    for rank in (0, 1):
        assert len([e for e in tracks[rank]["engine"] if e["cat"] == "step"]) == logged
    assert tracks["global"]["instants"] == []  # its last step ended no wave

    proc = cli("run", "--workload", tiny_trace, *clikit.SMALL, "--out", tmp_path / "r",
               "--timeline", tmp_path / "no" / "t.json")
    clikit.assert_user_error(proc, f"--timeline {tmp_path / 'no' / 't.json'}: the directory "
                                   f"{tmp_path / 'no'} does not exist")
    assert not (tmp_path / "r").exists()  # refused before anything ran
    proc = cli("timeline", tmp_path / "nothing")
    clikit.assert_user_error(proc, f"{tmp_path / 'nothing'}: not a run directory")


def test_schema_check_catches_broken_events():
    """The checker itself: each rule fails on an event that breaks it."""
    good = {"ph": "X", "name": "step", "pid": 1, "tid": 10, "ts": 0, "dur": 5}
    meta = [{"ph": "M", "name": "process_name", "pid": 1, "tid": 10, "args": {"name": "r"}},
            {"ph": "M", "name": "thread_name", "pid": 1, "tid": 10, "args": {"name": "t"}}]
    assert schema_problems({"traceEvents": [*meta, good]}) == []
    broken = [
        {**good, "dur": -1}, {**good, "ts": "0"}, {**good, "pid": "1"}, {**good, "ph": "Z"},
        {**good, "name": ""}, {**good, "cname": "pink"}, {**good, "ts": 2, "dur": 5},
        {"ph": "B", "name": "x", "pid": 1, "tid": 10, "ts": 1},
        {"ph": "E", "name": "x", "pid": 1, "tid": 11, "ts": 1},
        {"ph": "i", "s": "x", "name": "x", "pid": 1, "tid": 10, "ts": 1},
        {"ph": "C", "name": "c", "pid": 1, "tid": 10, "ts": 1, "args": {"v": "1"}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 10, "args": {}},
        {**good, "pid": 2},
    ]
    for event in broken:
        assert schema_problems({"traceEvents": [*meta, good, event]}), event


def test_devtools_trace_engine_reads_the_timeline(cli, tiny_trace, tmp_path, clikit):
    """A real consumer: Chrome DevTools' trace engine parses a run's timeline and finds
    every rank's engine thread with exactly the event log's steps and bubbles, each
    slice a root of the thread's slice tree (none overlaps another)."""
    missing = ("node is not on PATH" if shutil.which("node") is None else
               None if TRACE_ENGINE.is_dir() else "run `npm ci --prefix tests/js`")
    if missing is not None:
        if os.environ.get("DYNTRA_TRACE_ENGINE_REQUIRED") == "1":
            pytest.fail(f"DevTools' trace engine is required here: {missing}")
        pytest.skip(f"DevTools' trace engine not installed: {missing}")
    run_dir = tmp_path / "run"
    proc = cli("run", "--workload", tiny_trace, *clikit.SMALL, "--transport", "thread",
               "--quiet", "--additional-config", STATIC, "--out", run_dir,
               "--timeline", run_dir / "timeline.json")
    assert proc.returncode == 0, proc.stderr
    read = subprocess.run(["node", str(JS / "read_trace.mjs"), str(run_dir / "timeline.json")],
                          capture_output=True, text=True, timeout=120, cwd=JS)
    assert read.returncode == 0, read.stderr
    parsed = json.loads(read.stdout)

    assert parsed["generic"] is True
    assert sorted(parsed["processes"].values()) == ["rank 0", "rank 1"]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert parsed["bounds"]["max"] == _us(metrics["virtual_time_s"])
    for rank in (0, 1):
        pid = next(int(p) for p, name in parsed["processes"].items() if name == f"rank {rank}")
        (engine,) = [t for t in parsed["threads"] if t["pid"] == pid and t["name"] == "engine"]
        steps = _steps(run_dir, rank)
        expected = []
        for s in steps:
            start, own, step = _us(s["clock_s"]), _us(s["own_cost_s"]), _us(s["step_time_s"])
            expected.append(["dummy step" if s["dummy"] else "step", start, own])
            if step > own:
                expected.append(["bubble", start + own, step - own])
            charged = (s.get("control_plane") or {}).get("charged_s", 0)
            if charged > 0:  # DyntraLB's work after the step, before the next one
                expected.append(["DyntraLB control plane", start + step, _us(charged)])
        assert engine["slices"] == expected
        assert engine["roots"] == len(expected)
