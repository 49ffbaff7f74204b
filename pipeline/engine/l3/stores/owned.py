"""What in a file store's folder is the store's own: the objects whose place and header prove
it (`pipeline.core.l3_owned`), and the temporary files of its writes. Nothing else is counted,
read past its first bytes, or removed: a user's files beside or inside the namespace folders
are left alone, whatever their names.

A file is looked at without following a link, and read only where it is a regular file; its
access time (the store's own record of its last use) is kept where the kernel lets us
(O_NOATIME: the owner, or root).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field

from pipeline.core.l3 import MAX_OBJECT_BYTES
from pipeline.core.l3_owned import LEAF, NAMESPACE, PREFIX, name_bytes, names_itself, tenant_of
from pipeline.engine.l3.stores.beneath import FOLDER_FLAGS, Beneath

TEMPORARY = ".tmp-"
"""How a write in flight is named (`FileStore.put`), beside the object it becomes."""
TEMPORARY_NAME = re.compile(r"\.tmp-[0-9a-f]{16}")
"""A temporary file's whole name: the prefix and 16 hex digits (`secrets.token_hex(8)`)."""
STALE_TEMPORARY_NS = 3600 * 10**9
"""A temporary file this old is a crashed writer's (a write takes milliseconds): an
eviction pass removes it."""
PEEK_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
"""A file opened to look at: never through a link, a FIFO opens without blocking."""


@dataclass(frozen=True)
class Stored:
    """One object (or temporary file) in the folder, as a walk found it."""

    name: str
    size: int
    used_ns: int
    """When it was last written or read (its access time; a temporary file: its change)."""
    inode: int


@dataclass
class Passed:
    """What a walk passed by: temporary files, and the paths it could not look into."""

    temporaries: list[Stored] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """'path: why' for a folder it could not read and a file in an object's place that is not
    one (left alone, never counted)."""


def walk(
    beneath: Beneath, passed: Passed | None = None, tenant: str | None = None
) -> Iterator[Stored]:
    """Every object below the root: namespace/prefix/key files whose header names them,
    found without following a link; one that goes while the walk runs is left out. With
    `tenant`, only the objects of that tenant's namespaces."""
    passed = passed if passed is not None else Passed()
    try:
        spaces = _folders(beneath.fd, "", NAMESPACE, passed)
    except ValueError as e:
        raise ValueError(f"storage.path={beneath.path}: {e}") from e
    if tenant is not None:
        spaces = [space for space in spaces if tenant_of(space) == tenant]
    for space in spaces:
        with _opened(beneath.fd, space, passed) as inner:
            if inner is not None:
                yield from _prefixes(inner, space, passed)


def _prefixes(fd: int, space: str, passed: Passed) -> Iterator[Stored]:
    for prefix in _folders(fd, space, PREFIX, passed):
        with _opened(fd, prefix, passed, space) as leaves:
            if leaves is not None:
                yield from _objects(leaves, f"{space}/{prefix}", passed)


def _folders(fd: int, where: str, pattern: re.Pattern[str], passed: Passed) -> list[str]:
    return [n for n in _names(fd, where, passed) if pattern.fullmatch(n) and _is_dir(fd, n)]


def _names(fd: int, where: str, passed: Passed) -> list[str]:
    try:
        with os.scandir(fd) as entries:
            return sorted(e.name for e in entries)
    except OSError as e:
        if not where:
            raise ValueError(f"the store's folder cannot be listed ({e.strerror})") from e
        passed.notes.append(f"{where}: not read ({e.strerror})")
        return []


def _is_dir(fd: int, name: str) -> bool:
    try:
        return stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


@contextlib.contextmanager
def _opened(fd: int, name: str, passed: Passed, above: str = "") -> Iterator[int | None]:
    """The folder `name` below `fd`, open (None where it went or cannot be opened)."""
    try:
        inner = os.open(name, FOLDER_FLAGS, dir_fd=fd)
    except FileNotFoundError:
        inner = None
    except OSError as e:
        passed.notes.append(f"{above}/{name}".lstrip("/") + f": not read ({e.strerror})")
        inner = None
    try:
        yield inner
    finally:
        if inner is not None:
            os.close(inner)


