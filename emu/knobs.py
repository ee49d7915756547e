"""The kinds of value a run setting takes, each checked one way and parsed one way.

A ``RunSpec`` field (``emu.spec``) declares its kind and, when users set it on the command
line, its help text. ``emu.spec.check`` checks every field through its kind, and the
CLI builds every such field's flag from the same declaration (``emu.cli.flags``): the
flag's name, type, choices, default and help come from the field, so a new engine knob
is one field plus the code that uses it.

A kind has two faces:

- ``problem(value)``: what is wrong with the value a Python caller put in the spec
  (``"must be ..., got ..."``), or None when it is fine.
- ``parse(text)``: the text a user typed; raises ``argparse.ArgumentTypeError``, which
  argparse reports as a usage error naming the flag. Choices and switches need none:
  argparse reads those itself.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field
from typing import Any


def is_int(value) -> bool:
    """An int that is not a bool (``True`` is an int in Python, never a count here)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
    """An int or float that is not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class Int:
    """An integer in ``minimum``..``maximum`` (no upper bound when None). ``why`` says
    what an upper bound protects (a limit of the machine rather than of the value's
    range), for the flag's error message. ``optional``: None is allowed too (no limit,
    as the field's help says); on the command line it is the flag left out."""

    minimum: int
    maximum: int | None = None
    why: str = ""
    optional: bool = False
    metavar = "N"

    def problem(self, value) -> str | None:
        if value is None and self.optional:
            return None
        if not is_int(value) or value < self.minimum:
            none = ", or None" if self.optional else ""
            return f"must be an int >= {self.minimum}{none}, got {value!r}"
        if self.maximum is not None and value > self.maximum:
            return f"must be at most {self.maximum}, got {value!r}"
        return None

    def parse(self, text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if self.maximum is not None and not self.why:  # a range, not a machine limit
            if value is None or not self.minimum <= value <= self.maximum:
                raise argparse.ArgumentTypeError(
                    f"expected an integer in {self.minimum}..{self.maximum}, got {text!r}")
            return value
        if value is None or value < self.minimum:
            raise argparse.ArgumentTypeError(
                f"expected an integer >= {self.minimum}, got {text!r}")
        if self.maximum is not None and value > self.maximum:
            raise argparse.ArgumentTypeError(
                f"expected an integer >= {self.minimum} and at most {self.maximum:,} "
                f"({self.why}), got {text!r}")
        return value


@dataclass(frozen=True)
class Seconds:
    """A duration in seconds, > 0 and at most ``maximum``; ``optional``: None means no
    limit."""

    maximum: float
    optional: bool = False
    metavar = "S"

    def problem(self, value) -> str | None:
        if value is None and self.optional:
            return None
        if not is_number(value) or not 0 < value <= self.maximum:
            none = ", or None" if self.optional else ""
            return f"must be > 0 and at most {self.maximum:g}{none}, got {value!r}"
        return None

    def parse(self, text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or not 0 < value <= self.maximum:
            raise argparse.ArgumentTypeError(
                f"expected a number of seconds > 0 (at most {self.maximum:g}), got {text!r}")
        return value


@dataclass(frozen=True)
class NonNegativeSeconds:
    """A finite duration >= 0 (set from Python only)."""

    def problem(self, value) -> str | None:
        if not is_number(value) or not math.isfinite(value) or value < 0:
            return f"must be a finite number >= 0 (seconds), got {value!r}"
        return None


@dataclass(frozen=True)
class Choice:
    """One of ``values``; ``optional``: None is allowed too (it means "the default of
    whatever reads it", which the field's help says)."""

    values: tuple[str, ...]
    optional: bool = False

    def problem(self, value) -> str | None:
        if value in self.values or (value is None and self.optional):
            return None
        none = " or None" if self.optional else ""
        return f"must be one of {list(self.values)}{none}, got {value!r}"


@dataclass(frozen=True)
class Switch:
    """A bool; on the command line a flag without a value that turns it on. ``both``:
    the command line has ``--no-...`` too, and neither flag leaves the field None (the
    field then resolves it, as its help says)."""

    both: bool = False

    def problem(self, value) -> str | None:
        if isinstance(value, bool) or (value is None and self.both):
            return None
        return f"must be a bool{' or None' if self.both else ''}, got {value!r}"


@dataclass(frozen=True)
class Text:
    """A string, or None (set the optional way, e.g. a path)."""

    metavar: str = "TEXT"

    def problem(self, value) -> str | None:
        if value is not None and not isinstance(value, str):
            return f"must be a string or None, got {value!r}"
        return None

    def parse(self, text: str) -> str:
        return text


# Which commands show a flag: "input" flags define what runs (run, ab, validate, diff,
# sweep); "run" flags only matter once ranks start (run, ab, sweep).
SECTIONS = ("input", "run")


@dataclass(frozen=True)
class Knob:
    """How one RunSpec field is checked and, with ``help``, set on the command line.

    ``flag`` overrides the flag's name (default: ``--`` and the field's name with dashes);
    ``shown_default`` replaces the field's default in the help text (e.g. where None
    means "the environment variable, else ...")."""

    kind: Any
    help: str | None = None
    section: str = "input"
    flag: str | None = None
    shown_default: str | None = None
    metavar: str | None = field(default=None)


def knob(default, kind, help: str | None = None, **options):
    """A dataclass field of RunSpec with its ``Knob`` in the field's metadata."""
    return field(default=default, metadata={"knob": Knob(kind, help, **options)})
