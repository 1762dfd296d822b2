#!/usr/bin/env python3
"""Each CUDA kernel's main loops in SASS (issue 31, stage 7): the natural loops whose bodies hold
tensor-core instructions (HMMA: mma.sync; HGMMA: wgmma), and in a warp-specialized kernel the
producer's loops (TMA loads, no wgmma), each with its opcode mix, MUFU count and the stall cycles
ptxas wrote into the instructions' control bits.

Loops are found on the kernel's control-flow graph, not by address: ptxas moves the retry of an
mbarrier wait out of line to the end of the kernel, and a branch from there back into the body
spans everything between. Basic blocks split at branch targets and after branches and exits;
CALL, BSSY and BSYNC fall through (a call returns), RET and EXIT end a path. A back edge is an
edge n -> h where h dominates n; its natural loop is h with every block that reaches n without
passing h. A main loop holds HMMA/HGMMA and no smaller loop that does (a persistent scheduler's
loop around it is not one); a producer loop holds UTMALDG and mbarrier instructions (SYNCS), no
HGMMA, and no smaller such loop (the elect.sync loop around a single TMA load waits on nothing).
The figures count each block of the body once: where the body branches (a masked and an
unmasked path), an iteration runs less than all of it; tensor_per_iteration lists the HMMA/HGMMA
counts an iteration can execute, one per distinct path. `paths` gives, per (tensor count, cp.async
count) an iteration can execute, its leanest and heaviest path's instructions, stall cycles, MUFU,
jumps and tensor FLOP (a dynamic program over the body, path_figures), and `copy_loops` one trip
of each copy loop inside the body: tools/gpu_model.py's issue terms take a step's path from them.

Control bits (Volta and later; Jia et al., "Dissecting the NVIDIA Volta GPU Architecture via
Microbenchmarking", 2018): the top 23 bits of each 128-bit instruction, bits 41-63 of its second
64-bit word as cuobjdump prints it: stall cycles (4 bits), yield (1), write barrier (3), read
barrier (3), wait mask (6), operand reuse (4). The stall count is how many cycles the scheduler
waits before issuing the warp's next instruction.

tools/gpu_model.py checks each modeled kernel's main-loop HMMA count against the shim's mma count
per main-loop step, so a misidentified loop fails loudly there.

    python .ci/sass_loops.py --binary flashattn/_C.abi3.so [--kernel REGEX] [--arch sm_90]
"""
import argparse
import collections
import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;\s*/\*\s*0x[0-9a-f]{16}\s*\*/")
CONTROL_WORD = re.compile(r"^\s*/\*\s*(0x[0-9a-f]{16})\s*\*/\s*$")
PREDICATE = re.compile(r"^@(!?U?P\w+)\s+")
TARGET = re.compile(r"(0x[0-9a-f]+)\s*$")
TENSOR_OPS = {"HMMA", "HGMMA"}
NEVER = ("@!PT ", "@!UPT ")  # ptxas' padding: never executed


def opcode(text):
    text = PREDICATE.sub("", text)
    return text.split()[0].split(".")[0] if text else ""


def control(word):
    """The control fields of an instruction's second 64-bit word."""
    bits = word >> 41
    return dict(stall=bits & 0xF, yield_=(bits >> 4) & 1, write_barrier=(bits >> 5) & 7,
                read_barrier=(bits >> 8) & 7, wait_mask=(bits >> 11) & 0x3F,
                reuse=(bits >> 17) & 0xF)


def parse_sass(text):
    """{(arch, mangled kernel): [(address, instruction, control word)]} from cuobjdump
    --dump-sass output: a library's (its 'arch =' lines) or a lone cubin's ('code for')."""
    kernels, arch, name, pending = {}, "cubin", None, None
    for line in text.splitlines():
        if m := re.search(r"(?:arch =|code for) (sm_\d+a?)\b", line):
            arch = m.group(1)
        elif m := re.search(r"Function : (\S+)", line):
            name = (arch, m.group(1))
            kernels[name] = []
        elif name and (m := INSTRUCTION.search(line)):
            pending = (int(m.group(1), 16), m.group(2))
        elif name and pending and (m := CONTROL_WORD.match(line)):
            kernels[name].append((*pending, int(m.group(1), 16)))
            pending = None
    return kernels


