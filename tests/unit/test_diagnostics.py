"""Spec F: exact text of every diagnostics line and table."""

import enum
from types import SimpleNamespace

import pytest

from dyntra_lb import diagnostics
from dyntra_lb.config import DyntraLBConfig
from dyntra_lb.diagnostics import (
    activation_line,
    config_lines,
    deactivation_line,
    enable_line,
    modifications_table,
    pause_line,
    requests_table,
    scheduler_summary_line,
    step_counter_line,
    wave_end_line,
)


class RequestStatus(enum.IntEnum):
    """vLLM 0.27.1's ``RequestStatus`` order (finished ⇔ > PREEMPTED)."""

    WAITING = enum.auto()
    WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR = enum.auto()
    WAITING_FOR_REMOTE_KVS = enum.auto()
    WAITING_FOR_STREAMING_REQ = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    FINISHED_STOPPED = enum.auto()


def _req(request_id, num_tokens, status):
    return SimpleNamespace(request_id=request_id, num_tokens=num_tokens, status=status)


def test_module_docstring_names_the_logger():
    assert 'logging.getLogger("dyntra_lb")' in diagnostics.__doc__


def test_enable_line():
    assert enable_line() == "[dyntra_lb] Enable DyntraLB DP load balancing."


def test_config_lines_defaults():
    assert config_lines(DyntraLBConfig()) == [
        "[dyntra_lb] dyntra_lb_config.enabled = True",
        "[dyntra_lb] dyntra_lb_config.enable_diagnostics = False",
        "[dyntra_lb] dyntra_lb_config.mode = dynamic",
        "[dyntra_lb] dyntra_lb_config.start_step = 250",
        "[dyntra_lb] dyntra_lb_config.end_step = -1",
        "[dyntra_lb] dyntra_lb_config.bubble_threshold = 5.0",
        "[dyntra_lb] dyntra_lb_config.long_req_block_threshold = 700",
        "[dyntra_lb] dyntra_lb_config.dynamic_max_step = 256",
    ]


def test_config_lines_custom_int_threshold_prints_as_float():
    cfg = DyntraLBConfig.from_dict(
        {
            "enabled": True,
            "enable_diagnostics": True,
            "mode": "static",
            "start_step": 0,
            "end_step": 100,
            "bubble_threshold": 2,
            "long_req_block_threshold": 64,
            "dynamic_max_step": 8,
        }
    )
    assert config_lines(cfg)[1:] == [
        "[dyntra_lb] dyntra_lb_config.enable_diagnostics = True",
        "[dyntra_lb] dyntra_lb_config.mode = static",
        "[dyntra_lb] dyntra_lb_config.start_step = 0",
        "[dyntra_lb] dyntra_lb_config.end_step = 100",
        "[dyntra_lb] dyntra_lb_config.bubble_threshold = 2.0",
        "[dyntra_lb] dyntra_lb_config.long_req_block_threshold = 64",
        "[dyntra_lb] dyntra_lb_config.dynamic_max_step = 8",
    ]


def test_step_counter_line():
    assert step_counter_line(0) == "_has_global_unfinished_reqs | step_counter: 0"
    assert step_counter_line(31) == "_has_global_unfinished_reqs | step_counter: 31"


def test_wave_end_line():
    assert wave_end_line(3) == (
        "[dyntra_lb] run_busy_loop() | No engines running, step_counter set to 0, "
        "current_wave incremented to 3."
    )


def test_activation_line():
    assert activation_line(812, 700, 2, 57) == (
        "[dyntra_lb] Dynamic LB enabled by long request: blk_num=812, threshold=700, "
        "current_wave=2, step_counter=57"
    )


def test_deactivation_line():
    assert deactivation_line(256, 1, 400) == (
        "[dyntra_lb] Dynamic LB disabled after 256 steps without long request: "
        "current_wave=1, step_counter=400"
    )


def test_pause_line():
    assert pause_line("cmpl-7") == "DYNTRA_LB_PAUSE request_id=cmpl-7"


def test_requests_table_single_rank():
    # running [8, 4] is 18 characters, left-justified to 55; waiting drops the zero.
    assert requests_table([([8, 4, 9, 0], 2)]) == "\n".join(
        [
            "=" * 85,
            "[dyntra_lb] requests_by_rank (DP Workload Status):",
            " DP0 | Run(2): [  8,   4]" + " " * 37 + " | Wait(1): [  9]",
            "=" * 85,
        ]
    )


