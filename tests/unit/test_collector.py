"""The collector's pace of a command's processes (emu/collector.py): the young generation
collected every ``YOUNG_OBJECTS`` allocations from the command's first import on, the
older generations at CPython's ratios."""

from __future__ import annotations

import gc
import subprocess
import sys

from emu import collector


def test_tune_sets_the_young_generation_and_keeps_the_older_ones():
    saved = gc.get_threshold()
    try:
        gc.set_threshold(700, 7, 9)
        collector.tune()
        assert gc.get_threshold() == (collector.YOUNG_OBJECTS, 7, 9)
    finally:
        gc.set_threshold(*saved)


def test_the_command_tunes_its_process_before_a_command_module_runs():
    # A fresh interpreter at CPython's defaults: importing the CLI's package is what the
    # `dyntra-emu` entry point does first.
    code = ("import gc; before = gc.get_threshold(); import emu.cli.main; "
            "print(before[0], *gc.get_threshold())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out[0] == "700"
    assert [int(v) for v in out[1:]] == [collector.YOUNG_OBJECTS, 10, 10]
