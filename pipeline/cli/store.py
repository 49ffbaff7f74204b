"""`hicache-pipeline store stats|verify|evict FOLDER`: an operator's commands on a file store's
folder, with or without a job writing it (eviction takes the lock the writers take)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from pipeline.cli.failure import failed
from pipeline.config.app import CommandLine, checked_session, configs
from pipeline.core.checks import ConfigError
from pipeline.core.l3 import Checks
from pipeline.core.sizing import parse_bytes
from pipeline.engine.l3.stores.files import TIMEOUT_S, read_key_file
from pipeline.jobs.store_admin import evict_store, store_stats
from pipeline.jobs.store_verify import verify_store

STORE_HELP = """\
usage: hicache-pipeline store stats FOLDER [--json]
       hicache-pipeline store verify FOLDER [--remove] [--json] [storage.auth_key_file=KEY]
       hicache-pipeline store evict FOLDER --to BYTES [--json]
       (each also takes runtime.timeout_s=SECONDS, default 120: the longest wait on the lock)

A file store's folder (storage.path), shared or not with running jobs:
  stats   objects and bytes, in all and per namespace, and a bounded store's ledger
  verify  check every byte of every object, a piece at a time: its header (its own digest,
          its name, its length) and each unit's digest, as its header gives them; list the
          corrupt ones and why (--remove: unlink them; exit 1 where corrupt objects remain).
          Keyed objects need storage.auth_key_file=KEY; those it cannot check (keyed without
          the key, another format version, unreadable) are listed as not checked, never
          called intact, never removed. With the key, objects it does not authenticate
          (unkeyed, or another key's) are corrupt once another object checks with it.
  evict   remove objects, least recently used first, until the folder holds at most BYTES
          (an int or a size such as 64GiB)

Only the store's own objects are counted or removed: files in an object's place (namespace/
prefix/key) whose header names them. A folder that is missing, a link, not a folder, holds
anything but namespace folders and the store's ledger (.usage), or holds neither, is refused
before a byte is read.

example:
  hicache-pipeline store verify /data/l3 storage.auth_key_file=/etc/hicache/l3.key --remove
"""
ACTIONS = ("stats", "verify", "evict")
MAX_TIMEOUT_S = 86400.0
"""The longest wait on the lock a command line may ask for (a day)."""


@dataclass
class StoreLine:
    """One `store` command line."""

    action: str = ""
    folder: str = ""
    as_json: bool = False
    remove: bool = False
    to_bytes: int | None = None
    timeout_s: float = TIMEOUT_S
    overrides: list[str] = field(default_factory=list)

    @classmethod
    def parse(cls, args: list[str]) -> StoreLine:
        """ValueError saying what is missing or not understood."""
        line, rest = cls(), list(args)
        while rest:
            arg = rest.pop(0)
            if arg == "--json":
                line.as_json = True
            elif arg == "--remove":
                line.remove = True
            elif arg.partition("=")[0] == "--to":
                size = arg.partition("=")[2] or (rest.pop(0) if rest else "")
                line.to_bytes = _size(size)
            elif arg.startswith("runtime.timeout_s="):
                line.timeout_s = _seconds(arg.partition("=")[2])
            elif arg.startswith("-"):
                raise ValueError(f"store: {arg} is not an option (--json, --remove, --to BYTES)")
            elif not line.action:
                line.action = arg
            elif not line.folder and "=" not in arg:
                line.folder = arg
            else:
                line.overrides.append(arg)
        return line.checked()

    def checked(self) -> StoreLine:
        if self.action not in ACTIONS:
            raise ValueError(f"store: {self.action or 'no'} action; one of {', '.join(ACTIONS)}")
        if not self.folder:
            raise ValueError(f"store {self.action}: name the store's folder (storage.path)")
        if (self.action == "evict") != (self.to_bytes is not None):
            raise ValueError("store: --to BYTES goes with evict, and evict needs it")
        if (self.remove or self.overrides) and self.action != "verify":
            raise ValueError(f"store {self.action}: --remove and overrides go with verify")
        return self


def _size(text: str) -> int:
    try:
        return parse_bytes(text) if text != "0" else 0
    except ValueError:
        raise ValueError(f"store evict --to {text!r}: a size in bytes, e.g. 64GiB") from None


def _seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds <= MAX_TIMEOUT_S:
        raise ValueError(
            f"store: runtime.timeout_s={text!r}: seconds, > 0 and <= {MAX_TIMEOUT_S:g}"
        )
    return seconds


def store_main(args: list[str]) -> int:
    """Run one `store` command: 0, 1 where verify leaves corrupt objects, 2 for a mistake (a
    wrong folder, a bad option) said in one line."""
    if not args or args[0] in ("-h", "--help") or "--help" in args:
        print(STORE_HELP)
        return 0
    as_json = "--json" in args
    try:
        line = StoreLine.parse(args)
        if line.action == "stats":
            result = store_stats(line.folder)
        elif line.action == "evict":
            assert line.to_bytes is not None
            result = evict_store(line.folder, line.to_bytes, line.timeout_s)
        else:
            checks = _checks_of(line.overrides)
            result = verify_store(line.folder, checks, remove=line.remove, timeout_s=line.timeout_s)
    except (ConfigError, ValueError, OSError) as e:  # OSError: a lock held too long, a disk
        return failed(as_json, e, 2)
    print(json.dumps(result, indent=2) if as_json else _text(line.action, result))
    left = line.action == "verify" and result["corrupt"] and not line.remove
    return 1 if left else 0


def _checks_of(overrides: list[str]) -> Checks:
    """The checks of the key the overrides name (storage.auth_key_file), if any."""
    if not overrides:
        return Checks()
    with configs(None) as sources:
        job = checked_session(CommandLine(overrides=overrides), sources).job()
    key_file = job.storage.auth_key_file
    return Checks(read_key_file(key_file) if key_file else None)


def _text(action: str, result: dict) -> str:
    path = result["path"]
    if action == "evict":
        said = (
            f"{path}: evicted {result['evicted_objects']} objects ({result['evicted_bytes']} B);"
            f" {result['objects']} objects, {result['bytes']} B left"
        )
        return "\n".join([said, *_left_alone(result)])
    if action == "stats":
        lines = [f"{path}: {result['objects']} objects, {result['bytes']} B"]
        for space, held in result["namespaces"].items():
            lines.append(f"  {space}: {held['objects']} objects, {held['bytes']} B")
        if result["ledger"] is not None:
            ledger = result["ledger"]
            lines.append(f"  ledger: {ledger['objects']} objects, {ledger['bytes']} B")
        return "\n".join(lines + _left_alone(result))
    lines = [
        f"{path}: {result['objects']} objects: {result['intact']} intact (every byte "
        f"checked), {len(result['corrupt'])} corrupt ({result['removed']} removed), "
        f"{len(result['not_checked'])} not checked"
    ]
    lines += [f"  corrupt {c['name']}: {c['reason']}" for c in result["corrupt"]]
    lines += [f"  not checked {c['name']}: {c['reason']}" for c in result["not_checked"][:10]]
    return "\n".join(lines + _left_alone(result))


def _left_alone(result: dict) -> list[str]:
    notes = result["left_alone"]
    shown = [f"  left alone {note}" for note in notes[:10]]
    return shown + ([f"  ... and {len(notes) - 10} more left alone"] if len(notes) > 10 else [])
