"""pytest plugin (entry point ``pytest11: dyntra_lb``): emulated DP clusters in a few lines.

Installed with the package, so any test suite in the same environment gets:

- the ``dp(n)`` marker: the number of DP ranks of the test's clusters (default 2);
- the ``dyntra_cluster`` fixture: a function that runs one real cluster (``n`` rank
  processes joined by gloo groups, via ``emu.run.run``, as the CLI runs one) in the
  test's ``tmp_path`` and returns a ``ClusterRun``:

      @pytest.mark.dp(2)
      def test_balances(dyntra_cluster):
          run = dyntra_cluster(workload="uniform", max_num_seqs=8, additional_config={
              "scheduler_config": {"dyntra_lb_config": {"enabled": True, "mode": "static",
                                                        "start_step": 0}}})
          assert run.metrics["requests_finished"] == 200

Heavy modules (torch, matplotlib) are imported only when the fixture runs a cluster, so
loading the plugin costs nothing in test sessions that do not use it.
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pytest

from emu.knobs import is_int

if TYPE_CHECKING:  # imported when a cluster runs (see above)
    from emu.run import RunResult
    from emu.spec import RunSpec

DEFAULT_DP = 2


@dataclass
class ClusterRun:
    """What one ``dyntra_cluster(...)`` call produced.

    - ``result``: the ``emu.run.RunResult`` (per-rank summaries, file paths);
    - ``metrics``: the metrics.json dictionary (docs/metrics.md) of the run, written
      into ``out_dir`` too; its ``config`` is what the CLI records for the same spec;
    - ``events``: the parsed event log of every rank, ``events[rank]`` in file order;
    - ``out_dir``: where the run's files are (inside the test's ``tmp_path``);
    - ``spec``: the ``emu.spec.RunSpec`` that ran.
    """

    result: RunResult
    metrics: dict
    events: list[list[dict]]
    out_dir: pathlib.Path
    spec: RunSpec | None = field(repr=False, default=None)

    def steps(self, rank: int) -> list[dict]:
        """Step records of ``rank``."""
        return [e for e in self.events[rank] if e["kind"] == "step"]

    def requests(self, rank: int | None = None) -> list[dict]:
        """Request records of ``rank`` (of every rank when None)."""
        ranks = range(len(self.events)) if rank is None else [rank]
        return [e for r in ranks for e in self.events[r] if e["kind"] == "request"]


def _trace_from(trace, workload, reading: dict) -> tuple[list, str | None]:
    """The TraceRequest list for ``trace`` (TraceRequests, dicts in the trace-file schema,
    or a path) or ``workload`` (a file in any trace format, or a bundled workload name,
    read as ``reading`` says: ``emu.traces.read_trace``'s ``format``, ``replay`` and
    ``options``), and what ``RunSpec.workload`` calls it (as the CLI does for
    ``--workload``; None for a list)."""
    from emu.traces import read_trace
    from emu.workload import TraceRequest, resolve_workload, workload_label

    if (trace is None) == (workload is None):
        raise ValueError("dyntra_cluster: pass exactly one of trace=... or workload=...")
    if workload is not None:
        try:
            path = resolve_workload(str(workload))
        except ValueError as exc:
            raise ValueError(f"dyntra_cluster: workload {exc}") from None
        label = reading["replay"].label(workload_label(str(workload), path))
        return read_trace(path, **reading).requests, label
    if isinstance(trace, (str, pathlib.Path)):
        return read_trace(trace).requests, str(trace)
    return [r if isinstance(r, TraceRequest) else TraceRequest(**r) for r in trace], None


class ClusterFactory:
    """The ``dyntra_cluster`` fixture's value: call it to run a cluster."""

    def __init__(self, dp_size: int, tmp_path: pathlib.Path):
        self.dp_size = dp_size
        self._tmp_path = tmp_path
        self._runs = 0

    def __call__(self, trace=None, *, workload=None, additional_config=None,
                 dp_size: int | None = None, seed: int = 0, faults=None, strict: bool = True,
                 transport: str = "process", workload_format: str | None = None,
                 time_scale: float = 1.0, window: tuple[float, float] | None = None,
                 limit: int | None = None, tokenizer: str | None = None,
                 **spec_fields) -> ClusterRun:
        """Run one cluster to completion and return its ``ClusterRun``.

        ``trace``: TraceRequests, dicts with the trace-file fields (``request_id``,
        ``arrival_s``, ``prompt_tokens``, ``output_tokens``, optional ``rank``,
        ``priority``) or a trace file; or ``workload``: a file or bundled name
        ("default", "uniform", "longtail", "bimodal"), the file in any format of
        docs/workloads.md, detected or named by ``workload_format``, replayed as
        ``time_scale``, ``window`` (START, END seconds) and ``limit`` say, as the CLI's
        flags of the same names do (``tokenizer`` for a vllm-custom trace). ``additional_config``:
        vllm-ascend's additional config (None: DyntraLB off). ``dp_size`` overrides the
        ``dp`` marker. ``faults``: faults to inject (``emu.faults`` objects or
        ``--fault`` strings such as ``"kill:rank=1,step=50"``, or a ``FaultPlan``).
        ``strict`` (on by default in tests) checks the emulator's invariants every step.
        ``transport``: "process" (rank processes over gloo) or "thread" (every rank a
        thread of the test process, in-memory collectives: same event logs, faster).
        Other keyword arguments are ``emu.spec.RunSpec`` fields
        (``max_num_seqs``, ``block_size``, ``num_gpu_blocks``, ``device``,
        ``max_concurrency`` for closed-loop clients, ...).
        Raises ValueError (``emu.spec.SpecError``, every problem listed) for a bad spec
        and ``emu.cluster.launcher.ClusterError`` when a rank fails."""
        from emu.faults import FaultPlan
        from emu.run import run
        from emu.spec import RunSpec

        if faults is not None:
            spec_fields["faults"] = FaultPlan.of(faults)
        self._runs += 1
        out_dir = self._tmp_path / f"dyntra-cluster-{self._runs}"
        from emu.traces import ReadOptions, Replay

        reading = {"format": workload_format,
                   "replay": Replay(time_scale=time_scale, window=window, limit=limit),
                   "options": ReadOptions(tokenizer=tokenizer)}
        requests, label = _trace_from(trace, workload, reading)
        spec = RunSpec(trace=requests, workload=label,
                       dp_size=self.dp_size if dp_size is None else dp_size,
                       out_dir=out_dir, additional_config=additional_config, seed=seed,
                       strict=strict, transport=transport, **spec_fields)
        result = run(spec)
        events = [result.events(rank) for rank in range(spec.dp_size)]
        return ClusterRun(result=result, metrics=result.metrics, events=events,
                          out_dir=out_dir, spec=spec)


def _dp_from_marker(node) -> int:
    marker = node.get_closest_marker("dp")
    if marker is None:
        return DEFAULT_DP
    if len(marker.args) != 1 or marker.kwargs:
        raise pytest.UsageError(f"{node.nodeid}: @pytest.mark.dp takes one argument, the "
                                f"number of DP ranks, e.g. @pytest.mark.dp(2)")
    n = marker.args[0]
    if not is_int(n) or n < 1:
        raise pytest.UsageError(f"{node.nodeid}: @pytest.mark.dp expects an integer >= 1, "
                                f"got {n!r}")
    return n


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers",
        "dp(n): number of DP ranks of the clusters the dyntra_cluster fixture starts "
        f"(default {DEFAULT_DP})")


@pytest.fixture
def dyntra_cluster(request, tmp_path) -> ClusterFactory:
    """Runs emulated DP clusters for this test: ``dyntra_cluster(trace=... or
    workload=..., additional_config=..., **RunSpec fields) -> ClusterRun``. The number
    of ranks comes from ``@pytest.mark.dp(n)`` (default 2); files go under tmp_path."""
    return ClusterFactory(_dp_from_marker(request.node), tmp_path)
