"""The docs as the checks read them: every page a user reads, its fenced blocks, the note
before each block, and the wildcard that shown outputs use for what varies."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HISTORY = ROOT / "docs" / "benchmarks" / "history"
WILDCARD = "<...>"
"""In a shown output: a line that is only this matches any lines, within a line any text."""
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.S | re.M)
NOTE = re.compile(r"<!-- (.*?) -->\n\n?$")


@dataclass(frozen=True)
class Block:
    """One fenced block of a page: its language, text and the HTML comment right before it."""

    page: str
    line: int
    lang: str
    text: str
    note: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> dict[str, str]:
    """Every page a user reads, by its path from the root: README, BENCHMARKS and docs/,
    history left out (it is kept as it was written)."""
    paths = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return {str(p.relative_to(ROOT)): p.read_text() for p in paths if HISTORY not in p.parents}


def blocks(lang: str | None = None) -> list[Block]:
    """Every fenced block of every page (of one language, if given)."""
    found = []
    for page, text in pages().items():
        for m in FENCE.finditer(text):
            if lang is not None and m.group(1) != lang:
                continue
            before = NOTE.search(text[: m.start()])
            note = before.group(1) if before else ""
            line = text.count("\n", 0, m.start()) + 1
            found.append(Block(page, line, m.group(1), m.group(2), note))
    return found


def prose(text: str) -> str:
    """A page without its fenced blocks (blank lines in their place) and inline code."""
    blank = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return re.sub(r"`[^`\n]*`", "", blank)


def shown(expected: str) -> re.Pattern[str]:
    """A shown output as a pattern: every character literal but the wildcard."""
    parts = []
    for line in expected.splitlines(keepends=True):
        if line.rstrip("\n") == WILDCARD:
            parts.append(r"(?:.*\n)*?")
        else:
            parts.append(".*?".join(re.escape(piece) for piece in line.split(WILDCARD)))
    return re.compile("".join(parts))


def commands(block: Block) -> list[tuple[str, str]]:
    """(command, its shown output) of each `$ ` line of a console block."""
    found: list[tuple[str, str]] = []
    for line in block.text.splitlines(keepends=True):
        if line.startswith("$ "):
            found.append((line[2:].strip(), ""))
        elif found:
            found[-1] = (found[-1][0], found[-1][1] + line)
    return found
