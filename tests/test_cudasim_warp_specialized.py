"""Warp-specialized kernels on the shim (tests/cudasim/selftest/warp_specialized_test.cpp): a
producer warp feeding consumer warps through a 2-stage mbarrier ring with bulk copies, two
warpgroups taking turns through named barriers, warpgroup collectives. The correct kernels must
pass under every schedule and copy completion; every planted bug must be reported."""
import os
import re
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "cudasim"))
from fixtures import (CORRECT, SELFTEST_DIR, SIM_ERROR, WRONG, first_line,  # noqa: E402
                      named_error, program, run, site_of)

SOURCE = os.path.join(SELFTEST_DIR, "warp_specialized_test.cpp")
SCHEDULES = ["forward", "reverse", "random:1", "random:2", "random:3"]
COMPLETIONS = ["lazy", "eager", "random"]
MATRIX = [(s, c) for s in SCHEDULES for c in COMPLETIONS]


def site(marker):
    return site_of(SOURCE, marker)


def run_case(case, schedule="forward", completion=None):
    return run(program("warp_specialized_test"), case, schedule=schedule, completion=completion)


@pytest.mark.parametrize("schedule,completion", MATRIX)
@pytest.mark.parametrize("case", ["ring", "turns", "warpgroups"])
def test_correct_kernel_passes(case, schedule, completion):
    out = run_case(case, schedule, completion)
    assert out.returncode == CORRECT, out.stdout + out.stderr


@pytest.mark.parametrize("stall", [None, "0", "1", "7"])
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_warpgroups_exchanging_through_a_barrier_pass_with_any_warpgroup_held_back(
        schedule, stall, monkeypatch):
    if stall is not None:
        monkeypatch.setenv("CUDASIM_STALL_WARPGROUP", stall)
    out = run_case("handoff", schedule)
    assert out.returncode == CORRECT, out.stdout + out.stderr


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_missing_barrier_between_warpgroups_needs_one_held_back(schedule, monkeypatch):
    """Each warpgroup's own barrier keeps the two in step, so the plain schedules miss the
    missing 256-thread barrier (a known limit, README "Schedules"); holding either warpgroup
    back (CUDASIM_STALL_WARPGROUP) lets the other read the half it has not written."""
    monkeypatch.delenv("CUDASIM_STALL_WARPGROUP", raising=False)
    assert run_case("handoff_no_barrier", schedule).returncode == CORRECT
    for group in ("0", "1"):
        monkeypatch.setenv("CUDASIM_STALL_WARPGROUP", group)
        out = run_case("handoff_no_barrier", schedule)
        assert out.returncode == WRONG, out.stdout + out.stderr
        assert "128 threads read the other warpgroup's half before it was written" in out.stdout


def test_bad_stall_value_is_named(monkeypatch):
    monkeypatch.setenv("CUDASIM_STALL_WARPGROUP", "one")
    out = run_case("handoff")
    assert out.returncode == SIM_ERROR
    assert "bad CUDASIM_STALL_WARPGROUP 'one': expected a warpgroup index" in out.stdout


@pytest.mark.parametrize("schedule,completion", MATRIX)
def test_producer_on_the_wrong_parity_deadlocks_with_a_listing(schedule, completion):
    """The producer waits on phase 0 of an empty stage, which only consumers complete, while
    they wait for the tile it never copies: the report names both waits and both mbarriers."""
    out = run_case("ring_producer_wrong_parity", schedule, completion)
    message = named_error(
        out,
        r"deadlock in kernel void ring::pipeline<\(ring::Bug\)1>.* \(no thread can run and no "
        r"copy is in flight\): thread 0 waits in mbarrier\.try_wait\.parity at \S+ on the "
        r"mbarrier at smem\+0x10 for parity 0: phase 0, 0 of 2 arrivals, 0 tx bytes pending; "
        r"threads 1-31 returned; threads 32-95 \(warps 1-2\) wait in mbarrier\.try_wait\.parity "
        r"at \S+ on the mbarrier at smem\+0x0 for parity 0: phase 0, 0 of 1 arrivals, "
        r"0 tx bytes pending$")
    assert site("producer_wait") in message and site("consumer_wait") in message


@pytest.mark.parametrize("schedule,completion", MATRIX)
def test_consumer_on_the_wrong_parity_is_caught(schedule, completion):
    """Waiting on the phase before its tile's, a consumer passes at once, reads the poison and
    releases a stage the producer has not filled: the ring's phases drift apart until it
    deadlocks (or, lazily under forward, the producer arrives on a phase still loading)."""
    out = run_case("ring_consumer_wrong_parity", schedule, completion)
    named_error(out, r"deadlock in kernel|too many arrivals")


@pytest.mark.parametrize("schedule,completion", MATRIX)
def test_missing_expect_tx_is_caught(schedule, completion):
    """The full barrier completes at the producer's plain arrival, before its copy lands: the
    copy then lands on a phase that expects no bytes, or is still in flight at the end."""
    out = run_case("ring_missing_expect_tx", schedule, completion)
    message = named_error(
        out, r"transaction-byte underflow: the copy issued here lands 1024 bytes on the "
             r"mbarrier at smem\+0x[08] in phase \d+, which expects only 0|"
             r"cp\.async\.bulk issued here is still in flight when every thread of the "
             r"block has returned")
    assert site("producer_copy") in message


