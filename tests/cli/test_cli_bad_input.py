"""Bad input to the real `dyntra-emu` (subprocess), beyond test_cli_errors.py: every kind
of broken trace file, the config keys, types and values not covered there, malformed
JSON, contradictory or huge flag values, and bad --fault values. Each must give one clear
message and a non-zero exit before any rank starts: no rank file appears in --out (the
directory is not even created)."""

from __future__ import annotations

import json

import pytest

BASE = ["--dp", "2", "--device", "cpu", "--block-size", "16"]


def obj(**fields) -> str:
    """One trace line: a valid request with ``fields`` changed (``...`` = removed)."""
    request = {"request_id": "r0", "arrival_s": 0.0, "prompt_tokens": 100,
               "output_tokens": 10}
    request.update(fields)
    return json.dumps({k: v for k, v in request.items() if v is not ...})


# case -> (lines of the trace file, fragments expected in stderr; {t} = the file)
TRACE_CASES = {
    "missing-field": ([obj(output_tokens=...)],
                      ["{t}:1: field 'output_tokens': missing (required)"]),
    "missing-id": ([obj(), obj(request_id=...)],
                   ["{t}:2: field 'request_id': missing (required)"]),
    "negative-length": ([obj(prompt_tokens=-5)],
                        ["{t}:1: field 'prompt_tokens': expected an integer >= 1, got -5"]),
    "zero-length": ([obj(output_tokens=0)],
                    ["{t}:1: field 'output_tokens': expected an integer >= 1, got 0"]),
    "fractional-length": ([obj(prompt_tokens=12.5)],
                          ["{t}:1: field 'prompt_tokens': expected an integer >= 1, got 12.5"]),
    "string-length": ([obj(output_tokens="12")],
                      ["{t}:1: field 'output_tokens': expected an integer >= 1, got \"12\" "
                       "(a string)"]),
    "unsorted-arrivals": ([obj(request_id="a", arrival_s=0.5), obj(request_id="b",
                                                                   arrival_s=0.25)],
                          ["{t}:2: field 'arrival_s': arrivals must be non-decreasing, got "
                           "0.25 after 0.5 on line 1"]),
    "non-numeric-arrival": ([obj(arrival_s="soon")],
                            ["{t}:1: field 'arrival_s': expected a finite number >= 0 "
                             "(seconds), got \"soon\" (a string)"]),
    "negative-arrival": ([obj(arrival_s=-0.5)],
                         ["{t}:1: field 'arrival_s': expected a finite number >= 0"]),
    "nan-arrival": (['{"request_id": "a", "arrival_s": NaN, "prompt_tokens": 1, '
                     '"output_tokens": 1}'],
                    ["{t}:1: field 'arrival_s': expected a finite number >= 0 (seconds), "
                     "got NaN"]),
    "duplicate-id": ([obj(), obj(request_id="r1"), obj(arrival_s=1.0)],
                     ["{t}:3: field 'request_id': duplicate id 'r0' (first used on line 1)"]),
    "empty-file": ([], ["{t}: trace is empty (expected at least one request line)"]),
    "blank-lines-only": (["", "   ", "\t"],
                         ["{t}: trace is empty (expected at least one request line)"]),
    "huge-length": ([obj(prompt_tokens=10**8)],
                    ["{t}:1: field 'prompt_tokens': expected at most 10,000,000 tokens, "
                     "got 100000000"]),
    "huge-arrival": ([obj(arrival_s=1e12)],
                     ["{t}:1: field 'arrival_s': expected at most 1e+06 seconds",
                      "(is the trace in milliseconds?)"]),
    "number-with-5000-digits": (['{"request_id": "a", "arrival_s": 0, "prompt_tokens": 1'
                                 + "0" * 5000 + ', "output_tokens": 1}'],
                                ["{t}:1: invalid JSON: a number has too many digits"]),
    "malformed-json": (['{"request_id": "a", "arrival_s": 0,'], ["{t}:1: invalid JSON: "]),
    "array-line": (['["a", 0, 100, 10]'],
                   ["{t}:1: expected a JSON object per line, got an array"]),
    "unknown-field": ([obj(max_tokens=5)],
                      ["{t}:1: unknown field(s) ['max_tokens']; allowed fields are: "
                       "request_id, arrival_s"]),
    "rank-beyond-dp": ([obj(rank=2)],
                       ["{t}:1: field 'rank': expected an integer in 0..1 for dp_size=2, "
                        "got 2"]),
    "several-problems": ([obj(prompt_tokens=0), obj(request_id="x", arrival_s=-1)],
                         ["2 problems, nothing was started:",
                          "{t}:1: field 'prompt_tokens'", "{t}:2: field 'arrival_s'"]),
}


