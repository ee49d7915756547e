"""The records a rank writes (emu/rank/eventlog.py through emu/records): every step and
request record comes back from its Parquet table as the event log's JSON line, byte for
byte the generic encoder's output of the record; a rank's buffer never holds more than
a part's rows, whatever the length of the run; and a rank killed by a signal keeps every
part it wrote."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from emu.rank.control_costs import ControlCharge
from emu.rank.eventlog import EventLog, StepRecord
from emu.records import writer
from emu.records.reader import RecordsError, event_lines, read_table
from emu.records.schema import path

_dumps = json.JSONEncoder(sort_keys=True, separators=(",", ":")).encode

ids = st.lists(st.text(max_size=12), max_size=3)
ints = st.integers(min_value=-(2**40), max_value=2**53)
plans = st.none() | st.fixed_dictionaries(
    {"out_blk": st.lists(ints, max_size=4), "in_blk": st.lists(ints, max_size=4),
     "freeze": st.booleans()})
collective = st.fixed_dictionaries(
    {"seq": ints, "site": st.text(max_size=20), "op": st.text(max_size=16),
     "shape": st.lists(st.integers(0, 10**6), max_size=2), "dtype": st.text(max_size=8)})
records = st.builds(
    StepRecord, iter=ints, wave=ints, step_counter=ints, clock_us=ints, own_cost_us=ints,
    step_us=ints, dummy=st.booleans(), num_running=ints, num_waiting=ints,
    running_blocks=ints, waiting_blocks=ints, scheduled_tokens=ints, plan_applied=plans,
    paused=ids, resumed=ids, admitted=ids, preempted=ids, finished=ids,
    plan_generated=plans, kv_free_blocks=ints, kv_held_blocks=ints,
    paused_kv_blocks=st.dictionaries(st.text(max_size=12), ints, max_size=3),
    collectives=st.lists(collective, max_size=4),
    control_plane=st.none() | st.builds(ControlCharge, collectives_us=ints, planner_us=ints,
                                        charged_us=ints, measured=st.booleans()))
times = st.floats(allow_nan=False, allow_infinity=False)
requests = st.fixed_dictionaries({
    "request_id": st.text(max_size=12), "arrival_s": times,
    "prompt_tokens": ints, "output_tokens": ints, "first_scheduled_s": st.none() | times,
    "token_times_s": st.lists(times, max_size=5), "finish_s": st.none() | times,
    "pauses": st.lists(st.tuples(times, st.none() | times).map(list), max_size=2)})


def expected_step(record: StepRecord, rank: int) -> str:
    """The event log's line of a step record, from the record alone."""
    control = record.control_plane
    extra = {}
    if control is not None:
        extra = {"control_plane": {"charged_s": control.charged_us / 1e6,
                                   "collectives_s": control.collectives_us / 1e6,
                                   "planner_s": control.planner_us / 1e6,
                                   **({"planner_measured": True} if control.measured else {})}}
    return _dumps({
        **extra, "kind": "step", "rank": rank, "iter": record.iter, "wave": record.wave,
        "step_counter": record.step_counter, "clock_s": record.clock_us / 1e6,
        "own_cost_s": record.own_cost_us / 1e6, "step_time_s": record.step_us / 1e6,
        "dummy": record.dummy, "num_running": record.num_running,
        "num_waiting": record.num_waiting, "running_blocks": record.running_blocks,
        "waiting_blocks": record.waiting_blocks, "scheduled_tokens": record.scheduled_tokens,
        "plan_applied": record.plan_applied, "paused": record.paused,
        "resumed": record.resumed, "admitted": record.admitted,
        "preempted": record.preempted, "finished": record.finished,
        "plan_generated": record.plan_generated,
        "lb_active": record.plan_generated is not None,
        "kv_free_blocks": record.kv_free_blocks, "kv_held_blocks": record.kv_held_blocks,
        "paused_kv_blocks": record.paused_kv_blocks, "collectives": record.collectives})


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(st.tuples(records, st.lists(requests, max_size=2)), max_size=6),
       in_flight=st.lists(requests, max_size=2), rank=st.integers(0, 63))
