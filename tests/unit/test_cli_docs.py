"""docs/cli.md is what ``python -m emu.cli.docgen`` prints from the current parsers, and
the generation does not depend on the terminal: a flag added or changed without
regenerating the page fails here, naming the command that regenerates it."""

import difflib
import pathlib

from emu.cli import docgen

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "cli.md"
REGENERATE = "python -m emu.cli.docgen > docs/cli.md"


def test_docs_cli_md_is_up_to_date():
    expected, written = docgen.render(), PAGE.read_text()
    if written != expected:
        diff = "".join(difflib.unified_diff(written.splitlines(True), expected.splitlines(True),
                                            "docs/cli.md", "generated", n=1))
        raise AssertionError(f"docs/cli.md is out of date; regenerate it with `{REGENERATE}` "
                             f"(from the checkout's root):\n{diff[:4000]}")


def test_the_page_does_not_depend_on_the_terminal(monkeypatch):
    pages = set()
    for columns in ("20", "80", "500"):
        monkeypatch.setenv("COLUMNS", columns)
        pages.add(docgen.render())
    assert len(pages) == 1


def test_every_command_and_flag_is_on_the_page():
    """Each subcommand has its section, and each of its flags a line, with its help."""
    page = PAGE.read_text()
    commands = docgen._subparsers(docgen.build_parser())
    for name, parser in commands.choices.items():
        section = page.split(f"## `dyntra-emu {name}`\n", 1)[1].split("\n## ", 1)[0]
        for action in parser._actions:
            for option in action.option_strings:
                if option not in ("-h", "--help"):
                    assert f"`{option}" in section or f", {option}" in section, (name, option)


def test_the_cli_packages_docstring_names_every_command():
    import emu.cli

    names = docgen._subparsers(docgen.build_parser()).choices
    assert [n for n in names if f"``{n}``" not in emu.cli.__doc__] == []
