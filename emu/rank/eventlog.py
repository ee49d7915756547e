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

from emu.rank.control_costs import ControlCharge

# One encoder for every record: json.dumps with options would build a new one per call.
_dumps = json.JSONEncoder(sort_keys=True, separators=(",", ":")).encode
# What _dumps writes for a string and a float (json's own functions).
_string = json.encoder.encode_basestring_ascii
_float = float.__repr__
_PLAN_KEYS = frozenset(("freeze", "in_blk", "out_blk"))
_COLLECTIVE_KEYS = frozenset(("dtype", "op", "seq", "shape", "site"))
# A collective record's text before and after its seq, by (site, op, dtype, str(shape)):
# a run has a handful of descriptors (the bound only keeps odd callers in check).
_COLLECTIVE_TEXT: dict[tuple, tuple[str, str]] = {}
_MAX_COLLECTIVE_TEXTS = 1024
# Token-time texts an event log keeps (one per step of the rank's run, up to this many).
_MAX_FLOAT_TEXTS = 1 << 16


def _ints(values: list) -> str:
    """A list of Python ints (a shape, a plan's block sizes) as _dumps writes it."""
    if not values:
        return "[]"
    if all(type(v) is int for v in values):
        return "[" + ",".join(map(str, values)) + "]"
    return _dumps(values)


def _plan(plan: dict | None) -> str:
    if plan is None:
        return "null"
    freeze = plan.get("freeze")
    if plan.keys() != _PLAN_KEYS or type(freeze) is not bool:
        return _dumps(plan)
    return (f'{{"freeze":{"true" if freeze else "false"},"in_blk":{_ints(plan["in_blk"])},'
            f'"out_blk":{_ints(plan["out_blk"])}}}')


def _control(charge: ControlCharge) -> str:
    return f'"control_plane":{charge.json()},'


def _collectives(records: list[dict]) -> str:
    parts = []
    for c in records:
        seq = c.get("seq")
        if c.keys() != _COLLECTIVE_KEYS or type(seq) is not int:
            parts.append(_dumps(c))
            continue
        site, op, dtype, shape = c["site"], c["op"], c["dtype"], c["shape"]
        if type(site) is not str or type(op) is not str or type(dtype) is not str \
                or type(shape) is not list:
            parts.append(_dumps(c))
            continue
        # The text around ``seq`` is the same for every collective of a descriptor.
        key = (site, op, dtype, str(shape))
        around = _COLLECTIVE_TEXT.get(key)
        if around is None:
            if len(_COLLECTIVE_TEXT) >= _MAX_COLLECTIVE_TEXTS:
                _COLLECTIVE_TEXT.clear()
            around = (f'{{"dtype":{_string(dtype)},"op":{_string(op)},"seq":',
                      f',"shape":{_ints(shape)},"site":{_string(site)}}}')
            _COLLECTIVE_TEXT[key] = around
        parts.append(f"{around[0]}{seq}{around[1]}")
    return "[" + ",".join(parts) + "]"


