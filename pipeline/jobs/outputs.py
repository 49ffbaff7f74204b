"""The files a job writes (bench results): checked before any rank starts, written without
following a link, and only ever as regular files (an output folder may hold what someone else
planted there)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from pipeline.core.checks import ConfigError, Problem

WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
"""Never through a link; a FIFO opens without blocking (and without a reader, not at all)."""


def check_outputs(key: str, folder: Path, names: list[str]) -> None:
    """ConfigError naming `key` unless `folder` is (or can be made) a real folder whose
    outputs `names` are absent or regular files."""
    found = []
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        found.append(f"{key}={folder}: a link or not a folder; name a real folder")
    else:
        for name in names:
            path = folder / name
            if path.is_symlink() or (path.exists() and not path.is_file()):
                found.append(f"{key}: {path} is a link or not a regular file; remove it")
    if found:
        raise ConfigError([Problem(key, message) for message in found])


def write_output(path: Path, data: str | bytes) -> None:
    """Create or replace `path` in place with `data`; OSError if it is a link or not a
    regular file (nothing is written there)."""
    fd = os.open(path, WRITE_FLAGS, 0o644)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file: nothing written")
        view = memoryview(data.encode() if isinstance(data, str) else data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
