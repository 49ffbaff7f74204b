"""The docs kept true: every shown output is what its command prints (`<...>` marks what
varies), every program runs, every excerpt is in the file it names, every path and link
resolves, the pages stay within their budgets and hold no session log."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from docsfns import FENCE, ROOT, Block, blocks, commands, pages, prose, shown

BUDGETS = {"README.md": 15_000, "BENCHMARKS.md": 40_000}
"""Bytes a page may hold: README is read in minutes, BENCHMARKS holds current results only."""
PATH = re.compile(r"^(?:pipeline|stages|conf|tests|examples|benchmarks|docs|\.ci)/[\w./-]*$")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
SESSION_LOG = re.compile(r"\b(?:sessions? \d+|this session)\b", re.I)
FENCE_WORDS = re.compile(r"^```(?:bash|console)\n(.*?)^```\n", re.S | re.M)
"""Shell blocks, whose words may name paths."""
HASH = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b")


def shell(command: str) -> subprocess.CompletedProcess[str]:
    """A shown command as a user types it, `hicache-pipeline` being this interpreter's."""
    prelude = f'hicache-pipeline() {{ "{sys.executable}" -m pipeline "$@"; }}\n'
    return subprocess.run(
        ["bash", "-c", prelude + command],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )


CONSOLE = blocks("console")


@pytest.mark.parametrize("block", CONSOLE, ids=[str(b) for b in CONSOLE])
def test_each_shown_output_is_what_its_command_prints(block: Block) -> None:
    before = set(ROOT.iterdir())
    for command, expected in commands(block):
        done = shell(command)
        assert shown(expected).fullmatch(done.stdout), (
            f"{block}: `{command}` printed:\n{done.stdout}{done.stderr[-2000:]}"
        )
    assert set(ROOT.iterdir()) == before  # a shown command leaves no file behind


def test_the_docs_show_commands_and_their_outputs() -> None:
    assert len(CONSOLE) >= 10
    assert all(commands(b) for b in CONSOLE), "a console block with no `$ ` command"


PROGRAMS = [b for b in blocks("python") if not b.note]


@pytest.mark.parametrize("block", PROGRAMS, ids=[str(b) for b in PROGRAMS])
def test_each_program_runs_as_written(block: Block, tmp_path: Path) -> None:
    script = tmp_path / "program.py"
    script.write_text(block.text)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert done.returncode == 0, f"{block}: {done.stderr[-3000:]}"


def test_every_other_block_of_code_is_an_excerpt_or_run_by_a_named_test() -> None:
    """A block that is not a whole program says what it is: `<!-- excerpt: FILE -->` (its
    lines are in FILE, as they run there) or `<!-- run by tests/...py -->`."""
    wrong = []
    for block in blocks("python") + blocks("yaml"):
        if block.note.startswith("excerpt: "):
            source = (ROOT / block.note.removeprefix("excerpt: ")).read_text()
            body = block.text if block.lang == "python" else drop_title(block.text)
            if not any(textwrap.indent(body, " " * n) in source for n in range(0, 17, 4)):
                wrong.append(f"{block}: not in {block.note}")
        elif block.note.startswith("run by "):
            test = ROOT / block.note.removeprefix("run by ")
            if block.page not in test.read_text():
                wrong.append(f"{block}: {test.name} does not read {block.page}")
        elif block.note and block.lang == "python":
            wrong.append(f"{block}: unknown note {block.note!r}")
    assert wrong == []


def drop_title(text: str) -> str:
    """A YAML excerpt may open with a comment naming its file."""
    first, _, rest = text.partition("\n")
    return rest if first.startswith("# ") and "/" in first else text


def named_paths(text: str) -> set[str]:
    spans = re.findall(r"`([^`\s]+)`", text)
    words = [w for b in FENCE_WORDS.findall(text) for w in b.split()]
    return {p.split("::")[0].rstrip(".,:;)") for p in [*spans, *words] if PATH.match(p)}


def test_every_repository_path_the_docs_name_exists() -> None:
    missing = [
        f"{page}: {path}"
        for page, text in pages().items()
        for path in sorted(named_paths(text))
        if "*" not in path and "<" not in path and not (ROOT / path).exists()
    ]
    assert missing == []


def anchors(text: str) -> set[str]:
    """The anchors GitHub makes of a page's headings."""
    found = set()
    for heading in re.findall(r"^#+ (.+)$", FENCE.sub("", text), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug)
    return found


def test_every_internal_link_and_anchor_resolves() -> None:
    broken = []
    for page, text in pages().items():
        for target in LINK.findall(FENCE.sub("", text)):
            if re.match(r"[a-z]+:", target):
                continue  # a web address
            path, _, anchor = target.partition("#")
            where = (ROOT / page).parent / path if path else ROOT / page
            if not where.exists():
                broken.append(f"{page}: {target}")
            elif anchor and anchor not in anchors(where.read_text()):
                broken.append(f"{page}: {target} (no such heading)")
    assert broken == []


def test_every_docs_page_is_reachable_from_the_readme() -> None:
    readme = pages()["README.md"]
    linked = {t.split("#")[0] for t in LINK.findall(readme)}
    top = {p for p in pages() if p.startswith("docs/") and p.count("/") == 1}
    assert top - linked == set()


@pytest.mark.parametrize("page", sorted(BUDGETS))
def test_the_pages_keep_their_size_budgets(page: str) -> None:
    assert len((ROOT / page).read_bytes()) <= BUDGETS[page]


def test_no_session_log_outside_the_history() -> None:
    """History belongs in docs/benchmarks/history/; elsewhere dates and trees are named in
    tables, not sessions or bare commit hashes in prose."""
    found = []
    for page, text in pages().items():
        for number, line in enumerate(prose(text).splitlines(), 1):
            if line.startswith("|"):
                continue  # a table row may name the commit it was measured at
            if SESSION_LOG.search(line) or HASH.search(line):
                found.append(f"{page}:{number}: {line.strip()[:100]}")
    assert found == []
