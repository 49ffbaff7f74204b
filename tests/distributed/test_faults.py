"""Faults on real ranks (gloo): a stage that raises, a rank killed or stopped mid-transfer, a
parent killed. Each ends (its waits bounded by the collective timeout), names the rank at
fault and how, and leaves no process behind. No test asserts how long that took: a loaded
machine decides that, and a speed belongs in `bench`. (A corrupted host page caught by
`strategy.verify_every` is in test_dedup.py: the negative controls.)"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import rankfns
from conftest import job_config

from pipeline.jobs import scratch
from pipeline.jobs.launch import launch
from pipeline.jobs.soak import is_flat, soak_rank
from pipeline.jobs.soak import summarize as summarize_soak
from pipeline.jobs.spawn import RankFailure

pytestmark = pytest.mark.distributed
SMALL = ("workload.num_tokens=32", "workload.device_tokens=128")
GONE_WITHIN_S = 60.0
"""How long ranks get to end after their parent did: generous for a loaded 2-core machine."""
PIDS = re.compile(r"starting \d+ ranks \(pids \[([\d, ]+)\]\)")


def gone(pid: int) -> bool:
    """No such process, or only its zombie (dead, waiting for a reaper)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state == "Z"


def left_over(pids: list[int]) -> list[int]:
    """The processes still alive once they had GONE_WITHIN_S to end (an ending is the fact
    checked; the bound only keeps a broken build from hanging the suite)."""
    for _ in range(int(GONE_WITHIN_S / 0.1)):
        if all(gone(pid) for pid in pids):
            return []
        time.sleep(0.1)
    return [pid for pid in pids if not gone(pid)]


def rank_pids(log_text: str) -> list[int]:
    (pids,) = PIDS.findall(log_text)
    return [int(p) for p in pids.split(",")]


def test_a_failed_backup_fails_alone_and_the_next_transfer_works() -> None:
    """Replicated: the failure touched no collective, so the engine stays usable."""
    job = job_config("strategy=replicated", *SMALL)
    said = launch(rankfns.failed_then_next, (job, "backup"), 2, backend="gloo", timeout_s=30)
    assert said is not None
    assert "injected fault on rank 0" in said[0]["first"]  # the original error, on its ack
    assert said[1]["first"] == "ok"  # rank 1's own backup was fine
    assert [s["second"] for s in said] == ["", ""]  # the next round trip, bit-exact


def test_a_failed_exchange_breaks_the_engine_with_a_reason() -> None:
    """Rotating: rank 0 fails in its load's copies and never broadcasts; rank 1 waits out
    the collective timeout. The group's collectives may be out of step, so both engines refuse
    every later call, saying why."""
    job = job_config("strategy=rotating", "runtime.timeout_s=5", *SMALL)
    said = launch(rankfns.failed_then_next, (job, "load"), 2, backend="gloo", timeout_s=5)
    assert said is not None
    assert "injected fault on rank 0" in said[0]["first"]
    assert said[1]["first"] != "ok"  # rank 1's broadcast had no peer
    for s in said:
        assert s["second"].startswith("the engine is broken because a load failed"), s


def test_every_call_after_close_raises() -> None:
    job = job_config(*SMALL)
    said = launch(rankfns.after_close, job, 2, backend="gloo", timeout_s=30)
    assert said == [["the engine is closed: create a new one"] * 4] * 2


def test_engines_made_and_closed_again_and_again_leak_no_sockets_nor_threads() -> None:
    """Every group a runtime makes is destroyed when its engine closes (each held sockets:
    10 fds per engine and rank before), so a caller that makes a new engine after a failure
    can do so for ever."""
    job = job_config("strategy=rotating", *SMALL)
    seen = launch(rankfns.engines_made_and_closed, (job, 200), 2, backend="gloo", timeout_s=300)
    assert seen is not None
    for (fds_early, threads_early), (fds_late, threads_late) in seen:
        # (a thread or two come and go with the heartbeat and the streams; 6 per engine did;
        # a descriptor open at the first reading may be gone by the last: none may be added)
        assert fds_late <= fds_early and threads_late <= threads_early + 2


