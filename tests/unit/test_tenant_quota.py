"""A tenant's quota in a bounded file store shared by tenants (`storage.tenant_quota_bytes`):
a tenant over it evicts only its own objects, least recently used first, so every other
tenant's and the un-tenanted objects stay byte for byte; two stores writing the tenant (each
its own lock descriptor, as two processes) keep it under the one quota; a quota the store
cannot keep is a config error naming the knob."""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

import pytest
import torch

import pipeline
from pipeline.core.checks import ConfigError
from pipeline.core.l3_owned import tenant_of
from pipeline.engine.l3.stores import FileStore
from pipeline.engine.l3.stores.capacity import Quota
from pipeline.engine.l3.stores.ledger import LEDGER

OBJECT_BYTES = 4096
SPACE = "v3-bf16-p4-0123456789abcdef"


def space_of(tenant: str) -> str:
    return f"{SPACE}-t{tenant}" if tenant else SPACE


def name_of(tenant: str, i: int) -> str:
    key = hashlib.sha256(f"{tenant}{i}".encode()).hexdigest()[:32]
    return f"{space_of(tenant)}/{key[:2]}/{key}"


def blob(name: str) -> bytes:
    """A header that names the object (the store evicts only what proves to be its own),
    then bytes drawn from its name."""
    ns, nm = name.split("/")[0].encode(), name.encode()
    head = struct.pack("<5sHHHBIQ16s", b"HCPL3", 3, len(ns), len(nm), 0, 0, 0, bytes(16))
    seed = hashlib.sha256(nm).digest()
    return (head + ns + nm + seed * (OBJECT_BYTES // len(seed) + 1))[:OBJECT_BYTES]


def files_of(root: Path, tenant: str | None = None) -> dict[str, bytes]:
    """Every object file under `root` (only `tenant`'s namespaces where given), by path."""
    found = {}
    for path in root.rglob("*"):
        space = path.relative_to(root).parts[0]
        if path.is_file() and path.name != LEDGER and tenant in (None, tenant_of(space)):
            found[str(path.relative_to(root))] = path.read_bytes()
    return found


def bytes_of(root: Path, tenant: str) -> int:
    return sum(len(data) for data in files_of(root, tenant).values())


def test_a_tenant_over_its_quota_evicts_only_its_own(tmp_path: Path) -> None:
    capacity, quota = 64 * OBJECT_BYTES, 16 * OBJECT_BYTES
    others = FileStore(str(tmp_path), capacity_bytes=capacity)
    for tenant in ("globex", ""):  # another tenant's objects and un-tenanted ones
        for i in range(12):
            others.put(name_of(tenant, i), [blob(name_of(tenant, i))])
    theirs = files_of(tmp_path)
    acme = Quota("acme", quota, quota // 2)
    first = FileStore(str(tmp_path), capacity_bytes=capacity, evict_to=0.5, quota=acme)
    second = FileStore(str(tmp_path), capacity_bytes=capacity, evict_to=0.5, quota=acme)
    hot = name_of("acme", 0)
    first.put(hot, [blob(hot)])
    for i in range(1, 61):  # almost 4x the quota, the two stores taking turns
        name = name_of("acme", i)
        (first, second)[i % 2].put(name, [blob(name)])
        assert bytes_of(tmp_path, "acme") <= quota
        assert second.get(hot) == blob(hot)  # read after every write: always recently used
        assert first.get(name) == blob(name)
    mine = files_of(tmp_path, "acme")
    assert {k: v for k, v in files_of(tmp_path).items() if k not in mine} == theirs
    assert first.get(name_of("acme", 1)) is None  # the least recently used went
    evicted = first.stats()["evictions"] + second.stats()["evictions"]  # type: ignore[operator]
    assert evicted == 61 - len(mine)
    assert first.stats()["bytes"] == len(files_of(tmp_path)) * OBJECT_BYTES
    for store in (others, first, second):
        store.close()


def test_the_folder_capacity_still_applies_beside_a_quota(tmp_path: Path) -> None:
    capacity = 24 * OBJECT_BYTES
    acme = Quota("acme", 20 * OBJECT_BYTES, 10 * OBJECT_BYTES)
    store = FileStore(str(tmp_path), capacity_bytes=capacity, evict_to=0.5, quota=acme)
    for i in range(40):
        for tenant in ("acme", "globex"):
            store.put(name_of(tenant, i), [blob(name_of(tenant, i))])
            assert bytes_of(tmp_path, "acme") <= acme.bytes
            assert sum(len(v) for v in files_of(tmp_path).values()) <= capacity
    store.close()


@pytest.mark.usefixtures("one_rank")
def test_engines_of_two_tenants_share_a_bounded_folder(tmp_path: Path) -> None:
    """Through real engines: globex writes back, then acme writes back 4x its quota; every
    globex object is still there byte for byte, and acme stays under its quota throughout."""
    store = ["storage=file", f"storage.path={tmp_path}", "storage.capacity_bytes=64KB"]
    common = ["topology=tp1", "workload.num_tokens=32", "storage.evict_to=0.75", *store]
    write_backs(pipeline.compose([*common, "storage.tenant=globex"]), 6, tmp_path)
    theirs = files_of(tmp_path, "globex")
    assert len(theirs) == 12 and not files_of(tmp_path, "acme")
    quota = ["storage.tenant=acme", "storage.tenant_quota_bytes=20000"]
    write_backs(pipeline.compose([*common, *quota]), 30, tmp_path, 20_000)
    mine = files_of(tmp_path, "acme")
    one = len(next(iter(mine.values())))
    assert 60 * one >= 4 * 20_000 and len(mine) < 60  # written 4x the quota: some evicted
    assert files_of(tmp_path, "globex") == theirs


def write_backs(job: pipeline.Job, prefixes: int, root: Path, quota: int = 0) -> None:
    """`prefixes` write-backs of two pages each, its tenant's bytes checked under `quota`
    (where given) after each."""
    engine = pipeline.create_engine(job)
    try:
        size = engine.sizing.slots_per_page
        for p in range(prefixes):
            keys = engine.l3_keys(list(range(p * 1000, p * 1000 + 2 * size)))
            host = engine.host_slots.alloc(2 * size)
            engine.backup(host, torch.arange(2 * size)).wait()
            engine.write_back(keys, host).wait()
            while engine.acks.pending:
                engine.poll()
            engine.host_slots.free(host)
            if quota:
                assert bytes_of(root, job.storage.tenant) <= quota
    finally:
        engine.close()


Q = "storage.tenant_quota_bytes="


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ([f"{Q}30000", "storage.capacity_bytes=64KB"], "a tenant's bound; set storage.tenant"),
        ([f"{Q}30000", "storage.tenant=acme"], "set capacity_bytes"),
        ([f"{Q}30000", "storage.tenant=acme", "storage.capacity_bytes=20000"], "more than"),
        ([f"{Q}-1", "storage.tenant=acme"], "must be >= 0"),
        ([f"{Q}1", "storage.tenant=acme", "storage.capacity_bytes=1MB"], "one write-back of 64"),
    ],
)
def test_a_quota_the_store_cannot_keep_is_a_config_error(overrides: list[str], message: str):
    with pytest.raises(ConfigError) as refused:
        pipeline.compose(["storage=file", *overrides])
    problems = [p.message for p in refused.value.problems if p.key == Q[:-1]]
    assert problems and message in problems[0], refused.value.problems
