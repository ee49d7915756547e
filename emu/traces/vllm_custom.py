"""vLLM bench's ``custom`` dataset (``vllm bench serve --dataset-name custom``): JSON
Lines with ``prompt`` (text) and ``output_tokens``, its one explicit length, which
vllm bench uses with ``--custom-output-len -1`` (vllm/benchmarks/datasets/datasets.py,
``CustomDataset``). The prompt's length is its token count under the model's
tokenizer, counted as vllm bench counts it: the chat template applied (when the
tokenizer has one) and the special tokens the tokenizer adds. The file has no times:
every request arrives at 0, as vllm bench serve sends them at its default
``--request-rate inf``; ``--max-concurrency`` paces them as it does there."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

from emu.traces.base import ReadOptions, TraceFormat
from emu.workload import Row, TraceRequest, json_objects, show, tokens_problem


def _rows(path: Path, raw: bytes, options: ReadOptions) -> Iterator[Row]:
    count, problem = _token_counter(options.tokenizer)
    if problem is not None:
        yield Row(0, problems=(f"{path}: {problem}",))
    for line, obj, line_problem in json_objects(path, raw):
        if obj is None:
            yield Row(line, problems=(line_problem,))
            continue
        where = f"{path}:{line}"
        problems = [f"{where}: field {name!r}: missing (required)"
                    for name in ("prompt", "output_tokens") if name not in obj]
        prompt = obj.get("prompt")
        if "prompt" in obj and not isinstance(prompt, str):
            problems.append(f"{where}: field 'prompt': expected a string, got {show(prompt)}")
        output = obj.get("output_tokens")
        if "output_tokens" in obj and tokens_problem(output) is not None:
            problems.append(f"{where}: field 'output_tokens': {tokens_problem(output)}")
        if problems or count is None:
            yield Row(line, problems=tuple(problems))
            continue
        tokens = count(prompt)
        if tokens_problem(tokens) is not None:
            yield Row(line, problems=(f"{where}: field 'prompt': its token count "
                                      f"{tokens_problem(tokens, str(tokens))}",))
            continue
        yield Row(line, TraceRequest(f"vllm-custom-{line}", 0.0, tokens, output))


def _token_counter(tokenizer: str | None) -> tuple[Callable[[str], int] | None, str | None]:
    """A prompt's token count under ``tokenizer`` (a Hugging Face name or directory),
    or None and why there is none."""
    if tokenizer is None:
        return None, ("a vllm-custom trace holds prompt text, not its token count: name "
                      "the model's tokenizer (--tokenizer NAME|DIR, as given to vllm bench "
                      "serve) to count it")
    try:
        from transformers import AutoTokenizer
    except ImportError:
        return None, ("--tokenizer needs the transformers package (it comes with vLLM: "
                      "pip install -e '.[upstream]')")
    try:
        loaded = AutoTokenizer.from_pretrained(tokenizer)
    except (OSError, ValueError) as exc:
        return None, f"--tokenizer {tokenizer}: cannot load it: {exc}"

    def count(prompt: str) -> int:
        if loaded.chat_template is not None:
            prompt = loaded.apply_chat_template([{"role": "user", "content": prompt}],
                                                add_generation_prompt=True, tokenize=False)
        return len(loaded(prompt).input_ids)

    return count, None


FORMAT = TraceFormat(
    name="vllm-custom",
    about="vllm bench's custom dataset, JSON Lines: prompt, output_tokens (needs "
          "--tokenizer; every request arrives at 0)",
    rows=_rows,
    looks_like=lambda head: "prompt" in head.keys,
    ordered=True,
    rebase=True,
)
