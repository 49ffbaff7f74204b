"""The job's L3 store made concrete before any rank starts, and put away after the last.

file with no path: a temporary folder, removed at the end. mooncake with master=auto: a
`mooncake_master` on loopback (HTTP metadata server included, explicit free ports), killed
with its parent and stopped at the end. A given master must answer before a rank starts:
an unreachable one is a clear error naming `storage.master`, not a hang in every rank.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import importlib.util
import logging
import mmap
import os
import secrets
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from pipeline.core.checks import ConfigError, Problem
from pipeline.core.storage import P2P_METADATA, StorageConfig, StorageKind
from pipeline.engine.l3.stores.files import read_key_file
from pipeline.engine.l3.stores.ledger import check_folder_ledger
from pipeline.jobs.launch import under_torchrun
from pipeline.jobs.rank_start import die_with
from pipeline.jobs.scratch import made_folder
from pipeline.jobs.spawn import RankFailure, free_port

DIRECT_BLOCK = 4096
"""Bytes of the O_DIRECT probe: one page, aligned as such reads must be."""
MASTER_START_S = 20.0
"""How long a master gets to listen."""
MASTER_ATTEMPTS = 3
"""Masters started on fresh ports before giving up (another process may take a port)."""
MASTER_LINES_KEPT = 20
"""Lines of the master's stderr kept for an error that says why it did not start."""

log = logging.getLogger("hicache-pipeline")


@contextlib.contextmanager
def concrete(storage: StorageConfig) -> Iterator[StorageConfig]:
    """The store with its folder or master in place, for the length of the block."""
    if storage.auth_key_file is not None:
        try:
            read_key_file(storage.auth_key_file)
        except ValueError as e:
            raise ConfigError([Problem("storage.auth_key_file", str(e))]) from e
    temporary = storage.kind is StorageKind.file and storage.path is None
    auto_master = storage.kind is StorageKind.mooncake and storage.master == "auto"
    if under_torchrun() and (temporary or auto_master):
        key = "storage.path" if temporary else "storage.master"
        message = (
            f"{key}: under torchrun each rank is started on its own, so none can make the "
            "store for the others: give a folder every rank of a node reaches (file) or a "
            "running master (mooncake, with storage.metadata_server)"
        )
        raise ConfigError([Problem(key, message)])
    if temporary:
        folder = made_folder("hicache-l3-")
        try:
            check_direct_io(storage, folder)
            yield dataclasses.replace(storage, path=folder)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    elif auto_master:
        with master_on_loopback() as (master, metadata):
            yield dataclasses.replace(storage, master=master, metadata_server=metadata)
    else:
        if storage.kind is StorageKind.mooncake and not answers(storage.master):
            message = f"storage.master={storage.master}: nothing answers at that address"
            raise ConfigError([Problem("storage.master", message)])
        if storage.kind is StorageKind.file and storage.path is not None:
            check_folder(storage, storage.path)
        yield storage


def check_folder(storage: StorageConfig, path: str) -> None:
    """ConfigError naming storage.path where the given path is not a folder, or a bounded
    store's `.usage` in it is not the store's ledger (the ranks would refuse it, each with a
    traceback); and `check_direct_io`."""
    if not Path(path).is_dir():
        message = f"storage.path={path!r}: not a folder (create it, or name one)"
        raise ConfigError([Problem("storage.path", message)])
    if storage.capacity is not None:
        try:
            check_folder_ledger(path)
        except ValueError as e:
            raise ConfigError([Problem("storage.path", str(e))]) from e
    check_direct_io(storage, path)


def check_direct_io(storage: StorageConfig, folder: str) -> None:
    """With storage.direct_io, ConfigError unless `folder`'s file system takes O_DIRECT reads
    (tmpfs refuses them), tried on a block-sized file of its own (a fresh name, created with
    O_EXCL: nothing planted there is written through or removed), removed after."""
    if not storage.direct_io:
        return
    probe = Path(folder) / f".direct-io-{secrets.token_hex(8)}"
    created = False
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        created = True
        try:
            os.write(fd, bytes(DIRECT_BLOCK))
        finally:
            os.close(fd)
        fd = os.open(probe, os.O_RDONLY | os.O_DIRECT | os.O_NOFOLLOW)
        try:
            os.preadv(fd, [mmap.mmap(-1, DIRECT_BLOCK)], 0)
        finally:
            os.close(fd)
    except OSError as e:
        message = (
            f"storage.direct_io=true: the folder {folder} refuses O_DIRECT reads ({e.strerror}); "
            "set storage.direct_io=false, or storage.path to a folder on a disk"
        )
        raise ConfigError([Problem("storage.direct_io", message)]) from e
    finally:
        if created:
            probe.unlink(missing_ok=True)


