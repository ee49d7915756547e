"""``--split N``: one long trace replayed as N consecutive windows that run in parallel,
each after a warm-up replay of the traffic just before it, then stitched into one answer
(docs/split.md).

- ``emu.split.windows``: where the trace is cut, which requests each window owns and
  replays (its warm-up prefix and its own), and each window's measured span;
- ``emu.split.stitch``: the windows' runs stitched into one ``Run`` and its metrics
  (the owned requests, the measured steps), and the per-window spread ``ab --split``
  reports.
"""
