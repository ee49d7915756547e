"""`dyntra-emu explain` (emu/offline/explain.py): the planner's decision trace for one snapshot,
checked on the worked examples of docs/planner.md."""

import argparse
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dyntra_lb.planner.front
import dyntra_lb.planner.registry
from emu.cli import explain as explain_command
from emu.cli.main import build_parser
from emu.offline import explain

LOGS = Path(__file__).resolve().parents[1] / "data" / "logs"


def _explain(snapshot, *, max_num_seqs=None, threshold=5.0, dp=None):
    events, plans = explain.trace(snapshot, dp or len(snapshot), max_num_seqs=max_num_seqs,
                                  threshold=threshold)
    return explain.render(events, threshold=threshold, max_num_seqs=max_num_seqs), plans


def test_trace_is_the_production_planner_observer():
    assert dyntra_lb.planner.registry.get("reference") is dyntra_lb.planner.front.balance_load
    snapshot = [([20, 100, 30], 1), ([40, 40], 2)]
    direct = []
    plans = dyntra_lb.planner.front.balance_load(snapshot, 2, max_num_seqs=2, threshold=5.0,
                                                 observer=direct.append)
    events, traced = explain.trace(snapshot, 2, max_num_seqs=2, threshold=5.0)
    assert events == direct
    assert traced == [p.to_dict() for p in plans]


def test_ex4_decrease_swap_of_a_newly_added_item_then_cancellation():
    text, plans = _explain([([20, 100, 30], 1), ([40, 40], 2)], max_num_seqs=2)
    assert plans[0] == {"out_blk": [], "in_blk": [30], "freeze": False}
    expected_in_order = [
        "  DP0  running [20] = 20 blocks, waiting [100, 30]",
        "  DP0 admits 100 -> 120 blocks",
        "round 0 (Main loop): loads DP0 120, DP1 80 (most loaded first); avg 100; bubble 20 "
        ">= threshold 5.0: balance",
        "    DP0  running [20, 100*] = 120 blocks, waiting [30]",
        "  least loaded DP1: no increase swap (it has no waiting request)",
        "  most loaded DP0: decrease swap: pause 100 (newly added), admit 30; distance from "
        "the average 20 -> 15; DP0 now 50 blocks",
        "round 1 (Main loop): loads DP1 80, DP0 50 (most loaded first); avg 65; bubble 15 "
        ">= threshold 5.0: balance",
        "  least loaded DP0: no increase swap (no waiting request larger than a running one "
        "brings its total closer to the average)",
        "  most loaded DP1: no decrease swap (it has no waiting request)",
        "    nothing to drop: no pause raises the throughput 0.000185736",
        "stop: round 1 changed nothing",
        "  DP0: cancelled [100] -> out=[] in=[30]",
        "  DP0  out=[] in=[30] freeze=False: admits a waiting request of 30 blocks; admits "
        "nothing else",
        "  DP1  out=[] in=[] freeze=True: pauses nothing and admits nothing",
    ]
    lines = text.split("\n")
    positions = [lines.index(line) for line in expected_in_order]
    assert positions == sorted(positions)


def test_ex6_drops_the_newly_added_item_by_tie_and_leaves_the_rank_idle():
    text, plans = _explain([([4000, 4000], 1), ([100, 100], 2)], max_num_seqs=2,
                           threshold=1.0)
    assert plans[0] == {"out_blk": [4000], "in_blk": [], "freeze": True}
    assert ("    pause 4000: throughput 2.30415e-05 -> 3.09917e-05 (tie rule: equal "
            "throughput, the newly added item wins); DP0 now 4000 blocks") in text
    assert "    DP0  running [4000] = 4000 blocks, waiting [4000*]" in text
    assert "    pause 4000: throughput 3.09917e-05 -> 8.38926e-05; DP0 now 0 blocks" in text
    assert "  least loaded DP0: no increase swap (it has no running request)" in text
    assert "stop: round 2 changed nothing" in text
    assert "  DP0: cancelled [4000] -> out=[4000] in=[]" in text
    assert ("  DP0  out=[4000] in=[] freeze=True: pauses a running request of 4000 blocks; "
            "admits nothing else") in text
    assert text.count("no swap this round -> throughput drop on the most loaded DP") == 3


def test_ex1_increase_swap_then_bubble_below_threshold():
    text, plans = _explain([([3], 1), ([1, 2], 1)], threshold=1.0)
    assert plans[1] == {"out_blk": [1], "in_blk": [2], "freeze": False}
    assert ("  least loaded DP1: increase swap: pause 1, admit 2; distance from the average "
            "1 -> 0.5; DP1 now 2 blocks") in text
    assert text.split("\n")[-4] == "stop: bubble 0.5 < threshold 1.0"
    assert "decrease" not in text  # stopped before the decrease search
    assert "fill (Fill step)" not in text  # max_num_seqs None: no fill step


