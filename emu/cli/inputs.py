"""The inputs of a run, checked before anything starts: the workload, the configs, the
device, faults and the cost profile, gathered into one ``Prepared`` and one RunSpec.

``prepare`` collects every problem it finds (each naming the flag or file:line), so a
user fixes them in one go; ``build_spec`` hands the result to ``emu.spec.validate``, the
last gate.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from dyntra_lb.config import (
    DyntraLBConfig,
    check_deployment,
    load_additional_config,
    unknown_keys,
)
from emu.cli.errors import PROG, UsageError
from emu.cluster.device import DeviceError, select_device
from emu.faults import FaultPlan, plan_problems
from emu.limits import MAX_SMALL_FILE_BYTES, FileTooLarge, read_limited
from emu.rank.costs import CostProfileError, load_profile
from emu.recipes import is_recipe, write_recipe_trace
from emu.spec import RunSpec, knobs, kv_fit_problem, validate
from emu.workload import load_trace, validate_trace

# What `dyntra-emu run` with no --additional-config runs: DyntraLB static mode from step 0.
DEFAULT_ADDITIONAL_CONFIG = {
    "scheduler_config": {"dyntra_lb_config": {"enabled": True, "mode": "static", "start_step": 0}}
}

# Located next to the package, so it works from a source checkout / editable install.
WORKLOADS_DIR = Path(__file__).resolve().parents[2] / "fixtures" / "workloads"


def bundled_workloads() -> list[str]:
    """Names of the traces under fixtures/workloads/ (empty when not installed)."""
    if not WORKLOADS_DIR.is_dir():
        return []
    return sorted(p.stem for p in WORKLOADS_DIR.glob("*.jsonl"))


def resolve_workload(value: str) -> Path:
    """--workload FILE|NAME -> the trace file. An existing path wins; a bare name (no
    directory part, no .jsonl suffix) is a bundled workload."""
    path = Path(value)
    if path.exists():
        return path
    is_name = value and "/" not in value and os.sep not in value and path.suffix != ".jsonl"
    if is_name:
        bundled = WORKLOADS_DIR / f"{value}.jsonl"
        if bundled.is_file():
            return bundled
        names = bundled_workloads()
        if not names:
            raise UsageError(f"--workload {value!r}: no such file, and the bundled workloads "
                             f"are not installed (looked in {WORKLOADS_DIR}); pass a trace "
                             "file")
        raise UsageError(f"--workload {value!r}: no such file and not a bundled workload; "
                         f"bundled workloads are: {', '.join(names)}")
    raise UsageError(f"--workload {value}: no such file")


def read_config_arg(value: str, flag: str = "--additional-config") -> tuple[str, str]:
    """The JSON text of a config flag and the name to use in messages: the value itself,
    or with ``@path`` the file's contents."""
    if not value.startswith("@"):
        return value, flag
    path = value[1:]
    if not path:
        raise UsageError(f"{flag} @: expected a file name after '@'")
    try:
        text = read_limited(path, MAX_SMALL_FILE_BYTES).decode("utf-8")
    except (OSError, UnicodeDecodeError, FileTooLarge) as exc:
        reason = getattr(exc, "strerror", None) or exc
        raise UsageError(f"{flag} {value}: cannot read {path}: {reason}") from None
    return text, f"{flag} {value}"


def describe_config(cfg) -> str:
    """One line saying what a config runs, for status lines."""
    lb = cfg.dyntra_lb
    if not lb.enabled:
        return "DyntraLB off (plain DP)"
    text = f"DyntraLB {lb.mode} mode from step {lb.start_step}"
    if lb.end_step != -1:
        text += f" to {lb.end_step}"
    if lb.bubble_threshold != DyntraLBConfig.bubble_threshold:
        text += f", bubble_threshold {lb.bubble_threshold:g}"
    if lb.mode == "dynamic":
        text += f", long requests > {lb.long_req_block_threshold} blocks"
    return text


@dataclass
class Prepared:
    """Inputs of one or more cluster runs, checked."""

    trace: list
    workload_label: str
    configs: list  # AdditionalConfig per run
    warnings: list  # keys of the configs that vllm-ascend ignores (config.unknown_keys)


