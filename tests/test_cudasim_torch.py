"""A torch extension built on the shim: SimError reaches Python as RuntimeError naming the
kernel's line, and the next launch works. Slow (torch headers take minutes to compile on two
cores), so it runs only with -m slow."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "cudasim"))
import build  # noqa: E402
from fixtures import SELFTEST_DIR, source_line  # noqa: E402

PROBE = os.path.join(SELFTEST_DIR, "torch_probe.cpp")


@pytest.mark.slow
def test_sim_error_surfaces_as_runtime_error(tmp_path):
    import torch
    from torch.utils.cpp_extension import load

    if build.cuda_include_dir() is None:
        pytest.skip("no cuda_fp16.h / vector_types.h (set CUDA_HOME)")
    # torch chooses the C++ standard (2.14 requires C++20); the shim builds either way.
    flags = build.compile_flags(cxx_std=None)
    probe = load("cudasim_torch_probe", [PROBE] + build.SHIM_SOURCES, extra_cflags=flags,
                 build_directory=str(tmp_path), verbose=False)
    x = torch.randn(100)
    torch.testing.assert_close(probe.double_it(x, False), 2 * x, rtol=0, atol=0)
    with pytest.raises(RuntimeError) as error:
        probe.double_it(x, True)
    message = str(error.value)
    assert "divergent __syncthreads" in message
    assert "torch_probe::double_through_smem" in message
    assert f"torch_probe.cpp:{source_line(PROBE, 'probe_divergent')}" in message
    torch.testing.assert_close(probe.double_it(x, False), 2 * x, rtol=0, atol=0)
