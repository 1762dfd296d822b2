"""The test tolerance rule: a kernel may be at most `factor` times as far from the float64
reference as PyTorch itself is when it computes the same thing in the same dtype."""
import torch

# Absolute slack per dtype; it only matters when PyTorch happens to be exact by structure, e.g.
# dK at seqlen_k = 1, where dS = P * (dP - D) cancels exactly in PyTorch but a kernel computing
# dP = dO.V and D = dO.O in different orders (d = 32 terms of size ~1) is off by ~1e-6 in fp32.
EPSILON = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 1e-4, torch.bfloat16: 1e-3}


def max_abs_error(actual, expected):
    actual, expected = actual.double(), expected.double()
    finite = torch.isfinite(expected)
    # An infinite expectation (the LSE of a row that sees nothing) must be matched exactly.
    assert torch.equal(actual[~finite], expected[~finite]), "mismatch at infinite entries"
    if actual.numel() == 0 or not finite.any():
        return 0.0
    diff = (actual[finite] - expected[finite]).abs()
    return float("inf") if torch.isnan(diff).any() else diff.max().item()


def assert_within_torch_error(name, actual, reference64, torch_lowp, factor=2.0, slack=0.0):
    """actual: kernel result; reference64: float64 reference; torch_lowp: PyTorch's own result
    in the kernel's dtype (the yardstick). slack: an absolute allowance added to the bound, for
    error PyTorch avoids by structure (test_fuzz_differential.one_visible_key_slack)."""
    assert actual.shape == reference64.shape, f"{name}: shape {actual.shape} != {reference64.shape}"
    assert not torch.isnan(actual).any(), f"{name}: contains NaN (unwritten or masked-row bug)"
    err = max_abs_error(actual, reference64)
    yardstick = max_abs_error(torch_lowp, reference64)
    bound = (factor * yardstick + slack
             + EPSILON[actual.dtype if actual.is_floating_point() else torch.float32])
    assert err <= bound, (f"{name}: max error {err:.3e} exceeds {factor}x PyTorch's own error "
                          f"{yardstick:.3e} (+eps) in {actual.dtype}")
