"""The inputs of a run, read from the flags, and the run's RunSpec, built once from them
and checked before anything starts.

Reading is this module's: the workload (a trace file, a bundled workload or a
``recipe:``, with the line of every request), the additional config (``JSON`` or
``@file``) and the cost profile (a name or a file); a problem while reading names the
flag or ``file:line``. Judging is ``emu.spec``'s: ``build_spec`` makes the RunSpec from
the flags and what was read, and ``check_specs`` puts it through ``emu.spec.check``,
which hands back the checked run the command then runs, with ``FlagNames``, which words
every problem in the command line's terms (``--block-size 16``, ``trace.jsonl:3``,
``--fault kill:rank=2,step=5``), so a command and the pytest fixture are refused by the
same rules. Every problem of every input is
listed at once (``UsageError``), so a user fixes them in one go.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from dyntra_lb.config import DyntraLBConfig, unknown_keys
from emu.cli.errors import PROG, UsageError
from emu.cli.flags import flag_of
from emu.faults import FaultPlan
from emu.limits import MAX_SMALL_FILE_BYTES, FileTooLarge, read_limited
from emu.rank.costs import CostProfileError, StepCostModel, load_profile
from emu.recipes import is_recipe, write_recipe_trace
from emu.spec import CheckedRun, RunSpec, SpecError, check, knobs
from emu.traces import LoadedTrace, ReadOptions, Replay, read_trace
from emu.workload import TraceError, TraceRequest, resolve_workload, workload_label

# What `dyntra-emu run` with no --additional-config runs: DyntraLB static mode from step 0.
DEFAULT_ADDITIONAL_CONFIG = {
    "scheduler_config": {"dyntra_lb_config": {"enabled": True, "mode": "static", "start_step": 0}}
}


# ----------------------------------------------------------------------- reading


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


def default_config() -> tuple[str, str]:
    """The config a command runs without --additional-config, and its name."""
    return json.dumps(DEFAULT_ADDITIONAL_CONFIG), "the default config"


def config_source(args) -> tuple[str | None, str, list[str]]:
    """The one config of `run` / `validate` / `diff`: its JSON text (None when its @file
    cannot be read), its name for messages and the problems reading it."""
    if args.no_dyntra_lb:
        return "{}", "--no-dyntra-lb", []
    if args.additional_config is None:
        return (*default_config(), [])
    flag = getattr(args, "config_flag", "--additional-config")  # or the recipe's
    try:
        return (*read_config_arg(args.additional_config, flag), [])
    except UsageError as exc:
        return None, flag, exc.problems


@dataclass(frozen=True)
class TraceReading:
    """How --workload's trace is read and replayed: --workload-format (None: detected),
    --window, --limit and --time-scale, --tokenizer."""

    format: str | None
    replay: Replay
    tokenizer: str | None

    @classmethod
    def of(cls, args) -> TraceReading:
        return cls(args.workload_format,
                   Replay(time_scale=args.time_scale, window=args.window, limit=args.limit),
                   args.tokenizer)


@dataclass(frozen=True)
class Workload:
    """The trace --workload names, read: its requests, what RunSpec.workload calls it,
    where each request came from (``where``), and what the reader left out or changed
    (``notes``, shown to the user)."""

    value: str  # --workload as given
    trace: list[TraceRequest]
    label: str
    path: Path | None  # the trace file; None for a recipe (generated, then read)
    lines: list[int]  # the file line of each request
    notes: tuple[str, ...] = ()

    def where(self, index: int | None) -> str:
        """A request (by index) as messages name it: ``file:line``."""
        if index is None:
            return f"--workload {self.value}"
        if self.path is None:
            return f"--workload {self.value} (request {index})"
        return f"{self.path}:{self.lines[index]}"


@dataclass(frozen=True)
class Inputs:
    """What a command's flags name, read: the workload and the cost profile (None when
    not given, or when it could not be read: then ``problems`` says why)."""

    workload: Workload | None
    cost_model: StepCostModel | None
    problems: list[str]


def read_inputs(args, dp: int, seed: int | None = None) -> Inputs:
    """Read --workload (checked line by line, pinned ranks against ``dp``; a recipe is
    generated with ``seed``, default --seed) and --cost-model."""
    workload, problems = read_workload(args.workload, args.seed if seed is None else seed, dp,
                                       TraceReading.of(args))
    if workload is not None and not getattr(args, "quiet", False):
        for text in workload.notes:
            print(f"note: {text}", file=sys.stderr, flush=True)
    cost_model, cost_problems = read_cost_model(getattr(args, "cost_model", None))
    return Inputs(workload, cost_model, problems + cost_problems)


def read_workload(value: str, seed: int, dp: int | None, reading: TraceReading
                  ) -> tuple[Workload | None, list[str]]:
    """The trace of --workload FILE|NAME|recipe:..., read as ``reading`` says (pinned
    ranks checked against ``dp`` when given), or None and its problems."""
    if is_recipe(value):
        if reading.format is not None:
            return None, [f"--workload-format {reading.format}: --workload {value} is "
                          "generated in our own format (dyntra)"]
        with tempfile.TemporaryDirectory(prefix="dyntra-emu-recipe-") as tmp:
            try:
                path = write_recipe_trace(value, seed, Path(tmp) / "trace.jsonl")
            except ValueError as exc:
                return None, [f"--workload {value}: {exc}"]
            workload, problems = _read_trace(value, path, dp, reading, f"{value} (seed {seed})")
        # The generated file is gone once read: its requests are named by index.
        return (None if workload is None else replace(workload, path=None)), problems
    try:
        path = resolve_workload(value)
    except ValueError as exc:
        return None, [f"--workload {exc}"]
    return _read_trace(value, path, dp, reading, workload_label(value, path))


def _read_trace(value: str, path: Path, dp: int | None, reading: TraceReading, label: str
                ) -> tuple[Workload | None, list[str]]:
    try:
        loaded: LoadedTrace = read_trace(path, format=reading.format, replay=reading.replay,
                                         options=ReadOptions(dp, reading.tokenizer))
    except TraceError as exc:  # every problem of every line
        return None, exc.problems
    if reading.tokenizer is not None and loaded.format != "vllm-custom":
        return None, [f"--tokenizer {reading.tokenizer}: only a vllm-custom trace needs "
                      f"it; {path} was read as {loaded.format}"]
    return Workload(value, loaded.requests, reading.replay.label(label), path, loaded.lines,
                    tuple(loaded.notes)), []


def read_cost_model(value: str | None) -> tuple[StepCostModel | None, list[str]]:
    """--cost-model NAME|FILE.json as a profile (None: not given, or not readable)."""
    if value is None:
        return None, []
    try:
        return load_profile(value), []
    except CostProfileError as exc:
        return None, [f"--cost-model {exc}"]


# ----------------------------------------------------------------------- the spec


def spec_kwargs(args) -> dict:
    """The RunSpec fields this command's knob flags set (by field name)."""
    return {name: getattr(args, name) for name, _, knob in knobs()
            if knob.help is not None and hasattr(args, name)}


