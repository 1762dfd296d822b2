"""Malformed varlen lengths on the CUDA kernels: on CUDA nothing checks cu_seqlens or seqused on
the host, so the kernels clamp them to their tensors. The kernels' own source runs on the shim
under ASan with every tensor an exact-size heap block (tests/cudasim/selftest/
varlen_bounds_test.cpp): a single read or write outside one fails the run."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "cudasim"))
from fixtures import program, run  # noqa: E402

ASAN_TIMEOUT_S = 300


def test_malformed_lengths_never_leave_the_tensors():
    out = run(program("varlen_bounds_test", sanitize=True), timeout=ASAN_TIMEOUT_S)
    report = out.stdout + out.stderr
    assert out.returncode == 0, report
    assert "all cases ran" in out.stdout, report
    assert "AddressSanitizer" not in out.stderr and "runtime error" not in out.stderr, report
