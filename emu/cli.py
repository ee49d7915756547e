"""`dyntra-emu`: run the emulated DP cluster on a workload and report what DyntraLB did.

Commands:

- ``run``: one cluster run; progress on stderr, the summary table on stdout, and the
  run's files (event logs, metrics.json, summary.md, PNG plots) in an output directory;
- ``ab``: the same workload and seed twice, DyntraLB off and on (or two configs), with
  every metric side by side and overlay plots;
- ``validate``: check a config and a trace for a DP size, list every problem;
- ``replay`` / ``explain``: offline tools over diagnostics logs (emu/replay.py,
  emu/explain.py), registered here when those modules are present;
- ``diff``: kit against vllm-ascend (or two vllm-ascend trees, or two run directories)
  step by step (emu/diff_cli.py, emu/diff.py).

Every user error (bad flag, bad file, contradictory settings) is one message naming the
flag or file:line and what was expected, exit code 2, and nothing is started. Modules
that import torch are imported only when a command needs them, so ``--help`` is quick.
"""

from __future__ import annotations

import argparse
import copy
import difflib
import json
import math
import os
import signal
import sys
import tempfile
import textwrap
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from dyntra_lb.blocks import num_blocks
from dyntra_lb.config import (
    DyntraLBConfig,
    check_deployment,
    load_additional_config,
    unknown_keys,
)
from emu.costs import (
    DEFAULT_PROFILE,
    PROFILES,
    CostProfileError,
    add_fit_arguments,
    load_profile,
    run_fit,
)
from emu.device import DEVICE_CHOICES, DeviceError, select_device
from emu.faults import COLLECTIVE_SITES, FaultPlan, parse_fault, plan_problems
from emu.impl import IMPLS, PLANNERS
from emu.impl.vllm_ascend.tree import ENV_VAR as VLLM_ASCEND_ENV
from emu.limits import MAX_DP_SIZE, MAX_GPU_BLOCKS, MAX_NUM_SEQS, MAX_SECONDS
from emu.recipes import is_recipe, seed_table, write_recipe_trace
from emu.scheduler import SCHEDULING_POLICIES
from emu.workload import ROUTERS, load_trace, validate_trace

TRANSPORTS = ("process", "thread")  # emu.cluster.TRANSPORTS (not imported: it pulls torch)

PROG = "dyntra-emu"

# What `dyntra-emu run` with no --additional-config runs: DyntraLB static mode from step 0.
DEFAULT_ADDITIONAL_CONFIG = {
    "scheduler_config": {"dyntra_lb_config": {"enabled": True, "mode": "static", "start_step": 0}}
}
DEFAULT_DP = 4
DEFAULT_WORKLOAD = "default"
# Defaults of emu.cluster.RunSpec, shown in --help (RunSpec itself applies them; a test
# checks that the two agree).
SPEC_DEFAULTS = {
    "max_num_seqs": 16,
    "max_num_batched_tokens": 8192,
    "block_size": 128,
    "num_gpu_blocks": 4096,
    "router": "round_robin",
    "scheduling_policy": "fcfs",
    "seed": 0,
    "device": "auto",
    "collective_timeout_s": 60.0,
    "transport": "process",
}

# Located next to the package, so it works from a source checkout / editable install.
WORKLOADS_DIR = Path(__file__).resolve().parent.parent / "fixtures" / "workloads"

# Files a run leaves in its directory; --overwrite removes exactly these.
_RUN_FILES = ("run.json", "rank*.events.jsonl", "rank*.wall.jsonl", "rank*.log", "metrics.json",
              "summary.md", "error.txt", "load.png", "bubble.png", "tpot.png",
              "load_ab.png", "bubble_ab.png", "tpot_ab.png", "load_diff.png", "diff.json")
_AB_RUN_DIRS = ("a", "b")

EXIT_USAGE = 2
EXIT_FAILED = 1


class UsageError(Exception):
    """Bad user input found before anything started; each entry of `problems` is one
    complete message (flag or file:line, what was expected)."""

    def __init__(self, *problems: str):
        super().__init__("\n".join(problems))
        self.problems = list(problems)


# ----------------------------------------------------------------------- flag types


