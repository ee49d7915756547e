"""The seeded trace generator (fixtures/generate.py) and the bundled traces."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from emu.workload import load_trace

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "fixtures" / "generate.py"

_spec = importlib.util.spec_from_file_location("fixtures_generate", SCRIPT)
gen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen)


def _numbers(records):
    return [(r["arrival_s"], r["prompt_tokens"], r["output_tokens"]) for r in records]


@pytest.mark.parametrize("kind", gen.KINDS)
@pytest.mark.parametrize("arrivals", gen.ARRIVALS)
def test_every_kind_and_arrival_gives_a_valid_trace(tmp_path, kind, arrivals):
    records = gen.generate(kind, arrivals, 64, 10.0, 5)
    path = tmp_path / "t.jsonl"
    gen.write_trace(records, path)
    trace = load_trace(path)
    assert len(trace) == 64
    assert trace[0].arrival_s == 0.0
    assert len({r.request_id for r in trace}) == 64
    assert all(r.request_id.startswith(f"{kind}-") for r in trace)


def test_same_seed_same_trace_other_seed_differs():
    a = gen.generate("longtail", "gamma", 100, 20.0, 7, prompt_text=True)
    b = gen.generate("longtail", "gamma", 100, 20.0, 7, prompt_text=True)
    c = gen.generate("longtail", "gamma", 100, 20.0, 8, prompt_text=True)
    assert a == b
    assert _numbers(a) != _numbers(c)
    assert [r["request_id"] for r in a] != [r["request_id"] for r in c]
    assert all(isinstance(r["prompt_text"], str) and r["prompt_text"] for r in a)


def test_mean_rate_is_respected():
    for arrivals in gen.ARRIVALS:
        times = [r["arrival_s"] for r in gen.generate("uniform", arrivals, 4000, 50.0, 1)]
        rate = len(times) / times[-1]
        assert 40 < rate < 62, (arrivals, rate)


def test_gamma_is_burstier_than_poisson():
    def cv(arrivals):
        times = np.array([r["arrival_s"] for r in gen.generate("uniform", arrivals, 4000,
                                                                 50.0, 1)])
        gaps = np.diff(times)
        return gaps.std() / gaps.mean()

    assert 0.85 < cv("poisson") < 1.15
    assert cv("gamma") > 1.5


def test_burst_arrivals_come_in_groups():
    times = [r["arrival_s"] for r in gen.generate("uniform", "burst", 40, 16.0, 0)]
    assert times[:16] == [0.0] * 16
    assert times[16:32] == [1.0] * 16
    assert times[32:] == [2.0] * 8


def test_length_distributions_have_their_shape():
    uni = gen.generate("uniform", "poisson", 2000, 10.0, 0)
    assert min(r["prompt_tokens"] for r in uni) >= 256
    assert max(r["output_tokens"] for r in uni) <= 512

    tail = np.array([r["output_tokens"] for r in gen.generate("longtail", "poisson", 2000,
                                                              10.0, 0)])
    assert np.median(tail) < 200
    assert 0.03 < np.mean(tail >= 1536) < 0.08  # the tail of very long generations

    bi = np.array([r["output_tokens"] for r in gen.generate("bimodal", "poisson", 2000,
                                                            10.0, 0)])
    assert np.all((bi <= 128) | (bi >= 768))
    assert 0.65 < np.mean(bi <= 128) < 0.75


def test_long_prompts_cross_the_default_long_request_threshold():
    records = gen.generate("longtail", "poisson", 100, 10.0, 0, long_prompts=4)
    long_idx = [i for i, r in enumerate(records) if r["prompt_tokens"] > 700 * 128]
    assert long_idx == [20, 41, 62, 83]
    assert sorted(i % 4 for i in long_idx) == [0, 1, 2, 3]  # one per rank, round robin
    every = gen.generate("uniform", "poisson", 5, 10.0, 0, long_prompts=5)
    assert all(r["prompt_tokens"] > 700 * 128 for r in every)


def test_bundle_is_reproducible_and_matches_committed_files(tmp_path):
    """The committed traces are what `generate.py --bundle` writes (numbers exactly;
    ids are checked for shape only, as faker's name lists may change between versions)."""
    gen.write_bundle(tmp_path)
    for name in gen.BUNDLE:
        fresh = [json.loads(line) for line in (tmp_path / f"{name}.jsonl").open()]
        committed = [json.loads(line) for line in (gen.WORKLOADS_DIR / f"{name}.jsonl").open()]
        assert _numbers(fresh) == _numbers(committed), name
        assert [r["request_id"].split("-")[:2] for r in fresh] == \
               [r["request_id"].split("-")[:2] for r in committed]


def test_default_trace_has_work_for_dyntra_lb():
    trace = load_trace(gen.WORKLOADS_DIR / "default.jsonl", dp_size=4)
    assert 200 <= len(trace) <= 400
    assert sum(r.prompt_tokens > 700 * 128 for r in trace) >= 2
    outputs = np.array([r.output_tokens for r in trace])
    assert outputs.max() > 10 * np.median(outputs)


def test_cli_writes_a_trace_and_rejects_bad_flags(tmp_path):
    out = tmp_path / "x.jsonl"
    ok = subprocess.run(
        [sys.executable, str(SCRIPT), "--kind", "bimodal", "--arrivals", "burst", "--n", "20",
         "--rate", "5", "--seed", "3", "--out", str(out)],
        capture_output=True, text=True, check=False,
    )
    assert ok.returncode == 0, ok.stderr
    assert len(load_trace(out)) == 20
    for flags, message in [
        (["--rate", "0", "--out", str(out)], "expected a finite number > 0"),
        (["--n", "abc", "--out", str(out)], "expected an integer"),
        (["--kind", "zipf", "--out", str(out)], "invalid choice: 'zipf'"),
        ([], "--out FILE is required"),
        (["--n", "5", "--long-prompts", "6", "--out", str(out)], "long_prompts must be"),
    ]:
        bad = subprocess.run([sys.executable, str(SCRIPT), *flags], capture_output=True,
                             text=True, check=False)
        assert bad.returncode == 2 and message in bad.stderr, (flags, bad.stderr)


def test_pr12292_recipe_matches_the_published_shape():
    records = gen.pr12292(1000, 2.5, 0)
    assert records == gen.pr12292(1000, 2.5, 0)
    assert records != gen.pr12292(1000, 2.5, 1)
    prompts = np.array([r["prompt_tokens"] for r in records])
    outputs = np.array([r["output_tokens"] for r in records])
    block = gen.PR12292_BLOCK_SIZE
    long_ids = np.flatnonzero(prompts == 45 * block)
    assert len(long_ids) >= 20  # 20 placed; a lognormal draw may reach the cap too
    assert prompts.max() == 45 * block and prompts.min() >= 1
    assert outputs.min() >= 512 and outputs.max() <= 4096
    # the PR's totals: ~10.1k input and ~1,281 output tokens per request
    assert 8_500 < prompts.mean() < 11_500
    assert 1_150 < outputs.mean() < 1_400
    # the output mean follows the input
    assert outputs[prompts > np.median(prompts)].mean() > outputs[prompts <= np.median(
        prompts)].mean()
    times = [r["arrival_s"] for r in records]
    assert 2.0 < len(times) / times[-1] < 3.0
    # the long requests are spread out, not bunched at the end
    assert long_ids.min() < 100 and long_ids.max() > 900


def test_pr12292_recipe_from_the_command_line(tmp_path):
    out = tmp_path / "pr.jsonl"
    subprocess.run([sys.executable, str(SCRIPT), "--recipe", "pr12292", "--n", "50",
                    "--seed", "3", "--out", str(out)], check=True, capture_output=True)
    trace = load_trace(out)
    assert len(trace) == 50
    assert sum(r.prompt_tokens == 45 * 2048 for r in trace) >= 1


def test_pr12292_gpqa_recipe_is_the_published_accuracy_run():
    records = gen.pr12292_gpqa(seed=0)
    assert records == gen.pr12292_gpqa(seed=0) and records != gen.pr12292_gpqa(seed=1)
    assert len(records) == 198  # GPQA Diamond
    assert {r["arrival_s"] for r in records} == {0.0}  # request rate 0: all at once
    outputs = np.array([r["output_tokens"] for r in records])
    assert outputs.min() >= 1 and outputs.max() <= 32_768  # the published max output
    # many seeds pooled: the cited mean (capped at 32,768, which trims a little)
    pooled = np.concatenate([[r["output_tokens"] for r in gen.pr12292_gpqa(seed=s)]
                             for s in range(20)])
    assert 0.95 * gen.GPQA_OUTPUT_MEAN_TOKENS < pooled.mean() < 1.03 * gen.GPQA_OUTPUT_MEAN_TOKENS
    # the sweep's knobs: another mean, and Poisson arrivals at a rate
    longer = gen.pr12292_gpqa(seed=0, output_mean=14_566)
    assert np.mean([r["output_tokens"] for r in longer]) > 2 * outputs.mean()
    times = [r["arrival_s"] for r in gen.pr12292_gpqa(seed=0, rate=64.0)]
    assert times[0] == 0.0 and times == sorted(times) and 1.5 < times[-1] < 5.0


def test_pr12292_gpqa_recipe_from_the_command_line(tmp_path):
    out = tmp_path / "gpqa.jsonl"
    subprocess.run([sys.executable, str(SCRIPT), "--recipe", "pr12292-gpqa", "--out",
                    str(out)], check=True, capture_output=True)
    trace = load_trace(out)
    assert len(trace) == 198 and {r.arrival_s for r in trace} == {0.0}


def test_mooncake_like_recipe_has_the_cited_shape():
    records = gen.mooncake_like(hours=0.25, seed=0)
    assert records == gen.mooncake_like(hours=0.25, seed=0)
    assert records != gen.mooncake_like(hours=0.25, seed=1)
    # 19,700 requests an hour, Poisson arrivals spread over the hours asked for
    assert len(records) == round(0.25 * 19_700)
    times = np.array([r["arrival_s"] for r in records])
    assert times[0] == 0.0 and (np.diff(times) >= 0).all() and 870 < times[-1] < 930
    prompts = np.array([r["prompt_tokens"] for r in records])
    outputs = np.array([r["output_tokens"] for r in records])
    # long-context inputs: median ~6k, mean ~12k (the conversation trace's 12,035), under
    # Kimi's 128k context; about 1 % past DyntraLB's default long-request threshold
    assert 5_500 < np.median(prompts) < 6_500 and 10_500 < prompts.mean() < 13_500
    assert prompts.min() >= 891 and prompts.max() <= 131_072
    assert 0.005 < (prompts > 700 * 128).mean() < 0.02
    # chat-length outputs: median ~350, at most 2,000
    assert 320 < np.median(outputs) < 380 and outputs.min() >= 1 and outputs.max() <= 2_000
    assert len(gen.mooncake_like(hours=1.0, seed=0)) == 19_700
    assert len(gen.mooncake_like(hours=0.25, rate=2.0, seed=0)) == 1_800
    with pytest.raises(ValueError, match="hours must be a finite number > 0"):
        gen.mooncake_like(hours=0.0)


def test_mooncake_like_recipe_runs_on_the_default_config(tmp_path):
    """Every request fits a rank of the default config (128-token blocks, 4,096 blocks):
    the run's own checks find nothing."""
    from emu.spec import RunSpec, check

    path = tmp_path / "mc.jsonl"
    gen.write_trace(gen.mooncake_like(hours=0.25, seed=0), path)
    spec = RunSpec(trace=load_trace(path, dp_size=16), dp_size=16, out_dir=tmp_path / "run",
                   device="cpu", transport="thread")
    check(spec)  # raises SpecError on any problem


def test_mooncake_like_recipe_from_the_command_line(tmp_path):
    out = tmp_path / "mc.jsonl"
    subprocess.run([sys.executable, str(SCRIPT), "--recipe", "mooncake-like", "--hours",
                    "0.05", "--seed", "2", "--out", str(out)], check=True, capture_output=True)
    assert len(load_trace(out)) == round(0.05 * 19_700)
    for flags, message in [(["--recipe", "mooncake-like", "--n", "5"],
                            "--n: recipe mooncake-like does not take it"),
                           (["--recipe", "pr12292", "--hours", "1"],
                            "--hours: recipe pr12292 does not take it")]:
        bad = subprocess.run([sys.executable, str(SCRIPT), *flags, "--out", str(out)],
                             capture_output=True, text=True, check=False)
        assert bad.returncode == 2 and message in bad.stderr, (flags, bad.stderr)
