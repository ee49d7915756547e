"""Requests placed at a wave boundary: the wave ends in a rank's step records, and a
trace with one more request arriving exactly when a given wave ended (a workload, not a
fault: ``emu.faults``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from emu.workload.request import TraceRequest


@dataclass(frozen=True)
class WaveEnd:
    """A wave's last step (from a rank's step records): ``iter`` and ``start_us`` of
    that step, and ``end_us``, the virtual time its sync decided the wave was over —
    where the next iteration (idle, or a new wave) begins."""

    wave: int
    iter: int
    start_us: int
    end_us: int


def wave_ends(steps: Sequence[dict]) -> list[WaveEnd]:
    """Every wave end in one rank's step records (file order), the run's last step
    included (a finished run ends with its last wave)."""
    ends = []
    for i, record in enumerate(steps):
        if record.get("kind", "step") != "step":
            raise ValueError(f"wave_ends expects step records, got kind {record['kind']!r}")
        if i + 1 == len(steps) or steps[i + 1]["wave"] != record["wave"]:
            start_us = round(record["clock_s"] * 1e6)
            ends.append(WaveEnd(record["wave"], record["iter"], start_us,
                                start_us + round(record["step_time_s"] * 1e6)))
    return ends


def insert_request(trace: Sequence[TraceRequest],
                   request: TraceRequest) -> list[TraceRequest]:
    """``trace`` with ``request`` added after every request arriving no later (the
    trace stays sorted; the new id must be unused)."""
    if any(r.request_id == request.request_id for r in trace):
        raise ValueError(f"request id {request.request_id!r} is already in the trace")
    position = sum(1 for r in trace if r.arrival_s <= request.arrival_s)
    return [*trace[:position], request, *trace[position:]]


def wave_boundary_trace(trace: Sequence[TraceRequest], steps: Sequence[dict], *,
                        wave: int, request: TraceRequest,
                        offset_us: int = 0) -> list[TraceRequest]:
    """``trace`` plus ``request`` arriving exactly when ``wave`` ended in the run whose
    step records (of any rank) are ``steps`` (``offset_us`` shifts it, e.g. -1 = during
    the wave's last step). Requests before it are untouched, so a run of the new trace
    is identical to the old one up to that moment (a pinned ``request`` also leaves the
    round-robin rotation of later requests alone)."""
    ends = {end.wave: end for end in wave_ends(steps)}
    if wave not in ends:
        raise ValueError(f"wave {wave} is not in the step records (waves: {sorted(ends)})")
    arrival_us = ends[wave].end_us + offset_us
    if arrival_us < 0:
        raise ValueError(f"offset_us={offset_us} puts the arrival before time 0")
    return insert_request(trace, dataclasses.replace(request, arrival_s=arrival_us / 1e6))
