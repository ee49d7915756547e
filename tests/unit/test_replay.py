"""`dyntra-emu replay` (emu/offline/replay.py): reading diagnostics logs in vLLM's prefix styles,
rebuilding snapshots, re-planning, and reporting mismatches, cut-off tables and garbage.

The fixtures under tests/data/logs/ were written from the worked examples of
docs/planner.md with the table formats of docs/diagnostics.md; their modifications tables
hold the plans of the literal transcription (tests/literal_planner.py), so a fixture that
stops reproducing means the planner or the reader changed.
"""

import argparse
import json
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dyntra_lb import diagnostics
from dyntra_lb.planner.front import balance_load
from emu.cli import replay as replay_command
from emu.cli.main import build_parser
from emu.offline import replay
from emu.offline.logscan import clean_line, read_log, scan_lines

LOGS = Path(__file__).resolve().parents[1] / "data" / "logs"


def _statuses(report):
    return [r.status for r in report.results]


# --- line cleaning ---------------------------------------------------------------------


@pytest.mark.parametrize("raw, stream, message", [
    ("plain text", "", "plain text"),
    ("INFO 11-29 09:31:02 [dyntra_lb_core.py:123] [dyntra_lb] modifications:", "",
     "[dyntra_lb] modifications:"),
    ("INFO 11-29 09:31:02.123 [core.py:9]  DP0 | x", "", " DP0 | x"),
    ("WARNING 11-29 09:31:02 core.py:9] old style", "", "old style"),
    ("(EngineCore_DP0 pid=12345) INFO 11-29 09:31:02 [a.py:1] hello\r", "EngineCore_DP0 pid=12345",
     "hello"),
    ("\x1b[1;36m(EngineCore_DP1 pid=7)\x1b[0;0m \x1b[32mINFO\x1b[0m \x1b[90m11-29 09:31:02\x1b[0m "
     "\x1b[90m[a.py:1]\x1b[0m msg", "EngineCore_DP1 pid=7", "msg"),
    ("(Engine (DP0)) INFO 11-29 09:31:02 [a.py:1] msg", "Engine (DP0)", "msg"),
    ("2025-11-29T09:31:02.5Z (APIServer pid=1) INFO 11-29 09:31:02 [u.py:2] m", "APIServer pid=1",
     "m"),
    ("(EngineCore_DP0 pid=3)                      DP1 | Run(0): []", "EngineCore_DP0 pid=3",
     "                     DP1 | Run(0): []"),
    ("(EngineCore_DP1) INFO =====", "EngineCore_DP1", "====="),
])
def test_clean_line(raw, stream, message):
    assert clean_line(raw) == (stream, message)


# --- the fixtures ----------------------------------------------------------------------


@pytest.mark.parametrize("name, flags, steps, waves", [
    ("plain.log", {"max_num_seqs": 4}, [5, 6, 1], [0, 0, 1]),
    ("vllm_prefix.log", {}, [41, 42, 43, 44], [0] * 4),
    ("tagged_color.log", {}, [8, 9], [0, 0]),
    ("indented.log", {"max_num_seqs": 2}, [4], [0]),
    ("interleaved.log", {"max_num_seqs": 2}, [13, 14, 15], [0] * 3),
    ("emulator.log", {"max_num_seqs": 2}, [6, 7, 1], [0, 0, 1]),
])
def test_fixture_reproduces_every_plan(name, flags, steps, waves):
    report = replay.replay(read_log(LOGS / name), **flags)
    assert report.warnings == []
    assert report.assumptions == []
    assert _statuses(report) == ["reproduced"] * len(steps)
    assert [r.snapshot.step for r in report.results] == steps
    assert [r.snapshot.wave for r in report.results] == waves


def test_fixture_snapshots_are_rebuilt_exactly():
    scan = read_log(LOGS / "vllm_prefix.log")
    assert [s.requests_by_rank for s in scan.snapshots] == [
        [([20, 100, 30], 1), ([40, 40], 2)],
        [([4000, 4000], 1), ([100, 100], 2)],
        [([5, 3, 9, 2], 2), ([4], 1)],
        [([60, 40], 2), ([60], 1)],
    ]
    assert scan.snapshots[0].logged_plans == [
        {"out_blk": [], "in_blk": [30], "freeze": False},
        {"out_blk": [], "in_blk": [], "freeze": True},
    ]
    assert scan.snapshots[1].logged_plans[0] == {"out_blk": [4000], "in_blk": [],
                                                 "freeze": True}


def test_config_and_max_num_seqs_come_from_the_log():
    report = replay.replay(read_log(LOGS / "vllm_prefix.log"))
    assert report.settings == ["bubble_threshold=5.0 (log line 9)",
                               "max_num_seqs=2 (log line 2)"]
    assert {(r.threshold, r.max_num_seqs) for r in report.results} == {(5.0, 2)}
    assert report.scan.config["mode"] == "static"


