""".ci/sass_loops.py's reading of SASS, on listings in cuobjdump's format (no nvcc needed): main
loops found on the control-flow graph (an out-of-line wait retry at the kernel's end does not
make the code between it and its wait a loop), HMMA counts per path of an iteration, producer
loops, ptxas' never-executed padding left out, and the stall cycles in the control bits.
tools/gpu_model.py runs it on the built library (test_gpu_model.py)."""

import pytest
from repo_tools import load_tool

KERNEL = "_ZN9flashattn4cuda16fwd_kernel_16bitINS0_9FwdTraitsILi64ELb0EEE13__nv_bfloat16EEvNS_10AttnParamsEPf"


@pytest.fixture(scope="module")
def sass():
    return load_tool("sass_loops", folder=".ci")


def control_word(stall):
    """A second 64-bit word with `stall` cycles, yield off, no barriers (bits 41-44)."""
    return (stall | (7 << 5) | (7 << 8)) << 41


def listing(*instructions, arch="sm_90"):
    """cuobjdump --dump-sass text of one kernel: instructions are (text, stall), 16 bytes apart."""
    lines = ["", "Fatbin elf code:", "================", f"arch = {arch}", "",
             f"\t\tFunction : {KERNEL}"]
    for n, (text, stall) in enumerate(instructions):
        lines.append(f"        /*{16 * n:04x}*/                   {text} ;"
                     f"   /* 0x{0x1234:016x} */")
        lines.append(f"                                 /* 0x{control_word(stall):016x} */")
    return "\n".join(lines) + "\n"


def address(n):
    return f"0x{16 * n:x}"


def kernel_listing():
    """A main loop (instructions 2-9) whose body branches: a masked path with 2 more HMMA (5-6)
    and an unmasked one; a wait in it (3) whose retry is out of line after EXIT (14-15) and
    branches back; a producer loop with a TMA load (10-12); padding that never runs (8)."""
    return [
        ("S2R R0, SR_TID.X", 1),                               # 0
        ("MOV R1, RZ", 2),                                     # 1
        ("HMMA.16816.F32.BF16 R4, R8, R12, R4", 4),            # 2: the main loop's header
        ("@!P1 BRA " + address(14), 1),                        # 3: the wait failed: retry
        ("@P0 BRA " + address(7), 1),                          # 4: unmasked: skip 5-6
        ("HMMA.16816.F32.BF16 R4, R8, R12, R4", 4),            # 5
        ("HMMA.16816.F32.BF16 R4, R8, R12, R4", 4),            # 6
        ("MUFU.EX2 R2, R3", 2),                                # 7
        ("@!PT LDS RZ, [RZ]", 1),                              # 8: padding
        ("@P2 BRA " + address(2), 5),                          # 9: the main loop's back edge
        ("UTMALDG.2D [UR4], [UR6]", 1),                        # 10: the producer's header
        ("SYNCS.ARRIVE.TRANS64 RZ, [UR8], RZ", 1),             # 11
        ("@P3 BRA " + address(10), 2),                         # 12: the producer's back edge
        ("EXIT", 5),                                           # 13
        ("SYNCS.PHASECHK.TRANS64 P1, [UR8], R0", 1),           # 14: the retry
        ("BRA " + address(3), 1),                              # 15
    ]


def test_main_and_producer_loops(sass):
    kernels = sass.parse_sass(listing(*kernel_listing()))
    loops = sass.main_loops(kernels[("sm_90", KERNEL)])
    main = [l for l in loops if l["role"] == "main"]
    producer = [l for l in loops if l["role"] == "producer"]
    assert len(main) == 1 and len(producer) == 1
    # The main loop is 2-9 and the retry 14-15 (part of the wait's own loop), never the code
    # between 9 and 14; the padding at 8 does not count.
    assert main[0]["first"] == 16 * 2
    assert main[0]["hmma"] == 3 and main[0]["mufu"] == 1
    assert main[0]["tensor_per_iteration"] == [1, 3]  # unmasked, masked
    assert "UTMALDG" not in main[0]["opcodes"]
    assert producer[0]["first"] == 16 * 10 and producer[0]["opcodes"]["UTMALDG"] == 1
    assert producer[0]["stall_cycles"] == 1 + 1 + 2


def test_stall_cycles_come_from_the_control_bits(sass):
    word = control_word(11)
    fields = sass.control(word)
    assert fields["stall"] == 11 and fields["write_barrier"] == 7 and fields["read_barrier"] == 7
    kernels = sass.parse_sass(listing(("HMMA.16816.F32.BF16 R4, R8, R12, R4", 9),
                                      ("@P0 BRA " + address(0), 3), ("EXIT", 1)))
    (loop,) = sass.main_loops(kernels[("sm_90", KERNEL)])
    assert loop["stall_cycles"] == 9 + 3 and loop["instructions"] == 2


def test_an_out_of_line_retry_is_not_a_loop_around_the_code_before_it(sass):
    """By address, the retry's branch back to 1 spans 1-5, HMMA included; on the graph only the
    wait (1) and its retry (4-5) loop."""
    kernels = sass.parse_sass(listing(
        ("MOV R2, R3", 1),                                 # 0
        ("@!P1 BRA " + address(4), 1),                     # 1: a wait, retried out of line
        ("HMMA.16816.F32.BF16 R4, R8, R12, R4", 1),        # 2: after the wait, in no loop
        ("EXIT", 1),                                       # 3
        ("SYNCS.PHASECHK.TRANS64 P1, [UR8], R0", 1),       # 4: retry
        ("BRA " + address(1), 1)))                         # 5
    assert sass.main_loops(kernels[("sm_90", KERNEL)]) == []


