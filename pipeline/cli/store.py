"""`hicache-pipeline store stats|verify|evict FOLDER`: an operator's commands on a file store's
folder, with or without a job writing it (eviction takes the lock the writers take)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from pipeline.cli.failure import failed
from pipeline.config.app import CommandLine, checked_session, configs
from pipeline.engine.stores.files import read_key_file
from pipeline.jobs.store_admin import Known, evict_store, store_stats, verify_store
from pipeline.spec.checks import ConfigError
from pipeline.spec.l3 import Checks
from pipeline.spec.sizing import parse_bytes

STORE_HELP = """\
usage: hicache-pipeline store stats FOLDER [--json]
       hicache-pipeline store verify FOLDER [--remove] [--json] [OVERRIDE ...]
       hicache-pipeline store evict FOLDER --to BYTES [--json]

A file store's folder (storage.path), shared or not with running jobs:
  stats   objects and bytes, in all and per namespace, and a bounded store's ledger
  verify  read every object whole and check it: its header (its own digest, its name, its
          length) and, for the namespace of the model the overrides compose (model=...,
          topology=...), every unit's digest; list the corrupt ones and why (--remove:
          unlink them; exit 1 where corrupt objects remain). Keyed objects need
          storage.auth_key_file=KEY; objects of another format version are skipped.
  evict   remove objects, least recently used first, until the folder holds at most BYTES
          (an int or a size such as 64GiB)

A folder that is missing, a link, not a folder, or holds anything but namespace folders is
refused before a byte is read.

example:
  hicache-pipeline store verify /data/l3 model=deepseek_v3 topology=tp8 --remove
"""
ACTIONS = ("stats", "verify", "evict")


@dataclass
class StoreLine:
    """One `store` command line."""

    action: str = ""
    folder: str = ""
    as_json: bool = False
    remove: bool = False
    to_bytes: int | None = None
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
            result = evict_store(line.folder, line.to_bytes)
        else:
            known, checks = _model_of(line.overrides)
            result = verify_store(line.folder, known, checks, remove=line.remove)
    except (ConfigError, ValueError) as e:
        return failed(as_json, e, 2)
    print(json.dumps(result, indent=2) if as_json else _text(line.action, result))
    left = line.action == "verify" and result["corrupt"] and not line.remove
    return 1 if left else 0


def _model_of(overrides: list[str]) -> tuple[Known, Checks]:
    """The namespace (and units) of the model the overrides compose, and the checks of the
    key they name."""
    with configs(None) as sources:
        job = checked_session(CommandLine(overrides=overrides), sources).job()
    key_file = job.storage.auth_key_file
    return Known.of(job.model), Checks(read_key_file(key_file) if key_file else None)


def _text(action: str, result: dict) -> str:
    path = result["path"]
    if action == "evict":
        return (
            f"{path}: evicted {result['evicted_objects']} objects ({result['evicted_bytes']} B);"
            f" {result['objects']} objects, {result['bytes']} B left"
        )
    if action == "stats":
        lines = [f"{path}: {result['objects']} objects, {result['bytes']} B"]
        for space, held in result["namespaces"].items():
            lines.append(f"  {space}: {held['objects']} objects, {held['bytes']} B")
        if result["ledger"] is not None:
            ledger = result["ledger"]
            lines.append(f"  ledger: {ledger['objects']} objects, {ledger['bytes']} B")
        return "\n".join(lines)
    lines = [
        f"{path}: {result['objects']} objects: {result['intact']} intact ("
        f"{result['units_checked']} of the composed model's, every unit checked; the rest "
        f"by their header), {len(result['corrupt'])} corrupt ({result['removed']} removed), "
        f"{len(result['skipped'])} skipped"
    ]
    lines += [f"  corrupt {c['name']}: {c['reason']}" for c in result["corrupt"]]
    lines += [f"  skipped {c['name']}: {c['reason']}" for c in result["skipped"][:10]]
    return "\n".join(lines)