def test_tags_separate_streams():
    scan = read_log(LOGS / "tagged_color.log")
    assert scan.streams == ["APIServer pid=100", "EngineCore_DP0 pid=201",
                            "EngineCore_DP1 pid=202"]
    assert {s.stream for s in scan.snapshots} == {"EngineCore_DP0 pid=201"}


def test_bare_continuation_lines_belong_to_the_tagged_line_before_them():
    """The emulator's rank logs prefix only the first line of a table; rank 1's lines
    come in between the two tables of rank 0."""
    scan = read_log(LOGS / "emulator.log")
    assert scan.warnings == []
    assert {s.stream for s in scan.snapshots} == {"EngineCore_DP0"}
    assert scan.snapshots[0].requests_by_rank == [([20, 100, 30], 1), ([40, 40], 2)]


def test_missing_max_num_seqs_is_flagged_and_replayed_without_fill():
    report = replay.replay(read_log(LOGS / "indented.log"))
    assert len(report.assumptions) == 1
    text = report.assumptions[0]
    assert "max_num_seqs" in text and "--max-num-seqs" in text and ">= 2" in text
    # Ex.4 needs the fill step: without max_num_seqs the plan differs.
    assert _statuses(report) == ["mismatch"]
    assert report.results[0].max_num_seqs is None
    assert "ASSUMPTION" in replay.format_report(report)


def test_flags_override_the_log():
    scan = read_log(LOGS / "vllm_prefix.log")
    report = replay.replay(scan, threshold=1.0, max_num_seqs=2)
    assert report.settings == ["bubble_threshold=1.0 (--threshold)",
                               "max_num_seqs=2 (--max-num-seqs)"]
    assert {r.threshold for r in report.results} == {1.0}
    # At threshold 1 the C example (loads 8/4, bubble 2) now swaps 5 for 2 on DP0; the
    # logged plan (made at 5.0) froze both ranks.
    assert _statuses(report) == ["reproduced", "reproduced", "mismatch", "reproduced"]


def test_threshold_default_is_flagged_when_no_config_line():
    lines = (diagnostics.requests_table([([5], 1), ([1], 1)]) + "\n"
             + diagnostics.modifications_table(balance_load([([5], 1), ([1], 1)], 2))
             ).split("\n")
    report = replay.replay(scan_lines(lines), max_num_seqs=1)
    assert any("bubble_threshold" in a and "5.0" in a for a in report.assumptions)
    assert _statuses(report) == ["reproduced"]
    # no config line, no step line: the log may start mid-run, so wave and step are unknown
    assert (report.results[0].snapshot.wave, report.results[0].snapshot.step) == (None, None)


# --- damaged logs ------------------------------------------------------------------------


def test_truncated_log_is_reported_not_raised():
    report = replay.replay(read_log(LOGS / "truncated.log"), max_num_seqs=2)
    assert _statuses(report) == ["reproduced", "not_compared"]
    assert [(w.line, w.message) for w in report.warnings] == [
        (23, "unreadable requests row: 'DP0 | Run(1): [4000]'"),
        (23, "the log ends inside the requests table starting at line 22"),
    ]
    assert report.summary() == {"snapshots": 2, "compared": 1, "reproduced": 1,
                                "mismatched": 0, "not_compared": 1}


def test_garbage_lines_are_reported_line_by_line():
    report = replay.replay(read_log(LOGS / "garbage.log"), max_num_seqs=2)
    assert _statuses(report) == ["reproduced", "not_compared", "reproduced", "not_compared",
                                 "not_compared", "reproduced"]
    assert [w.line for w in report.warnings] == [24, 32, 38, 44, 55]
    messages = [w.message for w in report.warnings]
    assert messages[0].startswith("unreadable requests row")
    assert messages[1].startswith("table row outside a table")
    assert "no closing line" in messages[2]
    assert "not followed by a modifications table" in messages[3]
    assert "1 row(s)" in messages[4]
    # the table without closing lines is still used
    assert report.results[2].snapshot.requests_by_rank == [([5, 3, 9, 2], 2), ([4], 1)]


def test_invalid_utf8_and_control_bytes(tmp_path):
    good = (LOGS / "vllm_prefix.log").read_bytes()
    path = tmp_path / "bin.log"
    path.write_bytes(b"\xff\xfe\x00garbage\x1b[\n" + good + b"\xc3\x28 tail without newline")
    report = replay.replay(read_log(path))
    assert _statuses(report) == ["reproduced"] * 4
    assert report.results[0].snapshot.line == 16


