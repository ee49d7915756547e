"""The rules every trace's requests pass, each written and worded once: one request's
arrival time (``arrival_problem``) and token counts (``tokens_problem``); the requests of
a trace together (``UniqueIds``, ``ArrivalOrder``); a pinned rank against the DP size
(``pinned_rank_problem``). The readers of every trace format (``emu.traces``) apply them
line by line, naming ``file:line``; ``emu.spec.check`` applies them to a RunSpec's
trace, naming the request."""

from __future__ import annotations

import json
import math
from collections.abc import Callable

from emu.knobs import is_int, is_number
from emu.workload.request import MAX_ARRIVAL_S, MAX_TOKENS


def on_line(line: int) -> str:
    """A file's line as the rules below name an earlier one."""
    return f"line {line}"


class ArrivalOrder:
    """The rule of a trace in arrival order: each time is no earlier than the one before
    it (equal times are fine). ``check`` each time in order, with its position (a file's
    line; a request's index), which ``place`` names when a later time breaks the rule."""

    def __init__(self, place: Callable[[int], str] = on_line):
        self._previous: tuple[float, int] | None = None  # (time, position)
        self._place = place

    def check(self, time: float, position: int) -> str | None:
        """The problem with ``time`` at ``position`` (without the place's own prefix)."""
        previous, self._previous = self._previous, (time, position)
        if previous is not None and time < previous[0]:
            return (f"arrivals must be non-decreasing, got {time} after {previous[0]} on "
                    f"{self._place(previous[1])}")
        return None


class UniqueIds:
    """The rule that no two requests of a trace share an id. ``check`` each id in order,
    with its position (a file's line; a request's index), which ``place`` names when the
    id comes again."""

    def __init__(self, place: Callable[[int], str] = on_line):
        self._first: dict[str, int] = {}
        self._place = place

    def check(self, request_id: str, position: int) -> str | None:
        """The problem with ``request_id`` at ``position`` (without the place's prefix)."""
        first = self._first.setdefault(request_id, position)
        if first != position:
            return f"duplicate id {request_id!r} (first used on {self._place(first)})"
        return None


def pinned_rank_problem(rank: int, dp_size: int) -> str | None:
    """Why a request pinned to ``rank`` cannot run with ``dp_size`` ranks, or None."""
    if rank >= dp_size:
        return f"expected an integer in 0..{dp_size - 1} for dp_size={dp_size}, got {rank}"
    return None


def arrival_problem(value) -> str | None:
    """Why ``value`` is not a request's arrival time (a finite number of seconds in
    0..MAX_ARRIVAL_S), or None."""
    if not is_time(value):
        return f"expected a finite number >= 0 (seconds), got {show(value)}"
    if value > MAX_ARRIVAL_S:
        return (f"expected at most {MAX_ARRIVAL_S:g} seconds, got {show(value)} (is the "
                "trace in milliseconds?)")
    return None


def tokens_problem(value, shown: str | None = None) -> str | None:
    """Why ``value`` is not a token count of a request (an integer in 1..MAX_TOKENS), or
    None. ``shown``: how the message shows the value (default: as JSON, with its type)."""
    shown = show(value) if shown is None else shown
    if not is_int(value) or value < 1:
        return f"expected an integer >= 1, got {shown}"
    if value > MAX_TOKENS:
        return f"expected at most {MAX_TOKENS:,} tokens, got {shown}"
    return None


def is_time(value) -> bool:
    """A number >= 0 that is finite as a float (ints too large for a float count as
    finite: the MAX_ARRIVAL_S check rejects them)."""
    if not is_number(value):
        return False
    if isinstance(value, int):
        return value >= 0
    return math.isfinite(value) and value >= 0

def json_type(value) -> str:
    """A JSON value's type as messages name it ("a number", "an array")."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def show(value) -> str:
    """A JSON value as messages show it: at most 40 characters, with its type."""
    text = json.dumps(value)
    if len(text) > 40:
        text = text[:37] + "..."
    return f"{text} ({json_type(value)})"