def _int_type(minimum: int, maximum: int | None = None):
    expected = (f"an integer >= {minimum}" if maximum is None
                else f"an integer in {minimum}..{maximum}")

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if value < minimum or (maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value

    return parse


def _capped_int(minimum: int, maximum: int, why: str):
    """_int_type(minimum) with an upper bound for values that would exhaust the machine
    once the ranks start."""
    at_least = _int_type(minimum)

    def parse(text: str) -> int:
        value = at_least(text)
        if value > maximum:
            raise argparse.ArgumentTypeError(
                f"expected an integer >= {minimum} and at most {maximum:,} ({why}), "
                f"got {text!r}")
        return value

    return parse


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0 or value > MAX_SECONDS:
        raise argparse.ArgumentTypeError(
            f"expected a number of seconds > 0 (at most {MAX_SECONDS:g}), got {text!r}")
    return value


def _fault(text: str):
    try:
        return parse_fault(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# ----------------------------------------------------------------------- inputs


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
        return Path(path).read_text(encoding="utf-8"), f"{flag} {value}"
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or exc
        raise UsageError(f"{flag} {value}: cannot read {path}: {reason}") from None


def _describe_config(cfg) -> str:
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
        return ["--planner vllm-ascend: only with --impl vllm-ascend (the kit always runs "
                "its own planner, dyntra_lb/planner.py)"]
    try:
        impl.check(args.impl, cfg, dp_size=args.dp, async_scheduling=args.async_scheduling,
                   vllm_ascend=args.vllm_ascend,
                   faults=FaultPlan(tuple(args.fault)) if getattr(args, "fault", None) else None)
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
        needed = num_blocks(request.prompt_tokens + request.output_tokens, block_size)
        if needed > num_gpu_blocks:
            problems.append(
                f"{path}:{line}: request {request.request_id!r} needs {needed} KV blocks "
                f"({request.prompt_tokens} prompt + {request.output_tokens} output tokens, "
                f"--block-size {block_size}) but a rank has --num-gpu-blocks "
                f"{num_gpu_blocks}; it could never run")
    return trace, path, problems


def check_device(device: str, dp: int) -> list[str]:
    """Whether `dp` ranks can run on `device` here (NPU: torch_npu and enough NPUs)."""
    try:
        select_device(device, local_ranks=dp)
    except DeviceError as exc:
        return [f"--device {device}: {exc}"]
    return []


def _local_ranks(args) -> int:
    """Ranks on this machine: all of them, or torchrun's LOCAL_WORLD_SIZE."""
    if getattr(args, "torchrun", None) is None:
        return args.dp
    return int(os.environ.get("LOCAL_WORLD_SIZE", args.dp))


def _spec_kwargs(args) -> dict:
    """RunSpec fields given on the command line (RunSpec applies its defaults to the rest)."""
    names = ("max_num_seqs", "max_num_batched_tokens", "block_size", "num_gpu_blocks",
             "router", "scheduling_policy", "seed", "device", "impl", "vllm_ascend",
             "async_scheduling", "transport", "planner")
    kwargs = {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}
    if getattr(args, "collective_timeout", None) is not None:
        kwargs["collective_timeout_s"] = args.collective_timeout
    if getattr(args, "run_timeout", None) is not None:
        kwargs["run_timeout_s"] = args.run_timeout
    if getattr(args, "strict", False):
        kwargs["strict"] = True
    if getattr(args, "fault", None):
        kwargs["faults"] = FaultPlan(tuple(args.fault))
    if getattr(args, "cost_profile", None) is not None:
        kwargs["cost_model"] = args.cost_profile
    return kwargs


def _effective(args, name: str):
    value = getattr(args, name, None)
    return SPEC_DEFAULTS[name] if value is None else value


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
            workload, args.dp, _effective(args, "block_size"),
            _effective(args, "num_gpu_blocks"))
    problems += trace_problems
    problems += check_cost_model(args)
    if getattr(args, "fault", None) and trace is not None and configs and configs[0]:
        problems += check_faults(args.fault, args.dp, trace, configs[0])
    problems += check_device(_effective(args, "device"), _local_ranks(args))
    if problems:
        raise UsageError(*dict.fromkeys(problems))
    if is_recipe(args.workload):
        label = f"{args.workload} (seed {_effective(args, 'seed')})"
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
        path = write_recipe_trace(args.workload, _effective(args, "seed"), tmp / "trace.jsonl")
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
    """The RunSpec of one run, passed through emu.cluster.validate (the last gate)."""
    from emu.cluster import RunSpec, validate

    spec = RunSpec(trace=prepared.trace, dp_size=args.dp, out_dir=out_dir,
                   additional_config=config.raw, **_spec_kwargs(args))
    try:
        validate(spec)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return spec


def _config_sources(args) -> list[tuple[str, str]]:
    """The one config of `run` / `validate` as (JSON text, name for messages)."""
    if args.no_dyntra_lb:
        return [("{}", "--no-dyntra-lb")]
    if args.additional_config is None:
        return [(json.dumps(DEFAULT_ADDITIONAL_CONFIG), "the default config")]
    return [read_config_arg(args.additional_config)]


# ----------------------------------------------------------------------- output dir


def _default_out_dir(command: str) -> Path:
    """runs/<timestamp>-<command> under the current directory, never an existing one."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    base = Path("runs") / f"{stamp}-{command}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def _existing_run_files(directory: Path) -> list[Path]:
    return sorted(p for pattern in _RUN_FILES for p in directory.glob(pattern))


def prepare_out_dir(value: str | None, overwrite: bool, command: str,
                    subdirs: tuple[str, ...] = ()) -> Path:
    """Create the output directory. An existing directory that holds a previous run's
    files is refused unless --overwrite, which deletes exactly those files (so stale
    rank logs of a larger DP size can never mix into this run)."""
    out = _default_out_dir(command) if value is None else Path(value)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: exists and is not a directory")
    dirs = [out, *(out / s for s in subdirs)]
    stale = [p for d in dirs if d.is_dir() for p in _existing_run_files(d)]
    if stale and not overwrite:
        shown = ", ".join(str(p.relative_to(out)) for p in stale[:3])
        more = f" and {len(stale) - 3} more" if len(stale) > 3 else ""
        raise UsageError(f"--out {out}: already holds a run ({shown}{more}); choose a new "
                         "directory or pass --overwrite to replace it")
    try:
        for d in dirs:
            d.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--out {out}: cannot create the directory: "
                         f"{exc.strerror or exc}") from None
    for p in stale:
        p.unlink()
    return out


# ----------------------------------------------------------------------- progress


class Progress:
    """A progress bar on stderr while a cluster runs, fed by polling the ranks' event
    logs for finished-request records (the engine writes them with ordinary buffered
    writes, so the count advances in chunks of a few kB of log).

    The cluster runs in the calling thread (Ctrl-C then stops its ranks); the poller is
    a daemon thread. Without a terminal (or with --quiet) there is no bar."""

    _REQUEST = b'"kind":"request"'
    _STEP = b'"kind":"step"'
    INTERVAL_S = 0.25

    def __init__(self, out_dir: Path, dp: int, total: int, desc: str, enabled: bool):
        self.paths = [out_dir / f"rank{r}.events.jsonl" for r in range(dp)]
        self.offsets = [0] * dp
        self.done = 0
        self.clock_s = 0.0
        self.total = total
        self.desc = desc
        self.enabled = enabled
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bar = None

    def __enter__(self) -> Progress:
        if self.enabled:
            from tqdm import tqdm

            self._bar = tqdm(total=self.total, desc=self.desc, unit="req", file=sys.stderr,
                             dynamic_ncols=True, leave=True)
            self._thread = threading.Thread(target=self._loop, daemon=True,
                                            name="dyntra-emu-progress")
            self._thread.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            if exc_type is None:
                self.poll()
            self._bar.close()

    def _loop(self) -> None:
        while not self._stop.wait(self.INTERVAL_S):
            self.poll()

    def poll(self) -> None:
        """Read what the ranks appended since the last poll (complete lines only)."""
        for rank, path in enumerate(self.paths):
            try:
                with open(path, "rb") as f:
                    f.seek(self.offsets[rank])
                    chunk = f.read()
            except OSError:  # the rank has not opened its log yet
                continue
            end = chunk.rfind(b"\n")
            if end < 0:
                continue
            chunk = chunk[:end + 1]
            self.offsets[rank] += len(chunk)
            self.done += chunk.count(self._REQUEST)
            if rank == 0:
                self._read_clock(chunk)
        if self._bar is not None:
            self._bar.n = min(self.done, self.total)
            self._bar.set_postfix_str(f"virtual time {self.clock_s:.1f} s", refresh=False)
            self._bar.refresh()

    def _read_clock(self, chunk: bytes) -> None:
        start = chunk.rfind(self._STEP)
        if start < 0:
            return
        line_start = chunk.rfind(b"\n", 0, start) + 1
        line_end = chunk.find(b"\n", start)
        try:
            record = json.loads(chunk[line_start:line_end])
            self.clock_s = record["clock_s"] + record["step_time_s"]
        except (ValueError, KeyError, TypeError):
            pass


def _note(args, text: str) -> None:
    """A status line on stderr (suppressed by --quiet)."""
    if not args.quiet:
        print(text, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------- running


class ClusterFailed(Exception):
    """A cluster run failed after it started; the message is ready to print."""


class RunInterrupted(Exception):
    """SIGINT or SIGTERM stopped a cluster run; the message is ready to print and
    `exit_code` is the shell's status for that signal (130, 143)."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


class Terminated(KeyboardInterrupt):
    """SIGTERM outside a cluster launch (which handles it itself)."""


def _raise_terminated(signum, frame):
    raise Terminated()


def run_one(args, prepared: Prepared, config, out_dir: Path, desc: str):
    """Run one cluster into out_dir with a progress bar and write its metrics.json;
    returns the metrics (None on the ranks other than 0 under torchrun)."""
    from emu.launcher import ClusterError, Interrupted
    from emu.metrics import compute_metrics, load_run, write_metrics

    spec = build_spec(args, prepared, config, out_dir)
    rank = 0 if args.torchrun is None else args.torchrun[0]
    if rank == 0:
        _note(args, f"{desc}: {args.dp} ranks, workload {prepared.workload_label} "
                    f"({len(prepared.trace)} requests), {_describe_config(config)}, "
                    f"seed {spec.seed}; writing {out_dir}")
    bar = rank == 0 and not args.quiet and sys.stderr.isatty()
    start = time.monotonic()
    try:
        with Progress(out_dir, args.dp, len(prepared.trace), desc, bar):
            summaries = _launch(spec, torchrun=args.torchrun is not None)
    except DeviceError as exc:
        raise UsageError(f"--device {spec.device}: {exc}") from None
    except ClusterError as exc:
        (out_dir / "error.txt").write_text(str(exc) + "\n")
        raise ClusterFailed(_cluster_error_text(exc, out_dir)) from None
    except Interrupted as exc:
        (out_dir / "error.txt").write_text(str(exc) + "\n")
        raise RunInterrupted(
            f"interrupted by {exc.signal_name}; every rank was stopped. {out_dir} holds a "
            f"partial run (run.json: interrupted); every rank's report: "
            f"{out_dir / 'error.txt'}", exc.exit_code) from None
    if rank != 0:
        return None
    _note(args, f"{desc}: finished in {time.monotonic() - start:.1f} s wall-clock")
    if any(s.truncated for s in summaries):
        print(f"{PROG}: warning: the run hit max_steps and was cut short; metrics cover "
              "the steps run", file=sys.stderr)
    metrics = compute_metrics(load_run(out_dir),
                              config=_recorded_config(spec, prepared, summaries[0].device),
                              seed=spec.seed)
    write_metrics(metrics, out_dir / "metrics.json")
    return metrics


def _launch(spec, *, torchrun: bool) -> list:
    """Run the cluster; returns the rank summaries available here (all ranks when this
    process spawns them, its own under torchrun)."""
    if not torchrun:
        from emu.cluster import run_cluster

        return run_cluster(spec).ranks
    # Under torchrun this process is one rank.
    from emu.cluster import join_cluster

    try:
        summary = join_cluster(spec)
    except Exception as exc:  # torchrun stops the other ranks and reports the failure
        rank = os.environ.get("RANK")
        raise ClusterFailed(f"rank {rank} failed: {type(exc).__name__}: {exc}") from None
    return [summary]


def torchrun_env() -> tuple[int, int] | None:
    """(rank, world size) when this process was started by torchrun (or a launcher that
    sets the same variables), else None."""
    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    if not all(n in os.environ for n in names):
        return None
    try:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except ValueError:
        raise UsageError("RANK and WORLD_SIZE must be integers (set by torchrun)") from None


def _resolve_dp(args) -> None:
    """--dp defaults to 4, or to WORLD_SIZE under torchrun (where it must equal it)."""
    args.torchrun = torchrun_env() if args.command in ("run", "ab") else None
    if args.torchrun is None:
        if args.dp is None:
            args.dp = DEFAULT_DP
        return
    if args.command == "ab":
        raise UsageError("ab runs two clusters one after the other and cannot run under "
                         "torchrun; start it directly (it spawns its own ranks)")
    if getattr(args, "transport", None) == "thread":
        raise UsageError("--transport thread: under torchrun every rank is its own process; "
                         "drop --transport (or start dyntra-emu directly for threads)")
    world = args.torchrun[1]
    if args.dp is not None and args.dp != world:
        raise UsageError(f"--dp {args.dp}: under torchrun the DP size is WORLD_SIZE={world}")
    args.dp = world
    if args.out is None:
        raise UsageError("--out: required under torchrun, so that every rank writes into "
                         "the same directory (on several nodes: a shared directory)")


def _recorded_config(spec, prepared: Prepared, device: str) -> dict:
    """The `config` of metrics.json: what produced the run."""
    return {
        "additional_config": spec.additional_config,
        "workload": prepared.workload_label,
        "dp_size": spec.dp_size,
        "max_num_seqs": spec.max_num_seqs,
        "max_num_batched_tokens": spec.max_num_batched_tokens,
        "block_size": spec.block_size,
        "num_gpu_blocks": spec.num_gpu_blocks,
        "router": spec.router,
        "scheduling_policy": spec.scheduling_policy,
        "device": device,  # the one used ("cpu" / "npu"), never "auto"
        "cost_model": spec.cost_model.to_dict(),
        **_recorded_impl(spec),
    }


def _recorded_impl(spec) -> dict:
    """Which DyntraLB ran: the impl and, for vllm-ascend, its tree and vLLM's version."""
    if spec.impl == "kit":
        return {"impl": "kit"}
    from emu.impl.vllm_ascend.tree import resolve

    return {"impl": spec.impl, "async_scheduling": spec.async_scheduling,
            "planner": spec.planner or "vllm-ascend", **resolve(spec.vllm_ascend).describe()}


def _cluster_error_text(exc, out_dir: Path) -> str:
    if exc.rank is None:
        head = f"the cluster failed: {exc.message}"
        body = ""
    else:
        head = f"the cluster failed: rank {exc.rank} failed: {exc.message}"
        body = f"\n--- rank {exc.rank} ---\n{exc.details.get(exc.rank, '').rstrip()}"
    return (f"{head}{body}\nEvery rank was stopped. Every rank's report: "
            f"{out_dir / 'error.txt'}; rank logs: {out_dir}")


def cmd_run(args) -> int:
    from emu.metrics import load_run
    from emu.report import summary_table, write_plots, write_summary_md

    prepared = prepare(args, _config_sources(args))
    warn_ignored_keys(args, prepared)
    if args.torchrun is not None and args.torchrun[0] != 0:
        # Rank 0 prepares the directory; every rank writes after the rendezvous.
        out_dir = Path(args.out)
    else:
        out_dir = prepare_out_dir(args.out, args.overwrite, "run")
    metrics = run_one(args, prepared, prepared.configs[0], out_dir, "run")
    if metrics is None:
        return 0
    plots = write_plots(load_run(out_dir), out_dir)
    write_summary_md(out_dir / "summary.md", metrics,
                     title=f"dyntra-emu run: {prepared.workload_label}, dp={args.dp}",
                     plots=plots)
    print(summary_table(metrics))
    print(f"\nOutputs in {out_dir}/: summary.md, metrics.json, "
          f"{', '.join(p.name for p in plots)}, rank<r>.events.jsonl")
    return 0


def _ab_sources(args) -> tuple[list[tuple[str, str]], tuple[str, str]]:
    """The two configs of `ab` as (JSON text, name) and their labels."""
    if args.config_a is not None or args.config_b is not None:
        if args.config_a is None or args.config_b is None:
            missing = "--config-b" if args.config_a is not None else "--config-a"
            raise UsageError(f"{missing}: required when the other of --config-a/--config-b "
                             "is given (ab compares two configs)")
        return ([read_config_arg(args.config_a, "--config-a"),
                 read_config_arg(args.config_b, "--config-b")], ("A", "B"))
    if args.additional_config is None:
        on_text, source = json.dumps(DEFAULT_ADDITIONAL_CONFIG), "the default config"
    else:
        on_text, source = read_config_arg(args.additional_config)
    try:
        on = json.loads(on_text)
    except ValueError:
        on = None  # check_config names the JSON error
    if not isinstance(on, dict):
        return [(on_text, source), (on_text, source)], ("DyntraLB off", "DyntraLB on")
    off = copy.deepcopy(on)
    scheduler = off.get("scheduler_config")
    lb = scheduler.get("dyntra_lb_config") if isinstance(scheduler, dict) else None
    if not isinstance(lb, dict) or lb.get("enabled") is not True:
        ignored = "".join(f"; {message}" for message in unknown_keys(on))
        raise UsageError(f"{source}: does not enable DyntraLB "
                         "(scheduler_config.dyntra_lb_config.enabled is not true), so both "
                         "runs of ab would be the same; enable it, or compare two configs "
                         f"with --config-a and --config-b{ignored}")
    lb["enabled"] = False
    return ([(json.dumps(off), f"{source} with DyntraLB disabled"), (on_text, source)],
            ("DyntraLB off", "DyntraLB on"))


def cmd_ab(args) -> int:
    from emu.metrics import load_run
    from emu.no_effect import no_effect_notes
    from emu.report import (
        ab_table,
        ab_wall_table,
        headroom_summary,
        write_ab_plots,
        write_ab_summary_md,
    )

    sources, labels = _ab_sources(args)
    if args.seeds is not None:
        return _ab_seeds(args, sources, labels)
    prepared = prepare(args, sources)
    warn_ignored_keys(args, prepared)
    out_dir = prepare_out_dir(args.out, args.overwrite, "ab", _AB_RUN_DIRS)
    metrics = []
    for name, label, config in zip(_AB_RUN_DIRS, labels, prepared.configs, strict=True):
        metrics.append(run_one(args, prepared, config, out_dir / name,
                               f"{name.upper()} ({label})"))
    runs = [load_run(out_dir / name) for name in _AB_RUN_DIRS]
    plots = write_ab_plots(runs[0], runs[1], labels, out_dir)
    write_ab_summary_md(out_dir / "summary.md", metrics[0], metrics[1], labels,
                        title=f"dyntra-emu ab: {prepared.workload_label}, dp={args.dp}",
                        plots=plots)
    print(ab_table(metrics[0], metrics[1], labels))
    print()
    wall = ab_wall_table(metrics[0], metrics[1], labels)
    if wall is not None:
        print(wall)
        print()
    print(_ab_headline(metrics[0], metrics[1], labels))
    for line in headroom_summary(metrics[0], metrics[1], labels):
        print(line)
    for label, m in zip(labels, metrics, strict=True):
        for note in no_effect_notes(m):
            print(f"note ({label}): {note}")
    print(f"\nOutputs in {out_dir}/: summary.md, {', '.join(p.name for p in plots)}, "
          f"a/ and b/ (metrics.json and event logs of each run)")
    return 0


def _ab_seeds(args, sources, labels) -> int:
    """``ab --seeds N``: the A/B on N workload seeds of a recipe (--seed, --seed + 1,
    ...), each into DIR/seed<s>/a and b; prints and writes each key delta per seed and
    its mean with a 95 % confidence interval."""
    if not is_recipe(args.workload):
        raise UsageError(f"--seeds {args.seeds}: needs a generated workload "
                         "(--workload recipe:NAME[,n=N][,rate=R]), whose trace changes with "
                         f"the seed; {args.workload!r} is one fixed trace")
    first = _effective(args, "seed")
    seeds = list(range(first, first + args.seeds))
    prepared = []
    for seed in seeds:  # check every seed's trace before anything runs
        args.seed = seed
        prepared.append(prepare(args, sources))
    subdirs = tuple(f"seed{s}/{name}" for s in seeds for name in _AB_RUN_DIRS)
    out_dir = prepare_out_dir(args.out, args.overwrite, "ab", subdirs)
    pairs = []
    for seed, prep in zip(seeds, prepared, strict=True):
        args.seed = seed
        metrics = [run_one(args, prep, config, out_dir / f"seed{seed}" / name,
                           f"seed {seed} {name.upper()} ({label})")
                   for name, label, config in zip(_AB_RUN_DIRS, labels, prep.configs,
                                                  strict=True)]
        pairs.append((seed, metrics[0], metrics[1]))
    from emu.no_effect import no_effect_notes

    table = seed_table(pairs)
    print(f"{labels[1]} vs {labels[0]} on {len(seeds)} seeds of {args.workload}:\n")
    print(table)
    for seed, *metrics in pairs:
        for label, m in zip(labels, metrics, strict=True):
            for note in no_effect_notes(m):
                print(f"note (seed {seed}, {label}): {note}")
    (out_dir / "summary.md").write_text(
        f"# dyntra-emu ab --seeds {args.seeds}: {args.workload}, dp={args.dp}\n\n"
        f"A = `{labels[0]}`, B = `{labels[1]}`; deltas of B against A, per seed and as the "
        "mean with its 95 % confidence interval (Student's t)\n\n```\n" + table + "\n```\n")
    print(f"\nOutputs in {out_dir}/: summary.md, seed<s>/a and seed<s>/b (metrics.json and "
          "event logs of each run)")
    return 0


def _ab_headline(a: dict, b: dict, labels) -> str:
    """The few numbers a reader looks at first, A -> B."""
    rows = [
        ("DP bubble ratio", a["bubble_ratio"], b["bubble_ratio"], 100, " %"),
        ("balance ratio", a["balance_ratio"], b["balance_ratio"], 1, ""),
        ("bubble-free bound (tok/s)", a["headroom"]["sol_throughput_tok_s"],
         b["headroom"]["sol_throughput_tok_s"], 1, ""),
        ("throughput (tok/s)", a["throughput_tok_s"], b["throughput_tok_s"], 1, ""),
        ("TPOT p50 (ms)", a["tpot_ms"]["p50"], b["tpot_ms"]["p50"], 1, ""),
        ("TPOT p99 (ms)", a["tpot_ms"]["p99"], b["tpot_ms"]["p99"], 1, ""),
        ("virtual time (s)", a["virtual_time_s"], b["virtual_time_s"], 1, ""),
    ]
    width = max(len(r[0]) for r in rows)
    lines = [f"Key metrics, {labels[0]} -> {labels[1]}:"]
    for name, va, vb, scale, unit in rows:
        if va is None or vb is None:
            lines.append(f"  {name:<{width}}  -")
            continue
        rel = f" ({(vb - va) / abs(va) * 100:+.1f} %)" if va else ""
        lines.append(f"  {name:<{width}}  {va * scale:.3f}{unit} -> {vb * scale:.3f}{unit}"
                     f"{rel}")
    return "\n".join(lines)


def cmd_validate(args) -> int:
    problems: list[str] = []
    sources = []
    try:
        sources = _config_sources(args)
    except UsageError as exc:  # unreadable @file: still check the workload
        problems += exc.problems
    try:
        prepared = prepare(args, sources)
        problems += prepared.warnings
        if not problems:
            build_spec(args, prepared, prepared.configs[0], Path("."))
    except UsageError as exc:
        problems += exc.problems
    if problems:
        for problem in problems:
            print(f"problem: {problem}")
        print(f"{len(problems)} problem(s) found")
        return EXIT_FAILED
    from emu.no_effect import trace_warnings

    for warning in trace_warnings(prepared.configs[0].dyntra_lb, prepared.trace,
                                  _effective(args, "block_size")):
        print(f"warning: {warning}")
    impl = "" if args.impl == "kit" else f" with --impl {args.impl}"
    print(f"OK: {sources[0][1]} ({_describe_config(prepared.configs[0])}) and workload "
          f"{prepared.workload_label} ({len(prepared.trace)} requests) are valid for "
          f"dp={args.dp}{impl}")
    return 0


# ----------------------------------------------------------------------- parser


_TOP_EPILOG = """\
examples:
  dyntra-emu run                                 # bundled default workload, dp=4, DyntraLB static
  dyntra-emu run --workload longtail --out runs/lt
  dyntra-emu ab --workload longtail              # DyntraLB off vs on, side by side
  dyntra-emu validate --additional-config @decode.json --dp 8
  dyntra-emu run --cost-model planner-heuristic  # another step-cost profile
  dyntra-emu fit-cost steps.csv --out node.json  # a profile from steps measured on a node
  dyntra-emu diff --workload longtail --dp 2     # kit vs vllm-ascend's DyntraLB, step by step
  dyntra-emu <command> --help                    # options of one command

Bundled workloads: default, uniform, longtail, bimodal (fixtures/workloads/).
Metrics are documented in docs/metrics.md.
"""

_RUN_EPILOG = """\
examples:
  dyntra-emu run
      bundled default workload, 4 ranks, DyntraLB static mode from step 0
  dyntra-emu run --workload longtail --dp 2 --out runs/longtail
  dyntra-emu run --workload my_trace.jsonl --additional-config @decode_node.json
  dyntra-emu run --additional-config \\
      '{"scheduler_config": {"dyntra_lb_config": {"enabled": true, "mode": "dynamic"}}}'
  dyntra-emu run --no-dyntra-lb                  # plain DP, same as --additional-config '{}'

The output directory gets rank<r>.events.jsonl (event logs), rank<r>.wall.jsonl
(wall-clock times), rank<r>.log (DyntraLB log), metrics.json (docs/metrics.md),
summary.md, the plots load.png, bubble.png, tpot.png, and run.json (whether the run
finished: complete, failed, interrupted; error.txt then holds every rank's report).
SIGINT (Ctrl-C) and SIGTERM stop every rank and exit 130 and 143.
Without --out it is runs/<date>-<time>-run under the current directory.
"""

_AB_EPILOG = """\
examples:
  dyntra-emu ab --workload longtail
      DyntraLB off (A) vs the default config, static mode from step 0 (B)
  dyntra-emu ab --additional-config @decode_node.json
      the config with DyntraLB disabled (A) vs as given (B)
  dyntra-emu ab --config-a @static.json --config-b @dynamic.json --out runs/modes

The output directory gets summary.md, load_ab.png, bubble_ab.png, tpot_ab.png, and
a/ and b/ with each run's event logs and metrics.json.
"""

_VALIDATE_EPILOG = """\
examples:
  dyntra-emu validate                            # the defaults `dyntra-emu run` would use
  dyntra-emu validate --additional-config @decode_node.json --dp 8
  dyntra-emu validate --workload my_trace.jsonl --dp 2 --block-size 16

Exit code 0 and an "OK" line when everything is valid; 1 and one "problem:" line per
problem otherwise; 2 for a bad flag.
"""


_FIT_EPILOG = """\
examples:
  dyntra-emu fit-cost steps.csv --name node-a --out node-a.json
  dyntra-emu fit-cost steps.csv --terms fixed_s,per_kv_token_s
  dyntra-emu run --cost-model node-a.json

steps.csv has a header and one row per measured step:
  running_requests,kv_tokens,scheduled_tokens,step_ms
"""


def cmd_fit_cost(args) -> int:
    try:
        return run_fit(args)
    except CostProfileError as exc:
        raise UsageError(str(exc)) from None


def _wrap(text: str) -> str:
    return textwrap.fill(text, 88)


class _Formatter(argparse.RawDescriptionHelpFormatter):
    def __init__(self, prog):
        super().__init__(prog, max_help_position=34)


def _add_input_options(parser: argparse.ArgumentParser, *, single_config: bool,
                       impl: bool = True) -> None:
    """The flags that define a run; ``impl`` False leaves out --impl (diff picks the
    impl of each of its two runs itself)."""
    d = SPEC_DEFAULTS
    parser.add_argument(
        "--workload", metavar="FILE|NAME", default=DEFAULT_WORKLOAD,
        help="trace file (JSON Lines, see fixtures/README.md), the name of a bundled "
             f"workload: {', '.join(bundled_workloads()) or 'none installed'}, or a "
             "generated one, recipe:NAME[,n=N][,rate=R] (fixtures/generate.py recipes, "
             f"e.g. recipe:pr12292,n=200; seeded with --seed) (default: {DEFAULT_WORKLOAD})")
    parser.add_argument("--dp", type=_capped_int(1, MAX_DP_SIZE, "rank processes"), metavar="N",
                        help=f"number of DP ranks (default: {DEFAULT_DP}; "
                             "under torchrun: WORLD_SIZE)")
    if single_config:
        group = parser.add_mutually_exclusive_group()
        group.add_argument(
            "--additional-config", metavar="JSON|@FILE",
            help="vllm-ascend's --additional-config for the decode node, as JSON or @file "
                 "(default: DyntraLB static mode from step 0)")
        group.add_argument("--no-dyntra-lb", action="store_true",
                           help="plain DP without DyntraLB (same as --additional-config '{}')")
    parser.add_argument("--max-num-seqs", type=_capped_int(1, MAX_NUM_SEQS, "requests per rank"),
                        metavar="N",
                        help=f"vLLM max_num_seqs per rank (default: {d['max_num_seqs']})")
    parser.add_argument("--block-size", type=_int_type(1), metavar="N",
                        help=f"tokens per KV block (default: {d['block_size']})")
    parser.add_argument("--num-gpu-blocks",
                        type=_capped_int(1, MAX_GPU_BLOCKS, "each rank keeps every block id"),
                        metavar="N",
                        help=f"KV blocks per rank (default: {d['num_gpu_blocks']})")
    parser.add_argument("--max-num-batched-tokens", type=_int_type(1), metavar="N",
                        help="token budget per step per rank "
                             f"(default: {d['max_num_batched_tokens']})")
    parser.add_argument("--router", choices=ROUTERS,
                        help="how unpinned requests are assigned to ranks: round_robin, or "
                             "least_loaded (vLLM's front end: lowest waiting*4 + running) "
                             f"(default: {d['router']})")
    parser.add_argument("--scheduling-policy", choices=SCHEDULING_POLICIES,
                        help=f"vLLM scheduling policy (default: {d['scheduling_policy']})")
    parser.add_argument("--cost-model", metavar="NAME|FILE.json",
                        help="step-cost profile: a bundled one ("
                             f"{', '.join(PROFILES)}) or a profile file, e.g. from "
                             f"`{PROG} fit-cost` (default: {DEFAULT_PROFILE}; "
                             "docs/cost-models.md)")
    if impl:
        parser.add_argument(
            "--impl", choices=IMPLS, default="kit",
            help="which DyntraLB runs in the ranks: kit (ours, dyntra_lb/, in the stub "
                 "engine) or vllm-ascend (vllm-ascend's own, unmodified, on vLLM's engine "
                 "loop and scheduler; needs vLLM, see README) (default: kit)")
    parser.add_argument("--vllm-ascend", metavar="PATH",
                        help="vllm-ascend source tree for --impl vllm-ascend (default: "
                             f"${VLLM_ASCEND_ENV}, else the installed vllm_ascend)")
    parser.add_argument("--planner", choices=PLANNERS,
                        help="the planner of --impl vllm-ascend ranks: vllm-ascend's "
                             "_balance_load, or kit (dyntra_lb/planner.py in its place, the "
                             "rest of vllm-ascend unchanged) (default: the impl's own)")
    parser.add_argument("--async-scheduling", action="store_true", default=False,
                        help="vLLM's async scheduling (the Async* DyntraLB scheduler; "
                             "--impl vllm-ascend only)")
    parser.add_argument("--device", choices=DEVICE_CHOICES,
                        help="where the ranks' lockstep collective runs: cpu (gloo), npu "
                             "(HCCL, needs torch_npu), auto = npu when usable "
                             f"(default: {d['device']})")


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seed", type=_int_type(0, 2**32 - 1), metavar="N",
                        help=f"seed of every rank's RNGs (default: {SPEC_DEFAULTS['seed']})")
    parser.add_argument("--out", metavar="DIR",
                        help="output directory (default: runs/<date>-<time>-<command>)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace a previous run's files in --out DIR")
    parser.add_argument("--collective-timeout", type=_seconds, metavar="S",
                        help="a collective that waits longer than S seconds fails the run "
                             f"(default: {SPEC_DEFAULTS['collective_timeout_s']:g})")
    parser.add_argument("--run-timeout", type=_seconds, metavar="S",
                        help="stop the run after S seconds of wall-clock time (default: none)")
    parser.add_argument("--strict", action="store_true",
                        help="check invariants every step on every rank (requests and KV "
                             "blocks conserved, paused requests keep their KV, admission "
                             "only from the plan's set); slower")
    parser.add_argument("--quiet", action="store_true",
                        help="no progress bar or status lines on stderr")
    parser.add_argument("--transport", choices=TRANSPORTS,
                        help="process: one process per rank over gloo; thread: every rank a "
                             "thread of this process, collectives in memory (CPU only; same "
                             "event logs and metrics, many times faster with more ranks than "
                             f"cores) (default: {SPEC_DEFAULTS['transport']})")


