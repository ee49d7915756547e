"""Every relative link of the README and the docs pages leads somewhere: the file
exists, and a ``#anchor`` names a heading of the page it points into (GitHub's anchors).
Links inside code blocks and to other sites are not checked."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
         ROOT / "fixtures" / "README.md", ROOT / "benchmarks" / "RESULTS.md"]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped but for
    hyphens, each space a hyphen."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: pathlib.Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {anchor(h) for h in re.findall(r"^#{1,6} (.*)$", text, re.MULTILINE)}


def broken_links(page: pathlib.Path) -> list[str]:
    broken = []
    for target in LINK.findall(FENCE.sub("", page.read_text())):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, fragment = target.partition("#")
        where = (page.parent / path).resolve() if path else page
        if not where.exists():
            broken.append(f"{target}: no such file")
        elif fragment and where.suffix == ".md" and fragment not in anchors(where):
            broken.append(f"{target}: no heading with that anchor in {where.name}")
    return broken


def test_the_readme_is_a_front_page():
    """At most 300 lines, the set-up commands first; the reference lives in docs/."""
    readme = (ROOT / "README.md").read_text()
    assert readme.count("\n") <= 300
    first_block = readme.split("```bash\n", 1)[1].split("```", 1)[0]
    assert ".venv/bin/dyntra-emu ab " in first_block and ".venv/bin/pytest -n 2 -q" in first_block


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_leads_somewhere(page):
    assert broken_links(page) == []


def test_a_broken_link_is_seen(tmp_path):
    (tmp_path / "there.md").write_text("# A heading — with `code`\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](there.md#a-heading--with-code) [gone](missing.md) "
                    "[no anchor](there.md#elsewhere) [site](https://example.com)\n"
                    "```\n[in code](nowhere.md)\n```\n")
    assert broken_links(page) == ["missing.md: no such file",
                                  "there.md#elsewhere: no heading with that anchor in there.md"]
