"""`list`: every option of every config group, with the first line of its file's comment."""

from __future__ import annotations

from pathlib import Path

from pipeline.config.deployment import Configs
from pipeline.config.sources import shipped_root
from pipeline.jobs.report import printable


def defaults() -> dict[str, str]:
    """The option each group composes unless told otherwise (conf/config.yaml's defaults)."""
    found = {}
    for line in (shipped_root() / "config.yaml").read_text().splitlines():
        group, colon, option = line.strip().removeprefix("- ").partition(": ")
        if colon and line.startswith("  - "):
            found[group] = option.strip()
    return found


def description(path: str, width: int = 100) -> str:
    """The first sentence of an option file's leading comment, cut to `width` characters."""
    words = []
    for line in Path(path).read_text(errors="replace").splitlines()[:20]:
        if not line.startswith("#"):
            break
        words.extend(line.lstrip("#").split())
    text = " ".join(words)
    sentence = text.split(". ")[0].rstrip(".")
    if len(sentence) > width:
        sentence = sentence[: width - 3].rsplit(" ", 1)[0] + "..."
    return printable(sentence)


def options_by_group(loaded: Configs) -> dict[str, list[dict]]:
    """Per group, its options: name, description, whether it is the default (the user's
    deployment chooses over conf/config.yaml), and where it comes from (shipped, or the
    user's folder)."""
    chosen, shipped = defaults(), str(shipped_root())
    if loaded.deployment is not None:
        chosen |= loaded.deployment.choices
    groups: dict[str, list[dict]] = {}
    for group, name, path in loaded.sources.options():
        groups.setdefault(group, []).append(
            {
                "name": printable(name),
                "description": description(path),
                "default": chosen.get(group) == name,
                "source": "shipped" if path.startswith(shipped) else "user",
            }
        )
    return groups


def catalog_text(result: dict) -> str:
    lines = []
    for group, found in result["groups"].items():
        lines.append(f"{group}:")
        width = max(len(o["name"]) for o in found)
        for o in found:
            mark = "*" if o["default"] else " "
            user = " (your folder)" if o["source"] == "user" else ""
            lines.append(f"  {mark} {o['name']:<{width}}  {o['description']}{user}")
    lines.append("\n* the default; pick another with GROUP=OPTION, e.g. strategy=rotating")
    return "\n".join(lines)
