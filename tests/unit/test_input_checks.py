"""Inputs that passed unchecked (issue 62): each is now refused before anything moves, with
one error that names the key or argument and the fix; the command line says it in one
paragraph, with no traceback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import pipeline
from pipeline.cli.main import COMMANDS, run_command
from pipeline.core.checks import ConfigError
from pipeline.engine.l3.stores.keys import read_key_file

SGLANG = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
"""A SHA-256 in hex, as SGLang hashes a page."""
CPU = ["model=tiny_mla", "topology=tp1", "topology.device=cpu"]


def in_process(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = run_command(COMMANDS[args[0]], list(args[1:]), args[0])
    out, err = capsys.readouterr()
    return code, out, err


def problems(overrides: list[str]) -> dict[str, str]:
    """key -> message of every problem `compose` finds."""
    with pytest.raises(ConfigError) as refused:
        pipeline.compose(overrides)
    return {p.key: p.message for p in refused.value.problems}


@pytest.mark.parametrize("one", [SGLANG, SGLANG.encode()], ids=["str", "bytes"])
def test_page_keys_of_one_bare_hash_is_refused(one: Any) -> None:
    """A str is a sequence of characters: it made one key per character."""
    job = pipeline.compose(CPU)
    with pytest.raises(ValueError) as said:
        pipeline.page_keys(job, one)
    message = str(said.value)
    assert f"hashes: one {type(one).__name__}" in message
    assert "pass a list of hashes, one per page" in message
    assert len(pipeline.page_keys(job, [one])) == 1


@pytest.mark.parametrize("bad", [None, 5], ids=["None", "int"])
def test_page_keys_of_no_list_is_refused(bad: Any) -> None:
    with pytest.raises(
        ValueError, match=rf"hashes: a list of block hashes .* got {type(bad).__name__}"
    ):
        pipeline.page_keys(pipeline.compose(CPU), bad)


def test_a_store_views_lookup_refuses_what_is_no_list_of_keys(tmp_path: Path) -> None:
    job = pipeline.compose([*CPU, "storage=file", f"storage.path={tmp_path}"])
    key = pipeline.page_keys(job, [SGLANG])[0]
    with pipeline.open_store(job) as view:
        with pytest.raises(ValueError, match=r"keys: a list of page keys .*, got NoneType"):
            view.lookup(None)
        with pytest.raises(ValueError, match=r"keys: one str, not a list: pass \[key\]"):
            view.lookup(key)
        assert view.lookup([key]) == 0
    assert list(tmp_path.iterdir()) == []  # nothing written


@pytest.mark.parametrize(
    "phrase",
    [
        b"correct horse battery staple",
        b"Tr0ub4dor&3-and-more\n",
        "mot de passe été, très secret".encode(),
    ],
    ids=["words", "with-newline", "utf-8"],
)
def test_a_passphrase_key_file_is_refused(tmp_path: Path, phrase: bytes) -> None:
    """docs/security.md: a key is 16 to 64 random bytes, and a passphrase is refused."""
    path = tmp_path / "key"
    path.write_bytes(phrase)
    path.chmod(0o600)
    assert len(set(phrase)) >= 8  # what the distinct-bytes rule let through
    with pytest.raises(ValueError) as said:
        read_key_file(str(path))
    message = str(said.value)
    assert message.startswith(f"storage.auth_key_file={path}: text (a passphrase?)")
    assert f"head -c 32 /dev/urandom > {path}" in message


@pytest.mark.parametrize("planted", ["link", "folder"])
def test_run_on_a_store_whose_ledger_is_not_a_file_says_so_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture, planted: str
) -> None:
    store = tmp_path / "store"
    store.mkdir()
    ledger = store / ".usage"
    if planted == "link":
        ledger.symlink_to(tmp_path / "elsewhere")
    else:
        ledger.mkdir()
    args = [*CPU, "storage=file", f"storage.path={store}", "storage.capacity_bytes=64MiB"]
    code, _, err = in_process(capsys, "run", *args)
    assert code == 2 and "Traceback" not in err and err.count("\n") == 1, err
    assert f"storage.path={store}: .usage in the folder is not this store's ledger" in err
    assert "remove or move it away" in err
    assert ledger.is_symlink() if planted == "link" else ledger.is_dir()  # left alone


def test_the_capacity_check_names_the_workload_that_sizes_it() -> None:
    said = problems(["storage=file", "storage.capacity_bytes=1KiB", "workload.num_tokens=128"])
    message = said["storage.capacity_bytes"]
    assert "one write-back of 32 objects (workload.num_tokens=128)" in message
    assert "lower workload.num_tokens, or raise it to at least" in message
    quota = ["storage.capacity_bytes=1GiB", "storage.tenant=acme", "storage.tenant_quota_bytes=1"]
    said = problems(["storage=file", *quota, "workload.num_tokens=128"])
    assert "lower workload.num_tokens, or raise it" in said["storage.tenant_quota_bytes"]


@pytest.mark.parametrize("kind", ["none", "mooncake"])
def test_a_storage_path_without_the_file_store_is_refused(kind: str) -> None:
    said = problems([f"storage={kind}", "storage.path=/x"])
    assert said["storage.path"] == (
        f"storage.path='/x': only storage=file keeps its objects in a folder (this config "
        f"has storage={kind}): add storage=file, or drop storage.path"
    )


def test_a_storage_path_without_the_file_store_is_one_line_at_the_command_line(
    capsys: pytest.CaptureFixture,
) -> None:
    code, _, err = in_process(capsys, "plan", "storage.path=/x")
    assert code == 2 and "add storage=file" in err and "Traceback" not in err


def deployment(root: Path) -> str:
    """A folder that runs replicated on tiny_mla, with an option it does not use whose key is
    misspelt."""
    (root / "strategy").mkdir(parents=True)
    (root / "strategy" / "other.yaml").write_text(
        "defaults: [replicated, _self_]\nname: other\nstagin_bytes: 1\n"
    )
    (root / "config.yaml").write_text("defaults:\n  - model: tiny_mla\n  - topology: tp1\n")
    return str(root)


def test_explain_reads_only_the_options_the_job_uses(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    folder = deployment(tmp_path)
    code, out, err = in_process(capsys, "explain", "--config-dir", folder, "--json")
    assert code == 0, err
    said = json.loads(out)
    assert said["effective_strategy"] == "replicated" and said["problems"] == []
    # the option itself, chosen, is still refused naming its key
    code, _, err = in_process(capsys, "explain", "--config-dir", folder, "strategy=other")
    assert code == 2 and "other.yaml:3: strategy.stagin_bytes" in err
    # and validate checks every file of the folder
    code, out, _ = in_process(capsys, "validate", "--config-dir", folder, "--json")
    assert code == 1 and "strategy.stagin_bytes" in out
