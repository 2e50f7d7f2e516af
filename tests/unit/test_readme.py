"""README.md stays short and its links and those of docs/ stay true.

The README is the way in: what entroloop is, the two set-up commands, how to attach it, where each
part lives; the detail lives in docs/. These checks keep it that way.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
README_MAX_BYTES = 14_000

# [text](target) and ![alt](target); the target ends at whitespace or the closing parenthesis.
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)


def _pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def _without_code(text: str) -> str:
    """Markdown outside fenced blocks and inline code spans (links there are not links)."""
    text = _FENCE.sub("", text)
    return re.sub(r"`[^`\n]*`", "", text)


def _relative_links(page: Path) -> list[str]:
    links = []
    for target in _LINK.findall(_without_code(page.read_text(encoding="utf-8"))):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("#"):
            continue  # http(s), mailto, ... and anchors within the page
        links.append(target)
    return links


def _commands(block: str) -> list[str]:
    """The commands of a shell block: each line without its comment, blank lines dropped."""
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.split("#", 1)[0].strip()]


def test_readme_is_at_most_14000_bytes():
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes (limit {README_MAX_BYTES}): move detail into docs/"


def test_every_relative_link_points_to_an_existing_file():
    broken = []
    for page in _pages():
        for target in _relative_links(page):
            path = unquote(target.split("#", 1)[0])
            if not path:
                continue
            if not (page.parent / path).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, "links to missing files:\n  " + "\n  ".join(broken)


def test_readme_links_every_docs_page():
    linked = {
        (README.parent / unquote(t.split("#", 1)[0])).resolve() for t in _relative_links(README)
    }
    missing = [str(p.relative_to(ROOT)) for p in sorted(DOCS.glob("*.md")) if p.resolve() not in linked]
    assert not missing, f"README.md does not link {missing}"


def test_readme_has_exactly_the_two_setup_commands_in_a_fenced_block():
    blocks = [_commands(block) for block in _FENCE.findall(README.read_text(encoding="utf-8"))]
    assert ["make demo", "make test"] in blocks, "README.md needs one fenced block with `make demo` and `make test`"
    make_commands = [cmd for block in blocks for cmd in block if cmd.startswith("make ")]
    assert make_commands == ["make demo", "make test"], f"README.md shows other set-up commands: {make_commands}"
