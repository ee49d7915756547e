"""Hypothesis profiles, loaded before any test module builds its ``@settings``; the
compiled planner's cache, built once per session; each xdist worker on cores of its
own; soak tests first.

``ci`` (the default): derandomized, so every run (CI or local) tests the same examples
and a failure reproduces by rerunning; no example database, so earlier runs cannot
change what runs; 300 examples for the tests that do not set their own count (the
planner and fuzz tests set theirs). Neither profile has a deadline or the too-slow
health check: an example's wall time says how busy the machine is, not whether the code
is right. ``explore``: a fresh random seed on every run and the example database in
``.hypothesis/``, for hunting new failures locally:

    HYPOTHESIS_PROFILE=explore pytest -q tests/unit -n 2
"""

import os
import signal

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("ci", derandomize=True, database=None, max_examples=300,
                          print_blob=True, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("explore", derandomize=False, print_blob=True, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_configure(config):
    """Before any test (and, under xdist, before the workers start): compile the numba
    planner into its disk cache once, so that no rank of a test compiles it (tens of
    seconds) while its peers wait in a collective. In an xdist worker: keep to its own
    cores."""
    if hasattr(config, "workerinput"):
        keep_to_own_cores(config.workerinput["workerid"], config.workerinput["workercount"])
    else:
        from dyntra_lb.planner import front as planner

        planner.warm_up()


def keep_to_own_cores(worker_id: str, worker_count: int) -> None:
    """Give xdist worker ``gw<i>`` of ``worker_count`` its share of the cores this
    process may use (every ``worker_count``-th from the i-th; one core when there are
    fewer cores than workers), inherited by every thread and process it starts from now
    on: the ranks of its tests, their fork servers, the commands it runs, a Ray it
    starts. The workers then no longer compete for a core, and rank processes that wake
    each other at every collective stay on one core where there are as few cores as
    workers: on a 2-core VM, gloo's wake-ups across cores cost more CPU than the steps
    themselves (benchmarks/RESULTS.md, "CI"). Linux only (where Python has
    ``os.sched_setaffinity``); elsewhere the workers share every core."""
    if not hasattr(os, "sched_setaffinity"):
        return
    index = int(worker_id.removeprefix("gw"))
    os.sched_setaffinity(0, core_share(sorted(os.sched_getaffinity(0)), index, worker_count))


def core_share(cores: list[int], index: int, worker_count: int) -> list[int]:
    """The cores of worker ``index`` of ``worker_count``, out of ``cores``."""
    return cores[index::worker_count] or [cores[index % len(cores)]]


def pytest_collection_modifyitems(items):
    """Soak tests first: the 1,000-wave run is among the suite's longest tests, and xdist
    hands out tests in this order, so started last it would run on one worker while the
    other sits idle."""
    items.sort(key=lambda item: item.get_closest_marker("soak") is None)


def pytest_terminal_summary(terminalreporter):
    """Say once, at the end, why the upstream tier did not run (its tests are skipped
    with the reason; under xdist only this root conftest reaches the summary)."""
    reasons = {report.longrepr[2] for report in terminalreporter.stats.get("skipped", [])
               if isinstance(report.longrepr, tuple) and "upstream tier not run" in
               report.longrepr[2]}
    for reason in sorted(reasons):
        terminalreporter.write_line(reason.removeprefix("Skipped: "))


@pytest.fixture(autouse=True)
def stop_handlers_kept():
    """Fail a test that leaves SIGINT or SIGTERM handled or blocked otherwise than it
    found them, naming the signal, and put them back: later tests in the same xdist
    worker would see the leak (a stop test that expects KeyboardInterrupt then gets
    none), so the failure would land on an innocent test, in some orders only."""
    stops = (signal.SIGINT, signal.SIGTERM)
    before = {signum: signal.getsignal(signum) for signum in stops}
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    yield
    leaked = [f"{signum.name} handled" for signum in stops
              if signal.getsignal(signum) is not before[signum]]
    now_blocked = signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    leaked += [f"{signum.name} blocked" for signum in stops
               if (signum in now_blocked) != (signum in blocked)]
    for signum in stops:
        signal.signal(signum, before[signum])
    if leaked:
        pytest.fail(f"the test left {', '.join(leaked)} otherwise than it found it")


@pytest.fixture
def ray_installed():
    """The tests of ``--executor ray`` need Ray (``pip install -e '.[ray]'``); without it
    they are skipped with that reason, unless DYNTRA_RAY_REQUIRED=1 (what .ci/run sets,
    having installed it) makes that an error."""
    try:
        import ray  # noqa: F401
    except ImportError:
        if os.environ.get("DYNTRA_RAY_REQUIRED") == "1":
            pytest.fail("Ray is required here (DYNTRA_RAY_REQUIRED=1): pip install -e '.[ray]'")
        pytest.skip("Ray not installed: pip install -e '.[ray]'")


@pytest.fixture
def worker_tmp(monkeypatch):
    """A Ray test's own TMPDIR, inherited by the Ray it starts and its workers, so that
    what they leave there can be counted (tests/ray_tmpdir.py); removed after."""
    from tests.ray_tmpdir import own_tmpdir

    with own_tmpdir(monkeypatch) as path:
        yield path
