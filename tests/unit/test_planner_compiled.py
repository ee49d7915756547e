"""Which planner runs: ``dyntra_lb.planner.front`` selects the compiled planner
(``dyntra_lb.planner.compiled``) at import when numba imports, and the Python planner
otherwise; calls with an observer, and inputs the compiled planner declines, run the
Python planner. (That both give the oracle's plans is test_planner_properties.py.)"""

import fractions
import os
import subprocess
import sys
import textwrap

import numba
import numpy as np
import pytest
from numba.core.caching import FunctionCache, NullCache

from dyntra_lb.planner import compiled, front

SNAPSHOT = [([300, 200, 50], 2), ([100, 250, 20], 1), ([150, 50], 2)]


def test_the_compiled_planner_is_selected_when_numba_imports():
    # numba is a test dependency, so this also proves CI runs the compiled planner.
    assert numba.__version__
    assert front.IMPLEMENTATION == "numba"


def test_calls_without_observer_run_the_compiled_planner(monkeypatch):
    expected = front.balance_load_python(SNAPSHOT, 3, threshold=0.1)

    def python_planner_must_not_run(*args, **kwargs):
        raise AssertionError("the Python planner ran")

    monkeypatch.setattr(front, "balance_load_python", python_planner_must_not_run)
    assert front.balance_load(SNAPSHOT, 3, threshold=0.1) == expected
    assert front.balance_load_native(SNAPSHOT, 3, threshold=0.1) == expected


def test_calls_with_an_observer_run_the_python_planner(monkeypatch):
    def compiled_planner_must_not_run(*args, **kwargs):
        raise AssertionError("the compiled planner ran")

    monkeypatch.setattr(compiled, "plan", compiled_planner_must_not_run)
    events = []
    plans = front.balance_load(SNAPSHOT, 3, threshold=0.1, observer=events.append)
    assert [e["kind"] for e in events if e["kind"] == "swap"] == ["swap", "swap"]
    assert plans == front.balance_load_python(SNAPSHOT, 3, threshold=0.1)


def _rows(first=(30, 20, 5)):
    return [(list(first), 1), ([10, 40], 1)]


@pytest.mark.parametrize("make_rows, kw", [
    (lambda: _rows((30.0, 20, 5)), {}),                             # float sizes
    (lambda: [([True, True, False], 1), ([True], 1)], {}),          # bools only
    (lambda: [(iter([30, 20, 5]), 1), ([10, 40], 1)], {}),          # not a list
    (_rows, {"threshold": fractions.Fraction(1, 3)}),
    (_rows, {"threshold": 2**60 + 1}),                              # int beyond a float
    (_rows, {"max_num_seqs": 2.0}),                                 # Python planner: TypeError
    (lambda: _rows((2**31, 20, 5)), {}),                            # beyond int32: ValueError
])
def test_inputs_the_compiled_planner_declines_go_to_the_python_planner(make_rows, kw):
    assert front.balance_load_native(make_rows(), 2, **kw) is None
    try:
        expected = front.balance_load_python(make_rows(), 2, **kw)
    except (TypeError, ValueError) as error:
        with pytest.raises(type(error)) as raised:
            front.balance_load(make_rows(), 2, **kw)
        assert str(raised.value) == str(error)
    else:
        assert front.balance_load(make_rows(), 2, **kw) == expected


def test_payload_rows_as_numpy_arrays_are_taken():
    rows = [(np.array([30, 20, 5, 0], dtype=np.int32), 1), (np.array([10, 40]), 1)]
    plans = front.balance_load_native(rows, 2, threshold=1)
    assert plans == front.balance_load_python(rows, 2, threshold=1)


def test_the_gathered_int32_rows_reach_the_kernel_without_lists(monkeypatch):
    # What the coordinator passes: views of the gathered int32 block (payload.unpack).
    # They must be joined as arrays, never turned into Python lists first.
    gathered = [np.array([300, 200, 50, 0, 0, 0, 2, 0], np.int32),
                np.array([100, 250, 20, 0, 0, 0, 1, 0], np.int32),
                np.array([150, 50, 0, 0, 0, 0, 2, 0], np.int32)]
    rows = [(buf[:6], int(buf[6])) for buf in gathered]

    joined = []
    real = compiled._flatten_arrays
    monkeypatch.setattr(compiled, "_flatten_arrays",
                        lambda *a: joined.append(1) or real(*a))
    expected = front.balance_load_python([(r.tolist(), k) for r, k in rows], 3,
                                         threshold=0.1)
    plans = front.balance_load_native(rows, 3, threshold=0.1)
    assert joined == [1]
    assert plans == expected
    assert [p.to_dict() for p in plans][0]["out_blk"] == [300]


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64])
def test_any_signed_integer_rows_plan_as_their_lists(dtype):
    rows = [(np.array([30, 20, 5, 0, 7], dtype), 2), (np.array([10, 40], dtype), 1),
            (np.zeros(0, dtype), 0)]
    lists = [(r.tolist(), k) for r, k in rows]
    assert front.balance_load_native(rows, 4, threshold=1, max_num_seqs=2) == \
        front.balance_load_native(lists, 4, threshold=1, max_num_seqs=2) == \
        front.balance_load_python(lists, 4, threshold=1, max_num_seqs=2)