def _add_fault_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--fault", type=_fault, action="append", metavar="KIND:KEY=VALUE,...",
        help="inject a fault (repeatable; emu/faults.py): kill:rank=R,step=S | "
             "slow:rank=R,extra_ms=X | kv_fail:request=ID | kv_never:request=ID"
             "[,timeout_s=T] | not_ready:request=ID,lookups=N | "
             f"delay:rank=R,site=SITE,step=S,seconds=X with SITE one of "
             f"{', '.join(COLLECTIVE_SITES)}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, formatter_class=_Formatter, allow_abbrev=False, epilog=_TOP_EPILOG,
        description=_wrap("Emulated vLLM data-parallel decode cluster with the DyntraLB load "
                          "balancer: run a workload on N rank processes and measure what "
                          "DyntraLB does to the DP bubble, balance and latency."))
    sub = parser.add_subparsers(dest="command", metavar="<command>", title="commands")

    run = sub.add_parser(
        "run", help="run the cluster on a workload; print a summary, write metrics and plots",
        description=_wrap("Run the emulated DP cluster on a workload: progress while it runs, a "
                          "summary table at the end, and the run's files in an output directory."),
        formatter_class=_Formatter, allow_abbrev=False, epilog=_RUN_EPILOG)
    _add_input_options(run, single_config=True)
    _add_run_options(run)
    _add_fault_option(run)
    run.set_defaults(func=cmd_run, parser=run)

    ab = sub.add_parser(
        "ab", help="run a workload with DyntraLB off and on (or two configs), compare",
        description=_wrap("A/B comparison: the same workload and seed, run once per config, one "
                          "after the other; every metric side by side with its absolute and "
                          "relative change, and plots overlaying both runs."),
        formatter_class=_Formatter, allow_abbrev=False, epilog=_AB_EPILOG)
    _add_input_options(ab, single_config=False)
    ab.add_argument("--additional-config", metavar="JSON|@FILE",
                    help="config of run B; run A is the same config with DyntraLB disabled "
                         "(default: DyntraLB static mode from step 0)")
    ab.add_argument("--config-a", metavar="JSON|@FILE",
                    help="config of run A (with --config-b; instead of --additional-config)")
    ab.add_argument("--config-b", metavar="JSON|@FILE", help="config of run B")
    ab.add_argument("--seeds", type=_int_type(2, 100), metavar="N",
                    help="with --workload recipe:NAME: run the A/B on N workload seeds "
                         "(--seed, --seed + 1, ...) and report each delta as a mean with a "
                         "95 %% confidence interval")
    _add_run_options(ab)
    ab.set_defaults(func=cmd_ab, parser=ab)

    validate = sub.add_parser(
        "validate", help="check a config and a trace for a DP size; list every problem",
        description=_wrap("Check what `dyntra-emu run` with the same flags would run, without "
                          "starting anything: the additional config (including vllm-ascend's "
                          "deployment checks for a decode node), every line of the trace, and "
                          "how both fit the DP size and KV settings."),
        formatter_class=_Formatter, allow_abbrev=False, epilog=_VALIDATE_EPILOG)
    _add_input_options(validate, single_config=True)
    _add_fault_option(validate)
    validate.set_defaults(func=cmd_validate, parser=validate)

    fit_cost = sub.add_parser(
        "fit-cost", help="fit a step-cost profile to step times measured on a real node",
        description=_wrap("Least-squares fit of a step-cost profile (docs/cost-models.md) to "
                          "steps measured on a real decode node; prints the coefficients, "
                          "RMSE and R^2 and writes a profile file for --cost-model."),
        formatter_class=_Formatter, allow_abbrev=False, epilog=_FIT_EPILOG)
    add_fit_arguments(fit_cost)
    fit_cost.set_defaults(func=cmd_fit_cost, parser=fit_cost)

    for module in ("emu.replay", "emu.explain", "emu.sweep", "emu.diff_cli"):
        try:
            mod = __import__(module, fromlist=["add_parser"])
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
            continue
        offline = mod.add_parser(sub)
        offline.set_defaults(parser=offline)
    return parser


