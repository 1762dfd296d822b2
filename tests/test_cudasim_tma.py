"""TMA, bulk copies and mbarriers on the shim (tests/cudasim/selftest/tma_test.cpp and
sm90_cases.h): tensor loads 2D-5D with each swizzle and out-of-bounds boxes, stores and f32 add
reductions, bulk copies and mbarrier phases against references written from the PTX ISA, and a
ring of swizzled TMA tiles, under every schedule and copy completion; planted bugs and misuse
reported by name (a TMA store of plain stores without fence.proxy.async among them); the
tensor-map encoder's checks; the counters."""
import json
import os
import re
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "cudasim"))
from fixtures import (CORRECT, SELFTEST_DIR, SIM_ERROR, WRONG, first_line,  # noqa: E402
                      named_error, program, run, site_of)

SOURCE = os.path.join(SELFTEST_DIR, "tma_test.cpp")
SCHEDULES = ["forward", "reverse", "random:1", "random:2"]
COMPLETIONS = ["lazy", "eager", "random"]
MATRIX = [(s, c) for s in SCHEDULES for c in COMPLETIONS]


def site(marker):
    return site_of(SOURCE, marker)


def run_case(case, schedule="forward", completion=None, *args):
    return run(program("tma_test"), case, *args, schedule=schedule, completion=completion)


@pytest.mark.parametrize("schedule,completion", MATRIX)
@pytest.mark.parametrize("case", ["cases", "ring"])
def test_correct_kernels_pass(case, schedule, completion):
    out = run_case(case, schedule, completion)
    assert out.returncode == CORRECT, out.stdout + out.stderr


@pytest.mark.parametrize("seed", ["7", "12345"])
def test_cases_hold_for_other_seeds(seed):
    out = run_case("cases", "random:3", None, seed)
    assert out.returncode == CORRECT, out.stdout + out.stderr


def test_primitives_test_runs_the_sm90_cases_for_the_layout_check():
    """primitives_test --sm90 is the shim side of layout_check.py --arch 90a."""
    out = run(program("primitives_test"), "--hardware-safe", "--sm90")
    assert out.returncode == 0, out.stdout + out.stderr
    names = [line.split()[1] for line in out.stdout.splitlines() if line.startswith("PASS")]
    for rank in (2, 3, 4, 5):
        for swizzle in (0, 32, 64, 128):
            assert f"tma_load_{rank}d_swizzle{swizzle}" in names
    assert any(n.startswith("tma_store_") for n in names)
    assert any(n.startswith("tma_reduce_add_") for n in names)
    assert "bulk_copy_g2s_s2g_reduce_add_f32" in names and "mbarrier_phases_test_wait" in names


@pytest.mark.parametrize("schedule,completion", MATRIX)
def test_missing_expect_tx_is_caught(schedule, completion):
    """The producer's plain arrival completes "full" before the tile lands: the copy then lands
    on a phase that expects no bytes, or is still in flight at the end."""
    out = run_case("ring_missing_expect_tx", schedule, completion)
    message = named_error(
        out, r"transaction-byte underflow: the copy issued here lands 1024 bytes|"
             r"cp\.async\.bulk\.tensor issued here is still in flight when every thread "
             r"of the block has returned|too many arrivals")
    assert site("producer_load") in message or "too many arrivals" in message, message


@pytest.mark.parametrize("schedule,completion", MATRIX)
def test_wrong_parity_of_the_producer_deadlocks(schedule, completion):
    out = run_case("ring_producer_wrong_parity", schedule, completion)
    message = named_error(
        out, r"deadlock in kernel .*thread 0 waits in mbarrier\.try_wait\.parity at \S+ on "
             r"the mbarrier at smem\+0x810 for parity 0: phase 0, 0 of 2 arrivals")
    assert site("producer_wait") in message and site("consumer_wait") in message


