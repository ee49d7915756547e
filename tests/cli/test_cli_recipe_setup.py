"""A recipe that rebuilds a published run carries its setup (``RECIPE_SETUPS`` in
fixtures/generate.py, emu/cli/recipe_hint.py): a setting the command line leaves out
takes the published value, a flag the user gives wins (even one equal to the emulator's
default), and run, validate and inspect agree."""

from __future__ import annotations

import json

from emu.recipes import generator
from tests.records import events

TINY = ["--workload", "recipe:pr12292,n=3", "--dp", "2", "--device", "cpu",
        "--transport", "thread"]


def _config(out) -> dict:
    return json.loads((out / "metrics.json").read_text())["config"]


def _arrivals(out) -> list[float]:
    """Every request's arrival, from every rank's records."""
    ranks = sorted(int(p.name[4:].split(".")[0]) for p in out.glob("rank*.requests"))
    assert ranks, f"no request records in {out}"
    records = [r for rank in ranks for r in events(out, rank)]
    return sorted(r["arrival_s"] for r in records if r.get("kind") == "request")


def test_a_bare_recipe_run_is_the_published_setup(cli, tmp_path):
    published = generator().RECIPE_SETUPS["pr12292"]
    proc = cli("run", *TINY, "--out", tmp_path / "run")
    assert proc.returncode == 0, proc.stderr
    config = _config(tmp_path / "run")
    for field in ("max_concurrency", "block_size", "max_num_seqs", "router"):
        assert config[field] == published[field], field
    assert config["cost_model"]["name"] == published["cost_model"]
    assert config["additional_config"] == published["additional_config"]
    # the trace is the recipe's at its published request rate, not the generator's 2.5/s
    expected = [r["arrival_s"] for r in generator().pr12292(3, published["rate"], 0)]
    assert _arrivals(tmp_path / "run") == sorted(expected)
    start = next(line for line in proc.stderr.splitlines() if "published setup" in line)
    assert "rate=400 --max-concurrency 128 --block-size 2048 --max-num-seqs 16" in start
    assert "hint:" not in proc.stderr  # nothing differs from the published run


def test_a_flag_the_user_gives_wins_and_the_hint_names_the_difference(cli, tmp_path):
    # round_robin is the emulator's own default: given on the command line, it still wins
    proc = cli("run", *TINY, "--router", "round_robin", "--max-num-seqs", "4",
               "--out", tmp_path / "run")
    assert proc.returncode == 0, proc.stderr
    config = _config(tmp_path / "run")
    assert (config["router"], config["max_num_seqs"], config["block_size"]) == (
        "round_robin", 4, 2048)
    hint = next(line for line in proc.stderr.splitlines() if line.startswith("hint:"))
    assert "--max-num-seqs 16 --router vllm" in hint and "--block-size" not in hint
    start = next(line for line in proc.stderr.splitlines() if "published setup" in line)
    assert "--router" not in start and "--max-num-seqs" not in start


def test_a_given_config_wins_over_the_recipes(cli, tmp_path):
    proc = cli("run", *TINY, "--no-dyntra-lb", "--out", tmp_path / "run")
    assert proc.returncode == 0, proc.stderr
    assert _config(tmp_path / "run")["additional_config"] == {}


def test_validate_and_inspect_agree_with_run(cli, tmp_path):
    gpqa = generator().RECIPE_SETUPS["pr12292-gpqa"]
    proc = cli("validate", "--workload", "recipe:pr12292-gpqa,n=20", "--dp", "8")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "published --additional-config (DyntraLB static mode from step 250)" in proc.stdout
    assert (f"--max-concurrency {gpqa['max_concurrency']} --block-size {gpqa['block_size']} "
            f"--max-num-seqs {gpqa['max_num_seqs']} --router vllm") in proc.stdout
    proc = cli("validate", "--workload", "recipe:pr12292-gpqa,n=20", "--dp", "8",
               "--block-size", "16")
    assert "--block-size" not in proc.stdout.split("published setup")[1]
    proc = cli("inspect", "--workload", "recipe:pr12292-gpqa,n=20", "--out", tmp_path / "i")
    assert proc.returncode == 0, proc.stderr
    assert f"KV block size {gpqa['block_size']} tokens" in proc.stdout
    proc = cli("inspect", "--workload", "recipe:pr12292,n=20", "--out", tmp_path / "j")
    assert "KV block size 2048 tokens" in proc.stdout
