"""`poll()` is a collective: a rank that polls once more than its peer is named, with every
rank's poll count, within runtime.timeout_s (it was a silent hang, then "only slow" advice);
a rank that skips a poll its peer makes is told so where it waits instead."""

from __future__ import annotations

import pollfns
import pytest
from conftest import job_config

from pipeline.jobs.launch import launch

pytestmark = pytest.mark.distributed

TIMEOUT_S = 8  # a legitimate poll never waits this long, even on a busy 2-core box


def test_an_extra_poll_while_idle_meets_the_peer_at_another_count() -> None:
    job = job_config("topology=tp2", "strategy.idle_sync_skip.enabled=true")
    said = launch(pollfns.extra_poll, (job, True), 2, backend="gloo", timeout_s=60)
    assert said is not None
    for rank in said:  # both ranks are told, with both counts
        assert "rank 0: poll #1 with 1 acks outstanding" in rank["said"], rank
        assert "rank 1: poll #2 with 1 acks outstanding" in rank["said"], rank
        assert "poll() is a collective" in rank["said"]


def test_an_extra_poll_with_work_outstanding_is_named_within_the_timeout() -> None:
    job = job_config("topology=tp2", f"runtime.timeout_s={TIMEOUT_S}")
    said = launch(pollfns.extra_poll, (job, False), 2, backend="gloo", timeout_s=60)
    assert said is not None
    first, odd = said
    assert first["said"] == ""  # it polled as often as it backed up
    assert "this rank (rank 1) is at poll #2" in odd["said"], odd
    assert "rank(s) 0 did not join it" in odd["said"], odd
    assert "last together at poll #1" in odd["said"], odd
    assert "only slow" not in odd["said"]
    # bounded by the group's timeout (runtime.timeout_s), not the launcher's 60 s: the
    # launch would have failed otherwise; the time it took is for the reader
    print(f"named after {odd['after_s']:.1f} s (runtime.timeout_s={TIMEOUT_S})")


def test_a_skipped_poll_is_named_on_the_rank_that_skipped_it() -> None:
    job = job_config("topology=tp2", "strategy=rotating", f"runtime.timeout_s={TIMEOUT_S}")
    said = launch(pollfns.skipped_poll, job, 2, backend="gloo", timeout_s=60)
    assert said is not None
    polled, skipped = said
    assert "this rank (rank 0) is at poll #1 with 1 acks outstanding" in polled["said"]
    assert "rank(s) 1 did not join it" in polled["said"]
    # the rank that skipped the poll waits in the load's broadcast: it is told of the poll
    assert "rank 0 waits in poll #1 with 1 acks outstanding" in skipped["said"], skipped
    assert "which this rank (rank 1) has not made: it has begun 0 polls" in skipped["said"]
    assert "poll() is a collective" in skipped["said"]
    assert "only slow" not in skipped["said"]