@dataclass(slots=True)
class StepRecord:
    """One non-idle iteration of one rank, as both engines report it. Times are virtual
    microseconds; the event log writes them as seconds (docs/metrics.md has every
    field). ``control_plane`` is what DyntraLB's control plane charged after the
    forward; None (the profile has it off) leaves the key out of the log."""

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

    def to_dict(self) -> dict:
        control = ({} if self.control_plane is None
                   else {"control_plane": self.control_plane.to_dict()})
        return {**control,
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

    def line(self, rank: int) -> str:
        """The event-log line of this record: byte for byte ``_dumps`` of ``to_dict()``
        plus ``kind`` and ``rank`` (keys sorted), written field by field in key order.
        It runs on every step of every rank, and the generic encoder (sorting every
        dict's keys, a call per nested value) costs several times more. Nested values
        of another shape than the engines write go through ``_dumps``."""
        d = _dumps
        return (
            f'{{"admitted":{d(self.admitted) if self.admitted else "[]"},'
            f'"clock_s":{_float(self.clock_us / 1e6)},'
            f'"collectives":{_collectives(self.collectives)},'
            f'{"" if self.control_plane is None else _control(self.control_plane)}'
            f'"dummy":{"true" if self.dummy else "false"},'
            f'"finished":{d(self.finished) if self.finished else "[]"},'
            f'"iter":{self.iter},"kind":"step",'
            f'"kv_free_blocks":{self.kv_free_blocks},"kv_held_blocks":{self.kv_held_blocks},'
            f'"lb_active":{"false" if self.plan_generated is None else "true"},'
            f'"num_running":{self.num_running},"num_waiting":{self.num_waiting},'
            f'"own_cost_s":{_float(self.own_cost_us / 1e6)},'
            f'"paused":{d(self.paused) if self.paused else "[]"},'
            f'"paused_kv_blocks":{d(self.paused_kv_blocks) if self.paused_kv_blocks else "{}"},'
            f'"plan_applied":{_plan(self.plan_applied)},'
            f'"plan_generated":{_plan(self.plan_generated)},'
            f'"preempted":{d(self.preempted) if self.preempted else "[]"},"rank":{rank},'
            f'"resumed":{d(self.resumed) if self.resumed else "[]"},'
            f'"running_blocks":{self.running_blocks},'
            f'"scheduled_tokens":{self.scheduled_tokens},"step_counter":{self.step_counter},'
            f'"step_time_s":{_float(self.step_us / 1e6)},'
            f'"waiting_blocks":{self.waiting_blocks},"wave":{self.wave}}}')


class EventLog:
    """``rank<r>.events.jsonl``; ``path`` None writes nothing."""

    def __init__(self, path: pathlib.Path | None, rank: int):
        self.rank = rank
        self._file = open(path, "w") if path is not None else None  # noqa: SIM115
        # The text of each token time written so far (see _float_list).
        self._float_texts: dict[float, str] = {}

    def step(self, step: StepRecord, finished: list[dict]) -> None:
        """One iteration's step record, then the records of the requests it finished.
        Flushed when a request finished: the progress display counts request records."""
        if self._file is None:
            return
        if not finished:  # most steps
            self._file.write(step.line(self.rank) + "\n")
            return
        lines = [step.line(self.rank)]
        lines.extend(self._request_line(r) for r in finished)
        self._file.write("\n".join(lines) + "\n")
        self._file.flush()

    def requests(self, records: list[dict]) -> None:
        """Records of requests still in flight when the run ended."""
        if self._file is not None:
            for record in records:
                self._file.write(self._request_line(record) + "\n")

    def _request_line(self, record: dict) -> str:
        """A request record's line: byte for byte ``_dumps(record)`` (with ``kind`` and
        ``rank``). Its ``token_times_s``, the last key, holds a float per output token,
        and a request's tokens share their times with the other requests of the rank's
        steps: each time's text is made once (``_float_list``) and the rest of the record
        goes through the encoder."""
        record["kind"] = "request"
        record["rank"] = self.rank
        times = record.get("token_times_s")
        if type(times) is list and max(record) == "token_times_s":
            text = self._float_list(times)
            if text is not None:
                rest = dict(record)
                del rest["token_times_s"]
                return f'{_dumps(rest)[:-1]},"token_times_s":{text}}}'
        return _dumps(record)

    def _float_list(self, values: list) -> str | None:
        """``_dumps(values)`` for a list of floats, each distinct value's text made once
        per rank (a few thousand distinct times against hundreds of thousands of tokens);
        None when an item is not a float. Zeros are never kept (0.0 and -0.0 are equal
        keys with two texts), nor is NaN found again (it equals nothing)."""
        texts = self._float_texts
        parts = []
        for value in values:
            if type(value) is not float:
                return None
            text = texts.get(value)
            if text is None:
                text = _dumps(value)
                if value and len(texts) < _MAX_FLOAT_TEXTS:
                    texts[value] = text
            parts.append(text)
        return "[" + ",".join(parts) + "]"

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
