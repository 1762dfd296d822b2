"""The sm_90a instantiation files build for sm_90a only (kernel_list.py ARCHS, setup.py
give_own_gencode): a device pass for any other target stops at launch_fwd_sm90.cuh's #error, so a
build that gave them the common architecture list fails loudly instead of leaving empty kernels;
for sm_90a they compile with no spills. nvcc only, no GPU.

scripts/test.sh sets FLASHATTN_SM90A_GATED=1 once .ci/cuda_gates.py has passed on a wheel that
holds sm_90a kernels: that build compiled every sm_90a file with these flags (spills and local
memory fail it), and the gates checked each main kernel for a stack frame and each forward file
for all its main loops (FWD_SM90_MAIN_LOOPS), so the sm_90a compile here is not repeated."""
import os
import subprocess
import sys

import pytest
import torch
import torch.utils.cpp_extension as cpp_extension

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "cudasim"))
import hopper_gemm  # noqa: E402
from repo_tools import load_tool  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = os.path.join(REPO, "csrc", "cuda", "inst", "fwd_hdim64_bf16_sm90.cu")


def cxx_std():
    """The standard torch's cpp_extension builds with: C++20 from torch 2.13, C++17 before."""
    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    return "-std=c++20" if (major, minor) >= (2, 13) else "-std=c++17"


def compile_for(gencode, tmp_path):
    """nvcc -c SOURCE with the wheel build's flags and one -gencode; the completed process."""
    includes = [f"-I{p}" for p in cpp_extension.include_paths("cuda")]
    command = [hopper_gemm.nvcc_path(), "-c", SOURCE, "-o", str(tmp_path / "out.o"),
               f"-I{os.path.join(REPO, 'csrc')}", *includes, cxx_std(), "-O3",
               "--use_fast_math", "--expt-relaxed-constexpr", "-DFLASHATTN_SM90_KERNELS",
               "-Xptxas=-v,-warn-spills,-warn-lmem-usage,-Werror", f"-gencode={gencode}"]
    return subprocess.run(command, capture_output=True, text=True, timeout=600)


@pytest.mark.skipif(hopper_gemm.nvcc_path() is None, reason="nvcc not found")
@pytest.mark.parametrize("gencode", ["arch=compute_80,code=sm_80", "arch=compute_90,code=sm_90"])
def test_other_targets_stop_at_the_error(gencode, tmp_path):
    out = compile_for(gencode, tmp_path)
    assert out.returncode != 0
    assert "compiles for arch=compute_90a,code=sm_90a only" in out.stderr, out.stderr[-2000:]


@pytest.mark.skipif(hopper_gemm.nvcc_path() is None, reason="nvcc not found")
@pytest.mark.skipif(os.environ.get("FLASHATTN_SM90A_GATED") == "1",
                    reason="the wheel build compiled every sm_90a file and .ci/cuda_gates.py checked them")
def test_sm90a_compiles_without_spills(tmp_path):
    out = compile_for("arch=compute_90a,code=sm_90a", tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    # The main loops of kernel_list.py's fwd_sm90 family at d = 64 (no mask, causal, local, each
    # with softcap or not; ALiBi with no mask, causal or local; attn_mask, no mask, causal or local;
    # a gathered KV cache, no mask, causal or local; dropout, no mask, causal or local), each with
    # no stack and no spills: the count the gates hold the wheel's library to.
    loops = load_tool("cuda_gates", folder=".ci").FWD_SM90_MAIN_LOOPS[64]
    assert out.stderr.count("Compiling entry function") == loops, out.stderr
    assert out.stderr.count("0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads") == loops
