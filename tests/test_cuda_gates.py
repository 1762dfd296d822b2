""".ci/cuda_gates.py's reading of `cuobjdump --dump-resource-usage`, on listings in its format (no
nvcc needed). The registers it reads are what tools/gpu_model.py's occupancy uses, so a kernel
read under the wrong architecture or a row lost would skew the model silently."""

import pytest
from repo_tools import load_tool

FWD = "_ZN9flashattn4cuda16fwd_kernel_16bitINS0_9FwdTraitsILi128ELb1EEE13__nv_bfloat16EEvNS_10AttnParamsEPf"
MERGE = "_ZN9flashattn4cuda18split_merge_kernelIfEEvNS_16SplitMergeParamsE"

# A library: one fatbin entry per architecture, a PTX entry (no functions) between them.
LIBRARY = f"""
Fatbin elf code:
================
arch = sm_80
code version = [1,8]
host = linux
compile_size = 64bit

Resource usage:
 Common:
  GLOBAL:0
 Function {FWD}:
  REG:255 STACK:0 SHARED:0 LOCAL:0 CONSTANT[2]:8 CONSTANT[0]:1040 TEXTURE:0 SURFACE:0 SAMPLER:0
 Function {MERGE}:
  REG:66 STACK:16 SHARED:2048 LOCAL:0 CONSTANT[0]:600 TEXTURE:0 SURFACE:0 SAMPLER:0

Fatbin ptx code:
================
arch = sm_90
code version = [9,0]
host = linux
compile_size = 64bit
compressed

Fatbin elf code:
================
arch = sm_90
code version = [1,8]
host = linux
compile_size = 64bit

Resource usage:
 Common:
  GLOBAL:0
 Function {FWD}:
  REG:232 STACK:0 SHARED:0 LOCAL:24 CONSTANT[2]:8 CONSTANT[0]:1040 TEXTURE:0 SURFACE:0 SAMPLER:0
"""

# A lone cubin: no "arch =" line (resource_usage then asks `cuobjdump -elf`).
CUBIN = f"""
Resource usage:
 Common:
  GLOBAL:0
 Function {MERGE}:
  REG:40 STACK:0 SHARED:0 LOCAL:0 CONSTANT[0]:360 TEXTURE:0 SURFACE:0 SAMPLER:0
"""


@pytest.fixture(scope="module")
def gates():
    return load_tool("cuda_gates", folder=".ci")


def test_reads_every_kernel_under_its_architecture(gates):
    rows = gates.parse_resource_usage(LIBRARY)
    assert [(r["arch"], r["kernel"], r["regs"]) for r in rows] == [
        ("sm_80", FWD, 255), ("sm_80", MERGE, 66), ("sm_90", FWD, 232)]
    merge = rows[1]
    assert (merge["smem"], merge["stack"], merge["local"]) == (2048, 16, 0)
    assert rows[2]["local"] == 24


def test_a_lone_cubin_leaves_the_architecture_open(gates):
    rows = gates.parse_resource_usage(CUBIN)
    assert [(r["arch"], r["kernel"], r["regs"]) for r in rows] == [(None, MERGE, 40)]


def test_an_empty_listing_has_no_kernels(gates):
    assert gates.parse_resource_usage("\nFatbin ptx code:\n================\narch = sm_90\n") == []
