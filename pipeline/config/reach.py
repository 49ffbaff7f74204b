"""What a config file may point at: no network endpoint, no file outside its own folder, no
listener beyond loopback. The command line and the library call are the operator's own choice
and may name any; a config file may be a stranger's (see `untrusted`, which reads it).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from pipeline.config.schema_check import shown
from pipeline.core.checks import Problem
from pipeline.core.events import host_of

ENDPOINT_KEYS = ("master", "metadata_server")
"""storage keys that name a network endpoint every rank would connect to."""


def endpoint_problems(data: dict[str, Any], allowed: Sequence[str] = ()) -> list[Problem]:
    """A config file (someone else's, perhaps) may not point the ranks at a network address:
    store addresses come from the command line, the library call, or the operator's
    `--allow-endpoint` list (`master: auto` is fine, it starts a master on loopback)."""
    return [
        Problem(
            f"storage.{key}",
            f"storage.{key} may not be set in a config file (every "
            f"rank would connect there): give it on the command line, storage.{key}=..., or "
            "allow it with --allow-endpoint",
        )
        for key in ENDPOINT_KEYS
        if key in data
        and not (key == "master" and data[key] == "auto")
        and str(data[key]) not in allowed
    ]


PRESET = re.compile(r"[a-z0-9_]+")
"""A bare name of `runtime.links` is a preset (conf/links/<name>.yaml), not a path."""
FILES_READ: dict[str, re.Pattern | None] = {"runtime.links": PRESET, "storage.auth_key_file": None}
"""Keys whose value names a file a job reads (and the pattern of a value that names a shipped
preset instead): a config file may name one only inside its own folder, so it cannot make a
job read a file elsewhere (and echo its values in an error)."""
LISTENERS = ("runtime.metrics_address", "events.endpoint", "events.replay_endpoint")
"""Keys whose value is an address a job listens on: loopback only, from a config file."""


def folder_path(value: Any, root: Path) -> Path | None:
    """The file `value` names inside the config folder `root` (a relative path is the
    folder's), links resolved; None where it lies outside (a `..` step, an absolute path
    elsewhere, a link that leads out) or is a ${...} reference (it could be anything)."""
    text = str(value)
    if "${" in text or ".." in Path(text).parts:
        return None
    real = (root / text).resolve()  # an absolute `text` replaces root
    return real if real.is_relative_to(root.resolve()) else None


def named_files(group: str, data: dict[str, Any]) -> Iterator[tuple[str, str, Any]]:
    """(key, field, value) of each file to read that an option of `group` names (a preset's
    name is no file)."""
    for key, preset in FILES_READ.items():
        head, _, name = key.partition(".")
        value = data.get(name) if head == group else None
        if value is not None and not (preset is not None and preset.fullmatch(str(value))):
            yield key, name, value


def reach_problems(group: str, data: dict[str, Any], root: Path) -> list[Problem]:
    """A file to read outside the folder, or a listener beyond loopback, that a config file
    of `group` names (the command line and the library call may name any: the operator's)."""
    found = [
        Problem(
            key,
            f"{key}: a config file may name a file only inside its config folder (a relative "
            f"path is the folder's): move the file into {root}, or pass {key}=PATH on the "
            "command line",
        )
        for key, _, value in named_files(group, data)
        if folder_path(value, root) is None
    ]
    for key in LISTENERS:
        head, _, name = key.partition(".")
        if head == group and data.get(name) is not None and not loopback(host_of(data[name])):
            message = (
                f"{key}={shown(data[name])}: a config file may bind only a loopback address "
                f"(127.0.0.1, ::1, localhost); to listen there, pass {key}=... on the "
                "command line (or in the library call's overrides)"
            )
            found.append(Problem(key, message))
    return found


def loopback(value: Any) -> bool:
    """Whether `value` is a loopback address (or `localhost`)."""
    if str(value).lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(str(value)).is_loopback
    except ValueError:
        return False


def folder_paths(group: str, data: dict[str, Any], root: Path) -> dict[str, Any]:
    """`data` with each file it names as the path inside the folder `root` it resolves to
    (the job reads that, wherever it runs from)."""
    found = {name: folder_path(value, root) for _, name, value in named_files(group, data)}
    return {**data, **{name: str(path) for name, path in found.items() if path is not None}}
