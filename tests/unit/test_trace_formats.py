"""The field's trace formats (emu/traces): each sample in tests/data/traces, written in
its dataset's real layout, read and replayed; detection by content; --window, --limit
and --time-scale. Bad input of each format is in tests/cli/test_cli_trace_formats.py."""

from pathlib import Path

import pytest

from emu.traces import FORMATS, Replay, read_trace
from emu.workload import TraceError, TraceRequest

DATA = Path(__file__).resolve().parents[1] / "data" / "traces"


def test_mooncake_timestamps_are_milliseconds_since_the_first_request():
    trace = read_trace(DATA / "mooncake.jsonl")
    assert trace.format == "mooncake"
    assert len(trace.requests) == 10 and trace.lines == list(range(1, 11))
    assert trace.requests[0] == TraceRequest("mooncake-1", 0.0, 412, 18)
    assert [r.arrival_s for r in trace.requests] == [
        0.0, 0.0, 0.0, 0.04, 0.04, 0.08, 0.12, 0.12, 0.16, 0.2]
    assert trace.notes == []


def test_azure_times_count_from_the_first_row():
    trace = read_trace(DATA / "azure.csv")
    assert trace.format == "azure"
    assert trace.lines == list(range(2, 12))  # the header is line 1
    first, second, last = trace.requests[0], trace.requests[1], trace.requests[-1]
    assert (first.request_id, first.arrival_s, first.prompt_tokens, first.output_tokens) == (
        "azure-2", 0.0, 374, 14)
    # 18:15:46.7151690 - 18:15:46.6805900, the seventh digit beyond a microsecond dropped
    assert second.arrival_s == pytest.approx(0.034579)
    assert last.arrival_s == pytest.approx(0.364985)


def test_burstgpt_skips_failed_rows_and_starts_at_the_first_request():
    trace = read_trace(DATA / "burstgpt.csv")
    assert trace.format == "burstgpt"
    assert len(trace.requests) == 10
    assert 4 not in trace.lines  # line 4: Response tokens 0
    assert trace.notes == [f"{DATA / 'burstgpt.csv'}: skipped 1 row(s): failed request "
                           "(Response tokens 0)"]
    # Timestamp 5 s after midnight of the first day replays at 0
    assert [r.arrival_s for r in trace.requests[:3]] == [0.0, 0.0, 1.0]
    assert trace.requests[-1] == TraceRequest("burstgpt-12", 5.0, 520, 7)


def test_rows_out_of_time_order_are_replayed_in_time_order(tmp_path):
    path = tmp_path / "azure.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    "2024-05-10 00:00:02.000000+00:00,10,1\n"
                    "2024-05-10 00:00:01.000000+00:00,20,2\n"
                    "2024-05-10 00:00:03.000000+00:00,30,3\n")
    trace = read_trace(path)
    assert [r.prompt_tokens for r in trace.requests] == [20, 10, 30]
    assert [r.arrival_s for r in trace.requests] == [0.0, 1.0, 2.0]
    assert trace.lines == [3, 2, 4]
    assert trace.notes == [f"{path}: rows out of time order were replayed in time order"]


@pytest.mark.parametrize("name,fmt", [("mooncake.jsonl", "mooncake"), ("azure.csv", "azure"),
                                      ("burstgpt.csv", "burstgpt"),
                                      ("vllm_custom.jsonl", "vllm-custom")])
def test_detection_by_content_whatever_the_file_name(tmp_path, name, fmt):
    path = tmp_path / "trace.txt"
    path.write_bytes((DATA / name).read_bytes())
    from emu.traces import detect_format

    assert detect_format(path, path.read_bytes()).name == fmt


def test_every_format_is_in_the_registry():
    assert list(FORMATS) == ["dyntra", "mooncake", "azure", "burstgpt", "vllm-custom"]


def test_a_forced_format_reads_the_file_as_that_format():
    with pytest.raises(TraceError) as caught:
        read_trace(DATA / "mooncake.jsonl", format="dyntra")
    assert "field 'request_id': missing (required)" in str(caught.value)


def test_window_limit_and_time_scale():
    trace = read_trace(DATA / "mooncake.jsonl",
                       replay=Replay(time_scale=0.5, window=(0.04, 0.2), limit=4))
    # 40..200 ms: lines 4..9; the first 4; from 40 ms on, twice as fast
    assert trace.lines == [4, 5, 6, 7]
    assert [r.arrival_s for r in trace.requests] == pytest.approx([0.0, 0.0, 0.02, 0.04])


def test_our_format_keeps_its_clock_unless_a_window_moves_it(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"request_id": "a", "arrival_s": 2.5, "prompt_tokens": 1, '
                    '"output_tokens": 1}\n{"request_id": "b", "arrival_s": 4.0, '
                    '"prompt_tokens": 1, "output_tokens": 1}\n')
    assert [r.arrival_s for r in read_trace(path).requests] == [2.5, 4.0]
    moved = read_trace(path, replay=Replay(window=(3.0, float("inf")), time_scale=2.0))
    assert [(r.request_id, r.arrival_s) for r in moved.requests] == [("b", 2.0)]


def test_replay_label_names_what_was_cut():
    assert Replay().label("t.csv") == "t.csv"
    assert (Replay(time_scale=0.5, window=(60, float("inf")), limit=10).label("t.csv")
            == "t.csv (window 60:, limit 10, time-scale 0.5)")
