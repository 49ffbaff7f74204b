"""`Admission`: the counts a write-back's admission reads, their bound, and `always`; the
write-back queue's bound refused below 0."""

from __future__ import annotations

import pytest

from pipeline.core.checks import ConfigError
from pipeline.core.storage import StorageConfig, StorageKind, WriteAdmission
from pipeline.engine.l3.admission import Admission


def after(hits: int, tracked: int = 100) -> Admission:
    return Admission(
        StorageConfig(
            write_admission=WriteAdmission.after_hits,
            admit_after_hits=hits,
            admit_tracked_pages=tracked,
        )
    )


def test_always_admits_every_page_and_keeps_no_counts() -> None:
    admission = Admission(StorageConfig())
    admission.named(["a", "b"])
    assert admission.admitted(["a", "c"]).tolist() == [True, True]
    assert not admission._named


def test_a_page_is_admitted_once_named_as_often_as_asked() -> None:
    admission = after(3)
    admission.named(["a", "a"])  # one call names a key once
    admission.named(["a", "b"])
    assert admission.admitted(["a", "b"]).tolist() == [False, False]
    admission.named(["a"])
    assert admission.admitted(["a", "b", "z"]).tolist() == [True, False, False]


def test_the_least_recently_named_page_is_forgotten_first() -> None:
    admission = after(2, tracked=2)
    admission.named(["a", "b"])
    admission.named(["a"])  # a is now the most recent: b goes first
    admission.named(["c"])
    assert list(admission._named) == ["a", "c"]
    assert admission.admitted(["a", "b", "c"]).tolist() == [True, False, False]
    admission.named(["b"])  # a is the least recent now: forgotten, it counts from 0 again
    admission.named(["a", "c"])
    assert admission.admitted(["a", "b", "c"]).tolist() == [False, False, True]


def test_a_negative_write_back_queue_bound_is_refused_with_its_key() -> None:
    assert StorageConfig().write_back_queue_pages == 0  # no bound
    with pytest.raises(ConfigError, match=r"storage\.write_back_queue_pages=-1 must be >= 0"):
        StorageConfig(kind=StorageKind.file, write_back_queue_pages=-1)