def test_ex2_ratio_threshold_stops_at_once():
    text, _ = _explain([([3], 1), ([1, 2], 1)], threshold=0.5)
    assert "(ratio: bubble = (max - avg) / max)" in text
    assert "bubble 0.333333 below the threshold: stop" in text
    assert "swap" not in text


def test_ex3_drop_and_counter_case():
    text, plans = _explain([([4000, 1000], 2), ([1000], 1)], threshold=1.0)
    assert plans[0]["out_blk"] == [4000]
    assert "    pause 4000: throughput 2.58621e-05 -> 5.10204e-05; DP0 now 1000 blocks" in text
    text, plans = _explain([([60, 40], 2), ([60], 1)], threshold=5.0)
    assert all(p == {"out_blk": [], "in_blk": [], "freeze": True} for p in plans)
    assert "    nothing to drop: no pause raises the throughput 0.000136861" in text


def test_ex5_two_swaps_in_one_round():
    text, plans = _explain([([300, 200, 50], 2), ([100, 250, 20], 1), ([150, 50], 2)],
                           threshold=0.1)
    assert "  least loaded DP1: increase swap: pause 100, admit 250;" in text
    assert "  most loaded DP0: decrease swap: pause 300, admit 50;" in text
    assert "stop: bubble 0.0666667 < threshold 0.1" in text
    assert plans[2] == {"out_blk": [], "in_blk": [], "freeze": True}


def test_ex7_zero_gain_swap_by_tie_rule():
    text, plans = _explain([([10], 1), ([2, 18], 0)], max_num_seqs=1, threshold=1.0)
    assert ("  least loaded DP1: increase swap: pause 2 (newly added), admit 18; distance "
            "from the average 4 -> 4; DP1 now 18 blocks\n      taken by the tie rule (Swap "
            "search): at equal distance a newly added running item wins, even with zero gain "
            "(quirk Q4, docs/protocol.md)"
            ) in text
    assert plans[1] == {"out_blk": [], "in_blk": [18], "freeze": False}


def test_ex8_oscillation_is_folded_and_named():
    text, plans = _explain([([8], 0), ([3, 7, 3], 0)], max_num_seqs=2, threshold=1.0)
    assert plans[1] == {"out_blk": [], "in_blk": [3, 3], "freeze": False}
    assert "rounds 3 to 999: the same as round 2, line for line (not repeated)" in text
    assert "stop: max_iters reached after 1000 productive rounds" in text
    assert "  DP1: cancelled 1999 values: 3 x999, 7 x1000 -> out=[] in=[3, 3]" in text
    assert len(text.split("\n")) < 60


def test_unknown_event_kinds_are_still_shown():
    events = [{"kind": "parsed", "cards": [{"rank": 0, "running": [1], "waiting": [],
                                            "tot_blk": 1}]},
              {"kind": "something_new", "x": 1}]
    text = explain.render(events, threshold=5.0, max_num_seqs=None)
    assert 'something_new: {"kind": "something_new", "x": 1}' in text


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 4), st.data(), st.sampled_from([None, 1, 2, 4]),
       st.sampled_from([0.2, 1.0, 5.0]))
def test_trace_renders_every_snapshot_and_ends_with_the_plan(dp, data, max_num_seqs,
                                                            threshold):
    snapshot = []
    for _ in range(dp):
        blks = data.draw(st.lists(st.integers(1, 300), max_size=6))
        snapshot.append((blks, data.draw(st.integers(0, len(blks)))))
    text, plans = _explain(snapshot, max_num_seqs=max_num_seqs, threshold=threshold)
    lines = text.split("\n")
    final = lines.index("final plan (freeze = nothing to admit, Freeze):")
    assert lines[final + 1:] == [explain.plan_text(r, p) for r, p in enumerate(plans)]
    # the per-rank lists shown under each round agree with the planner's totals
    for i, line in enumerate(lines):
        if line.startswith("round ") and line.endswith(": balance"):
            assert all(x.startswith("    DP") for x in lines[i + 1:i + 1 + dp])


# --- command line ------------------------------------------------------------------------


def dyntra_emu_explain(argv: list[str]) -> int:
    """`dyntra-emu explain ARGV`: parsed by the CLI's parser, run by the command."""
    args = build_parser().parse_args(["explain", *argv])
    return args.func(args)