def _objects(fd: int, folder: str, passed: Passed) -> Iterator[Stored]:
    prefix = folder.rsplit("/", 1)[1]
    for leaf in _names(fd, folder, passed):
        name = f"{folder}/{leaf}"
        if TEMPORARY_NAME.fullmatch(leaf):
            with contextlib.suppress(OSError):
                info = os.stat(leaf, dir_fd=fd, follow_symlinks=False)
                if stat.S_ISREG(info.st_mode):
                    passed.temporaries.append(
                        Stored(name, info.st_size, info.st_mtime_ns, info.st_ino)
                    )
            continue
        key = LEAF.fullmatch(leaf)
        if key is None or not key.group(1).startswith(prefix):
            continue  # not in an object's place: not ours, not worth a note
        found = _proven(fd, leaf, name)
        if isinstance(found, Stored):
            yield found
        elif found:
            passed.notes.append(f"{name}: {found}")


def _proven(fd: int, leaf: str, name: str) -> Stored | str:
    """The object `leaf` if it is a regular file whose header names it as `name`; else why
    not ('' where it went meanwhile)."""
    try:
        opened = peek(fd, leaf)
    except FileNotFoundError:
        return ""
    except OSError as e:
        return f"not read ({e.strerror})"
    try:
        info = os.fstat(opened)
        if not stat.S_ISREG(info.st_mode):
            return "not a regular file"
        if info.st_size > MAX_OBJECT_BYTES:
            return "larger than any object: not an object of this store"
        if not names_itself(os.pread(opened, name_bytes(name), 0), name):
            return "no header naming it: not an object of this store"
        info = os.fstat(opened)  # after the read: an access time the read may have moved
        return Stored(name, info.st_size, info.st_atime_ns, info.st_ino)
    except OSError as e:
        return f"not read ({e.strerror})"
    finally:
        os.close(opened)


def peek(fd: int, leaf: str) -> int:
    """`leaf` below the folder `fd` opened for reads, its access time kept where we may."""
    try:
        return os.open(leaf, PEEK_FLAGS | os.O_NOATIME, dir_fd=fd)
    except PermissionError as e:  # O_NOATIME: only the file's owner (EPERM)
        if e.errno != errno.EPERM:
            raise
        return os.open(leaf, PEEK_FLAGS, dir_fd=fd)


def unlink_unchanged(beneath: Beneath, stored: Stored) -> str:
    """Remove `stored` if it is still the file the walk found, unused since: 'removed';
    'kept' where it changed (rewritten, or read: no longer the least recently used);
    'gone' where something else removed it; 'refused' where it cannot be removed."""
    *folders, leaf = stored.name.split("/")
    try:
        folder = beneath.open(folders, FOLDER_FLAGS)
    except FileNotFoundError:
        return "gone"
    except OSError:  # a link planted since the walk: not ours to follow
        return "kept"
    try:
        now = os.stat(leaf, dir_fd=folder, follow_symlinks=False)
        used = now.st_mtime_ns if leaf.startswith(TEMPORARY) else now.st_atime_ns
        if (now.st_ino, used) != (stored.inode, stored.used_ns) or not stat.S_ISREG(now.st_mode):
            return "kept"
        os.unlink(leaf, dir_fd=folder)
        return "removed"
    except FileNotFoundError:
        return "gone"
    except OSError:
        return "refused"
    finally:
        os.close(folder)


def own_size(folder: int, leaf: str, name: str) -> int | None:
    """The size of the object `leaf` in `folder` if it is a regular file whose header names
    it `name`; else None."""
    try:
        fd = peek(folder, leaf)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        ours = stat.S_ISREG(info.st_mode) and names_itself(os.pread(fd, name_bytes(name), 0), name)
        return info.st_size if ours else None
    except OSError:
        return None
    finally:
        os.close(fd)
