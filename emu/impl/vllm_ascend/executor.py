"""The model executor of an emulated vLLM rank: no model, the kit's virtual time.

vLLM's ``EngineCore`` builds its executor from the config and calls it for the KV-cache
setup and then once per step. This one declares a small full-attention KV spec (the
pool size is fixed by ``num_gpu_blocks_override``), and hands every forward — real or
dummy — to the rank (``emu.impl.vllm_ascend.engine.EmulatedRank``), which prices it,
joins the lockstep collective and returns what the worker would: the tokens sampled by
each request that completed its prompt (``sampler``: one, or with MTP the accepted drafts
plus one), and the remote-KV loads finished by then. As vLLM's model runner, a forward
that ran tokens hands its output over in two calls, ``execute_model`` (None) then
``sample_tokens``; with async scheduling vLLM's engine makes the second call for a step
only after it has scheduled and run the next one. With MTP and synchronous scheduling
the engine then takes the drafts the forward proposed (``take_draft_token_ids``).
"""

from __future__ import annotations

import torch
from vllm.v1.executor.abstract import Executor
from vllm.v1.kv_cache_interface import FullAttentionSpec

# The KV spec's shape is irrelevant (nothing is allocated), but vLLM sizes pages by it.
_LAYERS = 2
_KV_HEADS = 2
_HEAD_SIZE = 16
_PLENTY_OF_MEMORY = 1 << 40


class EmulatedExecutor(Executor):
    """``rank`` provides ``forward(scheduler_output)``, ``dummy_forward()`` and its
    ``sampler``."""

    def __init__(self, vllm_config, rank):
        self.rank = rank
        super().__init__(vllm_config)

    @classmethod
    def supports_async_scheduling(cls) -> bool:
        return True

    def _init_executor(self) -> None:
        pass

    def get_kv_cache_specs(self):
        spec = FullAttentionSpec(block_size=self.cache_config.block_size,
                                 num_kv_heads=_KV_HEADS, head_size=_HEAD_SIZE,
                                 dtype=torch.bfloat16)
        return [{f"model.layers.{i}.self_attn.attn": spec for i in range(_LAYERS)}]

    def determine_available_memory(self) -> list[int]:
        return [_PLENTY_OF_MEMORY]

    def initialize_from_config(self, kv_cache_configs) -> None:
        pass

    def get_supported_kv_cache_layouts(self) -> list[list[str]]:
        """vLLM >= 0.30 resolves one KV layout before it sizes the cache: the usual one
        (nothing is allocated here)."""
        return [["NHD"]]

    def set_kv_cache_layout(self, layout_name: str) -> None:
        pass

    def compile_or_warm_up_model(self) -> None:
        pass

    def get_kv_connector_handshake_metadata(self):
        return [{}]

    def execute_model(self, scheduler_output, non_block: bool = False):
        """The forward; as vLLM's model runner, a batch that ran tokens returns None
        here and its sampled tokens from ``sample_tokens``."""
        output = _Output(self.rank, self.rank.forward(scheduler_output))
        if scheduler_output.total_num_scheduled_tokens > 0:
            self._sampled, output = output, _Output(self.rank, None)
        return output if non_block else output.result()

    def sample_tokens(self, grammar_output, non_block: bool = False):
        output, self._sampled = self._sampled, None
        return output if non_block else output.result()

    def execute_dummy_batch(self) -> None:
        self.rank.dummy_forward()

    def take_draft_token_ids(self):
        return self.rank.sampler.take_draft_token_ids()

    def check_health(self) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None,
                       non_block: bool = False):
        raise NotImplementedError(f"the emulated executor has no workers ({method})")


class _Output:
    """A forward's output, done at once: the future ``execute_model(non_block=True)`` and
    ``sample_tokens`` hand vLLM's engine, which only calls its ``result()``. Not a
    ``concurrent.futures.Future``: that one builds a lock and a condition, twice per
    rank and step, for a value that is there from the start. vLLM's engine reads it right
    before it processes it (``update_from_output``): the rank then stamps the tokens
    with the virtual time the forward ended, which with async scheduling is a step
    before the clock (the next forward already ran)."""

    __slots__ = ("_ended_us", "_output", "_rank")

    def __init__(self, rank, output):
        self._ended_us = rank.clock_us
        self._rank = rank
        self._output = output

    def done(self) -> bool:
        return True

    def result(self, timeout=None):
        self._rank.output_clock_us = self._ended_us
        return self._output