def test_records_read_back_as_the_event_logs_lines(tmp_path_factory, steps, in_flight,
                                                    rank):
    out = tmp_path_factory.mktemp("run")
    log = EventLog(out, rank)
    expected = []
    for position, (record, finished) in enumerate(steps):
        # a rank's iterations only grow (a request's row names the step before it)
        record.iter = 3 * position + abs(record.iter) % 3
        expected.append(expected_step(record, rank))
        expected += [_dumps({**r, "kind": "request", "rank": rank}) for r in finished]
        log.step(record, [dict(r) for r in finished])
    log.requests([dict(r) for r in in_flight])
    expected += [_dumps({**r, "kind": "request", "rank": rank}) for r in in_flight]
    log.close()
    assert list(event_lines(out, rank)) == expected


def test_a_buffer_never_holds_more_than_a_row_group(tmp_path, monkeypatch):
    """Rows are written in parts of ``batch_rows`` as they come: after every append the
    buffer holds fewer than that, and the parts are full ones and the rest."""
    directory = tmp_path / "rank0.wall"
    table = writer.TableWriter(directory, "wall", batch_rows=3)
    held = []
    for i in range(10):
        table.append((0, i, 0.5, None, None))
        held.append(len(table.rows))
    table.close()
    assert max(held) < 3 and held == [1, 2, 0] * 3 + [1]
    assert _part_rows(directory) == [3, 3, 3, 1]
    assert read_table(tmp_path, 0, "wall")["iter"].to_pylist() == list(range(10))


def _part_rows(directory) -> list[int]:
    """The rows of each part of a table's directory, in part order."""
    return [pq.ParquetFile(part).metadata.num_rows
            for part in sorted(directory.glob("part-*.parquet"))]


def test_a_killed_rank_keeps_every_part_it_wrote(tmp_path):
    """A rank killed mid-table (here: its writer abandoned, its open part never closed)
    leaves the parts it flushed: they read back, in order, as a partial table, and
    never as a complete one."""
    source = "\n".join([
        "import sys",
        "from emu.records.writer import TableWriter",
        "table = TableWriter(sys.argv[1], 'wall', batch_rows=3)",
        "for i in range(8):",
        "    table.append((0, i, 0.5, None, None))",
        "import os, signal",
        "os.kill(os.getpid(), signal.SIGKILL)"])
    killed = subprocess.run([sys.executable, "-c", source, str(tmp_path / "rank0.wall")],
                            check=False)
    assert killed.returncode == -signal.SIGKILL
    assert read_table(tmp_path, 0, "wall", partial=True)["iter"].to_pylist() == list(range(6))
    with pytest.raises(RecordsError, match="never closed its wall records"):
        read_table(tmp_path, 0, "wall")


def test_a_rank_writes_its_steps_in_row_groups_of_its_batch(tmp_path, monkeypatch):
    monkeypatch.setitem(writer.BATCH_ROWS, "steps", 4)
    log = EventLog(tmp_path, 2)
    record = StepRecord(1, 0, 1, 0, 10, 10, False, 1, 0, 3, 0, 1, None, [], [], [], [], [],
                        None, 90, 3, {}, [])
    for _ in range(9):
        log.step(record, [])
        assert len(log._steps.rows) < 4
    log.close()
    assert _part_rows(path(tmp_path, 2, "steps")) == [4, 4, 1]


def test_a_step_row_holds_the_paused_kv_blocks_in_request_id_order():
    """The engines build the map by walking a set of request ids, whose order Python's
    string hashing changes from process to process: the row orders it by request id, so
    the same run writes the same steps table in any process."""
    def row(paused_kv_blocks: dict) -> tuple:
        return StepRecord(1, 0, 1, 0, 10, 10, False, 1, 0, 3, 0, 1, None, [], [], [], [],
                          [], None, 90, 3, paused_kv_blocks, []).row(0)

    orders = [row({"r2": 5, "r10": 1, "r1": 7}), row({"r1": 7, "r2": 5, "r10": 1})]
    assert orders[0] == orders[1]
    assert (("r1", 7), ("r10", 1), ("r2", 5)) in orders[0]