def assert_refused(proc, tmp_path, out, fragments, code=2):
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.count("error:") == 1, proc.stderr
    for fragment in fragments:
        assert fragment in proc.stderr, (fragment, proc.stderr)
    assert not out.exists(), sorted(p.name for p in out.iterdir())
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("case", list(TRACE_CASES))
def test_bad_trace_file(cli, tmp_path, case):
    lines, fragments = TRACE_CASES[case]
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(line + "\n" for line in lines))
    out = tmp_path / "out"
    proc = cli("run", "--workload", trace, *BASE, "--out", out)
    assert_refused(proc, tmp_path, out, [f.format(t=trace) for f in fragments])


def test_trace_with_invalid_utf8(cli, tmp_path):
    trace = tmp_path / "trace.jsonl"
    trace.write_bytes(obj().encode() + b"\n\xff\xfe{}\n")
    out = tmp_path / "out"
    proc = cli("run", "--workload", trace, *BASE, "--out", out)
    assert_refused(proc, tmp_path, out, [f"{trace}:2: not valid UTF-8"])


def test_trace_that_is_a_directory(cli, tmp_path):
    (tmp_path / "traces").mkdir()
    out = tmp_path / "out"
    proc = cli("run", "--workload", tmp_path / "traces", *BASE, "--out", out)
    assert_refused(proc, tmp_path, out, [f"{tmp_path / 'traces'}: cannot read trace: "])


def test_deeply_nested_trace_line(cli, tmp_path):
    trace = tmp_path / "trace.jsonl"
    trace.write_text("[" * 5000 + "\n")
    out = tmp_path / "out"
    proc = cli("run", "--workload", trace, *BASE, "--out", out)
    assert_refused(proc, tmp_path, out, [f"{trace}:1: invalid JSON"])


# --------------------------------------------------------------------------- config


def lb(**keys) -> str:
    return json.dumps({"scheduler_config": {"dyntra_lb_config": {"enabled": True, **keys}}})


# (value of --additional-config, fragment) — keys, types and values that
# test_cli_errors.py does not exercise.
CONFIG_CASES = {
    "enabled-not-bool": (json.dumps({"scheduler_config": {"dyntra_lb_config": {
        "enabled": "yes"}}}), "dyntra_lb_config.enabled must be a bool, got str."),
    "diagnostics-not-bool": (lb(enable_diagnostics=1),
                             "dyntra_lb_config.enable_diagnostics must be a bool, got int."),
    "mode-null": (lb(mode=None), "dyntra_lb_config.mode must be one of ['dynamic', 'static'], "
                                 "got None."),
    "start-step-negative": (lb(start_step=-1), "dyntra_lb_config.start_step must be"),
    "end-step-below-minus-one": (lb(end_step=-2),
                                 "dyntra_lb_config.end_step must be -1 or >= 0, got -2."),
    "end-step-not-after-start": (lb(start_step=3, end_step=0),
                                 "dyntra_lb_config.end_step must be greater than start_step"),
    "threshold-zero": (lb(bubble_threshold=0),
                       "dyntra_lb_config.bubble_threshold must be > 0, got 0.0."),
    "threshold-string": (lb(bubble_threshold="1"),
                         "dyntra_lb_config.bubble_threshold must be a number, got str."),
    "long-threshold-zero": (lb(long_req_block_threshold=0),
                            "dyntra_lb_config.long_req_block_threshold must be > 0, got 0."),
    "max-step-float": (lb(dynamic_max_step=1.5),
                       "dyntra_lb_config.dynamic_max_step must be an int, got float."),
    "scheduler-config-list": ('{"scheduler_config": []}',
                              "additional_config.scheduler_config must be a dict, got list."),
    "dyntra-lb-config-bool": ('{"scheduler_config": {"dyntra_lb_config": true}}',
                              "dyntra_lb_config must be a dict, got bool."),
    "empty-string": ('""', "additional_config must be a JSON object, got str."),
    "null": ("null", "additional_config must be a JSON object, got NoneType."),
    "trailing-comma": ('{"scheduler_config": {},}',
                       "additional_config is not valid JSON: Expecting property name enclosed "
                       "in double quotes (line 1, column 25)."),
    "single-quotes": ("{'scheduler_config': {}}", "additional_config is not valid JSON"),
    "deep-nesting": ("[" * 100_000, "additional_config is not valid JSON"),
}