def _line_numbers(path: Path) -> list[int]:
    """Physical line numbers of the non-blank lines of a valid trace (one per request)."""
    lines = path.read_bytes().split(b"\n")
    return [i for i, line in enumerate(lines, start=1) if line.strip()]


def check_config(text: str, source: str, args) -> tuple[object | None, list[str]]:
    """Parse an --additional-config value and run the startup checks of a decode
    (kv_consumer) node with --dp ranks, as --impl runs it (emu.impl). Returns
    (AdditionalConfig or None, problems)."""
    try:
        cfg = load_additional_config(text)
    except ValueError as exc:
        return None, [f"{source}: {exc}"]
    try:
        check_deployment(cfg, kv_role="kv_consumer", data_parallel_size=args.dp)
    except ValueError as exc:
        if cfg.dyntra_lb.enabled and args.dp <= 1:
            return cfg, [f"--dp {args.dp}: {exc} DyntraLB is enabled by {source}; use --dp 2 "
                         "or more, or run plain DP (--no-dyntra-lb)"]
        return cfg, [f"{source}: {exc}"]
    return cfg, []


def check_impl(args, cfg) -> list[str]:
    """What --impl needs beyond the config itself (the kit: the plain synchronous
    scheduler; vllm-ascend: its tree and vLLM)."""
    from emu import impl

    if args.impl == "kit" and getattr(args, "planner", None) == "vllm-ascend":
        return ["--planner vllm-ascend: only with --impl vllm-ascend (the kit runs the "
                "planners of dyntra_lb/planners.py: reference, fill-protect)"]
    try:
        impl.get(args.impl).check(cfg, dp_size=args.dp,
                                  async_scheduling=args.async_scheduling,
                                  vllm_ascend=args.vllm_ascend)
    except ValueError as exc:
        return [f"--impl {args.impl}: {exc}"]
    return []


def check_workload(value: str, dp: int, block_size: int,
                   num_gpu_blocks: int) -> tuple[list | None, Path | None, list[str]]:
    """Resolve and load --workload, checking every line, pinned ranks against `dp` and
    that every request fits a rank's KV pool. Returns (trace, path, problems)."""
    try:
        path = resolve_workload(value)
    except UsageError as exc:
        return None, None, exc.problems
    problems = validate_trace(path, dp_size=dp)
    if problems:
        return None, path, problems
    trace = load_trace(path, dp_size=dp)
    lines = _line_numbers(path)
    for request, line in zip(trace, lines, strict=True):
        problem = kv_fit_problem(request, block_size, num_gpu_blocks)
        if problem is not None:
            problems.append(f"{path}:{line}: {problem}")
    return trace, path, problems


def check_device(device: str, dp: int) -> list[str]:
    """Whether `dp` ranks can run on `device` here (NPU: torch_npu and enough NPUs)."""
    try:
        select_device(device, local_ranks=dp)
    except DeviceError as exc:
        return [f"--device {device}: {exc}"]
    return []


def prepare(args, config_sources: list[tuple[str, str]]) -> Prepared:
    """Check the workload and every (config text, source name) for args.dp; raise
    UsageError listing every problem found."""
    problems: list[str] = []
    configs = []
    ignored: dict[str, list[str]] = {}  # message -> the sources that have it
    for text, source in config_sources:
        cfg, config_problems = check_config(text, source, args)
        configs.append(cfg)
        problems += config_problems or (check_impl(args, cfg) if cfg is not None else [])
        for message in unknown_keys(cfg) if cfg is not None else []:
            ignored.setdefault(message, []).append(source)
    # ab's run A is derived from B's config: name the source the user wrote (the last).
    warnings = [f"{sources[-1]}: {message}" for message, sources in ignored.items()]
    with tempfile.TemporaryDirectory(prefix="dyntra-emu-recipe-") as tmp:
        workload, recipe_problems = _generated_workload(args, Path(tmp))
        problems += recipe_problems
        trace, path, trace_problems = (None, None, []) if workload is None else check_workload(
            workload, args.dp, args.block_size,
            args.num_gpu_blocks)
    problems += trace_problems
    problems += check_cost_model(args)
    if getattr(args, "fault", None) and trace is not None and configs and configs[0]:
        problems += check_faults(args.fault, args.dp, trace, configs[0])
    problems += check_device(args.device, local_ranks(args))
    if problems:
        raise UsageError(*dict.fromkeys(problems))
    if is_recipe(args.workload):
        label = f"{args.workload} (seed {args.seed})"
    else:
        label = args.workload if path.parent == WORKLOADS_DIR else str(path)
    return Prepared(trace, label, configs, warnings)


