"""When the engines of a DP group all-reduce their unfinished state: the DP sync cadence
(``DPEngineCoreProc._has_global_unfinished_reqs``, vllm/v1/engine/core.py), which decides
the steps at which a wave can end.

- vLLM 0.27.1, 0.28 and 0.29: every 32nd step of a wave (``step_counter % 32``);
- vLLM 0.30 and later: step 1 of a wave, then every ``dp_sync_interval`` steps
  (``ParallelConfig.dp_sync_interval``, ``--dp-sync-interval``, default 16).

A run's cadence is ``EngineSpec.dp_sync_interval``: None for the first, N for the
second. The kit's engine follows it (``syncs``); vllm-ascend's ranks run vLLM's own
method, and the installed vLLM decides (``emu.impl.vllm_ascend.VllmAscendImplementation.
dp_sync_interval``).
"""

from __future__ import annotations

# vLLM < 0.30: `if self.step_counter % 32 != 0: return True`
LEGACY_INTERVAL = 32
# vLLM >= 0.30: ParallelConfig.dp_sync_interval = Field(default=16, ge=1)
DEFAULT_INTERVAL = 16
# The first vLLM release with the configurable cadence.
CONFIGURABLE_SINCE = (0, 30)


def syncs(step_counter: int, interval: int | None) -> bool:
    """Whether the wave's ``step_counter``-th step (counted from 1) ends in the DP sync
    all-reduce, under the cadence ``interval`` (None: vLLM < 0.30's)."""
    if interval is None:
        return step_counter % LEGACY_INTERVAL == 0
    return step_counter == 1 or step_counter % interval == 0


def describe(interval: int | None) -> str:
    """The cadence in words, for the start line and summary.md."""
    if interval is None:
        return f"every {LEGACY_INTERVAL} steps (vLLM < 0.30)"
    return f"step 1 and every {interval} steps (vLLM >= 0.30)"


def record(interval: int | None) -> dict:
    """The cadence as metrics.json's ``config.dp_sync`` records it."""
    if interval is None:
        return {"interval": LEGACY_INTERVAL, "first_step": False}
    return {"interval": interval, "first_step": True}


def has_configurable_cadence(vllm_version: str) -> bool:
    """Whether vLLM ``vllm_version`` (e.g. "0.30.0+cpu") syncs on step 1 and every
    ``dp_sync_interval`` steps."""
    parts = []
    for part in vllm_version.split("+")[0].split(".")[:2]:
        digits = "".join(c for c in part if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts) >= CONFIGURABLE_SINCE