@pytest.mark.parametrize("schedule,completion", MATRIX)
def test_wrong_parity_of_a_consumer_is_caught(schedule, completion):
    """Waiting on the phase before its tile's, a consumer reads a stage that has not landed and
    releases it early: stale values, too many arrivals, a phase overrun or a deadlock."""
    out = run_case("ring_consumer_wrong_parity", schedule, completion)
    assert out.returncode in (WRONG, SIM_ERROR), out.stdout + out.stderr
    if out.returncode == SIM_ERROR:
        assert re.search(r"deadlock in kernel|too many arrivals|phase overrun|transaction-byte "
                         r"underflow", first_line(out)), first_line(out)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_read_before_the_wait_reads_the_poison_under_lazy_completion(schedule):
    out = run_case("ring_read_before_wait", schedule, "lazy")
    assert out.returncode == WRONG, out.stdout + out.stderr
    assert "stale values" in out.stdout


@pytest.mark.parametrize("schedule,completion", MATRIX)
def test_read_before_the_wait_is_caught(schedule, completion):
    out = run_case("ring_read_before_wait", schedule, completion)
    assert out.returncode in (WRONG, SIM_ERROR), out.stdout + out.stderr


@pytest.mark.parametrize("case,pattern,markers", [
    ("rank_mismatch", r"cp\.async\.bulk\.tensor \(load\): a 3d copy through a tensor map of rank 2",
     ["rank_mismatch"]),
    ("misaligned_box", r"cp\.async\.bulk\.tensor \(load\): destination \S+ \+ 256 bytes is not a "
                       r"128-byte aligned range inside dynamic shared memory", ["misaligned_box"]),
    ("not_a_map", r"prefetch\.tensormap: \S+ holds no tensor map encoded by "
                  r"flashattn::encode_tensor_map", ["not_a_map"]),
    ("map_in_smem", r"cp\.async\.bulk\.tensor \(store\): the tensor map at \S+ lies in shared "
                    r"memory", ["map_in_smem"]),
    ("load_before_init", r"cp\.async\.bulk\.tensor \(load\): mbarrier used before init",
     ["load_before_init"]),
    ("reduce_not_f32", r"cp\.reduce\.async\.bulk\.tensor \(add\): the shim models \.add only for "
                       r"f32 tensor maps", ["reduce_not_f32"]),
    ("store_without_wait", r"bulk store issued here is still pending when every thread of the "
                           r"block has returned", ["store"]),
    ("store_uncommitted", r"bulk store issued here is still pending when every thread of the "
                          r"block has returned", ["store"]),
    ("store_source_overwritten", r"cp\.async\.bulk\.wait_group\.read: bulk store source "
                                 r"overwritten before cp\.async\.bulk\.wait_group\.read: the store "
                                 r"issued at \S+ reads smem\+0x0 \+ 256 bytes, and byte 1[2-5] changed",
     ["read_wait", "store"]),
])
@pytest.mark.parametrize("schedule", ["forward", "random:1"])
def test_misuse_is_named(case, pattern, markers, schedule):
    out = run_case(case, schedule)
    named_error(out, pattern, [site(marker) for marker in markers])


@pytest.mark.parametrize("schedule", ["forward", "reverse", "random:1"])
def test_tma_store_of_plain_stores_without_proxy_fence_is_named(schedule):
    out = run_case("generic_store_without_fence", schedule)
    message = named_error(
        out, r"cp\.async\.bulk\.tensor \(store\) reads smem\+0x0 through the async proxy, "
             r"but thread 0 \(warp 0 lane 0\) stored it at \S+ through the generic proxy "
             r"and has not executed fence\.proxy\.async since")
    assert site("unfenced_store") in message and site("generic_store") in message


def test_tma_store_of_plain_stores_after_proxy_fence_passes():
    out = run_case("generic_store_with_fence")
    assert out.returncode == CORRECT, out.stdout + out.stderr


def test_a_store_retired_by_wait_group_read_completes_by_the_end():
    out = run_case("store_read_wait_then_exit")
    assert out.returncode == CORRECT, out.stdout + out.stderr


