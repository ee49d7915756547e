"""Where the emulated model collective runs: CPU (gloo) or Ascend NPU (HCCL via torch_npu).

A run chooses its device once, in the launching process, before any rank starts
(`select_device`, called by `emu.spec.check`), so that a missing torch_npu or NPU runtime
is one clear error instead of dp_size rank crashes; the transports take the kind chosen.
Each rank then calls `bind_rank_device` to pin itself to its device and learn the
backend of its device group. The DP group is gloo on every device (as vLLM's DP group).

torch_npu is never a dependency: it is imported only when an NPU run is asked for or
auto-detection probes for it.
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass

DEVICE_CHOICES = ("auto", "cpu", "npu")
# What a choice resolves to (select_device), which the transports take.
DEVICE_KINDS = ("cpu", "npu")

logger = logging.getLogger(__name__)


class DeviceError(RuntimeError):
    """The requested device cannot be used; raised before any rank process starts."""


@dataclass(frozen=True)
class NpuProbe:
    """What torch_npu reports on this machine; `problem` is None when NPUs are usable."""

    problem: str | None
    device_count: int = 0
    installed: bool = False


def _import_torch_npu():
    """Import torch_npu (which registers `torch.npu` and the "hccl" backend) and return
    the `torch.npu` runtime module. Unit tests replace this function.

    Without torch_npu installed this returns before importing torch, so that a CPU-only
    machine's CLI answers (bad input, a CPU run's launcher) without waiting for torch's
    import.
    """
    if importlib.util.find_spec("torch_npu") is None:
        raise ModuleNotFoundError("No module named 'torch_npu'", name="torch_npu")
    import torch
    import torch_npu  # noqa: F401

    return torch.npu


def probe_npu() -> NpuProbe:
    """Find out whether torch_npu can be imported and sees at least one NPU."""
    try:
        npu = _import_torch_npu()
    except ModuleNotFoundError as exc:
        if exc.name == "torch_npu":
            return NpuProbe(
                "torch_npu is not installed (an NPU run needs the torch_npu build matching "
                "this torch and the Ascend CANN toolkit)"
            )
        return NpuProbe(
            f"torch_npu is installed but a module it needs is missing: {exc}", installed=True
        )
    except Exception as exc:  # a broken CANN install surfaces as ImportError/OSError/...
        return NpuProbe(
            f"torch_npu is installed but failed to import ({type(exc).__name__}: {exc}); "
            "is the Ascend CANN toolkit installed and its set_env.sh sourced?",
            installed=True,
        )
    if not npu.is_available():
        return NpuProbe(
            "torch_npu is installed but reports no available NPU (check the Ascend driver "
            "with `npu-smi info` and ASCEND_RT_VISIBLE_DEVICES)",
            installed=True,
        )
    return NpuProbe(None, device_count=npu.device_count(), installed=True)


def select_device(requested: str, *, local_ranks: int) -> str:
    """Resolve `requested` ("auto" | "cpu" | "npu") to "cpu" or "npu" for a run that puts
    `local_ranks` ranks on this machine.

    "auto" takes the NPU only when torch_npu imports and reports devices, else the CPU.
    Raises ValueError for an unknown choice and DeviceError when NPUs are required (asked
    for, or auto-detected) but unusable or too few.
    """
    if requested not in DEVICE_CHOICES:
        raise ValueError(
            f"device must be one of {', '.join(DEVICE_CHOICES)}; got {requested!r}"
        )
    if requested == "cpu":
        return "cpu"
    probe = probe_npu()
    if probe.problem is not None:
        if requested == "npu":
            raise DeviceError(f"device 'npu' requested but {probe.problem}")
        if probe.installed:
            logger.warning("device 'auto' falls back to cpu: %s", probe.problem)
        return "cpu"
    if probe.device_count < local_ranks:
        raise DeviceError(
            f"device {requested!r} selected NPU, but torch_npu reports {probe.device_count} "
            f"NPU(s) and {local_ranks} rank(s) run on this machine (one NPU per rank); "
            "lower the DP size or pass device 'cpu'"
        )
    return "npu"


def check_kind(kind: str) -> None:
    """A transport's check of the device kind it is handed: one of ``DEVICE_KINDS``
    (``select_device`` resolves "auto" before)."""
    if kind not in DEVICE_KINDS:
        raise ValueError(f"device must be one of {', '.join(DEVICE_KINDS)} (select_device "
                         f"resolves 'auto'); got {kind!r}")


def bind_rank_device(kind: str, local_rank: int) -> tuple[str, str]:
    """Called once in each rank process before its groups are made: pins the rank to its
    device and returns (torch device string, device-group backend)."""
    if kind == "npu":
        _import_torch_npu().set_device(local_rank)
        return f"npu:{local_rank}", "hccl"
    return "cpu", "gloo"
