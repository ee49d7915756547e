"""The run flags come from RunSpec's fields: every knob with a help text is a flag of
`run` with the field's default and choices, and what the flags parse is what the RunSpec
gets."""

from __future__ import annotations

import argparse

import pytest

from emu.cli.inputs import spec_kwargs
from emu.cli.main import build_parser
from emu.knobs import Choice, Switch
from emu.spec import RunSpec, knobs


def _subparser(command: str) -> argparse.ArgumentParser:
    parser = build_parser()
    return parser._subparsers._group_actions[0].choices[command]


def _actions(command: str) -> dict[str, argparse.Action]:
    return {action.dest: action for action in _subparser(command)._actions}


FLAGGED = [(name, default, knob) for name, default, knob in knobs() if knob.help]


def test_every_knob_with_help_is_a_run_flag_with_the_fields_default():
    actions = _actions("run")
    for name, default, knob in FLAGGED:
        action = actions[name]
        assert action.default == default, name
        if isinstance(knob.kind, Choice):
            assert tuple(action.choices) == knob.kind.values, name
        if not isinstance(knob.kind, Switch):
            assert "(default: " in action.help, name


@pytest.mark.parametrize("command", ["ab", "validate", "diff", "sweep"])
def test_input_knobs_are_flags_of_every_command_that_defines_a_run(command):
    actions = _actions(command)
    inputs = [name for name, _, knob in FLAGGED if knob.section == "input"]
    missing = [n for n in inputs if n not in actions and not (command == "diff" and n == "impl")]
    assert missing == []


def test_knobs_without_help_are_not_flags():
    actions = _actions("run")
    hidden = [name for name, _, knob in knobs() if knob.help is None]
    assert hidden  # e.g. max_steps, the kv latencies
    assert [n for n in hidden if n in actions] == []


def test_parsed_flags_reach_the_runspec():
    args = build_parser().parse_args(
        ["run", "--max-num-seqs", "7", "--block-size", "16", "--router", "least_loaded",
         "--strict", "--transport", "thread", "--collective-timeout", "5", "--seed", "9",
         "--stall-steps", "50"])
    spec = RunSpec(trace=[], dp_size=2, out_dir=".", **spec_kwargs(args))
    assert (spec.max_num_seqs, spec.block_size, spec.router) == (7, 16, "least_loaded")
    assert (spec.strict, spec.transport, spec.collective_timeout_s, spec.seed) == (
        True, "thread", 5.0, 9)
    assert spec.stall_steps == 50


def test_unset_flags_give_the_runspec_its_own_defaults():
    args = build_parser().parse_args(["run"])
    assert RunSpec(trace=[], dp_size=2, out_dir=".", **spec_kwargs(args)) == RunSpec(
        trace=[], dp_size=2, out_dir=".")