def warn_ignored_keys(args, prepared: Prepared) -> None:
    """run / ab: the run goes ahead as on vllm-ascend, which ignores unknown keys, but the
    user is told (even with --quiet; under torchrun by rank 0 only)."""
    if args.torchrun is not None and args.torchrun[0] != 0:
        return
    for warning in prepared.warnings:
        print(f"{PROG} {args.command}: warning: {warning}", file=sys.stderr, flush=True)


def _generated_workload(args, tmp: Path) -> tuple[str | None, list[str]]:
    """--workload as a trace file to check: the value itself, or for
    ``recipe:NAME,...`` the trace generated with --seed into ``tmp``."""
    if not is_recipe(args.workload):
        return args.workload, []
    try:
        path = write_recipe_trace(args.workload, args.seed, tmp / "trace.jsonl")
    except ValueError as exc:
        return None, [f"--workload {args.workload}: {exc}"]
    return str(path), []


def check_cost_model(args) -> list[str]:
    """Resolve --cost-model NAME|FILE.json into ``args.cost_profile`` (None: RunSpec's
    default profile); returns the problem, if any."""
    args.cost_profile = None
    if getattr(args, "cost_model", None) is None:
        return []
    try:
        args.cost_profile = load_profile(args.cost_model)
    except CostProfileError as exc:
        return [f"--cost-model {exc}"]
    return []


def check_faults(faults, dp: int, trace, cfg) -> list[str]:
    """The --fault values against the run they would be injected into (emu.faults.
    plan_problems: ranks, request ids, collective sites the config enters)."""
    lb = cfg.dyntra_lb
    problems = plan_problems(faults, dp_size=dp, trace=trace,
                             lb_mode=lb.mode if lb.enabled else None)
    return [f"--fault {faults[i].spec()}: {problem}" for i, problem in problems]


def build_spec(args, prepared: Prepared, config, out_dir: Path):
    """The RunSpec of one run, passed through emu.spec.validate (the last gate)."""
    spec = RunSpec(trace=prepared.trace, dp_size=args.dp, out_dir=out_dir,
                   additional_config=config.raw, **spec_kwargs(args))
    try:
        validate(spec)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return spec


def config_sources(args) -> list[tuple[str, str]]:
    """The one config of `run` / `validate` as (JSON text, name for messages)."""
    if args.no_dyntra_lb:
        return [("{}", "--no-dyntra-lb")]
    if args.additional_config is None:
        return [(json.dumps(DEFAULT_ADDITIONAL_CONFIG), "the default config")]
    return [read_config_arg(args.additional_config)]


def spec_kwargs(args) -> dict:
    """The RunSpec fields the command line sets: every knob flag this command has, plus
    --fault and the cost profile ``prepare`` loaded."""
    names = [name for name, _, _ in knobs()]
    kwargs = {n: getattr(args, n) for n in names if hasattr(args, n)}
    if getattr(args, "fault", None):
        kwargs["faults"] = FaultPlan(tuple(args.fault))
    if getattr(args, "cost_profile", None) is not None:
        kwargs["cost_model"] = args.cost_profile
    return kwargs


def local_ranks(args) -> int:
    """Ranks on this machine: all of them, or torchrun's LOCAL_WORLD_SIZE."""
    if getattr(args, "torchrun", None) is None:
        return args.dp
    return int(os.environ.get("LOCAL_WORLD_SIZE", args.dp))
