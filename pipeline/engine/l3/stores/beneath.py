"""Opening a path below a folder's descriptor without following a link at any component.

Linux 5.6+ does it in one call: openat2 with RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS, where the
kernel itself refuses a link, a `..` or an absolute path anywhere in the walk. Elsewhere (an
older kernel, a sandbox that refuses the call) it is a walk of openat calls, one per
component, each with O_NOFOLLOW. One call instead of two per folder matters: on the H200 host
the walk (the root's whole path each time, then every folder) took a third of an L3 read, and
16 I/O threads walking the same folders contend for their entries in the kernel.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
from collections.abc import Sequence

SYS_OPENAT2 = 437
"""openat2's number in Linux's generic syscall table (x86-64 and arm64 alike)."""
RESOLVE_NO_MAGICLINKS, RESOLVE_NO_SYMLINKS, RESOLVE_BENEATH = 0x02, 0x04, 0x08
FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
COMPONENT = r"[\w-][\w.-]*"
"""One folder or file name of an object name: no separators, nothing hidden, never '..'."""
NAME = re.compile(rf"{COMPONENT}(?:/{COMPONENT})*")
NAMES = re.compile(rf"{NAME.pattern}(?:\n{NAME.pattern})*", re.ASCII)
"""Names a line each, of ASCII alone (a quarter of the time of any letter's): a match is a
match of NAME for each."""


def store_name(name: str) -> bool:
    """Whether `name` is a path of components below a folder (never opened otherwise)."""
    return NAME.fullmatch(name) is not None


def store_names(names: Sequence[str]) -> list[str]:
    """`names`, each replaced by '' where it is not a store name: a load's hundreds of names
    checked in one match where all are (a match a name took a millisecond of a fetch)."""
    joined = "\n".join(names)
    if joined.count("\n") == len(names) - 1 and NAMES.fullmatch(joined):  # none holds a \n
        return list(names)
    return [name if store_name(name) else "" for name in names]


class OpenHow(ctypes.Structure):
    """openat2's `struct open_how`: the open flags, the mode of a file it creates, and how
    the path may be resolved."""

    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


class Beneath:
    """A folder kept open, and the paths below it opened with no link followed."""

    def __init__(self, root: str) -> None:
        self.path = root
        self.fd = os.open(root, FOLDER_FLAGS & ~os.O_NOFOLLOW)  # the operator's own path
        self._syscall = ctypes.CDLL(None, use_errno=True).syscall
        self._syscall.restype = ctypes.c_long
        self.one_call = self._probe()
        """Whether this kernel resolves a path beneath a folder in one call (openat2)."""

    def _probe(self) -> bool:
        try:
            os.close(self._openat2(".", FOLDER_FLAGS, 0))
        except OSError:  # ENOSYS (before 5.6), EPERM (a sandbox's filter)
            return False
        return True

    def _openat2(self, path: str, flags: int, mode: int) -> int:
        how = OpenHow(flags, mode, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)
        fd = self._syscall(SYS_OPENAT2, self.fd, path.encode(), ctypes.byref(how), 24)
        if fd < 0:
            code = ctypes.get_errno()
            if code == errno.ELOOP:  # a link in the walk: what O_NOFOLLOW reports too
                raise OSError(code, f"{path}: a link below the store's folder")
            raise OSError(code, f"{path}: {os.strerror(code)}")
        return int(fd)

    def open(self, parts: list[str], flags: int, mode: int = 0) -> int:
        """A descriptor of `parts` below the folder (flags as for os.open; O_NOFOLLOW is
        added); OSError where a part is missing, a link, or not a real folder."""
        flags |= os.O_NOFOLLOW | os.O_CLOEXEC
        if not parts:  # the folder itself
            return os.open(".", flags, dir_fd=self.fd)
        if self.one_call:
            return self._openat2("/".join(parts), flags, mode if flags & os.O_CREAT else 0)
        fd = self.fd
        try:
            for part in parts[:-1]:
                inner = os.open(part, FOLDER_FLAGS, dir_fd=fd)
                if fd != self.fd:
                    os.close(fd)
                fd = inner
            return os.open(parts[-1], flags, mode, dir_fd=fd)
        finally:
            if fd != self.fd:
                os.close(fd)

    def close(self) -> None:
        os.close(self.fd)
