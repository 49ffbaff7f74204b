"""The file store owns only what it made (issue 49): a bounded `run`, `store evict` and `store
verify --remove` (with a wrong key, and with the right key on a really damaged object) leave
every file a user planted in the store's folder byte for byte as it was, links and their
targets untouched; and a `.usage` or an object-looking file that is not the store's is never
written or removed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import job_config

from pipeline.cli.main import main
from pipeline.spec.l3 import namespace

FOUR_HOURS_NS = 4 * 3600 * 10**9


def cli(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, dict]:
    """Exit code and JSON document of `hicache-pipeline store ARGS --json`."""
    try:
        main(["store", *args, "--json"])
        code = 0
    except SystemExit as e:
        code = int(e.code or 0)
    return code, json.loads(capsys.readouterr().out)


def run(*overrides: str) -> subprocess.CompletedProcess:
    """`hicache-pipeline run OVERRIDES`, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "pipeline", "run", *overrides],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def old(path: Path) -> None:
    then = time.time_ns() - FOUR_HOURS_NS
    os.utime(path, ns=(then, then), follow_symlinks=False)


def plant(folder: Path, outside: Path) -> dict[Path, bytes]:
    """User files in the store's folder: at its top, inside a namespace and a prefix folder,
    hidden ones, old `.tmp-*` ones, an object-looking name, and links to files outside. The
    bytes of each regular file (links: their target's path)."""
    space = folder / "v3-bf16-p4-0123456789abcdef"
    prefix = space / "ab"
    real = folder / namespace(job_config().model)  # where the run writes its objects
    for made in (prefix, real / "00", folder / "docs"):
        made.mkdir(parents=True)
    files = {
        folder / "docs" / "thesis.txt": b"my thesis",
        folder / "notes.txt": b"notes",
        folder / ".bashrc": b"alias ll='ls -l'",
        folder / ".tmp-old": b"a user's old temporary file",
        space / "README": b"about this folder",
        space / ".tmp-0123456789abcdef": b"not in a prefix folder",
        prefix / ("ab" * 16): b"named like an object, no header",
        prefix / ".tmp-mine": b"a user's, not the store's name",
        prefix / "notes.txt": b"inside a prefix folder",
    }
    for path, data in files.items():
        path.write_bytes(data)
        old(path)
    target = outside / "secret.txt"
    target.write_bytes(b"outside the store")
    links = {folder / "link": target, prefix / ("cd" * 16): target, folder / "docs.link": outside}
    for link, to in links.items():
        link.symlink_to(to)
    return {**files, target: b"outside the store"}


def unchanged(planted: dict[Path, bytes], outside: Path, *, moved: Path, to: Path) -> None:
    """Every planted file byte for byte (those at `moved`'s top now below `to`), and the
    links as they were."""
    target = str(outside / "secret.txt")
    for path, data in planted.items():
        assert where(path, moved, to).read_bytes() == data, path
    space = moved / "v3-bf16-p4-0123456789abcdef"
    for link in (moved / "link", space / "ab" / ("cd" * 16)):
        assert os.readlink(where(link, moved, to)) == target
    assert os.readlink(where(moved / "docs.link", moved, to)) == str(outside)


def where(path: Path, moved: Path, to: Path) -> Path:
    """`path`, or where it went if it was at the top of `moved` and not a namespace folder."""
    if moved in path.parents and not path.relative_to(moved).parts[0].startswith("v"):
        return to / path.relative_to(moved)
    return path


def test_a_bounded_run_evict_and_verify_leave_every_planted_file(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    folder, outside, aside = tmp_path / "store", tmp_path / "outside", tmp_path / "aside"
    for made in (folder, outside, aside):
        made.mkdir()
    planted = plant(folder, outside)
    key, wrong = tmp_path / "key", tmp_path / "wrong"
    for path in (key, wrong):
        path.write_bytes(os.urandom(32))
        path.chmod(0o600)
    store = ["storage=file", f"storage.path={folder}", "storage.capacity_bytes=100KiB"]
    done = run(*store, "workload.cycles=3", f"storage.auth_key_file={key}")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "verified: bit-exact (2 ranks)" in done.stdout
    unchanged(planted, outside, moved=folder, to=folder)
    # the store commands refuse a folder with a user's files at its top, before any byte
    code, said = cli(capsys, "evict", str(folder), "--to", "0")
    assert code == 2 and "not a store's folder" in said["error"]
    for entry in list(folder.iterdir()):
        if not entry.name.startswith(("v", ".usage")):
            entry.rename(aside / entry.name)
    code, checked = cli(capsys, "verify", str(folder), f"storage.auth_key_file={wrong}", "--remove")
    assert code == 0 and (checked["removed"], checked["intact"], checked["corrupt"]) == (0, 0, [])
    assert len(checked["not_checked"]) == checked["objects"] > 0
    objects = [p for p in folder.glob("v*/*/*") if p.is_file() and p.stat().st_size > 1000]
    assert len(objects) == checked["objects"]  # none removed
    damaged = sorted(objects)[0]
    data = bytearray(damaged.read_bytes())
    data[-1] ^= 1
    damaged.write_bytes(bytes(data))
    code, checked = cli(capsys, "verify", str(folder), f"storage.auth_key_file={key}", "--remove")
    assert code == 0 and checked["removed"] == 1 and not damaged.exists()
    assert [c["name"] for c in checked["corrupt"]] == [str(damaged.relative_to(folder))]
    assert checked["intact"] == len(objects) - 1
    code, evicted = cli(capsys, "evict", str(folder), "--to", "0")
    assert code == 0 and evicted["objects"] == 0 and evicted["evicted_objects"] == len(objects) - 1
    unchanged(planted, outside, moved=folder, to=aside)