def test_without_numba_the_python_planner_is_selected():
    # A fresh interpreter in which "import numba" fails.
    code = textwrap.dedent("""
        import sys
        sys.modules["numba"] = None
        from dyntra_lb.planner import front
        print(front.IMPLEMENTATION)
        print(front.balance_load_native([([3], 1), ([1, 2], 1)], 2, threshold=1.0))
        print([p.to_dict() for p in front.balance_load([([3], 1), ([1, 2], 1)], 2,
                                                       threshold=1.0)])
        front.warm_up()
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120).stdout.splitlines()
    assert out == ["python", "None",
                   "[{'out_blk': [], 'in_blk': [], 'freeze': True}, "
                   "{'out_blk': [1], 'in_blk': [2], 'freeze': False}]"]


def test_no_writable_cache_location_compiles_without_a_disk_cache(monkeypatch):
    # What numba meets on a read-only install with a read-only home: no cache locator.
    monkeypatch.setattr(numba.core.config, "CACHE_LOCATOR_CLASSES", "ZipCacheLocator")

    def add_one(x):
        return x + 1

    kernel = compiled._cached_jit(add_one)
    assert kernel(1) == 2
    assert isinstance(kernel._cache, NullCache)


def test_the_kernel_is_cached_on_disk_in_a_writable_checkout():
    if not os.access(os.path.dirname(compiled.__file__), os.W_OK):
        pytest.skip("installed read-only")
    assert isinstance(compiled._balance._cache, FunctionCache)


def test_warm_up_compiles_the_kernel():
    front.warm_up()
    assert compiled._balance.signatures


def test_an_edit_to_a_callee_in_another_file_compiles_the_kernel_anew(tmp_path):
    # numba alone would load the cached kernel (its own file is unchanged) and run the
    # callee's old code; the kernel modules are split across files, so this must not.
    (tmp_path / "callee.py").write_text(
        "from numba import njit\n\n@njit(inline='always')\ndef f(x):\n    return x + 1\n")
    (tmp_path / "kernel.py").write_text(textwrap.dedent("""
        import callee
        from dyntra_lb.planner.compiled import _cached_jit

        def g(x):
            return callee.f(x)

        g = _cached_jit(g, (__file__, callee.__file__))
    """))
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    code = ("import kernel; print(kernel.g(1), "
            "sum(kernel.g.stats.cache_hits.values()), sum(kernel.g.stats.cache_misses.values()))")

    def run():
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              check=True, timeout=120, cwd=tmp_path, env=env).stdout.strip()

    assert run() == "2 0 1"           # compiled
    assert run() == "2 1 0"           # loaded from the disk cache
    (tmp_path / "callee.py").write_text(
        "from numba import njit\n\n@njit(inline='always')\ndef f(x):\n    return x + 100\n")
    assert run() == "101 0 1"         # compiled anew from the edited callee


def test_two_environments_over_one_checkout_keep_each_others_cached_kernel(tmp_path):
    # The README's .venv and .venv-upstream differ in their prefix and their numba
    # version; numba keeps one index per source file and drops an index another
    # version wrote, so each switch compiled the planner anew. Here the other
    # environment is this interpreter with another prefix and numba version.
    (tmp_path / "kernel.py").write_text(textwrap.dedent("""
        from dyntra_lb.planner.compiled import _cached_jit

        def g(x):
            return x + 1

        g = _cached_jit(g, (__file__,))
    """))
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    other = ("import sys, numba; sys.prefix = '/opt/other-venv'; "
             "numba.__version__ = '0.0.1'; ")
    code = ("import kernel; print(kernel.g(1), "
            "sum(kernel.g.stats.cache_hits.values()), sum(kernel.g.stats.cache_misses.values()))")

    def run(prelude=""):
        return subprocess.run([sys.executable, "-c", prelude + code], capture_output=True,
                              text=True, check=True, timeout=120, cwd=tmp_path,
                              env=env).stdout.strip()

    assert run() == "2 0 1"           # compiled in this environment
    assert run(other) == "2 0 1"      # compiled in the other one
    assert run() == "2 1 0"           # this one's kernel is still there
    assert run(other) == "2 1 0"      # and the other one's
    tags = {p.name.split(".")[-2] for p in (tmp_path / "cache").rglob("*.nbi")}
    assert len(tags) == 2
