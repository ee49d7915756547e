"""The ``VllmConfig`` of one emulated decode rank, built from its ``EngineSpec``.

vLLM needs a model to build its config; no weights are ever loaded, so a directory with
a small Hugging Face ``config.json`` of a MoE model (``vllm-model/`` in the run's output
directory) stands in for it (MoE, because vLLM runs ``DPEngineCoreProc`` — the class
DyntraLB replaces — only for MoE models; a GLM-4.5 MoE with one MTP layer, so that a cost
profile with draft tokens becomes vLLM's own speculative config, ``method="mtp"``, see
``speculative_config``). The
scheduler settings are the same flags the kit uses; the KV pool is fixed with
``num_gpu_blocks_override`` (one block more than the kit's pool: vLLM reserves block 0
as its null block); the node is a P/D decode node (``kv_role="kv_consumer"``) whose
connector is the emulated one of ``emu.impl.vllm_ascend.connector``; the user's
``--additional-config`` goes into ``additional_config`` verbatim.
"""

from __future__ import annotations

import json
import os
import pathlib

from emu.impl.vllm_ascend.connector import CONNECTOR_NAME, register_connector
from emu.rank.engine_spec import EngineSpec

# vllm-ascend's scheduler class per deployment variant (dyntra_lb.config.check_deployment)
# and DyntraLB on/off, as its platform selects it; None: vLLM's own (Scheduler, or
# AsyncScheduler with async scheduling).
_SCHEDULER_CLS = {
    ("plain", True): "vllm_ascend.core.dyntra_lb_scheduler.DyntraLBScheduler",
    ("async", True): "vllm_ascend.core.dyntra_lb_scheduler.AsyncDyntraLBScheduler",
    ("recompute", False): "vllm_ascend.core.recompute_scheduler.RecomputeScheduler",
    ("async_recompute", False): "vllm_ascend.core.recompute_scheduler.AsyncRecomputeScheduler",
    ("recompute", True): "vllm_ascend.core.recompute_scheduler.DyntraLBRecomputeScheduler",
    ("async_recompute", True):
        "vllm_ascend.core.recompute_scheduler.AsyncDyntraLBRecomputeScheduler",
}


def scheduler_cls(variant: str, dyntra_lb_enabled: bool) -> str | None:
    """The scheduler class production runs for this variant."""
    return _SCHEDULER_CLS.get((variant, dyntra_lb_enabled))


def _model_config_json(max_model_len: int) -> dict:
    """A two-layer MoE in GLM-4.5's format, with one MTP layer (vLLM derives its draft
    model from ``num_nextn_predict_layers``); only its shape reaches the KV spec."""
    return {
        "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe",
        "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "num_hidden_layers": 2, "n_routed_experts": 4, "num_experts_per_tok": 2,
        "n_shared_experts": 1, "first_k_dense_replace": 0, "num_nextn_predict_layers": 1,
        "vocab_size": 1024, "max_position_embeddings": max_model_len,
        "torch_dtype": "bfloat16", "rms_norm_eps": 1e-6,
    }


def model_dir(out_dir: pathlib.Path, max_model_len: int) -> pathlib.Path:
    """The model directory vLLM reads while the config and the engine are built:
    ``vllm-model/`` in the run's output directory, which keeps it as a record of the
    model vLLM was given. (It was a temporary directory removed after the build; a rank
    stopped while it built, e.g. because another rank failed, left it in TMPDIR.) Every
    rank writes the same ``config.json``, each through a file of its own renamed into
    place, so a rank never reads a half-written one."""
    path = out_dir / "vllm-model"
    path.mkdir(exist_ok=True)
    mine = path / f".config.json.{os.getpid()}"
    mine.write_text(json.dumps(_model_config_json(max_model_len)))
    os.replace(mine, path / "config.json")
    return path