def build_spec(args, dp: int, inputs: Inputs, config: str | None, out_dir: Path,
               **fields) -> RunSpec:
    """The RunSpec of one run: the knob flags, --fault, and what ``inputs`` read;
    ``config`` is the JSON text of its additional config; ``fields`` set the
    fields that differ from the flags (ab's and diff's two sides, sweep's transport).
    An input that could not be read is left at RunSpec's default (``check_specs``
    then leaves out the problems that would follow from that)."""
    kwargs = spec_kwargs(args)
    if getattr(args, "fault", None):
        kwargs["faults"] = FaultPlan(tuple(args.fault))
    if inputs.cost_model is not None:
        kwargs["cost_model"] = inputs.cost_model
    workload = inputs.workload
    kwargs.update(fields)
    return RunSpec(trace=[] if workload is None else workload.trace,
                   workload=None if workload is None else workload.label,
                   dp_size=dp, out_dir=out_dir, additional_config=config, **kwargs)


@dataclass(frozen=True)
class FlagNames:
    """``emu.spec.Names`` in the command line's words: a problem's place is the flag and
    its value (``--planner vllm-ascend``), the trace file and line of a request, the
    ``--fault`` value of a fault, the config's source (``--additional-config @x.json``,
    ``--config-b``, ``the default config``); a setting is a flag with a value."""

    spec: RunSpec
    workload: Workload | None
    config_source: str
    cost_model: str | None  # --cost-model as given
    flags: dict[str, str]  # fields set by another flag than their own (ab's --planner-b)

    def where(self, field: str, index: int | None = None) -> str:
        if field == "trace" and self.workload is not None:
            return self.workload.where(index)
        if field == "faults" and index is not None:
            return f"--fault {self.spec.faults.faults[index].spec()}"
        if field == "additional_config":
            return self.config_source
        if field == "cost_model":
            return f"--cost-model {self.cost_model or self.spec.cost_model.name}"
        return self.setting(field, getattr(self.spec, field))

    def setting(self, field: str, value) -> str:
        if field == "additional_config":
            return "--no-dyntra-lb" if value == {} else self.config_source
        flag = self.flags.get(field) or flag_of(field)
        return f"RunSpec.{field}={value!r}" if flag is None else f"{flag} {value}"


