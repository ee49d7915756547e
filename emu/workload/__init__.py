"""Workload traces for the emulated cluster, one module per job:

- ``request``: what a request is (``TraceRequest``), the fields a trace line holds and
  their limits, ``TraceError``, ``arrival_us``;
- ``rules``: the rules every trace's requests pass, each written and worded once, for
  trace files (naming ``file:line``) and RunSpecs (naming the request);
- ``jsonl``: reading trace files: the ``Row`` every format reader hands back, JSON Lines
  objects, and this project's own format with ``load_trace`` and ``validate_trace``
  (the field's formats are ``emu.traces``');
- ``bundled``: the bundled workloads and resolving ``--workload``;
- ``wave_boundary``: a request placed exactly at a wave's end.

The engine on every rank loads the same trace, routes every request with the same
deterministic router (``emu.routers``) and keeps only the requests routed to itself, so
no rank needs to talk to another about arrivals. Virtual time in the engine is integer
microseconds (``arrival_us``).

The names below are the package's: import them from ``emu.workload`` (the routing names
``emu.routers`` now owns stay importable from here too).
"""

from emu.routers import (
    DEFAULT_ROUTER,
    LeastLoadedRouter,
    RoundRobinRouter,
    check_dp_size,
    make_router,
)
from emu.routers import ROUTERS as _ROUTER_TYPES
from emu.workload.bundled import (
    WORKLOADS_DIR,
    bundled_workloads,
    resolve_workload,
    workload_label,
)
from emu.workload.jsonl import (
    Row,
    dyntra_rows,
    empty_trace_problem,
    is_blank,
    json_objects,
    load_trace,
    read_trace_bytes,
    validate_trace,
)
from emu.workload.request import (
    MAX_ARRIVAL_S,
    MAX_PRIORITY,
    MAX_TOKENS,
    OPTIONAL_FIELDS,
    REQUIRED_FIELDS,
    TraceError,
    TraceRequest,
    arrival_us,
)
from emu.workload.rules import (
    ArrivalOrder,
    UniqueIds,
    arrival_problem,
    is_time,
    on_line,
    pinned_rank_problem,
    show,
    tokens_problem,
)
from emu.workload.wave_boundary import WaveEnd, insert_request, wave_boundary_trace, wave_ends

# The router names, as this module listed them before emu.routers had a registry.
ROUTERS = tuple(_ROUTER_TYPES)

__all__ = [
    "DEFAULT_ROUTER", "MAX_ARRIVAL_S", "MAX_PRIORITY", "MAX_TOKENS", "OPTIONAL_FIELDS",
    "REQUIRED_FIELDS", "ROUTERS", "WORKLOADS_DIR", "ArrivalOrder", "LeastLoadedRouter",
    "RoundRobinRouter", "Row", "TraceError", "TraceRequest", "UniqueIds", "WaveEnd",
    "arrival_problem", "arrival_us", "bundled_workloads", "check_dp_size", "dyntra_rows",
    "empty_trace_problem", "insert_request", "is_blank", "is_time", "json_objects",
    "load_trace", "make_router", "on_line", "pinned_rank_problem", "read_trace_bytes",
    "resolve_workload", "show", "tokens_problem", "validate_trace", "wave_boundary_trace",
    "wave_ends", "workload_label",
]
