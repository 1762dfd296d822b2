"""The shim's counters (tests/cudasim/README.md, "Counters") against hand counts for small
kernels (tests/cudasim/selftest/counters_test.cpp): shared-memory wavefronts with and without
bank conflicts, ldmatrix rows that conflict and rows that do not, mma, cp.async, atomics,
global stores, barriers and shuffles."""
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "cudasim"))
from fixtures import program, run  # noqa: E402
from repo_tools import load_tool  # noqa: E402

# kernel -> {dotted counter path: hand count}. Every counter not listed must be 0, so a kernel
# that counts something it does not do fails too. The comments in counters_test.cpp derive each.
LDS = "lds.instructions", "lds.wavefronts", "lds.wavefronts_ideal"
STS = "sts.instructions", "sts.wavefronts", "sts.wavefronts_ideal"
LDM = "ldmatrix_wavefronts", "ldmatrix_wavefronts_ideal"


def triple(keys, values):
    return dict(zip(keys, values))


EXPECTED = {
    "sts_stride32": triple(STS, (1, 32, 1)),         # 32-way bank conflict
    "sts_consecutive": triple(STS, (1, 1, 1)),
    "lds_stride33": triple(LDS, (1, 1, 1)),          # padded rows: conflict-free column
    "lds_broadcast": triple(LDS, (1, 1, 1)),
    "lds_stride2": triple(LDS, (1, 2, 1)),           # 2-way
    "lds_half_warp_stride32": triple(LDS, (1, 16, 1)),
    "lds_uint4_consecutive": triple(LDS, (1, 4, 4)),
    "lds_uint4_stride32B": triple(LDS, (1, 8, 4)),   # 2-way in each quarter-warp phase
    "sts_loop3": triple(STS, (3, 3, 3)),
    "sts_u16": triple(STS, (1, 1, 1)),
    "ldmatrix_padded": {"ldmatrix.x4": 1, "ldmatrix.x2.trans": 1, "ldmatrix.x1": 1,
                        **triple(LDM, (7, 7))},
    "ldmatrix_unpadded": {"ldmatrix.x4": 1, **triple(LDM, (32, 4))},  # 8-way per matrix
    "mma_count": {"mma.m16n8k16.bf16": 6, "mma.m16n8k16.f16": 4},
    "cp_async_count": {"cp_async.instructions": 2, "cp_async.copies": 64, "cp_async.bytes": 576,
                       "cp_async.sectors": 18, "cp_async.smem_wavefronts": 8,
                       "cp_async.smem_wavefronts_ideal": 8},
    "atomic_count": {"atomics.ops": 72, "atomics.instructions": 3, "atomics.sectors": 7,
                     "atomics.by_width.4": 64, "atomics.by_width.8": 8},
    "red_v2_count": {"atomics.ops": 32, "atomics.instructions": 1, "atomics.sectors": 8,
                     "atomics.by_width.8": 32},
    "gmem_count": {"gmem_store.instructions": 1, "gmem_store.bytes": 128,
                   "gmem_store.sectors": 4, "gmem_load.instructions": 1, "gmem_load.bytes": 256,
                   "gmem_load.sectors": 1},
    "barriers_and_shuffles": {"blocks": 2, "barriers": 6, "shuffles": 8},
}
# Totals the JSON derives from the parts.
DERIVED = ("smem_wavefronts", "smem_wavefronts_ideal", "global_sectors")


# The model flattens the shim's nested counters the same way.
flatten = load_tool("gpu_model").flatten


@pytest.fixture(scope="module")
def counted():
    out = run(program("counters_test"))
    assert out.returncode == 0, out.stdout + out.stderr
    data = json.loads(out.stdout)
    launches = {launch["kernel"].split("::")[-1].split("(")[0]: launch
                for launch in data["launches"]}
    return data, launches


@pytest.mark.parametrize("kernel", sorted(EXPECTED))
def test_counters_match_hand_counts(counted, kernel):
    _, launches = counted
    counters = flatten(launches[kernel]["counters"])
    expected = {"blocks": 1, **EXPECTED[kernel]}
    got = {key: value for key, value in counters.items()
           if key not in DERIVED and (value or key in expected)}
    assert got == expected
    smem = sum(counters[k] for k in ("ldmatrix_wavefronts", "lds.wavefronts", "sts.wavefronts",
                                     "cp_async.smem_wavefronts"))
    assert counters["smem_wavefronts"] == smem
    assert counters["global_sectors"] == (counters["cp_async.sectors"] +
                                          counters["gmem_load.sectors"] +
                                          counters["gmem_store.sectors"] +
                                          counters["atomics.sectors"])


def test_launch_records_and_per_kernel_totals(counted):
    data, launches = counted
    assert set(launches) == set(EXPECTED)
    mma = launches["mma_count"]
    assert mma["grid"] == [1, 1, 1] and mma["block"] == [64, 1, 1] and mma["smem_bytes"] == 0
    assert launches["barriers_and_shuffles"]["grid"] == [2, 1, 1]
    for name, totals in data["kernels"].items():
        assert totals["launches"] == 1
        assert totals["counters"] == next(l["counters"] for l in data["launches"]
                                          if l["kernel"] == name)


def test_counters_off_count_nothing():
    out = run(program("counters_test"), "off")
    assert out.returncode == 0, out.stdout + out.stderr
    assert json.loads(out.stdout) == {"launches": [], "kernels": {}}
