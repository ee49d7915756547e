"""The field's trace formats through the real `dyntra-emu`: each sample of
tests/data/traces (made in its dataset's real layout) runs end to end on 2 rank threads,
and every kind of bad input in each format is one error naming the file, the line and
the field, exit 2, and no run started (docs/workloads.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.records import events

DATA = Path(__file__).resolve().parents[1] / "data" / "traces"
THREADS = ["--transport", "thread", "--quiet"]


def request_records(out: Path) -> list[dict]:
    return [record for rank in (0, 1) for record in events(out, rank)
            if record["kind"] == "request"]


@pytest.mark.parametrize("sample,ids", [
    ("mooncake.jsonl", [f"mooncake-{line}" for line in range(1, 11)]),
    ("azure.csv", [f"azure-{line}" for line in range(2, 12)]),
])
def test_a_sample_runs_end_to_end(cli, tmp_path, clikit, sample, ids):
    out = tmp_path / "out"
    proc = cli("run", "--workload", DATA / sample, *clikit.SMALL, *THREADS, "--out", out)
    assert proc.returncode == 0, proc.stderr
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["requests_finished"] == len(ids)
    assert sorted(r["request_id"] for r in request_records(out)) == sorted(ids)


def test_burstgpt_replays_a_window_faster_without_its_failed_rows(cli, tmp_path, clikit):
    out = tmp_path / "out"
    proc = cli("run", "--workload", DATA / "burstgpt.csv", "--window", "6:9", "--limit", "3",
               "--time-scale", "0.5", *clikit.SMALL, *THREADS, "--out", out)
    assert proc.returncode == 0, proc.stderr
    # Seconds 6..9 of the trace hold lines 4..9; line 4 failed (Response tokens 0); the
    # first three left, at 6, 7 and 7 s, replay from 6 s at twice the speed.
    records = sorted(request_records(out), key=lambda r: r["request_id"])
    assert [(r["request_id"], r["arrival_s"]) for r in records] == [
        ("burstgpt-5", 0.0), ("burstgpt-6", 0.5), ("burstgpt-7", 0.5)]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["config"]["workload"] == (f"{DATA / 'burstgpt.csv'} "
                                             "(window 6:9, limit 3, time-scale 0.5)")


MOONCAKE = '{"timestamp": 0, "input_length": 100, "output_length": 10, "hash_ids": [0]}'
AZURE_HEAD = "TIMESTAMP,ContextTokens,GeneratedTokens"
BURSTGPT_HEAD = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"

# case -> (file name, lines, extra flags, fragments expected in stderr; {t} = the file)
CASES = {
    "mooncake-missing-field": (
        "m.jsonl", [MOONCAKE, '{"timestamp": 5, "input_length": 100, "hash_ids": []}'], [],
        ["{t}:2: field 'output_length': missing (required)"]),
    "mooncake-negative-length": (
        "m.jsonl", [MOONCAKE.replace('"input_length": 100', '"input_length": -100')], [],
        ["{t}:1: field 'input_length': expected an integer >= 1, got -100"]),
    "mooncake-timestamp-goes-back": (
        "m.jsonl", [MOONCAKE.replace(": 0,", ": 3000,", 1), MOONCAKE], [],
        ["{t}:2: field 'timestamp': arrivals must be non-decreasing, got 0 after 3000 on "
         "line 1"]),
    "mooncake-hash-ids-not-a-list": (
        "m.jsonl", [MOONCAKE.replace("[0]", '"0"')], [],
        ["{t}:1: field 'hash_ids': expected a list of integers"]),
    "azure-missing-column": (
        "a.csv", ["TIMESTAMP,ContextTokens", "2023-11-16 18:15:46.6805900,374"],
        ["--workload-format", "azure"],
        ["{t}:1: missing column(s) 'GeneratedTokens'; the header has: TIMESTAMP, "
         "ContextTokens"]),
    "azure-negative-length": (
        "a.csv", [AZURE_HEAD, "2023-11-16 18:15:46.6805900,374,44",
                  "2023-11-16 18:15:47.0000000,-3,44"], [],
        ["{t}:3: column 'ContextTokens': expected an integer >= 1, got '-3'"]),
    "azure-bad-timestamp": (
        "a.csv", [AZURE_HEAD, "yesterday,374,44"], [],
        ["{t}:2: column 'TIMESTAMP': expected a date and time such as"]),
    "azure-short-row": (
        "a.csv", [AZURE_HEAD, "2023-11-16 18:15:46.6805900,374"], [],
        ["{t}:2: expected 3 fields as in the header, got 2"]),
    "azure-header-only": (
        "a.csv", [AZURE_HEAD], [], ["{t}: trace is empty (expected at least one request"]),
    "burstgpt-missing-column": (
        "b.csv", ["Timestamp,Model,Request tokens,Total tokens", "5,ChatGPT,472,490"],
        ["--workload-format", "burstgpt"],
        ["{t}:1: missing column(s) 'Response tokens'; the header has: Timestamp, Model, "
         "Request tokens, Total tokens"]),
    "burstgpt-negative-length": (
        "b.csv", [BURSTGPT_HEAD, "5,ChatGPT,-472,18,-454,Conversation log"], [],
        ["{t}:2: column 'Request tokens': expected an integer >= 1, got '-472'"]),
    "burstgpt-negative-timestamp": (
        "b.csv", [BURSTGPT_HEAD, "-5,ChatGPT,472,18,490,Conversation log"], [],
        ["{t}:2: column 'Timestamp': expected a finite number of seconds >= 0, got '-5'"]),
    "burstgpt-only-failed-rows": (
        "b.csv", [BURSTGPT_HEAD, "5,ChatGPT,472,0,472,Conversation log"], [],
        ["{t}: no request to replay: every row was skipped (failed request"]),
    "burstgpt-beyond-the-clock": (
        "b.csv", [BURSTGPT_HEAD, "5,ChatGPT,472,18,490,Conversation log",
                  "10454400,ChatGPT,472,18,490,Conversation log"], [],
        ["{t}:3: the request replays at 1.04544e+07 s", "--window START:END"]),
    "vllm-custom-negative-output": (
        "v.jsonl", ['{"prompt": "hello", "output_tokens": -2}'], [],
        ["{t}:1: field 'output_tokens': expected an integer >= 1, got -2"]),
    "vllm-custom-without-tokenizer": (
        "v.jsonl", ['{"prompt": "hello", "output_tokens": 2}'], [],
        ["{t}: a vllm-custom trace holds prompt text, not its token count"]),
    "empty-file": ("e.csv", [], [], ["{t}: trace is empty (expected at least one request"]),
    "unknown-format": (
        "u.csv", ["time,tokens_in,tokens_out", "0,100,10"], [],
        ["{t}:1: cannot tell the trace format from this line (read as a CSV header: time, "
         "tokens_in, tokens_out); name it with --workload-format, one of: dyntra, mooncake, "
         "azure, burstgpt, vllm-custom"]),
    "two-formats-at-once": (
        "x.jsonl", ['{"request_id": "a", "input_length": 5}'], [],
        ["fits several formats: dyntra, mooncake; name one with --workload-format"]),
    "window-with-no-request": (
        "m.jsonl", [MOONCAKE], ["--window", "10:20"],
        ["{t}: no request arrives in the window 10:20 s"]),
    "tokenizer-for-another-format": (
        "m.jsonl", [MOONCAKE], ["--tokenizer", "gpt2"],
        ["--tokenizer gpt2: only a vllm-custom trace needs it; {t} was read as mooncake"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_trace_is_refused_before_anything_runs(cli, tmp_path, clikit, case):
    name, lines, flags, fragments = CASES[case]
    trace = tmp_path / name
    trace.write_text("".join(line + "\n" for line in lines))
    out = tmp_path / "out"
    proc = cli("run", "--workload", trace, *flags, *clikit.SMALL, *THREADS, "--out", out)
    clikit.assert_user_error(proc, *(f.format(t=trace) for f in fragments))
    assert proc.stderr.count("error:") == 1, proc.stderr
    assert not out.exists()


@pytest.mark.parametrize("flag,value,fragment", [
    ("--window", "20:10", "expected 0 <= START < END, got '20:10'"),
    ("--window", "ten", "expected START:END in seconds"),
    ("--time-scale", "0", "expected a factor > 0"),
    ("--limit", "0", "expected an integer >= 1"),
    ("--workload-format", "sharegpt", "invalid choice: 'sharegpt'"),
])
def test_bad_replay_flags(cli, tmp_path, clikit, flag, value, fragment):
    proc = cli("run", flag, value, *clikit.SMALL, "--out", tmp_path / "out")
    clikit.assert_user_error(proc, fragment)
    assert not (tmp_path / "out").exists()
