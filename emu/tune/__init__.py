"""``dyntra-emu tune``: search DyntraLB's knobs for one workload with Optuna.

    dyntra-emu tune --workload recipe:pr12292,n=200,rate=400 --dp 8 --block-size 2048 \\
        --trials 20 --seeds 3 --jobs 2 --out runs/pr-tune

The DyntraLB feature guide's loop, done for the user: A/B against DyntraLB off, then adjust
``mode``, ``start_step``, ``bubble_threshold``, ``long_req_block_threshold`` and
``dynamic_max_step`` to the workload. Each trial of the study is one config (the base
``--additional-config`` with the trial's knobs set and DyntraLB on), run on ``--seeds``
workload seeds; its objectives are the means over those seeds of

- ``throughput``: the output throughput's gain over DyntraLB off on the same seed, in %
  (maximised);
- ``tpot_p99``: TPOT p99 in ms (minimised);
- ``longest_pause``: the longest pause of any request in ms, 0 without pauses (minimised).

One objective is searched with TPE, several with NSGA-II (a Pareto front). A trial whose
first seeds already keep it off the front is pruned before its last seeds run
(``out_of_reach``: against some finished trial, the 95 % confidence interval of the
difference on the same seeds is on the worse side in every objective). The study lives
in an Optuna storage (SQLite by default), with the settings that made it
(``Fingerprint``) in its user attributes, so the same command resumes it and another
workload is refused.
This package is the study below the command, one module per job: ``objectives`` (what a
trial is measured by, the estimate over seeds, dominance), ``space`` (the knobs and their
ranges), ``study`` (the fingerprint and the Optuna storage), ``search`` (the loop: each
round's runs go through the ``run_batch`` it is handed, the command's executor) and
``front`` (the front, the recommendation, their table and plot). The command
(``emu.cli.tune``) reads the flags, builds and checks the runs' specs, and runs the
fresh-seed A/B of the recommendation. The names below are the package's: import them
from ``emu.tune``.
"""

from emu.tune.front import front_table, pareto_front, plot_front, recommend, trial_rows
from emu.tune.objectives import (
    OBJECTIVES,
    Objective,
    dominates,
    estimate,
    objective_value,
    out_of_reach,
    parse_names,
)
from emu.tune.search import Candidate, RunBatch, Search, seed_estimates
from emu.tune.space import (
    BUBBLE_BLOCKS,
    BUBBLE_RATIO,
    DYNAMIC_MAX_STEP,
    KNOBS,
    OPT_IN_KNOBS,
    PAUSE_LIMITS_MS,
    START_STEP,
    Space,
    config_label,
    spec_fields,
)
from emu.tune.study import (
    BASELINES_ATTR,
    FINGERPRINT_ATTR,
    POPULATION,
    STARTUP_TRIALS,
    STUDY_NAME,
    Fingerprint,
    StudyMismatch,
    delete_study,
    find_study,
    open_study,
)

__all__ = [
    "BASELINES_ATTR", "BUBBLE_BLOCKS", "BUBBLE_RATIO", "DYNAMIC_MAX_STEP", "FINGERPRINT_ATTR",
    "KNOBS", "OBJECTIVES", "OPT_IN_KNOBS", "PAUSE_LIMITS_MS", "POPULATION", "STARTUP_TRIALS",
    "START_STEP", "STUDY_NAME", "Candidate", "Fingerprint", "Objective", "RunBatch", "Search",
    "Space", "StudyMismatch", "config_label", "delete_study", "dominates", "estimate",
    "find_study", "front_table", "objective_value", "open_study", "out_of_reach",
    "pareto_front", "parse_names", "plot_front", "recommend", "seed_estimates", "spec_fields",
    "trial_rows",
]