def test_missing_expect_tx_is_an_underflow_when_copies_land_eagerly():
    out = run_case("ring_missing_expect_tx", "forward", "eager")
    assert "transaction-byte underflow" in first_line(out), out.stdout + out.stderr


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_every_producer_lane_arriving_is_too_many_arrivals(schedule):
    """Lazily, lane 1's arrive.expect_tx meets the phase lane 0 opened, with no arrival left."""
    out = run_case("ring_producer_every_lane", schedule, "lazy")
    message = named_error(
        out, r"mbarrier: too many arrivals: mbarrier\.arrive\.expect_tx \(count 1\) on "
             r"the mbarrier at smem\+0x[08] in phase 0, which has 0 of its 1 arrivals "
             r"left \(it waits only for 1024 tx bytes\)")
    assert site("producer_arrive") in message


@pytest.mark.parametrize("schedule,completion", MATRIX)
def test_every_producer_lane_arriving_is_caught(schedule, completion):
    out = run_case("ring_producer_every_lane", schedule, completion)
    assert out.returncode in (WRONG, SIM_ERROR), out.stdout + out.stderr


def test_too_many_arrivals_on_one_phase():
    out = run_case("mbarrier_arrives_twice")
    named_error(out, re.escape("too many arrivals: mbarrier.arrive (count 1) on the mbarrier at "
                               "smem+0x0"), [site("second_arrival")])


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_use_before_init_is_named(schedule):
    out = run_case("ring_empty_not_initialized", schedule)
    named_error(out, r"mbarrier\.try_wait\.parity: mbarrier used before init: smem\+0x18 holds "
                     r"no initialized mbarrier")


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_lazy_completion_shows_a_read_before_the_wait_as_stale_data(schedule):
    """A consumer that reads its stage before waiting on "full": lazily, the copy has not landed
    when it reads (nothing else had to wait for it yet), so it reads the poison or an old tile."""
    out = run_case("ring_consumer_reads_early", schedule, "lazy")
    every_value = 6 * 256
    assert out.returncode == WRONG, out.stdout + out.stderr
    assert f"consumers read {every_value} stale values" in out.stdout, out.stdout


@pytest.mark.parametrize("schedule,completion", MATRIX)
def test_read_before_the_wait_is_caught(schedule, completion):
    out = run_case("ring_consumer_reads_early", schedule, completion)
    assert out.returncode in (WRONG, SIM_ERROR), out.stdout + out.stderr


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_named_barrier_count_mismatch_is_named(schedule):
    out = run_case("turns_count_mismatch", schedule)
    message = named_error(
        out, r"named barrier count mismatch: bar\.sync [34] with (96|128) threads, but "
             r"this generation of barrier [34] was opened by bar\.sync at \S+ with "
             r"(96|128) threads")
    assert site("group_sync") in message


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_named_barrier_deadlock_lists_arrivals(schedule):
    out = run_case("turns_no_hand_back", schedule)
    at = re.escape(site("wait_turn"))
    named_error(out, rf"deadlock in kernel .*: threads 0-127 \(warps 0-3\) wait in bar\.sync at "
                     rf"\S*{at} \(barrier 1: 128 of 256 threads arrived\); threads 128-255 "
                     rf"\(warps 4-7\) wait in bar\.sync at \S*{at} \(barrier 2: 128 of 256 "
                     rf"threads arrived\)$")


@pytest.mark.parametrize("case,pattern,markers", [
    ("warpgroup_partial", r"warpgroup_sum is a warpgroup collective, but warpgroup 0 has only 96 "
                          r"threads \(it needs 4 full warps\)", ["even_warps"]),
    ("warpgroup_different_sites", r"threads of one warpgroup meet different collectives: this "
                                  r"thread calls warpgroup_sum while \d+ threads of warpgroup 0 "
                                  r"wait in warpgroup_sum at ", ["odd_warps", "even_warps"]),
    ("warpgroup_warp_returns", r"thread returns while \d+ threads of warpgroup 0 wait for it in "
                               r"warpgroup_sum|lanes 0-31 of warp 3 in warpgroup 0 have already "
                               r"returned", []),
    ("copy_in_flight_at_exit", r"cp\.async\.bulk issued here is still in flight when every "
                               r"thread of the block has returned", ["unawaited_copy"]),
    ("mbarrier_parity_two", r"mbarrier\.try_wait\.parity 2: not 0 or 1", ["parity_two"]),
])
@pytest.mark.parametrize("schedule", ["forward", "reverse", "random:1"])
def test_misuse_is_named(case, pattern, markers, schedule):
    out = run_case(case, schedule)
    named_error(out, pattern, [site(marker) for marker in markers])


def test_bad_copy_completion_is_reported():
    out = run_case("ring", "forward", "sometimes")
    assert "bad copy completion 'sometimes'" in out.stdout + out.stderr


@pytest.mark.parametrize("case", ["ring", "turns", "warpgroups", "ring_producer_wrong_parity",
                                  "ring_missing_expect_tx", "warpgroup_warp_returns"])
def test_clean_under_asan(case):
    """Blocked threads abandoned by an error own nothing; the copy engine's queue frees its own."""
    out = run(program("warp_specialized_test", sanitize=True), case, schedule="random:7")
    assert out.returncode in (CORRECT, SIM_ERROR), out.stdout + out.stderr
    assert "Sanitizer" not in out.stderr and "runtime error" not in out.stderr, out.stderr
