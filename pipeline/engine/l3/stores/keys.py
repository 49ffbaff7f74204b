"""A MAC key for L3 objects (`storage.auth_key_file`): read from a file only its owner may
read, and refused where it is not a secret (text such as a passphrase, all one byte, or a
few)."""

from __future__ import annotations

import os
import stat

KEY_BYTES = (16, 64)
"""A MAC key's length in bytes: at least 128 bits, at most what BLAKE2b takes."""
MIN_DISTINCT_BYTES = 8
"""Fewer distinct byte values than this is not a random key (16 random bytes have about 15;
a passphrase such as 'hunter2hunter2...' has 6)."""


def read_key_file(path: str) -> bytes:
    """The key in the regular file `path` (its raw bytes), opened without following a link;
    ValueError naming storage.auth_key_file where it is no such file, others may read or
    write it, or its bytes are no secret."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise ValueError(f"storage.auth_key_file={path}: {e.strerror}") from e
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"storage.auth_key_file={path}: not a regular file")
        if info.st_mode & 0o077:
            raise ValueError(
                f"storage.auth_key_file={path}: its group or others may read or write it "
                f"(mode {stat.S_IMODE(info.st_mode):04o}); chmod 600 {path}"
            )
        key = os.read(fd, KEY_BYTES[1] + 1)
    finally:
        os.close(fd)
    if not KEY_BYTES[0] <= len(key) <= KEY_BYTES[1]:
        raise ValueError(
            f"storage.auth_key_file={path}: {len(key)} bytes; a key is {KEY_BYTES[0]} to "
            f"{KEY_BYTES[1]} bytes (e.g. head -c 32 /dev/urandom > key)"
        )
    if len(set(key)) < MIN_DISTINCT_BYTES:
        raise ValueError(
            f"storage.auth_key_file={path}: not a secret ({len(set(key))} distinct byte values "
            f"in {len(key)}); use random bytes, e.g. head -c 32 /dev/urandom > {path}"
        )
    if is_text(key):
        raise ValueError(
            f"storage.auth_key_file={path}: text (a passphrase?), not random bytes; a key is "
            f"{KEY_BYTES[0]} to {KEY_BYTES[1]} random bytes, e.g. head -c 32 /dev/urandom > "
            f"{path}"
        )
    return key


def is_text(key: bytes) -> bool:
    """Whether `key` reads as printable text (UTF-8, spaces and a newline included): a
    passphrase someone typed, or a key written out in hex or base64. 16 random bytes read so
    about once in millions, 32 once in 10**13."""
    try:
        text = key.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return all(c.isprintable() or c.isspace() for c in text)
