"""vLLM bench's custom dataset end to end: the prompts' token counts under a tokenizer,
as vllm bench serve counts them (chat template applied, then tokenized), then a tiny
run. The tokenizer is made here (a word-level one with a chat template), so nothing is
downloaded; transformers comes with vLLM, which this tier has."""

from __future__ import annotations

import json
import re
from pathlib import Path

from emu.traces import ReadOptions, read_trace
from tests.in_process import run_in_process

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "traces" / "vllm_custom.jsonl"
TEMPLATE = "<s> user : {{ messages[0]['content'] }} assistant :"


def make_tokenizer(where: Path) -> Path:
    """A tokenizer that knows no word (each word or punctuation run is one token) and
    wraps a prompt in five tokens of chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    model = Tokenizer(models.WordLevel({"[UNK]": 0, "<s>": 1}, unk_token="[UNK]"))
    model.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=model, unk_token="[UNK]",
                                        bos_token="<s>")
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(where)
    return where


def test_prompt_lengths_are_counted_as_vllm_bench_counts_them(tmp_path):
    tokenizer = make_tokenizer(tmp_path / "tokenizer")
    trace = read_trace(SAMPLE, options=ReadOptions(tokenizer=str(tokenizer)))
    lines = [json.loads(line) for line in SAMPLE.read_text().splitlines()]
    # the template's "<s> user :" and "assistant :" are five tokens around the prompt
    words = [len(re.findall(r"\w+|[^\w\s]+", line["prompt"])) + 5 for line in lines]
    assert trace.format == "vllm-custom"
    assert [r.prompt_tokens for r in trace.requests] == words
    assert [r.output_tokens for r in trace.requests] == [line["output_tokens"] for line in lines]
    assert {r.arrival_s for r in trace.requests} == {0.0}  # --request-rate inf


def test_a_custom_dataset_runs_end_to_end(tmp_path):
    tokenizer = make_tokenizer(tmp_path / "tokenizer")
    out = tmp_path / "out"
    proc = run_in_process(["run", "--workload", str(SAMPLE), "--tokenizer", str(tokenizer),
                           "--dp", "2", "--block-size", "16", "--num-gpu-blocks", "512",
                           "--max-num-seqs", "4", "--device", "cpu", "--transport", "thread",
                           "--quiet", "--max-concurrency", "4", "--out", str(out)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["requests_finished"] == len(SAMPLE.read_text().splitlines())