@pytest.mark.parametrize("case", list(CONFIG_CASES))
def test_bad_config(cli, tmp_path, tiny_trace, case):
    value, fragment = CONFIG_CASES[case]
    out = tmp_path / "out"
    proc = cli("run", "--workload", tiny_trace, *BASE, "--additional-config", value,
               "--out", out)
    assert_refused(proc, tmp_path, out, [f"--additional-config: {fragment}"])


@pytest.mark.parametrize("content, fragment", [
    (b"", "additional_config is not valid JSON"),
    (b'{"scheduler_config": {"dyntra_lb_config": {"enabled": tru}}}',
     "additional_config is not valid JSON"),
    (b'{"a": "\xff"}', "cannot read decode.json"),
])
def test_bad_config_file(cli, tmp_path, tiny_trace, content, fragment):
    (tmp_path / "decode.json").write_bytes(content)
    out = tmp_path / "out"
    proc = cli("run", "--workload", tiny_trace, *BASE, "--additional-config", "@decode.json",
               "--out", out)
    assert_refused(proc, tmp_path, out, [f"--additional-config @decode.json: {fragment}"])


def test_config_file_that_is_a_directory(cli, tmp_path, tiny_trace):
    (tmp_path / "conf").mkdir()
    out = tmp_path / "out"
    proc = cli("run", "--workload", tiny_trace, *BASE, "--additional-config", "@conf",
               "--out", out)
    assert_refused(proc, tmp_path, out, ["--additional-config @conf: cannot read conf: "
                                         "Is a directory"])


# ---------------------------------------------------------------------------- flags


