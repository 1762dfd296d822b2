#!/usr/bin/env python3
"""Counts SASS instructions per cp.async (LDGSTS) in the forward's unrolled K/V tile copies, a
paged cache's against strided (dense) rows, and fails when the paged copy is longer than the
dense one by more than a bound.

Decoding reads its cache in the one-m-tile 16-bit forward, FwdTraits<d, true> for d <= 128
(fwd_kernel.cuh, kUnrolledCacheCopies). A whole tile's copy there is straight-line code, one
basic block per call site and layout with the thread's kPerThread chunks. A paged cache's block
reads its row addresses from memory, from the row table in shared memory (LDS;
paged_row_table.cuh) or, before that table, from the block table in global memory (LDG),
where a strided block reads none. Before the table (issue 33) the paged block took ~38-44
instructions per cp.async at d = 128 on sm_90, the dense one ~14.

    python .ci/sass_copy_loops.py [--tree .] [--arch 90] [--files fwd_hdim128_bf16.cu]
    python .ci/sass_copy_loops.py --before main          # also prints main's counts, no gate
    python .ci/sass_copy_loops.py --binary flashattn/_C.abi3.so   # every architecture built

--tree compiles csrc/cuda/inst/<files> for --arch with .ci/sass_compare.py's nvcc command
(cached under build/sass/); --binary reads a built library. Exit status 0 when, in every
checked kernel, each paged full-tile copy block is at most MAX_PAGED_OVER_DENSE times the
longest dense one (per cp.async), and both kinds were found.
"""
import argparse
import collections
import importlib.util
import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The paged copy may cost this much more per cp.async than the dense one: its row address is
# one shared-memory load where the dense one is a product, so they should be about even; the
# slack is for ptxas' scheduling, which moves a few neighbouring instructions into the blocks.
MAX_PAGED_OVER_DENSE = 1.25
# The one-m-tile forward kernels whose cache copies are unrolled: FwdTraits<d, true>, d <= 128.
KERNEL = re.compile(r"fwd_kernel_16bitINS0_9FwdTraitsILi(\d+)ELb1EEE")
UNROLLED_MAX_HEAD_DIM = 128
BLOCK_N, THREADS, CHUNK_ELEMS = 64, 128, 8  # FwdTraits' kBlockN, kNThreads up to d = 128

BRANCH_TARGET = re.compile(r"\b(?:BRA|BSSY|CALL\.REL(?:\.NOINC)?|BREAK|BPT)\b.*?(0x[0-9a-f]+)")
ENDS_BLOCK = ("BRA", "EXIT", "RET", "BSYNC", "CALL", "JMP", "BRX", "BREAK", "WARPSYNC", "BAR")


def _load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, ".ci", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def opcode(instruction):
    text = re.sub(r"^@!?U?P\w+\s+", "", instruction)
    return text.split()[0].split(".")[0] if text else ""


def dump_sass(cuobjdump, nvdisasm, obj):
    """{(arch, mangled kernel): [(address, instruction)]} of a cubin or a library."""
    return without_control_words(_load("sass_loops").dump_sass(cuobjdump, nvdisasm, obj))


def without_control_words(kernels):
    """.ci/sass_loops.py's listings, {key: [(address, instruction, control word)]}, as this
    script reads them."""
    return {key: [(address, text) for address, text, _ in listing]
            for key, listing in kernels.items()}


def basic_blocks(instructions):
    """The kernel split at branch targets and after branches, exits and barriers; instructions
    predicated on @!PT (never executed: ptxas' padding) are left out."""
    leaders = {instructions[0][0]} if instructions else set()
    for i, (_, text) in enumerate(instructions):
        if m := BRANCH_TARGET.search(text):
            leaders.add(int(m.group(1), 16))
        if opcode(text) in ENDS_BLOCK and i + 1 < len(instructions):
            leaders.add(instructions[i + 1][0])
    blocks = []
    for address, text in instructions:
        if address in leaders or not blocks:
            blocks.append([])
        if not text.startswith("@!PT"):
            blocks[-1].append(text)
    return blocks