def test_requests_table_many_ranks():
    text = requests_table(
        [
            ([0, 0, 0, 0], 0),
            ([1234, 5, 0, 7], 1),  # positive values after the split, zero hidden
            ([3, 3, 3, 3], 4),
        ]
    )
    assert text.split("\n") == [
        "=" * 85,
        "[dyntra_lb] requests_by_rank (DP Workload Status):",
        " DP0 | Run(0): []" + " " * 45 + " | Wait(0): []",
        " DP1 | Run(1): [1234]" + " " * 41 + " | Wait(2): [  5,   7]",
        " DP2 | Run(4): [  3,   3,   3,   3]" + " " * 27 + " | Wait(0): []",
        "=" * 85,
    ]


def test_requests_table_long_running_list_not_cut():
    blks = list(range(1, 13))
    line = requests_table([(blks, 12)]).split("\n")[2]
    running = "Run(12): [" + ", ".join(f"{b:3d}" for b in blks) + "]"
    assert len(running) > 55
    assert line == f" DP0 | {running} | Wait(0): []"


def test_modifications_table_dicts_and_objects():
    plans = [
        {"out_blk": [12], "in_blk": [], "freeze": True},
        SimpleNamespace(out_blk=[], in_blk=[7, 3], freeze=False),
        SimpleNamespace(out_blk=[1, 2, 3], in_blk=[1000], freeze=False),
    ]
    assert modifications_table(plans) == "\n".join(
        [
            "=" * 60,
            "[dyntra_lb] modifications:",
            " DP0 | Out: [ 12]      | In: []          | Freeze: True",
            " DP1 | Out: []         | In: [  7,   3]  | Freeze: False",
            " DP2 | Out: [  1,   2,   3] | In: [1000]      | Freeze: False",
            "=" * 60,
        ]
    )


def test_modifications_table_empty():
    assert modifications_table([]) == "=" * 60 + "\n[dyntra_lb] modifications:\n" + "=" * 60


def test_summary_worked_example():
    """The worked case of docs/diagnostics.md, "Scheduler summary", statuses as vLLM
    IntEnum members."""
    line = scheduler_summary_line(
        running=[_req("r", 17, RequestStatus.RUNNING)],
        waiting=[_req("w", 9, RequestStatus.WAITING)],
        skipped_waiting=[_req("s", 5, RequestStatus.WAITING_FOR_REMOTE_KVS)],
        paused_ids=set(),
        scheduler_block_size=8,
        cache_block_size=8,
    )
    assert line == (
        "schedule() | scheduler req num: [1, 2, 1, 1, 0, 0] | blk num [3, 3, 2] "
        "| block size [scheduler=8, dyntra_lb=8]"
    )


def test_summary_paused_preempted_grammar_and_string_statuses():
    waiting = [
        _req("paused", 33, "PREEMPTED"),  # LB-paused: schedulable, not counted in F
        _req("pre", 10, RequestStatus.PREEMPTED),  # upstream-preempted: F
        _req("new", 1, RequestStatus.WAITING),
    ]
    skipped = [
        _req("g", 20, RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR),
        _req("kv", 16, "WAITING_FOR_REMOTE_KVS"),
        _req("stream", 4, RequestStatus.WAITING_FOR_STREAMING_REQ),
    ]
    running = [_req("a", 16, RequestStatus.RUNNING), _req("b", 17, RequestStatus.RUNNING)]
    line = scheduler_summary_line(running, waiting, skipped, {"paused", "gone"}, 16, 16)
    # G = 1 + 2; H = 3 + 1 + 1 + 2 + 1 + 1 = 9; I = paused 3 + new 1 = 4
    assert line == (
        "schedule() | scheduler req num: [2, 6, 2, 1, 1, 1] | blk num [3, 9, 4] "
        "| block size [scheduler=16, dyntra_lb=16]"
    )


def test_summary_without_paused_set_and_different_block_sizes():
    line = scheduler_summary_line(
        running=[],
        waiting=[_req("x", 100, RequestStatus.PREEMPTED)],
        skipped_waiting=(),
        paused_ids=None,
        scheduler_block_size=64,
        cache_block_size=128,
    )
    assert line == (
        "schedule() | scheduler req num: [0, 1, 0, 0, 0, 1] | blk num [0, 1, 0] "
        "| block size [scheduler=64, dyntra_lb=128]"
    )


def test_summary_invalid_block_size():
    with pytest.raises(RuntimeError, match="^Invalid DyntraLB block size: 0$"):
        scheduler_summary_line([_req("r", 1, "RUNNING")], [], [], None, 16, 0)