@pytest.mark.parametrize(
    ("signal_name", "blame"),
    [
        ("SIGKILL", "rank 1 was killed by SIGKILL before reporting"),
        ("SIGSTOP", "rank 1 sent no heartbeat for"),
    ],
)
def test_a_rank_killed_or_stopped_mid_transfer_is_named(signal_name, blame, caplog) -> None:
    job = job_config("strategy=rotating", "runtime.timeout_s=5", "workload.cycles=3", *SMALL)
    with (
        caplog.at_level(logging.INFO, logger="hicache-pipeline"),
        pytest.raises(RankFailure) as failure,
    ):
        launch(rankfns.faulty_run, (job, 1, signal_name), 2, backend="gloo", timeout_s=5)
    message = str(failure.value)
    assert message.startswith(blame), message
    if signal_name == "SIGSTOP":
        assert "raise it if the ranks were only slow" in message  # the knob: runtime.timeout_s
    assert all(gone(pid) for pid in rank_pids(caplog.text))


def started_run(folder: Path, *overrides: str) -> tuple[subprocess.Popen, str]:
    """`run` in a child process, once it has logged its ranks' pids: the process, and what
    it said on stderr so far (the rest is still to be read)."""
    parent = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "run", *overrides],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        cwd=folder,
    )
    assert parent.stderr is not None
    text = ""
    while not PIDS.search(text):
        line = parent.stderr.readline()
        assert line, f"the run ended before starting its ranks: {text}"
        text += line
    return parent, text


@pytest.mark.parametrize("signal_name", ["SIGKILL", "SIGTERM"])
def test_ranks_die_with_their_parent(signal_name: str, tmp_path: Path) -> None:
    """A long run whose parent is killed: its ranks end (README gives how soon, measured)."""
    parent, text = started_run(tmp_path, "workload.cycles=100000", *SMALL)
    pids = rank_pids(text)
    time.sleep(1.0)  # the ranks are up and working
    assert not any(gone(pid) for pid in pids)
    parent.send_signal(getattr(signal, signal_name))
    parent.wait(timeout=30)
    leftover = left_over(pids)
    for pid in leftover:  # do not leave them to the next test
        os.kill(pid, signal.SIGKILL)
    assert leftover == []


def test_a_rank_stopped_while_it_starts_is_named_not_its_waiting_peer(tmp_path: Path) -> None:
    """A rank stopped before its work began (here: as soon as it is spawned, while it imports):
    its heartbeat, armed before anything heavy, stops, so it is named as stalled. Before, it
    had no heartbeat yet and its peer's rendezvous timeout was blamed ("rank 0 failed: Wait
    timeout")."""
    parent, text = started_run(tmp_path, "runtime.timeout_s=5", *SMALL)
    pids = rank_pids(text)
    os.kill(pids[1], signal.SIGSTOP)
    try:
        rest = parent.communicate(timeout=300)[1]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pids[1], signal.SIGKILL)
    assert parent.returncode == 1
    assert "rank 1 sent no heartbeat for" in rest, rest
    assert all(gone(pid) for pid in pids)


@pytest.mark.mooncake
def test_a_master_killed_while_the_ranks_start_is_named(tmp_path: Path) -> None:
    """The job's own Mooncake master killed as its ranks start: a rank waiting on it inside
    Mooncake's client holds Python's lock and stops beating, and the error names the master
    first (before: only "rank 0 sent no heartbeat for 5 s")."""
    parent, text = started_run(tmp_path, "storage=mooncake", "runtime.timeout_s=5")
    (master,) = re.findall(r"mooncake_master \(pid (\d+)\)", text)
    os.kill(int(master), signal.SIGKILL)
    rest = parent.communicate(timeout=300)[1]
    assert parent.returncode == 1
    assert "the L3 store is down: the Mooncake master at 127.0.0.1:" in rest, rest
    assert all(gone(pid) for pid in rank_pids(text))


def soak(ranks: int, *overrides: str) -> dict:
    job = job_config("strategy=rotating", f"topology=tp{ranks}", *overrides)
    said = launch(soak_rank, job, ranks, backend="gloo", timeout_s=120, job_s=3600)
    assert said is not None
    return summarize_soak(job, said)


