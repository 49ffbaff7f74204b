"""The job's temporary folders ($TMPDIR/hicache-*): each names the process that made it, so
those of a job killed before it could remove them (SIGKILL) are removed by the next job."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

OWNER = ".owner"
"""In each folder: the maker's pid and start time (a pid alone may be reused)."""


def started(pid: int) -> str | None:
    """When process `pid` started (clock ticks since boot), or None if it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def made_folder(prefix: str) -> str:
    """A fresh temporary folder of this process, after removing the orphans of others."""
    remove_orphans()
    folder = tempfile.mkdtemp(prefix=prefix)
    Path(folder, OWNER).write_text(f"{os.getpid()} {started(os.getpid())}")
    return folder


def remove_orphans() -> list[str]:
    """Remove this user's hicache-* temporary folders whose maker is gone; the removed."""
    removed = []
    for path in Path(tempfile.gettempdir()).glob("hicache-*"):
        if path.is_symlink() or not path.is_dir() or path.stat().st_uid != os.getuid():
            continue
        owner = path / OWNER
        with contextlib.suppress(OSError, ValueError):
            if owner.is_symlink():
                continue
            pid, _, when = owner.read_text().partition(" ")
            if started(int(pid)) != when:  # gone, or another process with its pid
                shutil.rmtree(path, ignore_errors=True)
                removed.append(str(path))
    return removed