@contextlib.contextmanager
def blamed_on_a_dead_store(storage: StorageConfig) -> Iterator[None]:
    """A rank failure while the job's Mooncake master does not answer names the master first:
    a rank waiting on a dead master inside Mooncake's client holds Python's lock, so the
    parent sees only its missing heartbeat."""
    try:
        yield
    except RankFailure as failure:
        if storage.kind is not StorageKind.mooncake:
            raise
        if answers(storage.master):
            raise
        message = f"the L3 store is down: the Mooncake master at {storage.master} does not answer"
        raise RankFailure(f"{message} (it died or was stopped); {failure}") from failure


def answers(address: str, timeout_s: float = 2.0) -> bool:
    """Does something accept TCP connections at `address` (host:port)?"""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return True
    except OSError:
        return False


def master_binary() -> str:
    """The `mooncake_master` that ships with the mooncake package."""
    spec = importlib.util.find_spec("mooncake")
    found = Path(spec.origin).parent / "mooncake_master" if spec and spec.origin else None
    if found is None or not found.is_file():
        raise ConfigError(
            [
                Problem(
                    "storage.kind",
                    "storage.kind=mooncake needs the mooncake-transfer-engine package (its "
                    "mooncake_master) and the libibverbs1 system library: see README, L3 tier",
                )
            ]
        )
    return str(found)


@contextlib.contextmanager
def master_on_loopback() -> Iterator[tuple[str, str]]:
    """(master host:port, metadata) of a fresh master on loopback, for the block: its RPC
    and metrics ports bound to 127.0.0.1, and no HTTP metadata server (that one listened on
    every address whatever its host flag said): the clients exchange their metadata directly
    (Mooncake's P2PHANDSHAKE). Ports are picked free, then bound by the master: if another
    process took one in between, the master exits and a new one starts on other ports."""
    for attempt in range(MASTER_ATTEMPTS):
        process, rpc, said = _start_master()
        if process.poll() is None:
            break
        if attempt == MASTER_ATTEMPTS - 1:
            raise RuntimeError(_why_not_started(process, said))
    try:
        log.info("mooncake_master (pid %d) on 127.0.0.1:%d for this job", process.pid, rpc)
        yield f"127.0.0.1:{rpc}", P2P_METADATA
    finally:
        process.terminate()
        try:
            process.wait(2)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _start_master() -> tuple[subprocess.Popen, int, StderrTail]:
    """A master on fresh ports, once it answers (or once it has exited), and the tail of what
    it says on stderr."""
    rpc, metrics = free_port(), free_port()
    process = subprocess.Popen(
        [
            master_binary(),
            "--rpc_address=127.0.0.1",
            f"--rpc_port={rpc}",
            f"--metrics_port={metrics}",
            "--metrics_host=127.0.0.1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=functools.partial(die_with, os.getpid()),  # in the master, before exec
    )
    said = StderrTail(process)
    deadline = time.monotonic() + MASTER_START_S
    while not answers(f"127.0.0.1:{rpc}", 0.2):
        if process.poll() is not None:
            break
        if time.monotonic() > deadline:
            process.kill()
            process.wait()
            break
        time.sleep(0.1)
    return process, rpc, said


class StderrTail:
    """The last lines a process wrote to its stderr pipe, drained by a thread for as long as
    it runs (a full pipe would block it)."""

    def __init__(self, process: subprocess.Popen) -> None:
        assert process.stderr is not None, "started with stderr=PIPE"
        self.lines: collections.deque[str] = collections.deque(maxlen=MASTER_LINES_KEPT)
        self._reader = threading.Thread(
            target=self._drain, args=(process.stderr,), name="mooncake-master-stderr", daemon=True
        )
        self._reader.start()

    def _drain(self, stream: IO[bytes]) -> None:
        with stream:
            for line in stream:
                self.lines.append(line.decode(errors="replace").rstrip())

    def text(self) -> str:
        """What it said last (once it has exited: everything up to its exit)."""
        self._reader.join(1.0)
        return " | ".join(line for line in self.lines if line) or "nothing"


def _why_not_started(process: subprocess.Popen, said: StderrTail) -> str:
    code = process.poll()
    # 127: the loader could not start it, as when a library it links is missing
    hint = " (a library it needs is missing: is libibverbs1 installed?)" if code == 127 else ""
    return f"the Mooncake master did not start (exit code {code}{hint}); it said: {said.text()}"