def copy_blocks(instructions, head_dim):
    """[(kind, instructions, cp.async)] of the whole-tile copy blocks: those with the thread's
    kPerThread cp.async, none of them zero-filling (a partial tile's); kind "paged" when the
    block loads row addresses (LDS or LDG), else "dense"."""
    per_thread = -(-BLOCK_N * (head_dim // CHUNK_ELEMS) // THREADS)
    found = []
    for block in basic_blocks(instructions):
        copies = [t for t in block if opcode(t) == "LDGSTS"]
        if len(copies) != per_thread or any(".ZFILL" in t for t in copies):
            continue
        ops = collections.Counter(opcode(t) for t in block)
        kind = "paged" if ops["LDS"] or ops["LDG"] else "dense"
        found.append((kind, len(block), len(copies)))
    return found


def check(kernels, demangle=lambda names: names):
    """Prints each checked kernel's copy blocks; returns the failures."""
    failures = []
    names = sorted(k for k in kernels if (m := KERNEL.search(k[1]))
                   and int(m.group(1)) <= UNROLLED_MAX_HEAD_DIM)
    if not names:
        return ["no one-m-tile 16-bit forward kernel (FwdTraits<d <= 128, true>) found"]
    pretty = dict(zip(names, demangle([n for _, n in names])))
    for key in names:
        head_dim = int(KERNEL.search(key[1]).group(1))
        blocks = copy_blocks(kernels[key], head_dim)
        per = {kind: [round(n / c, 1) for k, n, c in blocks if k == kind]
               for kind in ("dense", "paged")}
        short = re.sub(r"\(.*\)$", "", pretty[key].replace("void ", "", 1)).replace(
            "flashattn::cuda::", "")
        print(f"{key[0]} {short}: instructions per cp.async, dense blocks {per['dense']}, "
              f"paged blocks {per['paged']}")
        if not per["dense"] or not per["paged"]:
            failures.append(f"{key[0]} {short}: found {len(per['dense'])} dense and "
                            f"{len(per['paged'])} paged whole-tile copy blocks; expected both "
                            f"(has the copy's shape changed? see copy_blocks)")
            continue
        bound = MAX_PAGED_OVER_DENSE * max(per["dense"])
        if max(per["paged"]) > bound:
            failures.append(f"{key[0]} {short}: the paged copy takes {max(per['paged'])} SASS "
                            f"instructions per cp.async, more than {bound:.1f} "
                            f"({MAX_PAGED_OVER_DENSE} x the dense copy's {max(per['dense'])})")
    return failures


def kernels_of_tree(root, arch, files, cuobjdump, nvdisasm):
    compare = _load("sass_compare")
    kernels = {}
    for cubin in compare.compile_tree(root, arch, files):
        kernels.update(dump_sass(cuobjdump, nvdisasm, cubin))
    return kernels


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", default=REPO, help="a source tree to compile")
    parser.add_argument("--binary", default=None, help="a built library instead of --tree")
    parser.add_argument("--arch", default="90")
    parser.add_argument("--files", default="fwd_hdim128_bf16.cu",
                        help="glob over csrc/cuda/inst/ file names")
    parser.add_argument("--before", default=None,
                        help="a tree or git revision whose counts are printed first (no gate)")
    args = parser.parse_args()

    gates = _load("cuda_gates")
    cuobjdump, nvdisasm = gates.find_tool("cuobjdump"), gates.find_tool("nvdisasm")
    if args.before:
        compare = _load("sass_compare")
        before = args.before if os.path.isdir(args.before) else compare.export_revision(args.before)
        print(f"before ({args.before}):")
        check(kernels_of_tree(before, args.arch, args.files, cuobjdump, nvdisasm), gates.demangle)
        print("after:")
    if args.binary:
        kernels = dump_sass(cuobjdump, nvdisasm, args.binary)
    else:
        kernels = kernels_of_tree(args.tree, args.arch, args.files, cuobjdump, nvdisasm)
    failures = check(kernels, gates.demangle)
    for f in failures:
        print("FAIL", f)
    print("copy loops:", "FAIL" if failures else "ok")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
