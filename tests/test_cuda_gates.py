""".ci/cuda_gates.py's reading of `cuobjdump --dump-resource-usage`, on listings in its format (no
nvcc needed). The registers it reads are what tools/gpu_model.py's occupancy uses, so a kernel
read under the wrong architecture or a row lost would skew the model silently."""

import pytest
from repo_tools import load_tool

FWD = "_ZN9flashattn4cuda16fwd_kernel_16bitINS0_9FwdTraitsILi128ELb1EEE13__nv_bfloat16EEvNS_10AttnParamsEPf"
MERGE = "_ZN9flashattn4cuda18split_merge_kernelIfEEvNS_16SplitMergeParamsE"


def function_row(name, regs, stack=0, shared=0, local=0):
    """One kernel's line under "Resource usage:", as cuobjdump prints it."""
    return (f" Function {name}:\n  REG:{regs} STACK:{stack} SHARED:{shared} LOCAL:{local} "
            "CONSTANT[0]:600 TEXTURE:0 SURFACE:0 SAMPLER:0\n")


def resource_usage(*rows):
    return "\nResource usage:\n Common:\n  GLOBAL:0\n" + "".join(rows)


def fatbin_entry(kind, arch, body=""):
    """A fatbin entry's header ("elf" or "ptx") for `arch`, then its body."""
    return (f"\nFatbin {kind} code:\n================\narch = {arch}\ncode version = [1,8]\n"
            f"host = linux\ncompile_size = 64bit\n{body}")


# A library: one fatbin entry per architecture, a PTX entry (no functions) between them.
LIBRARY = (fatbin_entry("elf", "sm_80", resource_usage(function_row(FWD, 255),
                                                       function_row(MERGE, 66, stack=16, shared=2048)))
           + fatbin_entry("ptx", "sm_90", "compressed\n")
           + fatbin_entry("elf", "sm_90", resource_usage(function_row(FWD, 232, local=24))))

# A lone cubin: no "arch =" line (resource_usage then asks `cuobjdump -elf`).
CUBIN = resource_usage(function_row(MERGE, 40))


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