def dump_sass(cuobjdump, nvdisasm, obj, functions=None):
    """parse_sass of a library or cubin; functions: only these mangled names (much faster)."""
    env = dict(os.environ, NVDISASM_PATH=os.path.dirname(nvdisasm),
               PATH=os.path.dirname(nvdisasm) + os.pathsep + os.environ.get("PATH", ""))
    command = [cuobjdump, "--dump-sass"]
    if functions:
        command += ["--function", ",".join(functions)]
    result = subprocess.run(command + [obj], capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise RuntimeError(f"cuobjdump --dump-sass {obj} failed:\n{result.stderr}")
    return parse_sass(result.stdout)


def branch(text):
    """(target address or None, whether the path may also fall through)."""
    op = opcode(text)
    if op in ("EXIT", "RET"):
        return None, bool(PREDICATE.match(text))
    if op not in ("BRA", "JMP"):
        return None, True
    target = TARGET.search(text)
    operands = PREDICATE.sub("", text).split(None, 1)[1] if " " in PREDICATE.sub("", text) else ""
    conditional = (bool(PREDICATE.match(text)) or ".DIV" in text
                   or bool(re.match(r"!?U?P\w+\s*,", operands.strip())))
    return (int(target.group(1), 16) if target else None), conditional


def control_flow(instructions):
    """(blocks: [[(address, text, word)]], successors: [set of block indices])."""
    live = [i for i in instructions if not i[1].startswith(NEVER)]
    leaders = {live[0][0]} if live else set()
    for n, (address, text, _) in enumerate(live):
        target, _ = branch(text)
        if target is not None:
            leaders.add(target)
        if opcode(text) in ("BRA", "JMP", "EXIT", "RET") and n + 1 < len(live):
            leaders.add(live[n + 1][0])
    blocks = []
    for instruction in live:
        if instruction[0] in leaders or not blocks:
            blocks.append([])
        blocks[-1].append(instruction)
    start = {block[0][0]: b for b, block in enumerate(blocks)}
    successors = []
    for b, block in enumerate(blocks):
        target, falls = branch(block[-1][1])
        out = set()
        if target is not None and target in start:
            out.add(start[target])
        if falls and b + 1 < len(blocks):
            out.add(b + 1)
        successors.append(out)
    return blocks, successors


def dominators(successors):
    """dom[b]: the blocks that dominate b (from block 0); unreachable blocks get None."""
    n = len(successors)
    predecessors = [set() for _ in range(n)]
    for b, out in enumerate(successors):
        for s in out:
            predecessors[s].add(b)
    reachable, stack = {0}, [0]
    while stack:
        for s in successors[stack.pop()]:
            if s not in reachable:
                reachable.add(s)
                stack.append(s)
    order = sorted(reachable)
    dom = {b: set(reachable) for b in order}
    dom[0] = {0}
    changed = True
    while changed:
        changed = False
        for b in order[1:]:
            preds = [dom[p] for p in predecessors[b] if p in reachable]
            new = {b} | (set.intersection(*preds) if preds else set())
            if new != dom[b]:
                dom[b], changed = new, True
    return [dom.get(b) for b in range(n)], predecessors


def natural_loops(successors, dom_and_predecessors=None):
    """[(header, frozenset of body blocks)], one per header (back edges to it merged)."""
    dom, predecessors = dom_and_predecessors or dominators(successors)
    bodies = collections.defaultdict(set)
    for n, out in enumerate(successors):
        for h in out:
            if dom[n] is not None and h in dom[n]:  # n -> h is a back edge
                body, stack = {h, n}, ([n] if n != h else [])  # never walk past the header
                while stack:
                    for p in predecessors[stack.pop()]:
                        if p not in body and dom[p] is not None:
                            body.add(p)
                            stack.append(p)
                bodies[h] |= body
    return [(h, frozenset(body)) for h, body in sorted(bodies.items())]


PATH_FIELDS = ("instructions", "stall_cycles", "mufu", "ldgsts", "jumps", "tensor_flops")
HMMA_SHAPE = re.compile(r"HMMA\.(16)(8)(16|8)\b")
HGMMA_SHAPE = re.compile(r"HGMMA\.(\d+)x(\d+)x(\d+)\b")


def tensor_flops(text):
    """FLOP one warp's share of a tensor instruction computes: HMMA.16816 a whole m16n8k16;
    HGMMA.64xNxK a warpgroup's m64, 16 rows of it per warp."""
    if m := HGMMA_SHAPE.search(text):
        return 2 * (int(m.group(1)) // 4) * int(m.group(2)) * int(m.group(3))
    if m := HMMA_SHAPE.search(text):
        return 2 * int(m.group(1)) * int(m.group(2)) * int(m.group(3))
    return 0


def path_figures(blocks, successors, dom, header, body, wanted=TENSOR_OPS):
    """For each (count of `wanted` instructions, count of cp.async) an iteration can execute, the
    leanest and the heaviest path through the body (fewest / most instructions, then stall
    cycles): {(count, ldgsts): {"lean": figures, "heavy": figures}}. Figures: instructions,
    stall_cycles, mufu, ldgsts (cp.async), jumps (edges to a block other than the next one:
    taken branches, the back edge included), tensor_flops (tensor_flops summed). A path is told
    by both counts because a step that copies the next tiles and the last step, which copies
    none, run the same products. Paths run from the header back to it; inner loops' back edges
    are left out, so an inner loop's blocks count once (inner_loops gives their per-trip
    figures). A dynamic program over the body's blocks: the paths are too many to list (the
    mma.sync forward's body holds ~1,200 branches)."""
    def own(b):
        ops = [opcode(t) for _, t, _ in blocks[b]]
        return (sum(1 for o in ops if o in wanted),
                (len(ops), sum(control(w)["stall"] for _, _, w in blocks[b]),
                 sum(1 for o in ops if o == "MUFU"), sum(1 for o in ops if o == "LDGSTS"), 0,
                 sum(tensor_flops(t) for _, t, _ in blocks[b])))

    def add(a, b, jump):
        total = [x + y for x, y in zip(a, b)]
        total[PATH_FIELDS.index("jumps")] += jump
        return tuple(total)

    zero = (0,) * len(PATH_FIELDS)
    memo, state, stack = {}, {}, [header]
    while stack:  # iterative post-order: bodies are deeper than Python's recursion limit
        b = stack[-1]
        nexts = [s for s in successors[b] if s != header and s in body
                 and not (dom[b] is not None and s in dom[b])]
        if b not in state:
            state[b] = "open"
            pending = [s for s in nexts if s not in state]
            if pending:
                stack.extend(pending)
                continue
        stack.pop()
        if state[b] == "done":
            continue
        state[b] = "done"
        count, figures = own(b)
        tails = [(header, {(0, 0): (zero, zero)})] if header in successors[b] else []
        tails += [(s, memo[s]) for s in nexts if s in memo]  # one still open: an inner cycle
        result = {}
        for s, tail in tails:
            jump = int(s != b + 1)
            for (n, copies), (lean, heavy) in tail.items():
                n = (n + count, copies + figures[3])
                lean, heavy = add(figures, lean, jump), add(figures, heavy, jump)
                if n in result:
                    lean, heavy = min(lean, result[n][0]), max(heavy, result[n][1])
                result[n] = (lean, heavy)
        memo[b] = result
    return {n: {"lean": dict(zip(PATH_FIELDS, lean)), "heavy": dict(zip(PATH_FIELDS, heavy))}
            for n, (lean, heavy) in sorted(memo.get(header, {}).items())}


def inner_loops(blocks, successors, dom, loops, body, wanted):
    """The innermost loops inside `body` that hold a `wanted` opcode: [{first, per trip: the
    leanest path with at least one of them (path_figures' figures), wanted: their count on
    it}]. The main loop's path counts such a loop's blocks once; each further trip adds these."""
    inside = [(h, b) for h, b in loops if b < body
              and any(opcode(t) in wanted for x in b for _, t, _ in blocks[x])]
    result = []
    for h, b in inside:
        if any(other < b for _, other in inside):
            continue
        paths = {n: p["lean"] for (n, _), p in
                 path_figures(blocks, successors, dom, h, b, wanted).items() if n > 0}
        if paths:
            n = min(paths, key=lambda k: (paths[k]["instructions"], k))
            result.append(dict(first=blocks[h][0][0], wanted=n, per_trip=paths[n]))
    return sorted(result, key=lambda loop: loop["first"])


def summarize(blocks, body, paths, copy_loops=()):
    instructions = [i for b in sorted(body) for i in blocks[b]]
    ops = collections.Counter(opcode(text) for _, text, _ in instructions)
    return dict(first=blocks[min(body)][0][0], blocks=len(body), instructions=len(instructions),
                hmma=ops["HMMA"], hgmma=ops["HGMMA"], mufu=ops["MUFU"],
                tensor_per_iteration=sorted({n for n, _ in paths}),
                paths=[dict(tensor=n, ldgsts=c, **p) for (n, c), p in sorted(paths.items())],
                copy_loops=list(copy_loops),
                stall_cycles=sum(control(word)["stall"] for _, _, word in instructions),
                opcodes=dict(ops.most_common()))


def main_loops(instructions):
    """The kernel's main loops and producer loops: [summary with "role"], by first address."""
    blocks, successors = control_flow(instructions)
    dom, predecessors = dominators(successors)
    loops = natural_loops(successors, (dom, predecessors))
    ops_of = {h: {opcode(t) for b in body for _, t, _ in blocks[b]} for h, body in loops}
    result = []
    roles = (("main", lambda ops: bool(ops & TENSOR_OPS)),
             # TMA loads and mbarrier traffic, no wgmma: not the elect.sync loop around one load
             ("producer", lambda ops: {"UTMALDG", "SYNCS"} <= ops and not ops & TENSOR_OPS))
    for role, fits in roles:
        chosen = [(h, body) for h, body in loops if fits(ops_of[h])]
        for h, body in chosen:
            if not any(other < body for _, other in chosen):  # innermost
                paths = path_figures(blocks, successors, dom, h, body)
                copies = inner_loops(blocks, successors, dom, loops, body, {"LDGSTS"})
                result.append(dict(role=role, **summarize(blocks, body, paths, copies)))
    return sorted(result, key=lambda loop: loop["first"])


def table(kernels, pattern=None, arch=None, demangle=lambda names: names):
    keys = sorted(k for k in kernels if (arch is None or k[0] == arch)
                  and (pattern is None or re.search(pattern, k[1])))
    pretty = dict(zip(keys, demangle([k[1] for k in keys])))
    lines = [f"{'arch':<6} {'role':<8} {'instr':>5} {'HMMA':>4} {'HGMMA':>5} {'MUFU':>4} "
             f"{'stall':>5}  top opcodes  kernel"]
    for key in keys:
        name = re.sub(r"\(.*\)$", "", pretty[key].replace("void ", "", 1)).replace(
            "flashattn::cuda::", "")
        for loop in main_loops(kernels[key]):
            top = " ".join(f"{op}:{n}" for op, n in list(loop["opcodes"].items())[:6])
            lines.append(f"{key[0]:<6} {loop['role']:<8} {loop['instructions']:>5} "
                         f"{loop['hmma']:>4} {loop['hgmma']:>5} {loop['mufu']:>4} "
                         f"{loop['stall_cycles']:>5}  {top}  {name}")
    return "\n".join(lines)


def _load(name):
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, ".ci", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binary", required=True, help="a built library or a cubin")
    parser.add_argument("--kernel", default=None, help="a regex over mangled kernel names")
    parser.add_argument("--arch", default=None, help="e.g. sm_90 (default: every one built)")
    args = parser.parse_args()
    gates = _load("cuda_gates")
    kernels = dump_sass(gates.find_tool("cuobjdump"), gates.find_tool("nvdisasm"), args.binary)
    print(table(kernels, args.kernel, args.arch, gates.demangle))
    return 0


if __name__ == "__main__":
    sys.exit(main())
