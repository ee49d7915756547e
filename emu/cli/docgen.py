"""docs/cli.md, the reference of every ``dyntra-emu`` command, generated from the parsers
``emu.cli.main.build_parser`` makes (the flags' ``--help`` texts are their reference):

    python -m emu.cli.docgen > docs/cli.md

Run after changing a command or a flag; ``tests/unit/test_cli_docs.py`` fails while the
page differs from what this prints. The page is Markdown written here from the parsers'
actions (not argparse's help layout), so it is the same whatever the terminal's width
and the Python version.
"""

from __future__ import annotations

import argparse
import sys

from emu.cli.main import build_parser

HEADER = """\
# `dyntra-emu` command reference

Every command and flag of `dyntra-emu` (`python -m emu` is the same), as `dyntra-emu
<command> --help` prints them. Generated from the parsers by `python -m emu.cli.docgen >
docs/cli.md`: do not edit by hand. What the commands are for, with an example each: the
[README](../README.md); exit codes and output files: [usage.md](usage.md).
"""


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:
    [action] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return action


def _invocation(action: argparse.Action, formatter: argparse.HelpFormatter) -> str:
    """How the flag is written: its option strings with the value they take, or a
    positional's name."""
    if not action.option_strings:
        return formatter._metavar_formatter(action, action.dest)(1)[0]
    if action.nargs == 0:
        return ", ".join(action.option_strings)
    value = formatter._format_args(action, action.dest.upper())
    return ", ".join(f"{option} {value}" for option in action.option_strings)


def _section(name: str, parser: argparse.ArgumentParser) -> list[str]:
    formatter = parser._get_formatter()
    lines = [f"## `dyntra-emu {name}`", ""]
    if parser.description:
        lines += [parser.description.strip(), ""]
    for group in parser._action_groups:
        actions = [a for a in group._group_actions
                   if a.help is not argparse.SUPPRESS and not isinstance(a, argparse._HelpAction)]
        if not actions:
            continue
        lines += [f"{group.title[:1].upper()}{group.title[1:]}:", ""]
        for action in actions:
            text = " ".join(formatter._expand_help(action).split()) if action.help else ""
            lines.append(f"- `{_invocation(action, formatter)}`" + (f": {text}" if text else ""))
        lines.append("")
    if parser.epilog:
        lines += ["```text", parser.epilog.strip("\n"), "```", ""]
    return lines


def render() -> str:
    """docs/cli.md's text."""
    parser = build_parser()
    commands = _subparsers(parser)
    summaries = {c.dest: c.help for c in commands._choices_actions}
    lines = [HEADER, "| command | what |", "|---|---|"]
    lines += [f"| [`{name}`](#dyntra-emu-{name}) | {summaries[name]} |"
              for name in commands.choices]
    lines.append("")
    for name, subparser in commands.choices.items():
        lines += _section(name, subparser)
    return "\n".join(lines).rstrip("\n") + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