def _check_combinations(args) -> None:
    if args.command == "ab":
        if args.additional_config is not None and (args.config_a or args.config_b):
            raise UsageError("--additional-config: not allowed with --config-a/--config-b "
                             "(give either one config for B, or both A and B)")


def main(argv=None) -> int:
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    if extras:
        _unrecognized(getattr(args, "parser", parser), extras)
    if getattr(args, "func", None) is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    prog = f"{PROG} {args.command}"
    # SIGTERM (a CI runner, `timeout`) ends the command like Ctrl-C, with a message.
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        if args.command in ("run", "ab", "validate"):
            _resolve_dp(args)
            _check_combinations(args)
        return args.func(args)
    except UsageError as exc:
        _print_problems(prog, exc.problems)
        return EXIT_USAGE
    except ClusterFailed as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except RunInterrupted as exc:
        print(f"\n{prog}: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt as exc:
        name = "SIGTERM" if isinstance(exc, Terminated) else "SIGINT"
        print(f"\n{prog}: interrupted by {name}; no cluster was running", file=sys.stderr)
        return 143 if name == "SIGTERM" else 130


def _unrecognized(parser: argparse.ArgumentParser, extras: list[str]) -> None:
    """argparse's error for unknown arguments, from the subcommand's parser (its usage),
    with the closest known flag suggested."""
    message = f"unrecognized arguments: {' '.join(extras)}"
    flags = [f for action in parser._actions for f in action.option_strings]
    unknown = next((e.split("=")[0] for e in extras if e.startswith("--")), None)
    close = difflib.get_close_matches(unknown, flags, n=1) if unknown else []
    if close:
        message += f" (did you mean {close[0]}?)"
    parser.error(message)


def _print_problems(prog: str, problems: list[str]) -> None:
    if len(problems) == 1:
        print(f"{prog}: error: {problems[0]}", file=sys.stderr)
        return
    print(f"{prog}: error: {len(problems)} problems, nothing was started:", file=sys.stderr)
    for problem in problems:
        print(f"  {problem}", file=sys.stderr)

