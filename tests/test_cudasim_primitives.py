"""Every primitive the shim emulates, against a scalar reference built from the PTX ISA's
fragment descriptions and the CUDA guide's shuffle rules (tests/cudasim/selftest/primitive_cases.h).
"""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "cudasim"))
from fixtures import program, run  # noqa: E402

CASES = (
    [f"ldmatrix_x{n}{t}" for t in ("", "_trans") for n in (1, 2, 4)]
    + [f"mma_m16n8k16_{ty}_{vals}" for ty in ("f16", "bf16") for vals in ("integers", "reals")]
    + [f"{op}_{ty}" for op in ("shfl_sync", "shfl_up_sync", "shfl_down_sync", "shfl_xor_sync")
       for ty in ("float", "int", "double")]
    + ["shfl_xor_width16_mask_0000ffff", "shfl_xor_width16_mask_ffff0000",
       "vote_mask_ffffffff", "vote_mask_0f0f00ff", "cp_async_groups_and_zero_fill",
       "exp2_approx", "thread_index", "red_add_f32x2"]
)

_results = {}


def results_for(seed, *flags):
    if (seed, flags) not in _results:
        out = run(program("primitives_test"), *flags, str(seed))
        lines = [line for line in out.stdout.splitlines() if line.startswith(("PASS", "FAIL"))]
        assert lines, f"primitives_test printed nothing\n{out.stdout}\n{out.stderr}"
        _results[seed, flags] = {line.split()[1].rstrip(":"): line for line in lines}
    return _results[seed, flags]


@pytest.mark.parametrize("seed", [20261129, 7])
@pytest.mark.parametrize("case", CASES)
def test_primitive_matches_reference(case, seed):
    results = results_for(seed)
    assert "run" not in results, results["run"]
    assert case in results, f"case {case} did not run: {sorted(results)}"
    assert results[case].startswith("PASS"), results[case]


def test_no_unlisted_cases():
    assert set(results_for(20261129)) == set(CASES)


def test_hardware_safe_inputs_pass_too():
    """The shim side of the GPU layout check (valid addresses on lanes ldmatrix ignores and for
    zero-byte copies) must itself match the reference."""
    results = results_for(20261129, "--hardware-safe")
    assert set(results) == set(CASES)
    assert all(line.startswith("PASS") for line in results.values()), results
