"""The Mooncake tests need the system library libibverbs1 and the mooncake package: where
either is missing they skip, saying how to enable them, and `--require-mooncake` (which
`.ci/run` passes) turns that skip into a failure, so CI never passes without them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import mooncake_gate, mooncake_missing

ROOT = Path(__file__).resolve().parents[2]
PATHS = ("tests/unit/test_l3.py", "tests/unit/test_cli.py", "tests/distributed")


def test_a_missing_library_is_named_with_the_command_that_installs_it() -> None:
    reason = mooncake_missing(library="libhicache-absent.so.1")
    assert reason is not None
    assert reason.startswith("needs libibverbs1: apt-get install libibverbs1")
    assert "\n" not in reason
    assert mooncake_missing(package="hicache_absent_package") == (
        "needs the mooncake package: pip install -e '.[dev]' (or '.[mooncake]' on GPU machines)"
    )


def test_without_the_option_a_missing_library_skips_and_with_it_fails() -> None:
    reason = "needs libibverbs1: apt-get install libibverbs1"
    with pytest.raises(pytest.skip.Exception, match=reason):
        mooncake_gate(reason, required=False)
    with pytest.raises(pytest.fail.Exception, match=r"--require-mooncake"):
        mooncake_gate(reason, required=True)
    mooncake_gate(None, required=True)  # found: nothing to say


def test_the_tests_that_start_a_master_or_a_client_are_marked() -> None:
    """Every test that reaches a Mooncake master or client carries the `mooncake` mark (the
    file-store cases beside them do not), so the gate sees each one."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-n",
            "0",
            "-m",
            "mooncake",
            *PATHS,
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    ids = [line for line in done.stdout.splitlines() if "::" in line]
    assert all("file" not in i.partition("[")[2] for i in ids), ids
    names = {i.split("::")[1].partition("[")[0] for i in ids}
    assert names == {
        "test_each_store_writes_parts_reads_ranges_and_removes",
        "test_mooncake_reads_land_in_registered_memory_without_a_copy_gaps_and_all",
        "test_read_parts_reads_ranges_of_many_objects_up_to_the_first_miss",
        "test_the_master_a_job_starts_listens_on_loopback_only",
        "test_run_with_a_store_makes_it_and_puts_it_away",
        "test_a_master_killed_while_the_ranks_start_is_named",
        "test_l3_bench_puts_the_strategies_side_by_side_per_store",
        "test_run_loads_back_from_l3_bit_exact",
        "test_ranks_that_plan_differently_fall_back_to_their_own_reads",
        "test_a_bad_object_is_a_miss_from_its_page_on_never_wrong_bytes",
        "test_a_master_that_dies_during_a_run_is_a_miss_and_loses_nothing",
        "test_two_launches_share_one_mooncake_master",
        "test_ttft_bench_rows_for_a_mooncake_store",
        "test_a_scheduler_finds_what_ranks_wrote_to_a_mooncake_master",
        "test_a_subscriber_rebuilds_every_tier_from_the_events",
    }
