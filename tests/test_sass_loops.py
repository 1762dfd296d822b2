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