def loop_of(sass, *instructions):
    kernels = sass.parse_sass(listing(*instructions))
    (main,) = [l for l in sass.main_loops(kernels[("sm_90", KERNEL)]) if l["role"] == "main"]
    return main


def test_path_figures_per_path(sass):
    """kernel_listing's main loop has two paths: unmasked (2, 3, 4, 7, 9: one HMMA, a taken
    branch 4 -> 7 and the back edge) and masked (2-7, 9: three HMMA, only the back edge jumps).
    The wait's out-of-line retry (14-15) goes back to 3 and ends no path; padding (8) counts
    nowhere."""
    main = loop_of(sass, *kernel_listing())
    paths = {(p["tensor"], p["ldgsts"]): p for p in main["paths"]}
    assert set(paths) == {(1, 0), (3, 0)}
    unmasked, masked = paths[1, 0], paths[3, 0]
    assert unmasked["lean"] == unmasked["heavy"] == dict(
        instructions=5, stall_cycles=4 + 1 + 1 + 2 + 5, mufu=1, ldgsts=0, jumps=2,
        tensor_flops=4096)
    assert masked["lean"] == dict(instructions=7, stall_cycles=13 + 4 + 4, mufu=1, ldgsts=0,
                                  jumps=1, tensor_flops=3 * 4096)


def test_lean_and_heavy_paths_with_the_same_counts(sass):
    """Two ways around the same HMMA: a short and a long arm (2 and 4 instructions); the lean
    path takes the short one, the heavy the long one."""
    main = loop_of(sass,
                   ("HMMA.16816.F32.BF16 R4, R8, R12, R4", 2),     # 0: header
                   ("@P0 BRA " + address(4), 1),                  # 1
                   ("IADD3 R1, R1, 1, RZ", 3),                    # 2: the short arm
                   ("BRA " + address(8), 1),                      # 3
                   ("IMAD R1, R1, 3, RZ", 4),                     # 4: the long arm
                   ("IMAD R1, R1, 3, RZ", 4),                     # 5
                   ("IMAD R1, R1, 3, RZ", 4),                     # 6
                   ("IMAD R1, R1, 3, RZ", 4),                     # 7
                   ("@P1 BRA " + address(0), 2),                  # 8: back edge
                   ("EXIT", 1))
    (path,) = main["paths"]
    assert path["lean"]["instructions"] == 2 + 2 + 1 and path["lean"]["stall_cycles"] == 2 + 1 + 3 + 1 + 2
    assert path["heavy"]["instructions"] == 2 + 4 + 1 and path["heavy"]["stall_cycles"] == 2 + 1 + 16 + 2


def test_copy_loops_and_paths_told_by_their_copies(sass):
    """A main loop whose step may copy the next tile through an inner loop of one cp.async per
    trip (4-6), or skip it (the last step): the two paths differ in cp.async, not in HMMA, and the
    inner loop's blocks count once on the path; copy_loops gives one trip's figures."""
    main = loop_of(sass,
                   ("HMMA.16816.F32.BF16 R4, R8, R12, R4", 1),     # 0: header
                   ("HMMA.16816.F32.BF16 R4, R8, R12, R4", 1),     # 1
                   ("MUFU.EX2 R2, R3", 1),                         # 2
                   ("@P0 BRA " + address(7), 1),                   # 3: the last step: no copy
                   ("IMAD R5, R6, 16, R7", 2),                     # 4: copy loop header
                   ("LDGSTS.E.128 [R5], [R6.64]", 3),              # 5
                   ("@P1 BRA " + address(4), 4),                   # 6: copy loop back edge
                   ("@P2 BRA " + address(0), 5),                   # 7: main back edge
                   ("EXIT", 1))
    paths = {(p["tensor"], p["ldgsts"]): p["lean"] for p in main["paths"]}
    assert set(paths) == {(2, 0), (2, 1)}
    assert paths[2, 0]["instructions"] == 5 and paths[2, 0]["jumps"] == 2
    assert paths[2, 1]["instructions"] == 8 and paths[2, 1]["stall_cycles"] == 4 + 2 + 3 + 4 + 5
    assert paths[2, 1]["jumps"] == 1 and paths[2, 1]["mufu"] == 1
    (copy,) = main["copy_loops"]
    assert copy["first"] == 16 * 4 and copy["wanted"] == 1
    assert copy["per_trip"] == dict(instructions=3, stall_cycles=9, mufu=0, ldgsts=1, jumps=1,
                                    tensor_flops=0)


def test_tensor_flops_of_each_shape(sass):
    """A warp's share: m16n8k16 whole, m16n8k8 whole, a warpgroup's m64nNk16 a quarter."""
    assert sass.tensor_flops("HMMA.16816.F32.BF16 R4, R8, R12, R4") == 2 * 16 * 8 * 16
    assert sass.tensor_flops("HMMA.1688.F32.TF32 R4, R8, R12, R4") == 2 * 16 * 8 * 8
    assert sass.tensor_flops("HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], R24, gsb0") == 2 * 16 * 128 * 16
    assert sass.tensor_flops("HGMMA.64x64x16.F32.BF16 R24, R88, gdesc[UR8], R24") == 2 * 16 * 64 * 16
    assert sass.tensor_flops("FFMA R1, R2, R3, R4") == 0
