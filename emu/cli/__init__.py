"""`dyntra-emu`: run the emulated DP cluster on a workload and report what DyntraLB did.

Commands:

- ``run``: one cluster run; progress on stderr, the summary table on stdout, and the
  run's files (records, metrics.json, summary.md, PNG plots) in an output directory;
- ``ab``: the same workload and seed twice, DyntraLB off and on (or two configs), with
  every metric side by side and overlay plots;
- ``validate``: check a config and a trace for a DP size, list every problem;
- ``inspect``: a workload's request block counts, DyntraLB's thresholds on them
  (emu/block_counts.py);
- ``fit-cost``: a step-cost profile fitted to step times measured on a node;
- ``replay`` / ``explain``: offline tools over diagnostics logs (emu/offline/replay.py,
  emu/offline/explain.py underneath);
- ``sweep``: a grid of DyntraLB configs on the thread transport (emu/sweep.py);
- ``tune``: an Optuna study of DyntraLB's knobs on one workload, resumable, and its
  recommendation's A/B on fresh seeds (``emu.tune``);
- ``diff``: kit against vllm-ascend (or two vllm-ascend trees, or two run directories)
  step by step (emu/cli/diff.py, emu/offline/diff.py);
- ``gate``: a run's metrics against a baseline's within per-metric tolerances, for
  nightly jobs and CI (emu/gate.py);
- ``timeline``: a run directory's timeline in the Trace Event Format (emu/timeline.py);
- ``events``: a run's records as the JSON Lines event logs of earlier versions
  (emu/records/reader.py);
- ``convert``: a run directory of those JSON Lines logs turned into records
  (emu/records/convert.py).

``emu.cli.main`` builds the parser and runs a command (the ``dyntra-emu`` console script
and ``python -m emu``; there is no other entry point). Each command is a module with
``add_parser(subparsers)`` and its ``cmd_*`` function; the flags they share are made in
``emu.cli.flags``, mostly from RunSpec's fields. A command reads its inputs, builds each
run's RunSpec once from the flags (``emu.cli.inputs``), has ``emu.spec`` judge it, and
runs the checked run with ``emu.run.run_checked`` (a batch, on an executor: each run's
spec checked once); nothing below the CLI imports it. ``emu.cli.docgen`` writes
docs/cli.md, every command's flags, from the same parsers.

Every user error (bad flag, bad file, contradictory settings) is one message naming the
flag or file:line and what was expected, exit code 2, and nothing is started; a spec's
problems are all listed at once. Modules that import torch are imported only when a
command needs them, so ``--help`` is quick.
"""

from emu import collector
from emu.bytecode import use_cache

# Before any command module is imported: they, and everything they import, are compiled
# once into the kit's bytecode cache instead of at every start (emu/bytecode.py), and
# the garbage collector runs at the pace of a command's allocations (emu/collector.py).
use_cache()
collector.tune()