def _mutate(text, rng):
    lines = text.split("\n")
    for _ in range(rng.randint(1, 6)):
        op = rng.randrange(4)
        i = rng.randrange(len(lines))
        if op == 0:
            del lines[i]
        elif op == 1:
            lines.insert(i, "".join(chr(rng.randrange(1, 0x250)) for _ in range(rng.randrange(40))))
        elif op == 2 and lines[i]:
            lines[i] = lines[i][: rng.randrange(len(lines[i]))]
        else:
            lines.insert(i, lines[rng.randrange(len(lines))])
    return "\n".join(lines)[: rng.randrange(len(text) + 1)]


@pytest.mark.parametrize("name", ["vllm_prefix.log", "interleaved.log", "garbage.log",
                                  "emulator.log", "tagged_color.log"])
def test_damaged_logs_never_raise(name):
    text = (LOGS / name).read_text()
    rng = random.Random(1234)
    for _ in range(150):
        damaged = _mutate(text, rng)
        report = replay.replay(scan_lines(damaged.split("\n")), max_num_seqs=2)
        replay.format_report(report)
        json.dumps(report.to_dict())
        for r in report.results:
            assert r.status in {"reproduced", "mismatch", "not_compared", "error"}


def test_a_snapshot_the_planner_rejects_is_an_error_not_a_crash(capsys):
    lines = (LOGS / "plain.log").read_text().replace("300, 200", "300, 99999999999")
    report = replay.replay(scan_lines(lines.split("\n")), max_num_seqs=4)
    assert _statuses(report) == ["error", "reproduced", "reproduced"]
    assert "int32" in report.results[0].detail
    assert "error: planner failed" in replay.format_report(report)


# --- a deliberately edited plan ----------------------------------------------------------


def _edited_copy(tmp_path):
    text = (LOGS / "vllm_prefix.log").read_text().split("\n")
    # the DP0 row of the third modifications table (planned at step 43)
    rows = [i for i, line in enumerate(text) if " DP0 | Out: [" in line]
    i = rows[2]
    assert text[i].endswith(" DP0 | Out: []         | In: []          | Freeze: True")
    text[i] = text[i].replace("Out: []        ", "Out: [  5]     ")
    path = tmp_path / "edited.log"
    path.write_text("\n".join(text))
    return path, i + 1


def test_edited_modifications_line_is_a_mismatch_at_its_step(tmp_path):
    path, lineno = _edited_copy(tmp_path)
    report = replay.replay(read_log(path))
    assert _statuses(report) == ["reproduced", "reproduced", "mismatch", "reproduced"]
    bad = report.results[2]
    assert (bad.snapshot.step, bad.snapshot.line) == (43, lineno - 6)
    assert bad.mismatched_ranks == [0]
    assert bad.snapshot.logged_plans[0] == {"out_blk": [5], "in_blk": [], "freeze": True}
    assert bad.recomputed[0] == {"out_blk": [], "in_blk": [], "freeze": True}


def dyntra_emu_replay(argv: list[str]) -> int:
    """`dyntra-emu replay ARGV`: parsed by the CLI's parser, run by the command."""
    args = build_parser().parse_args(["replay", *argv])
    return args.func(args)


def test_cli_reports_the_edited_line(tmp_path, capsys):
    path, _ = _edited_copy(tmp_path)
    assert dyntra_emu_replay([str(path)]) == 1
    out = capsys.readouterr().out
    assert "snapshots: 4  compared: 4  reproduced: 3 (75.0%)  mismatched: 1" in out
    assert "MISMATCH snapshot 2 at line" in out and "step 43" in out
    assert "logged     out=[5] in=[] freeze=True  <-- differs" in out
    assert "recomputed out=[] in=[] freeze=True" in out


# --- output forms and CLI ------------------------------------------------------------------