ENCODER_ERRORS = {
    "valid": r"^ok$",
    "rank_zero": r"rank 0 is out of range: the tensor rank must be 1 to 5",
    "rank_six": r"rank 6 is out of range",
    "global_misaligned": r"global address \S+ is not 16-byte aligned",
    "dim_zero": r"globalDim\[1\] = 0 is out of range: it must be 1 to 2\^32",
    "dim_too_big": r"globalDim\[2\] = 4294967297 is out of range",
    "stride_not_16": r"globalStrides\[0\] = 136 bytes is not a multiple of 16",
    "stride_too_big": r"globalStrides\[1\] = 1099511627776 bytes is out of range: it must be below 2\^40",
    "box_zero": r"boxDim\[2\] = 0 is out of range: it must be 1 to 256",
    "box_too_big": r"boxDim\[1\] = 257 is out of range",
    "box_inner_not_16_bytes": r"the box's inner dimension is 24 bytes \(boxDim\[0\] \* element "
                              r"size\), not a multiple of 16",
    "box_inner_over_swizzle": r"the box's inner dimension is 128 bytes, more than the 64-byte "
                              r"swizzle span",
    "element_stride_zero": r"elementStrides\[1\] = 0 is out of range: it must be 1 to 8",
    "element_stride_nine": r"elementStrides\[2\] = 9 is out of range",
    "bad_dtype": r"data type 42 is not a CUtensorMapDataType",
    "bad_swizzle": r"swizzle 9 is not a CUtensorMapSwizzle",
    "nan_fill_integer": r"NaN out-of-bounds fill needs a floating-point data type",
    "interleave_32_rank_2": r"an interleaved layout needs rank 3 to 5",
    "unmodelled_interleave": r"interleaved layouts are not modelled by the shim",
    "unmodelled_element_stride": r"element strides other than 1 are not modelled by the shim",
    "unmodelled_nan_fill": r"NaN out-of-bounds fill is not modelled by the shim",
    "map_misaligned": r"the CUtensorMap address \S+ is not 64-byte aligned",
}


def test_encoder_checks_are_named():
    out = run_case("encoder")
    assert out.returncode == CORRECT, out.stdout + out.stderr
    lines = dict(line.split(": ", 1) for line in out.stdout.splitlines())
    assert set(lines) == set(ENCODER_ERRORS)
    for name, pattern in ENCODER_ERRORS.items():
        if name != "valid":
            assert lines[name].startswith("tensor map: "), lines[name]
        assert re.search(pattern, lines[name]), f"{name}: {lines[name]}"


def test_counters():
    out = run_case("counters")
    assert out.returncode == CORRECT, out.stdout + out.stderr
    c = json.loads(out.stdout)
    assert c["mbarrier"] == {"init": 1, "arrive": 0, "arrive_expect_tx": 1, "expect_tx": 0,
                             "try_wait": 2, "test_wait": 0, "inval": 1, "fence_init": 1}
    assert c["named_barriers"] == {"sync": 2, "arrive": 0}
    assert c["bulk_copy"] == {"load": {"instructions": 1, "bytes": 64},
                              "store": {"instructions": 1, "bytes": 64},
                              "reduce": {"instructions": 1, "bytes": 64},
                              "commit_group": 2, "wait_group": 1, "wait_group_read": 1}
    assert c["tma"] == {"load": {"instructions": 1, "bytes": 256},
                        "store": {"instructions": 1, "bytes": 256},
                        "reduce": {"instructions": 0, "bytes": 0}, "prefetch": 1}
    assert c["barriers"] == 1


@pytest.mark.parametrize("case", ["cases", "ring", "ring_missing_expect_tx", "store_without_wait"])
def test_clean_under_asan(case):
    out = run(program("tma_test", sanitize=True), case, schedule="random:5")
    assert out.returncode in (CORRECT, SIM_ERROR), out.stdout + out.stderr
    assert "Sanitizer" not in out.stderr and "runtime error" not in out.stderr, out.stderr
