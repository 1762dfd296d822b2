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


def sm90a_rows(loops, stack=0):
    """(rows as parse_resource_usage gives them, demangled names) of a library whose sm_90a
    forward file at d = 64 holds `loops` main loops, the first with a `stack`-byte frame, beside
    a backward kernel and an sm_80 one with stack frames of their own."""
    def row(kernel, arch, stack):
        return {"kernel": kernel, "arch": arch, "regs": 168, "smem": 0, "stack": stack, "local": 0}
    rows = [row(f"_ZN9flashattn6hopper15fwd_sm90_kernelI{i}E", "sm_90a", stack if i == 0 else 0)
            for i in range(loops)]
    names = [f"void flashattn::hopper::fwd_sm90_kernel<__nv_bfloat16, 64, {i}>(flashattn::hopper::Params)"
             for i in range(loops)]
    rows += [row("_ZN9flashattn6hopper15bwd_sm90_kernelIE", "sm_90a", 0), row(FWD, "sm_80", 16)]
    names += ["void flashattn::hopper::bwd_sm90_kernel<__half, 64>(flashattn::hopper::Params)",
              "void flashattn::cuda::fwd_kernel_16bit<bf16>(flashattn::AttnParams, float*)"]
    return rows, names


def test_sm90a_forward_with_every_main_loop_and_no_stack_passes(gates):
    assert gates.sm90a_problems(*sm90a_rows(gates.FWD_SM90_MAIN_LOOPS[64])) == []


def test_sm90a_forward_missing_a_main_loop_fails(gates):
    problems = gates.sm90a_problems(*sm90a_rows(gates.FWD_SM90_MAIN_LOOPS[64] - 1))
    assert problems == [f"fwd_sm90_kernel<__nv_bfloat16, 64>: {gates.FWD_SM90_MAIN_LOOPS[64] - 1} "
                        f"main loops built, FWD_SM90_MAIN_LOOPS says {gates.FWD_SM90_MAIN_LOOPS[64]}"]


def test_sm90a_fp8_forward_counts_its_own_main_loops(gates):
    """The FP8 forward's file holds FWD_SM90_FP8_MAIN_LOOPS, not the 16-bit files' count."""
    rows, names = sm90a_rows(gates.FWD_SM90_MAIN_LOOPS[64])
    fp8 = gates.FWD_SM90_FP8_MAIN_LOOPS[128]
    for i in range(fp8):
        rows.append({"kernel": f"_ZN9flashattn6hopper15fwd_sm90_kernelIF{i}E", "arch": "sm_90a",
                     "regs": 168, "smem": 0, "stack": 0, "local": 0})
        names.append(f"void flashattn::hopper::fwd_sm90_kernel<__nv_fp8_e4m3, 128, {i}>(P)")
    assert gates.sm90a_problems(rows, names) == []
    assert gates.sm90a_problems(rows[:-1], names[:-1]) == [
        f"fwd_sm90_kernel<__nv_fp8_e4m3, 128>: {fp8 - 1} main loops built, "
        f"FWD_SM90_FP8_MAIN_LOOPS says {fp8}"]


def test_sm90a_stack_frame_fails(gates):
    problems = gates.sm90a_problems(*sm90a_rows(gates.FWD_SM90_MAIN_LOOPS[64], stack=8))
    assert len(problems) == 1 and "a 8-byte stack frame" in problems[0], problems
