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