FLAG_CASES = {
    "dp-one-with-dynamic-config": (["--dp", "1", "--additional-config", lb(mode="dynamic")], [
        "--dp 1: DyntraLB requires data_parallel_size > 1.",
        "DyntraLB is enabled by --additional-config; use --dp 2 or more"]),
    "batched-tokens-zero": (["--max-num-batched-tokens", "0"],
                            ["argument --max-num-batched-tokens: expected an integer >= 1, "
                             "got '0'"]),
    "gpu-blocks-negative": (["--num-gpu-blocks", "-3"],
                            ["argument --num-gpu-blocks: expected an integer >= 1"]),
    "block-size-fraction": (["--block-size", "1.5"],
                            ["argument --block-size: expected an integer >= 1, got '1.5'"]),
    "max-num-seqs-word": (["--max-num-seqs", "many"],
                          ["argument --max-num-seqs: expected an integer >= 1, got 'many'"]),
    "huge-dp": (["--dp", "100000"], ["argument --dp: expected an integer >= 1 and at most "
                                     "1,024 (rank processes), got '100000'"]),
    "huge-max-num-seqs": (["--max-num-seqs", str(10**12)],
                          ["argument --max-num-seqs: expected an integer >= 1 and at most "
                           "65,536"]),
    "huge-num-gpu-blocks": (["--num-gpu-blocks", str(10**12)],
                            ["argument --num-gpu-blocks: expected an integer >= 1 and at most "
                             "1,000,000"]),
    "huge-collective-timeout": (["--collective-timeout", "1e12"],
                                ["argument --collective-timeout: expected a number of seconds "
                                 "> 0 (at most 1e+06), got '1e12'"]),
    "huge-run-timeout": (["--run-timeout", "1e300"],
                         ["argument --run-timeout: expected a number of seconds > 0"]),
    "kv-pool-smaller-than-a-request": (["--num-gpu-blocks", "2"], [
        "needs 3 KV blocks", "but a rank has --num-gpu-blocks 2; it could never run"]),
    "fault-syntax": (["--fault", "kill:rank=one,step=5"], [
        "argument --fault: 'kill:rank=one,step=5': 'rank=one': expected an integer >= 0"]),
    "fault-unknown-kind": (["--fault", "crash:rank=1"], [
        "argument --fault: 'crash:rank=1': unknown fault kind 'crash'; expected one of kill, "
        "slow, kv_fail, kv_never, not_ready, delay"]),
    "fault-missing-key": (["--fault", "delay:rank=1,site=engine.dp_sync,step=3"],
                          ["argument --fault: 'delay:rank=1,site=engine.dp_sync,step=3': "
                           "delay needs seconds="]),
    "fault-rank-beyond-dp": (["--fault", "kill:rank=2,step=5"], [
        "--fault kill:rank=2,step=5: rank 2 is not a rank of this cluster (dp_size=2)"]),
    "fault-unknown-request": (["--fault", "kv_fail:request=nope"], [
        "--fault kv_fail:request=nope: request 'nope' is not in the trace"]),
    "fault-site-without-dyntra-lb": (
        ["--no-dyntra-lb", "--fault", "delay:rank=0,site=dyntra_lb.allgather,step=1,seconds=1"],
        ["--fault delay:rank=0,site=dyntra_lb.allgather,step=1,seconds=1: site "
         "dyntra_lb.allgather is never entered: DyntraLB is disabled"]),
    "fault-load-fails-and-hangs": (
        ["--fault", "kv_fail:request=req-0", "--fault", "kv_never:request=req-0"],
        ["--fault kv_never:request=req-0: request 'req-0' already has the fault "
         "kv_fail:request=req-0"]),
    "several-faults-wrong": (["--fault", "kill:rank=7,step=1", "--fault", "slow:rank=9,extra_ms=1"],
                             ["2 problems, nothing was started:", "rank 7", "rank 9"]),
}


@pytest.mark.parametrize("case", list(FLAG_CASES))
def test_bad_flags(cli, tmp_path, tiny_trace, case):
    args, fragments = FLAG_CASES[case]
    out = tmp_path / "out"
    proc = cli("run", "--workload", tiny_trace, *BASE, *args, "--out", out)
    assert_refused(proc, tmp_path, out, fragments)


def test_out_below_a_file(cli, tmp_path, tiny_trace):
    out = tiny_trace / "run"
    proc = cli("run", "--workload", tiny_trace, *BASE, "--out", out)
    assert_refused(proc, tmp_path, out, [f"--out {out}: cannot create the directory"])


def test_validate_lists_every_fault_problem(cli, tmp_path, tiny_trace):
    proc = cli("validate", "--workload", tiny_trace, *BASE, "--fault", "kill:rank=3,step=0",
               "--fault", "not_ready:request=ghost,lookups=2", "--fault",
               "delay:rank=1,site=dyntra_lb.flag,step=4,seconds=1")
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.splitlines() == [
        "problem: --fault kill:rank=3,step=0: rank 3 is not a rank of this cluster "
        "(dp_size=2)",
        "problem: --fault not_ready:request=ghost,lookups=2: request 'ghost' is not in the "
        "trace",
        "problem: --fault delay:rank=1,site=dyntra_lb.flag,step=4,seconds=1: site "
        "dyntra_lb.flag is never entered: only DyntraLB's dynamic mode issues the flag "
        "all-reduce (mode is 'static')",
        "3 problem(s) found"]


def test_validate_accepts_good_faults(cli, tiny_trace):
    proc = cli("validate", "--workload", tiny_trace, *BASE, "--fault", "kill:rank=1,step=9",
               "--fault", "kv_never:request=req-3,timeout_s=5")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("OK: ")
