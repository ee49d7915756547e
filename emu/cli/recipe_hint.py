"""A recipe that rebuilds a published run carries its setup (``RECIPE_SETUPS`` in
fixtures/generate.py): every command given ``--workload recipe:NAME`` runs the published
value of each setting its own flags leave out (``apply_recipe_setup``, called by
``emu.cli.main`` once the flags are parsed), says which settings came from the recipe,
and, in `run` and `ab`, prints a hint naming the published flags where a flag the user
gave differs (``emu.recipes.setup_hint``)."""

from __future__ import annotations

import argparse
import json
import sys

from emu.recipes import setup_fields, setup_flag, setup_hint, setup_params

# The flags that set a run's additional config: one of them given, the recipe's is not used.
_CONFIG_DESTS = ("additional_config", "no_dyntra_lb", "config_a", "config_b")


def given_dests(parser: argparse.ArgumentParser, argv: list[str]) -> set[str]:
    """The destinations of the flags ``argv`` (a command's arguments) gives itself, the
    defaults left aside: the command is parsed once more with every default suppressed."""
    saved = [(action, action.default) for action in parser._actions]
    try:
        for action, _ in saved:
            action.default = argparse.SUPPRESS
        given, _ = parser.parse_known_args(argv)
    finally:
        for action, default in saved:
            action.default = default
    return {dest for dest in vars(given) if dest not in parser._defaults}


def apply_recipe_setup(args: argparse.Namespace, given: set[str]) -> None:
    """Put the recipe's published value into every setting of ``args`` that no flag in
    ``given`` set (a command without the setting's flag keeps it out); records what
    came from the recipe in ``args.recipe_settings`` (the flags, for the start line)."""
    workload = getattr(args, "workload", None)
    try:
        fields = setup_fields(workload) if workload is not None else {}
        applied = [f"{key}={value:g}" for key, value in setup_params(workload).items()]
    except ValueError:
        fields, applied = {}, []  # the workload's own problem is reported where it is read
    for field, published in fields.items():
        if not hasattr(args, field):
            continue
        if field == "additional_config":
            if given & set(_CONFIG_DESTS):
                continue
            value = json.dumps(published)
            args.config_flag = f"{args.workload.split(',')[0]}'s published --additional-config"
        elif field in given:
            continue
        else:
            value = published
        setattr(args, field, value)
        applied.append(setup_flag(field, published))
    args.recipe_settings = tuple(applied)


def recipe_note(args) -> str:
    """What the start line adds for the settings that came from the recipe ('' for
    none)."""
    settings = getattr(args, "recipe_settings", ())
    if not settings:
        return ""
    return f"; from {args.workload.split(',')[0]}'s published setup: {' '.join(settings)}"


def print_setup_hint(workload: str, spec) -> None:
    """Print the hint on stderr (even with --quiet, like the config warnings)."""
    hint = setup_hint(workload, spec)
    if hint is not None:
        print(hint, file=sys.stderr, flush=True)