def checked_spec(args, inputs: Inputs, spec: RunSpec, source: str,
                 flags: dict[str, str] | None = None, *,
                 local_ranks: int | None = None) -> CheckedRun:
    """``emu.spec.check`` of ``spec`` in the flags' words (``FlagNames``; ``source``
    names its config, ``flags`` the fields another flag set): the checked run, or
    ``emu.spec.SpecError`` with its problems (``emu.spec.Problem``)."""
    names = FlagNames(spec, inputs.workload, source, getattr(args, "cost_model", None),
                      flags or {})
    return check(spec, names, local_ranks=local_ranks)


def check_specs(args, inputs: Inputs, runs: list[tuple], *, local_ranks: int,
                problems: list[str] = ()) -> list[CheckedRun]:
    """Check each (spec, name of its config[, {field: flag} of fields another flag set])
    with ``emu.spec.check``, its device for ``local_ranks`` ranks on this machine;
    returns each checked run, or raises UsageError listing ``problems`` (found while
    reading the configs: then the specs were built without theirs), what ``inputs``
    could not read and every spec's problems, each once. The problems of a field left
    at its default because its input could not be read are not the user's, and are
    left out."""
    found = list(problems) + inputs.problems
    unread = {"trace", "faults"} if inputs.workload is None else set()
    if problems:
        unread |= {"additional_config", "faults"}
    checked = []
    for spec, source, *flags in runs:
        try:
            checked.append(checked_spec(args, inputs, spec, source, *flags,
                                        local_ranks=local_ranks))
        except SpecError as exc:
            found += [str(p) for p in exc.problems if p.field not in unread]
    if found:
        raise UsageError(*dict.fromkeys(found))
    return checked


# ----------------------------------------------------------------------- reporting


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


def ignored_keys(configs: list[tuple[object, str]]) -> list[str]:
    """The keys of the (parsed config, name) pairs that vllm-ascend ignores
    (``dyntra_lb.config.unknown_keys``), each once, named by the last source that has
    it: ab's run A is derived from B's config, and the user wrote B's."""
    ignored: dict[str, list[str]] = {}
    for config, source in configs:
        for message in unknown_keys(config):
            ignored.setdefault(message, []).append(source)
    return [f"{sources[-1]}: {message}" for message, sources in ignored.items()]


def warn_ignored_keys(command: str, warnings: list[str]) -> None:
    """run / ab: the run goes ahead as on vllm-ascend, which ignores unknown keys, but the
    user is told (even with --quiet)."""
    for warning in warnings:
        print(f"{PROG} {command}: warning: {warning}", file=sys.stderr, flush=True)


def local_ranks(dp: int, torchrun: bool) -> int:
    """Ranks on this machine: all of them, or torchrun's LOCAL_WORLD_SIZE."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", dp)) if torchrun else dp