def test_a_short_soak_reports_memory_per_rank() -> None:
    result = soak(2, "soak.cycles=40", "soak.warmup_cycles=10", "soak.max_rss_growth_mb=1000")
    assert result["verified"] and result["flat"]
    assert [r["rank"] for r in result["ranks"]] == [0, 1]
    assert all(r["rss_end_mb"] > 0 for r in result["ranks"])
    assert all("rss_late_growth_mb" in r for r in result["ranks"])


def test_a_soak_tells_a_leak_from_a_one_time_rise() -> None:
    """The store soak rose 1.5-2 MB after its warm-up over 1000 rounds and as much over 4000:
    a rise that stops. A leak keeps growing in the second half too, and fails even within
    the total bound."""
    assert is_flat(growth_mb=2.0, late_growth_mb=0.1, most_mb=5)  # rose early, then flat
    assert not is_flat(growth_mb=4.0, late_growth_mb=2.6, most_mb=5)  # still growing
    assert not is_flat(growth_mb=5.5, late_growth_mb=0.0, most_mb=5)  # too much at once


@pytest.mark.slow
def test_a_soak_with_a_store_is_flat(tmp_path: Path) -> None:
    """Rotating on 2 ranks with a file store, 2000 rounds: backup, write-back, evict, lookup
    and load from L3 every round, bit-exact, and no growth in the second half."""
    store = (f"storage.path={tmp_path}", "soak.cycles=2000", "soak.warmup_cycles=200")
    result = soak(2, "storage=file", *store)
    assert result["verified"] and result["flat"], result["ranks"]


@pytest.mark.slow
def test_a_soak_of_2000_rounds_on_4_ranks_stays_bit_exact_and_flat() -> None:
    """Rotating on 4 ranks: every round bit-exact, and under 5 MB of growth per rank after
    the warm-up (the op trace and poll records no longer grow with every transfer)."""
    result = soak(4, "soak.cycles=2000", "soak.warmup_cycles=200")
    assert result["verified"]
    assert all(r["rss_growth_mb"] < 5 for r in result["ranks"]), result["ranks"]


def default_sigint() -> None:
    """SIGINT as a terminal's job gets it: a suite started in the background of a script
    (`cmd &`) ignores SIGINT, and so would the job, as POSIX asks of background jobs."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_job_leaves_no_store_nor_rank_folder_behind(sig: int, tmp_path: Path) -> None:
    """SIGTERM (the default action skipped every cleanup: 2049 object files and the ranks'
    folder were left in $TMPDIR) and SIGINT end the job with its temporary store removed."""
    job = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "run", "storage=file", "workload.cycles=100000"],
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "TMPDIR": str(tmp_path)},
        preexec_fn=default_sigint,
    )
    assert job.stderr is not None
    said = ""
    while "starting 2 ranks" not in said:
        line = job.stderr.readline()
        assert line, said
        said += line
    time.sleep(2)  # the ranks are running cycles against the store
    assert any(p.name.startswith("hicache-l3-") for p in tmp_path.iterdir())
    job.send_signal(sig)
    try:
        job.communicate(timeout=60)
    except subprocess.TimeoutExpired:  # say where it hung: the job itself, or a process
        ended = job.poll()  # that holds its stderr open
        job.kill()
        pytest.fail(f"no end of stderr 60 s after {signal.Signals(sig).name}; exit {ended}")
    pids = rank_pids(said)
    assert left_over(pids) == []
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("hicache-")] == []


def test_a_killed_jobs_folders_are_removed_by_the_next_job(tmp_path: Path) -> None:
    """SIGKILL leaves a job no chance to clean up; the next job removes this user's hicache-*
    folders whose maker is gone (by pid and start time), and nothing else."""
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    orphan, alive, foreign = (
        tmp_path / n for n in ("hicache-l3-x", "hicache-ranks-y", "hicache-z")
    )
    for folder in (orphan, alive, foreign):
        folder.mkdir()
    (orphan / "object").write_bytes(b"left behind")
    (orphan / ".owner").write_text(f"{dead.pid} 12345")
    (alive / ".owner").write_text(f"{os.getpid()} {scratch.started(os.getpid())}")
    done = subprocess.run(
        [sys.executable, "-m", "pipeline", "run", "storage=file"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("hicache-")) == [
        "hicache-ranks-y",
        "hicache-z",  # no owner named: not ours to judge
    ]
