"""The records a rank writes while it runs: its step and request records and its
wall-clock times, each into its Parquet table (emu/records: ``rank<r>.steps/``,
``rank<r>.requests/``, ``rank<r>.wall/``), in bounded parts as the run
goes. Step and request records are deterministic (virtual time only); the wall table
holds the wall-clock time of each iteration (and of the planner and DyntraLB's
collectives), which differs from run to run. Both engine implementations write through
this module, so their records share one schema (docs/records.md).

Beside them each rank appends a few bytes to ``rank<r>.progress.jsonl`` for every step
that finished requests (that step's clock, then one line per finished request): what the
progress display polls while the ranks run. It is no record and nothing reads it after
the run.
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass

from emu.rank.control_costs import ControlCharge
from emu.records.schema import REQUESTS, STEPS, WALL, path
from emu.records.writer import TableWriter


@dataclass(slots=True)
class StepRecord:
    """One non-idle iteration of one rank, as both engines report it. Times are virtual
    microseconds; the steps table holds them as seconds (docs/records.md has every
    field). ``control_plane`` is what DyntraLB's control plane charged after the
    forward; None (the profile has it off) is a null ``control_plane``."""

    iter: int
    wave: int
    step_counter: int
    clock_us: int
    own_cost_us: int
    step_us: int
    dummy: bool
    num_running: int
    num_waiting: int
    running_blocks: int
    waiting_blocks: int
    scheduled_tokens: int
    plan_applied: dict | None
    paused: list
    resumed: list
    admitted: list
    preempted: list
    finished: list
    plan_generated: dict | None
    kv_free_blocks: int
    kv_held_blocks: int
    paused_kv_blocks: dict
    collectives: list
    control_plane: ControlCharge | None = None

    def row(self, rank: int) -> tuple:
        """The record as a row of the steps table (emu.records.schema.STEP_FIELDS), its
        nested values as tuples of plain values (structs by position): a rank holds a
        row group's rows, and tuples of such values leave the garbage collector's sight
        (lists and dicts would be walked by every full collection)."""
        control = self.control_plane
        return (rank, self.iter, self.wave, self.step_counter, self.clock_us / 1e6,
                self.own_cost_us / 1e6, self.step_us / 1e6, self.dummy, self.num_running,
                self.num_waiting, self.running_blocks, self.waiting_blocks,
                self.scheduled_tokens, _plan(self.plan_applied), tuple(self.paused),
                tuple(self.resumed), tuple(self.admitted), tuple(self.preempted),
                tuple(self.finished), _plan(self.plan_generated),
                self.plan_generated is not None, self.kv_free_blocks, self.kv_held_blocks,
                tuple(sorted(self.paused_kv_blocks.items())),
                tuple((c["dtype"], c["op"], c["seq"], tuple(c["shape"]), c["site"])
                      for c in self.collectives),
                None if control is None else (
                    control.charged_us / 1e6, control.collectives_us / 1e6,
                    control.planner_us / 1e6, True if control.measured else None))


def _plan(plan: dict | None) -> tuple | None:
    """A plan as the steps table's struct, by position."""
    if plan is None:
        return None
    return plan["freeze"], tuple(plan["in_blk"]), tuple(plan["out_blk"])


def request_row(rank: int, record: dict, logged_after_iter: int | None) -> tuple:
    """A request record (the engines' dictionary) as a row of the requests table (its
    lists as tuples, see ``StepRecord.row``)."""
    return (rank, record["request_id"], record["arrival_s"], record["prompt_tokens"],
            record["output_tokens"], record["first_scheduled_s"], record["finish_s"],
            tuple(record["token_times_s"]),
            tuple((start, end) for start, end in record["pauses"]), logged_after_iter)


def _clock_line(step: StepRecord) -> str:
    """The progress feed's line for ``step``: where the rank's virtual clock is."""
    return (f'{{"clock_s":{step.clock_us / 1e6!r},"kind":"step",'
            f'"step_time_s":{step.step_us / 1e6!r}}}\n')


class EventLog:
    """A rank's step and request tables and its progress feed; ``out_dir`` None writes
    nothing."""

    def __init__(self, out_dir: pathlib.Path | None, rank: int):
        self.rank = rank
        self._steps = self._requests = self._progress = None
        self._last_step: StepRecord | None = None
        if out_dir is not None:
            self._steps = TableWriter(path(out_dir, rank, STEPS), STEPS)
            self._requests = TableWriter(path(out_dir, rank, REQUESTS), REQUESTS)
            self._progress = open(out_dir / f"rank{rank}.progress.jsonl", "w")  # noqa: SIM115

    def step(self, step: StepRecord, finished: list[dict]) -> None:
        """One iteration's step record, then the records of the requests it finished;
        the progress feed gets the step's clock and a line per finished request (and the
        last step's clock when the log closes)."""
        if self._steps is None:
            return
        self._steps.append(step.row(self.rank))
        self._last_step = step
        if not finished:  # most steps
            return
        for record in finished:
            self._requests.append(request_row(self.rank, record, step.iter))
        self._progress.write(_clock_line(step) + '{"kind":"request"}\n' * len(finished))
        self._progress.flush()

    def requests(self, records: list[dict]) -> None:
        """Records of requests still in flight when the run ended."""
        if self._requests is not None:
            for record in records:
                self._requests.append(request_row(self.rank, record, None))

    def close(self) -> None:
        if self._steps is not None:
            self._steps.close()
            self._requests.close()
            if self._last_step is not None:  # where the rank's clock ended
                self._progress.write(_clock_line(self._last_step))
            self._progress.close()


class WallLog:
    """A rank's wall table; ``out_dir`` None writes nothing."""

    def __init__(self, out_dir: pathlib.Path | None, rank: int):
        self.rank = rank
        self._table = TableWriter(path(out_dir, rank, WALL), WALL) if out_dir else None

    def step(self, iteration: int, step_wall_s: float, planner_s: float | None = None,
             collectives_s: float | None = None) -> None:
        """One iteration; ``planner_s`` / ``collectives_s`` only when DyntraLB is on."""
        if self._table is not None:
            self._table.append((self.rank, iteration, step_wall_s, planner_s, collectives_s))

    def close(self) -> None:
        if self._table is not None:
            self._table.close()