def test_json_output(capsys):
    assert dyntra_emu_replay([str(LOGS / "vllm_prefix.log"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["summary"] == {"snapshots": 4, "compared": 4, "reproduced": 4,
                               "mismatched": 0, "not_compared": 0}
    first = data["snapshots"][0]
    assert first["requests_by_rank"] == [[[20, 100, 30], 1], [[40, 40], 2]]
    assert first["step"] == 41 and first["status"] == "reproduced"
    assert first["recomputed_plans"] == first["logged_plans"]


def test_plots_are_written(tmp_path, capsys):
    out_dir = tmp_path / "plots"
    path, _ = _edited_copy(tmp_path)
    assert dyntra_emu_replay([str(path), "--plot", str(out_dir)]) == 1
    files = sorted(p.name for p in out_dir.iterdir())
    assert files == ["overview.png", "snapshot_00000.png", "snapshot_00001.png",
                     "snapshot_00002.png", "snapshot_00003.png"]
    for name in files:
        assert (out_dir / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_unreadable_file_exits_2(tmp_path, capsys):
    assert dyntra_emu_replay([str(tmp_path / "missing.log")]) == 2
    err = capsys.readouterr().err
    assert "cannot read" in err and "Traceback" not in err


@pytest.mark.parametrize("argv", [["x.log", "--max-num-seqs", "0"], ["x.log", "--threshold", "0"],
                                  ["x.log", "--threshold", "abc"]])
def test_bad_flags_are_usage_errors(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        dyntra_emu_replay(argv)
    assert exc.value.code == 2


def test_add_parser_registers_the_subcommand():
    parser = argparse.ArgumentParser(prog="dyntra-emu")
    sub = parser.add_subparsers(dest="command")
    replay_command.add_parser(sub)
    args = parser.parse_args(["replay", str(LOGS / "plain.log"), "--max-num-seqs", "4",
                              "--threshold", "0.1"])
    assert args.func is replay_command.cmd_replay
    assert (args.max_num_seqs, args.threshold, args.json, args.plot) == (4, 0.1, False, None)


# --- round trip through the diagnostics formats --------------------------------------------

_STYLES = {
    "plain": lambda line: line,
    "vllm": lambda line: f"INFO 11-29 09:31:02 [dyntra_lb_core.py:231] {line}",
    "tagged": lambda line: f"(EngineCore_DP0 pid=9) INFO 11-29 09:31:02 [c.py:1] {line}\r",
    "color": lambda line: (f"\x1b[1;36m(EngineCore_DP0 pid=9)\x1b[0;0m \x1b[32mINFO\x1b[0m "
                           f"\x1b[90m11-29 09:31:02\x1b[0m \x1b[90m[c.py:1]\x1b[0m {line}"),
}


@st.composite
def _snapshots(draw):
    dp = draw(st.integers(2, 4))
    max_num_seqs = draw(st.integers(1, 4))
    blk = st.integers(1, 5000)
    ranks = []
    for _ in range(dp):
        run = draw(st.lists(blk, max_size=max_num_seqs))
        wait = draw(st.lists(blk, max_size=2 * max_num_seqs - len(run)))
        padding = [0] * (2 * max_num_seqs - len(run) - len(wait))
        ranks.append((run + wait + padding, len(run)))
    return ranks, max_num_seqs


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_snapshots(), st.sampled_from([0.1, 0.5, 1.0, 5.0, 20.0]), st.sampled_from(list(_STYLES)))
def test_round_trip_reproduces_every_plan(snapshot, threshold, style):
    requests_by_rank, max_num_seqs = snapshot
    plans = balance_load(requests_by_rank, len(requests_by_rank), max_num_seqs=max_num_seqs,
                         threshold=threshold)
    lines = [diagnostics.step_counter_line(7)]
    lines += diagnostics.requests_table(requests_by_rank).split("\n")
    lines += diagnostics.modifications_table(plans).split("\n")
    report = replay.replay(scan_lines([_STYLES[style](x) for x in lines]), threshold=threshold,
                           max_num_seqs=max_num_seqs)
    assert report.warnings == []
    assert _statuses(report) == ["reproduced"]
    rebuilt = report.results[0].snapshot.requests_by_rank
    assert rebuilt == [([b for b in blks if b], split) for blks, split in requests_by_rank]
    assert report.results[0].snapshot.step == 8


def test_zero_inside_waiting_cannot_be_rebuilt():
    """The documented limit: the table hides a 0 in the waiting part, the planner stops
    at it (docs/protocol.md, quirk Q7). Real requests never have 0 blocks."""
    snap = [([5, 3, 0, 7], 2), ([1], 1)]
    lines = diagnostics.requests_table(snap).split("\n")
    lines += diagnostics.modifications_table(balance_load(snap, 2, threshold=1.0)).split("\n")
    scan = scan_lines(lines)
    assert scan.snapshots[0].requests_by_rank == [([5, 3, 7], 2), ([1], 1)]


def test_replay_with_another_planner_uses_it_and_says_so(capsys):
    from dyntra_lb.planner import registry as planners

    scan = read_log(LOGS / "vllm_prefix.log")
    report = replay.replay(scan, planner="fill-protect")
    assert "planner=fill-protect (--planner)" in report.settings
    for r in report.results:
        expected = planners.get("fill-protect")(
            r.snapshot.requests_by_rank, len(r.snapshot.requests_by_rank),
            max_num_seqs=r.max_num_seqs, threshold=r.threshold)
        assert r.recomputed == [p.to_dict() for p in expected]
    assert dyntra_emu_replay([str(LOGS / "vllm_prefix.log"), "--planner", "fill-protect"]) in (0, 1)
    assert "planner=fill-protect (--planner)" in capsys.readouterr().out