def test_cli_snapshot(capsys):
    assert dyntra_emu_explain(["--snapshot", "[[[20,100,30],1],[[40,40],2]]",
                               "--max-num-seqs", "2", "--threshold", "5"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("snapshot from --snapshot\nplanner trace: dp=2, max_num_seqs=2")
    assert "DP0  out=[] in=[30] freeze=False" in out


def test_cli_dp_adds_empty_ranks(capsys):
    assert dyntra_emu_explain(["--snapshot", "[[[5,3,9],2],[[4],1]]", "--dp", "3", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["dp"] == 3 and len(data["plans"]) == 3
    assert data["events"][0]["cards"][2] == {"rank": 2, "running": [], "waiting": [],
                                             "tot_blk": 0}
    assert data["events"][-1] == {"kind": "plans", "plans": data["plans"]}


def test_cli_log_index(capsys):
    assert dyntra_emu_explain([str(LOGS / "vllm_prefix.log"), "--index", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("snapshot 1 of ")
    assert "(line 27, wave 0, step 42)" in out
    assert "bubble_threshold=5.0 (log line 9)\nmax_num_seqs=2 (log line 2)" in out
    assert out.rstrip().endswith("logged plan: the same")


def test_cli_log_without_max_num_seqs_flags_the_assumption(capsys):
    assert dyntra_emu_explain([str(LOGS / "indented.log"), "--index", "0"]) == 0
    out = capsys.readouterr().out
    assert "ASSUMPTION: max_num_seqs is not in the log" in out
    assert "logged plan: DIFFERENT" in out
    assert dyntra_emu_explain([str(LOGS / "indented.log"), "--index", "0",
                               "--max-num-seqs", "2"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("logged plan: the same")


@pytest.mark.parametrize("argv, message", [
    ([], "give either LOG with --index, or --snapshot"),
    (["x.log"], "LOG needs --index N"),
    (["--snapshot", "[[[1],1]]", "--index", "0"], "--index only goes with LOG"),
    (["--snapshot", "[[[1],1]]", "--dp", "1", "x.log"], "give either LOG"),
    (["--snapshot", "not json"], "--snapshot is not valid JSON"),
    (["--snapshot", "[]"], "--snapshot must be a non-empty JSON list"),
    (["--snapshot", "[[[1, -2], 1]]"], "--snapshot rank 0: expected [blks, split]"),
    (["--snapshot", "[[[1], true]]"], "--snapshot rank 0: expected [blks, split]"),
    (["--snapshot", "[[[1],1],[[2],1]]", "--dp", "1"], "--dp 1 is smaller than the 2 ranks"),
    ([str(LOGS / "garbage.log"), "--index", "1"], "cannot be used: requests table unusable"),
    ([str(LOGS / "garbage.log"), "--index", "6"], "has 6 snapshot(s) (0..5)"),
    ([str(LOGS / "vllm_prefix.log"), "--index", "0", "--dp", "2"], "--dp only goes with"),
    (["/nonexistent/x.log", "--index", "0"], "cannot read /nonexistent/x.log"),
    (["--snapshot", "[[[99999999999],1]]"], "the planner rejects this snapshot"),
])
def test_cli_input_errors(argv, message, capsys):
    assert dyntra_emu_explain(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_add_parser_registers_the_subcommand():
    parser = argparse.ArgumentParser(prog="dyntra-emu")
    explain_command.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["explain", "--snapshot", "[[[1],1]]", "--dp", "2"])
    assert args.func is explain_command.cmd_explain
    assert (args.log, args.index, args.dp, args.threshold, args.max_num_seqs) == (
        None, None, 2, None, None)


# --- --planner ---------------------------------------------------------------------------

STARVED = "[[[10,800],1],[[20,20],2]]"


def test_cli_planner_fill_protect_admits_what_the_reference_takes_back(capsys):
    assert dyntra_emu_explain(["--snapshot", STARVED, "--max-num-seqs", "2"]) == 0
    reference = capsys.readouterr().out
    assert "DP0  out=[] in=[] freeze=True" in reference
    assert "planner=" not in reference
    assert dyntra_emu_explain(["--snapshot", STARVED, "--max-num-seqs", "2",
                               "--planner", "fill-protect"]) == 0
    out = capsys.readouterr().out
    assert "planner=fill-protect (--planner)" in out
    assert "DP0  out=[] in=[800] freeze=False" in out


def test_cli_planner_json_names_it(capsys):
    assert dyntra_emu_explain(["--snapshot", STARVED, "--max-num-seqs", "2", "--json",
                               "--planner", "fill-protect"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["planner"] == "fill-protect"
    assert data["plans"][0] == {"out_blk": [], "in_blk": [800], "freeze": False}


@pytest.mark.parametrize("name", ["kit", "vllm-ascend"])
def test_cli_planner_refuses_other_names(capsys, name):
    with pytest.raises(SystemExit) as exit_info:
        dyntra_emu_explain(["--snapshot", STARVED, "--planner", name])
    assert exit_info.value.code == 2
    assert "argument --planner: invalid choice" in capsys.readouterr().err
