""".ci/sass_copy_loops.py's reading of SASS, on hand-written listings in cuobjdump's format (no
nvcc needed): basic blocks split at branch targets, whole-tile copy blocks told paged (they
load row addresses) from dense, and the gate failing when the paged copy grows back or when
either kind is missing. The gate on real SASS runs in .ci/cuda_gates.py on the CUDA build."""

import pytest
from repo_tools import load_tool

KERNEL = "_ZN9flashattn4cuda16fwd_kernel_16bitINS0_9FwdTraitsILi128ELb1EEE13__nv_bfloat16EEvNS_10AttnParamsEPf"


@pytest.fixture(scope="module")
def loops():
    return load_tool("sass_copy_loops", folder=".ci")


class Listing:
    """A kernel's instructions as dump_sass returns them: (address, text), 16 bytes apart."""

    def __init__(self):
        self.instructions = []

    def add(self, *texts):
        for text in texts:
            self.instructions.append((16 * len(self.instructions), text))
        return self

    def copy_block(self, address_loads, other, copies=8, zfill=False):
        """A block ending in a branch: `address_loads` LDS, `other` IMADs, `copies` LDGSTS."""
        self.add(*["LDS.64 R4, [R2+0xcc00]"] * address_loads, *["IMAD R6, R7, R8, RZ"] * other)
        self.add(*[f"LDGSTS.E.BYPASS.128{'.ZFILL' if zfill else ''} [R5], desc[UR6][R4.64]"] * copies)
        return self.add("BRA 0x0")


def per_copy(loops, listing):
    return [(kind, round(n / c, 1)) for kind, n, c in loops.copy_blocks(listing.instructions, 128)]


def test_blocks_split_at_branch_targets_and_padding_is_left_out(loops):
    listing = Listing().add("IMAD R1, R2, R3, RZ", "@P0 BRA 0x40", "IMAD R1, R2, R3, RZ",
                            "@!PT LDS RZ, [RZ]", "IMAD R1, R2, R3, RZ", "EXIT")
    blocks = loops.basic_blocks(listing.instructions)
    # 0x40 is the 5th instruction: a leader; @!PT padding dropped.
    assert blocks == [["IMAD R1, R2, R3, RZ", "@P0 BRA 0x40"], ["IMAD R1, R2, R3, RZ"],
                      ["IMAD R1, R2, R3, RZ", "EXIT"]]


def test_copy_blocks_are_told_apart(loops):
    listing = Listing().copy_block(0, 100).copy_block(8, 63).copy_block(0, 200, zfill=True)
    listing.copy_block(0, 10, copies=3)  # a rolled loop's body: not a whole tile
    # 100 + 8 copies + 1 branch over 8; 8 + 63 + 8 + 1 over 8; the zero-filling block is left out.
    assert per_copy(loops, listing) == [("dense", 13.6), ("paged", 10.0)]


def test_gate_fails_when_the_paged_copy_regrows(loops, capsys):
    good = Listing().copy_block(0, 100).copy_block(8, 63)
    assert loops.check({("sm_90", KERNEL): good.instructions}) == []
    # Main before the row table: ~44 instructions per cp.async against ~14.
    bad = Listing().copy_block(0, 100).copy_block(8, 335)
    failures = loops.check({("sm_90", KERNEL): bad.instructions})
    assert len(failures) == 1 and "the paged copy takes 44.0 SASS instructions" in failures[0]
    assert "1.25 x the dense copy's 13.6" in failures[0]


def test_gate_fails_when_a_kind_is_missing(loops):
    only_dense = Listing().copy_block(0, 100)
    failures = loops.check({("sm_80", KERNEL): only_dense.instructions})
    assert len(failures) == 1 and "found 1 dense and 0 paged" in failures[0]
    assert loops.check({("sm_80", "other_kernel"): only_dense.instructions}) == [
        "no one-m-tile 16-bit forward kernel (FwdTraits<d <= 128, true>) found"]
