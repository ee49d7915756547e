"""The Mooncake trace (kvcache-ai/Mooncake, FAST'25): JSON Lines with ``timestamp`` in
milliseconds since the first request, ``input_length``, ``output_length`` and
``hash_ids`` (prefix-cache block hashes, which a decode node's replay does not use).
Other keys are left alone: tools that write this format add their own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from emu.knobs import is_int
from emu.traces.base import ReadOptions, TraceFormat
from emu.workload import (
    ArrivalOrder,
    Row,
    TraceRequest,
    is_time,
    json_objects,
    show,
    tokens_problem,
)

REQUIRED = ("timestamp", "input_length", "output_length")


def _rows(path: Path, raw: bytes, options: ReadOptions) -> Iterator[Row]:
    order = ArrivalOrder()
    for line, obj, problem in json_objects(path, raw):
        if obj is None:
            yield Row(line, problems=(problem,))
            continue
        where = f"{path}:{line}"
        problems = [f"{where}: field {name!r}: missing (required)"
                    for name in REQUIRED if name not in obj]
        timestamp = obj.get("timestamp")
        if "timestamp" in obj:
            if not is_time(timestamp):
                problems.append(f"{where}: field 'timestamp': expected a finite number >= 0 "
                                f"(milliseconds), got {show(timestamp)}")
            else:
                out_of_order = order.check(timestamp, line)
                if out_of_order is not None:
                    problems.append(f"{where}: field 'timestamp': {out_of_order}")
        for name in ("input_length", "output_length"):
            if name in obj:
                length = tokens_problem(obj[name])
                if length is not None:
                    problems.append(f"{where}: field {name!r}: {length}")
        hash_ids = obj.get("hash_ids", [])
        if not (isinstance(hash_ids, list) and all(is_int(h) for h in hash_ids)):
            problems.append(f"{where}: field 'hash_ids': expected a list of integers, got "
                            f"{show(hash_ids)}")
        if problems:
            yield Row(line, problems=tuple(problems))
            continue
        yield Row(line, TraceRequest(f"mooncake-{line}", timestamp / 1000,
                                     obj["input_length"], obj["output_length"]))


FORMAT = TraceFormat(
    name="mooncake",
    about="the Mooncake trace, JSON Lines: timestamp (ms), input_length, output_length, "
          "hash_ids",
    rows=_rows,
    looks_like=lambda head: bool(head.keys & {"input_length", "output_length", "hash_ids"}),
    ordered=True,
    rebase=True,
)
