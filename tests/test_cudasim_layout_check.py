"""The GPU layout check (tests/cudasim/layout_check.py) can only run on a GPU, but both of its
sides must keep compiling: nvcc builds the inline-PTX branch of csrc/cuda/ptx.cuh."""
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "cudasim"))
import layout_check  # noqa: E402


@pytest.mark.skipif(layout_check.nvcc_path() is None, reason="nvcc not found")
def test_layout_check_compiles_for_sm90():
    out = subprocess.run([sys.executable, layout_check.__file__, "--arch", "90", "--compile-only"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.skipif(layout_check.nvcc_path() is None, reason="nvcc not found")
def test_layout_check_compiles_for_sm90a():
    """--arch 90a adds the sm_90 cases (TMA, bulk copies, mbarriers; wgmma where present), whose
    PTX only an arch-specific sm_90a build accepts."""
    out = subprocess.run([sys.executable, layout_check.__file__, "--arch", "90a", "--compile-only"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "layout_check_gpu_sm90a" in out.stdout