def build_vllm_config(spec: EngineSpec, *, rank: int, dp_size: int, variant: str,
                      dyntra_lb_enabled: bool, model_path: pathlib.Path,
                      additional_config: dict):
    """The VllmConfig of DP rank ``rank`` of ``dp_size`` running ``spec``. ``variant``
    is the deployment variant the startup checks chose; ``additional_config`` the
    user's JSON, parsed."""
    from vllm.config import (
        CacheConfig,
        DeviceConfig,
        KVTransferConfig,
        ModelConfig,
        ParallelConfig,
        SchedulerConfig,
        VllmConfig,
    )

    register_connector()
    max_model_len = max_model_len_of(spec)
    model = ModelConfig(model=str(model_path), skip_tokenizer_init=True,
                        max_model_len=max_model_len, dtype="bfloat16", seed=spec.seed)
    scheduler = SchedulerConfig(
        max_num_seqs=spec.max_num_seqs,
        max_num_batched_tokens=spec.max_num_batched_tokens,
        max_model_len=max_model_len,
        is_encoder_decoder=False,
        policy=spec.scheduling_policy,
        async_scheduling=spec.async_scheduling,
        enable_chunked_prefill=True,
        scheduler_cls=scheduler_cls(variant, dyntra_lb_enabled),
    )
    cadence = ({} if spec.dp_sync_interval is None  # vLLM < 0.30 has no such field
               else {"dp_sync_interval": spec.dp_sync_interval})
    parallel = ParallelConfig(data_parallel_size=dp_size, data_parallel_rank=rank,
                              data_parallel_rank_local=rank, **cadence)
    config = VllmConfig(
        model_config=model,
        cache_config=CacheConfig(block_size=spec.block_size, enable_prefix_caching=False,
                                 num_gpu_blocks_override=spec.num_gpu_blocks + 1),
        scheduler_config=scheduler,
        parallel_config=parallel,
        speculative_config=speculative_config(spec.cost_model, model, parallel),
        kv_transfer_config=KVTransferConfig(
            kv_connector=CONNECTOR_NAME, kv_role="kv_consumer",
            kv_load_failure_policy="recompute",
            kv_connector_extra_config={
                "latency_fixed_s": spec.kv_latency_fixed_s,
                "latency_per_block_s": spec.kv_latency_per_block_s}),
        device_config=DeviceConfig(device="cpu"),
        additional_config=additional_config,
    )
    # vLLM's CPU platform turns async scheduling off while the config is built (its
    # check_and_update_config); vllm-ascend's NPU platform keeps it, and so does the
    # node emulated here: with it, vLLM's engine overlaps each step with the next
    # (its batch queue), as on the node.
    config.scheduler_config.async_scheduling = spec.async_scheduling
    return config


def speculative_config(profile, model, parallel):
    """vLLM's speculative config for a cost profile with k > 0 draft tokens (None
    without): MTP (``method="mtp"``) from the model's own MTP layer, k tokens, as
    PR #12292's node ran. The scheduler reads k from it (``num_spec_tokens``), reserves
    k lookahead KV slots per allocation (MTP is an EAGLE-type drafter) and pads requests
    back from the waiting queue to 1 + k tokens; the engine takes the worker's drafts
    after each step. No draft model is loaded: the worker is emulated (``sampler``)."""
    from vllm.config import SpeculativeConfig

    k = profile.num_speculative_tokens
    if not k:
        return None
    return SpeculativeConfig(method="mtp", num_speculative_tokens=k,
                             target_model_config=model, target_parallel_config=parallel)


def max_model_len_of(spec: EngineSpec) -> int:
    """Room for the longest request of the trace, rounded up to whole blocks, plus, with
    k draft tokens, 3k more: the drafts and lookahead slots of a request's last steps
    (vLLM caps a step's tokens and slots at ``max_model_len``; the kit has no such cap,
    so it must never bind)."""
    longest = max(r.prompt_tokens + r.output_tokens for r in spec.trace)
    longest += 3 * spec.cost_model.num_speculative_tokens
    blocks = -(-longest // spec.block_size) + 1
    return blocks * spec.block_size


def preset_ascend_config(vllm_config) -> None:
    """Install vllm-ascend's config singleton for this rank before its engine starts.

    DyntraLB's ``_init_data_parallel`` calls ``init_ascend_config``, which returns the
    singleton when one exists for the same ``vllm_config`` and otherwise builds a whole
    ``AscendConfig`` — whose compilation, fusion and device parts import torch_npu.
    DyntraLB reads only ``scheduler_config`` from it, so the singleton installed here
    carries vllm-ascend's own ``SchedulerConfig``, parsed from the same additional
    config with the same balance-scheduling default, and nothing of the NPU parts.
    """
    import vllm_ascend.ascend_config as ascend_config
    from vllm_ascend import envs as ascend_envs

    config = ascend_config.AscendConfig.__new__(ascend_config.AscendConfig)
    config.vllm_config = vllm_config
    config.scheduler_config = ascend_config.SchedulerConfig(
        vllm_config.additional_config or {},
        balance_env_value=ascend_envs.VLLM_ASCEND_BALANCE_SCHEDULING)
    config.ascend_compilation_config = None  # what marks the singleton as initialized
    config.eplb_config = None
    ascend_config._ASCEND_CONFIG = config
