"""CPU streams and events: every wait is bounded, a failed event stays failed, and an error in
one piece of work does not stop the stream's later work."""

from __future__ import annotations

import pytest

from pipeline.engine.cuda.streams import CpuEvent, WorkerStream


def test_a_wait_gives_up_after_the_timeout_naming_the_knob() -> None:
    """(That it gives up at all is the fact; how soon is the machine's, so it is not asserted.)"""
    with pytest.raises(TimeoutError, match=r"within runtime\.timeout_s=0\.2 s: raise runtime"):
        CpuEvent(timeout_s=0.2).wait()


def test_the_first_completion_wins() -> None:
    """A failed transfer's event stays failed when a later record reaches it."""
    event = CpuEvent(timeout_s=1)
    event.fail(ValueError("boom"))
    event.set()
    with pytest.raises(RuntimeError, match="transfer failed: boom"):
        event.wait()


def test_an_error_ends_only_its_own_work() -> None:
    stream = WorkerStream("test", timeout_s=5)
    ran: list[str] = []

    def boom() -> None:
        raise RuntimeError("first transfer fails")

    stream.submit(boom)
    stream.submit(lambda: ran.append("second"))
    done = stream.new_event()
    stream.record(done)
    done.wait()  # completes without the first one's error
    assert ran == ["second"]
    stream.close()
