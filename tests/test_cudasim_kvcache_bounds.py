"""Malformed KV-cache indices on the CUDA kernels: on CUDA nothing checks cache_seqlens,
block_table, cache_batch_idx or cache_leftpad on the host, so the append and forward kernels
(one split, and three with split-KV's merge; a GQA group's heads as their own tiles and packed
as the rows of one, cuda/gqa_decode.h) clamp or skip them. The kernels' own source runs
on the shim under ASan with every tensor an exact-size heap block
(tests/cudasim/selftest/kvcache_bounds_test.cpp): a single read or write outside one fails the
run."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "cudasim"))
from fixtures import program, run  # noqa: E402

ASAN_TIMEOUT_S = 300


def test_malformed_cache_indices_never_leave_the_tensors():
    out = run(program("kvcache_bounds_test", sanitize=True), timeout=ASAN_TIMEOUT_S)
    report = out.stdout + out.stderr
    assert out.returncode == 0, report
    assert out.stdout.count(": ran") == 40 and "all cases ran" in out.stdout, report
    assert out.stdout.count("packed heads): ran") == 20, report
    assert "AddressSanitizer" not in out.stderr and "runtime error" not in out.stderr, report
