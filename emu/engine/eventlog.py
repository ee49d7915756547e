"""The files a rank writes while it runs: the event log and the wall log.

``rank<r>.events.jsonl`` is deterministic: one ``step`` record per non-idle iteration
and one ``request`` record per request (when it finishes, or at the end of the run for
the unfinished ones), keys sorted, no wall-clock values. ``rank<r>.wall.jsonl`` holds
the wall-clock time of each iteration (and of the planner and DyntraLB's collectives),
which differs from run to run. Both engine implementations write through this module,
so their logs share one schema (``docs/metrics.md``).
"""

from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass

# One encoder for every record: json.dumps with options would build a new one per call.
_dumps = json.JSONEncoder(sort_keys=True, separators=(",", ":")).encode


@dataclass(slots=True)
class StepRecord:
    """One non-idle iteration of one rank, as both engines report it. Times are virtual
    microseconds; the event log writes them as seconds (docs/metrics.md has every
    field)."""

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

    def to_dict(self) -> dict:
        return {
            "iter": self.iter, "wave": self.wave, "step_counter": self.step_counter,
            "clock_s": self.clock_us / 1e6, "own_cost_s": self.own_cost_us / 1e6,
            "step_time_s": self.step_us / 1e6, "dummy": self.dummy,
            "num_running": self.num_running, "num_waiting": self.num_waiting,
            "running_blocks": self.running_blocks, "waiting_blocks": self.waiting_blocks,
            "scheduled_tokens": self.scheduled_tokens, "plan_applied": self.plan_applied,
            "paused": self.paused, "resumed": self.resumed, "admitted": self.admitted,
            "preempted": self.preempted, "finished": self.finished,
            "plan_generated": self.plan_generated,
            "lb_active": self.plan_generated is not None,
            "kv_free_blocks": self.kv_free_blocks, "kv_held_blocks": self.kv_held_blocks,
            "paused_kv_blocks": self.paused_kv_blocks, "collectives": self.collectives,
        }


class EventLog:
    """``rank<r>.events.jsonl``; ``path`` None writes nothing."""

    def __init__(self, path: pathlib.Path | None, rank: int):
        self.rank = rank
        self._file = open(path, "w") if path is not None else None  # noqa: SIM115

    def step(self, step: StepRecord, finished: list[dict]) -> None:
        """One iteration's step record, then the records of the requests it finished.
        Flushed when a request finished: the progress display counts request records."""
        if self._file is None:
            return
        record = step.to_dict()
        record["kind"] = "step"
        record["rank"] = self.rank
        lines = [_dumps(record)]
        lines.extend(self._request_line(r) for r in finished)
        self._file.write("\n".join(lines) + "\n")
        if finished:
            self._file.flush()

    def requests(self, records: list[dict]) -> None:
        """Records of requests still in flight when the run ended."""
        if self._file is not None:
            for record in records:
                self._file.write(self._request_line(record) + "\n")

    def _request_line(self, record: dict) -> str:
        record["kind"] = "request"
        record["rank"] = self.rank
        return _dumps(record)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


class WallLog:
    """``rank<r>.wall.jsonl``; ``path`` None writes nothing."""

    def __init__(self, path: pathlib.Path | None):
        self._file = open(path, "w") if path is not None else None  # noqa: SIM115

    def step(self, iteration: int, step_wall_s: float, planner_s: float | None = None,
             collectives_s: float | None = None) -> None:
        """One iteration; ``planner_s`` / ``collectives_s`` only when DyntraLB is on.
        Formatted by hand (keys sorted, as in the event log): it runs every step, and
        this is several times cheaper than json.dumps."""
        if self._file is None:
            return
        if planner_s is None:
            line = f'{{"iter":{iteration},"step_wall_s":{step_wall_s!r}}}\n'
        else:
            line = (f'{{"dyntra_lb_collectives_s":{collectives_s!r},'
                    f'"iter":{iteration},"planner_s":{planner_s!r},'
                    f'"step_wall_s":{step_wall_s!r}}}\n')
        self._file.write(line)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
