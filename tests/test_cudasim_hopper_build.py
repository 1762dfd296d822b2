"""The sm_90a instantiation files build for sm_90a only (kernel_list.py ARCHS, setup.py
give_own_gencode): a device pass for any other target stops at launch_fwd_sm90.cuh's #error, so a
build that gave them the common architecture list fails loudly instead of leaving empty kernels;
for sm_90a they compile with no spills. nvcc only, no GPU.

scripts/test.sh sets FLASHATTN_SM90A_GATES_LOG to .ci/cuda_gates.py's log once the gates have
passed on a wheel that holds sm_90a kernels. That build compiled every sm_90a file with these flags
(spills and local memory fail it), so the sm_90a test reads the log instead of compiling one file
again (~4 minutes on CI's two cores): it checks the library's table itself, every sm_90a
instantiation file's forward with all its main loops, none with a stack frame or local memory."""
import collections
import os
import re
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


# A row of cuda_gates.py's table: arch, registers, shared memory, stack, local memory, kernel.
GATES_ROW = re.compile(r"^(sm_\w+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\S.*)$", re.M)
FWD_SM90_ROW = re.compile(r"fwd_sm90_kernel<(__nv_bfloat16|__half|__nv_fp8_e4m3), (\d+),")
TYPE_OF_FILE = {"bf16": "__nv_bfloat16", "fp16": "__half", "e4m3": "__nv_fp8_e4m3"}


def sm90a_forward_rows(log):
    """{(dtype, d): [(stack, local), ...]} for the sm_90a forward kernels in a gates log."""
    rows = collections.defaultdict(list)
    for arch, _, _, stack, local, kernel in GATES_ROW.findall(log):
        if arch == "sm_90a" and (m := FWD_SM90_ROW.search(kernel)):
            rows[m.group(1), int(m.group(2))].append((int(stack), int(local)))
    return rows


def sm90a_forward_files():
    """{(dtype, d)} of csrc/cuda/inst/fwd_hdim<d>_<type>_sm90.cu."""
    files = os.listdir(os.path.join(REPO, "csrc", "cuda", "inst"))
    return {(TYPE_OF_FILE[m.group(2)], int(m.group(1)))
            for f in files if (m := re.fullmatch(r"fwd_hdim(\d+)_(bf16|fp16|e4m3)_sm90\.cu", f))}


def check_gates_log(log):
    """The failures of a gates log against the tree: the gates did not pass, or an sm_90a forward
    file is missing, short of its main loops (FWD_SM90_MAIN_LOOPS[d], FP8: FWD_SM90_FP8_MAIN_LOOPS[d]),
    or one has a stack or local memory."""
    if not re.search(r"^all gates passed: .* the [1-9]\d* sm_90a kernels use", log, re.M):
        return ["the gates log does not say that every gate passed on sm_90a kernels"]
    loops_of = load_tool("cuda_gates", folder=".ci").fwd_sm90_main_loops
    rows, failures = sm90a_forward_rows(log), []
    for dtype, d in sorted(sm90a_forward_files()):
        built, want = rows.get((dtype, d), []), loops_of(dtype, d)
        if len(built) != want:
            failures.append(f"fwd_sm90_kernel<{dtype}, {d}>: {len(built)} kernels, want {want}")
        failures += [f"fwd_sm90_kernel<{dtype}, {d}>: stack {s}, local {lm}"
                     for s, lm in built if s or lm]
    return failures


GATES_LOG = os.environ.get("FLASHATTN_SM90A_GATES_LOG")


@pytest.mark.skipif(hopper_gemm.nvcc_path() is None, reason="nvcc not found")
def test_sm90a_compiles_without_spills(tmp_path):
    if GATES_LOG:
        with open(GATES_LOG) as f:
            assert check_gates_log(f.read()) == []
        return
    out = compile_for("arch=compute_90a,code=sm_90a", tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    # The main loops of kernel_list.py's fwd_sm90 family at d = 64 (no mask, causal, local, each
    # with softcap or not; ALiBi with no mask, causal or local; attn_mask, no mask, causal or local;
    # a gathered KV cache, no mask, causal or local; dropout, no mask, causal or local), each with
    # no stack and no spills: the count the gates hold the wheel's library to.
    loops = load_tool("cuda_gates", folder=".ci").FWD_SM90_MAIN_LOOPS[64]
    assert out.stderr.count("Compiling entry function") == loops, out.stderr
    assert out.stderr.count("0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads") == loops


def test_the_gates_log_check_fails_on_a_short_or_failed_log():
    """check_gates_log, which stands in for the compile above in CI, is not vacuous."""
    loops_of = load_tool("cuda_gates", folder=".ci").fwd_sm90_main_loops
    files = sorted(sm90a_forward_files())
    assert files, "no fwd_*_sm90.cu instantiation files found"
    assert ("__nv_fp8_e4m3", 128) in files, "the FP8 forward's file is checked too"
    flags = ", ".join(["false"] * 7)
    table = "\n".join(f"sm_90a  168  1024     0     0  flashattn::hopper::fwd_sm90_kernel<{t}, {d}, "
                      f"{flags}>" for t, d in files for _ in range(loops_of(t, d)))
    passed = ("all gates passed: 9 kernels in SASS for sm_90a, no local memory; the 9 sm_90a "
              "kernels use HGMMA")
    assert check_gates_log(f"{table}\n{passed}\n") == []
    assert check_gates_log(f"{table}\nFAILED gates:\n") != []
    short = table.rsplit("\n", 1)[0]
    assert any("kernels, want" in f for f in check_gates_log(f"{short}\n{passed}\n"))
    stacked = table.replace("  1024     0     0", "  1024    16     0", 1)
    assert any("stack 16" in f for f in check_gates_log(f"{stacked}\n{passed}\n"))
    no_fp8 = "\n".join(line for line in table.split("\n") if "fp8" not in line)
    want_fp8 = loops_of("__nv_fp8_e4m3", 128)
    assert f"fwd_sm90_kernel<__nv_fp8_e4m3, 128>: 0 kernels, want {want_fp8}" in check_gates_log(
        f"{no_fp8}\n{passed}\n")
