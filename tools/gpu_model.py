#!/usr/bin/env python3
"""GPU speed without a GPU (issue 15): count what the CUDA kernels do on the CPU shim, and turn
the counts into modeled H100/H200/A100 time with a roofline model. FlashAttention-2's counts for
its own tile geometry are worked out on paper and go through the same model.

    python tools/gpu_model.py [--json FILE] [--quick] [--binary path/to/_C.abi3.so]
    python tools/gpu_model.py --decode     one KV-cache decoding step instead (issue 12), below

--decode counts issue 12's H200 decode shape (B = 32, Sq = 1, 32 / 8 heads, d = 128, bf16,
Sk = 8k and 32k) the same way: one sequence on the shim at 512 and 1024 keys, each counter
fitted exactly as a * key tiles + b and checked at 768, scaled to the batch, and modeled as
below with the cache's bytes as the compulsory HBM traffic. Latency and the bytes in flight per
SM, which decide how close a real decode step gets to HBM bandwidth, are not modeled there: it
says whether the kernel's own work (tensor cores, shared memory) stays under the memory time.
A second table (issue 33) models split-KV with a latency term, for B = 1, 4, 32, Sq = 1, 4,
Sk = 8k, 32k on the H200 and the A100: the split count the plan chooses (plan_fwd.h,
choose_num_splits, through the sim extension's plan_fwd) and the step time of the formula that
choice minimizes, with the GPU's HBM bandwidth and CTAs per SM: launch + max(waves x (per-CTA
cost + key tiles per split x a tile's latency), KV bytes / HBM) + the merge (launch +
ceil(head_dim / 32) x splits x a step: a warp per row), next to no split, the previous
heuristic's count, and the thread-per-row merge it replaced (docs/lab/2026-12-02-decode-splits.md,
docs/lab/2026-12-02-decode-part-2.md).

What it does, and the method, in order:

1. Counts. Builds the sim extension if needed (tests/sim_ext/build.py) and runs each kernel
   family -- forward, backward (dK/dV with atomic dQ), deterministic backward (dK/dV + the dQ
   kernel) -- in bf16 for head dims 64, 128, 256, causal and not, with the shim's counters on
   (tests/cudasim/README.md, "Counters"): mma.sync, ldmatrix, shared-memory wavefronts (actual,
   from the 32 lanes' addresses, and ideal), cp.async bytes and sectors, global stores, atomics,
   barriers, per launch.
2. Extrapolation to N = 4096. The shim runs one (batch, head) at two small sequence lengths
   (128 and 256; --quick: the same). Each counter of each launch is fitted exactly, in rational
   numbers, as  a * steps + b * ctas: `steps` is the number of (CTA, tile) iterations of the
   kernel's main loop and `ctas` the number of CTAs, both computed here from the kernel's tile
   geometry (which mirrors csrc/cuda/traits.h and is checked against each launch's grid and
   shared memory). A third length (192) must then be predicted exactly, counter by counter, or
   the run fails: the counts are linear in tiles, and this proves it for every counter. The fit
   gives the counts at N = 4096 for one head; the shape is the FA papers' (16k tokens, hidden
   2048: batch 4, heads 2048 / d), so totals are multiplied by batch x heads.
3. Occupancy. Registers per thread come from the built CUDA library's cubins
   (`cuobjdump --dump-resource-usage`, through .ci/cuda_gates.py: sm_90 for H100/H200, sm_80
   for A100), shared memory from the launch. CTAs per SM = the least of the register, shared-memory,
   thread and CTA limits (tools/gpu_specs.py).
3b. Main loops. Each counted kernel's main loops are read from its SASS in the built library
   (.ci/sass_loops.py: natural loops of the control-flow graph holding HMMA), and every one must
   be able to execute, on some path of an iteration, exactly the shim's mma.sync count per
   main-loop step per warp, or the run fails: a loop read wrong cannot feed the model. Each
   record keeps the main kernel's loops (instructions, HMMA per path, MUFU, stall cycles from
   the control bits) for sm_80 and sm_90. The issue terms (6.) take these per path.
4. Time. For each kernel: tensor time = mma.sync count / the GPU's mma.sync rate; shared-memory
   time = wavefronts / (SMs x 1 wavefront of 128 B per clock); memory time = max(L2 bytes / L2
   bandwidth, compulsory HBM bytes / HBM bandwidth), where L2 bytes = 32-byte sectors counted
   (cp.async, stores, atomics) plus the few plain loads/stores the shim cannot see (LSE, D:
   added analytically). Modeled time = q x max(tensor, shared, memory) + a launch overhead
   (gpu_specs.LAUNCH_OVERHEAD_S), where q >= 1 is the wave factor: the CTAs, each weighted by
   its main-loop steps + 1, are list-scheduled in launch order onto SMs x CTAs-per-SM slots, and
   q is the makespan over the perfectly balanced time. The backward's two row kernels (D_i and
   the dQ conversion) are HBM-bound and modeled from their bytes. Not modeled: latency,
   instruction issue, ALU and MUFU work (softmax, masking), L2 atomic throughput beyond its
   sectors. It is a bound; its use is comparing kernels, and the first GPU run calibrates it.
5. FA2. The same quantities for FA2's kernels at their tile geometry (gpu_specs.fa2_*), counted
   on paper: per main-loop iteration and per CTA, from FA2's TiledMMA layouts.

6. Issue terms (issue 31, stage 7; `--issue`, no shim). The time above leaves out instruction
   issue and latency, which bound the mma.sync kernels on the H200. `--issue` models a main-loop
   step on the path it takes through the SASS (sass_loops' leanest path with the step's HMMA
   and cp.async counts, plus the extra trips of copy loops inside the body): tensor, issue, MUFU
   and latency cycles per scheduler for the warps on it (section "Issue, MUFU and latency terms"
   below), calibrated on the H200's two measurements of the mma.sync forward (--run1, --run2),
   then applied to the sm_90a kernels (--hopper) with the wgmma rate at the GEMM ceiling
   measured on that GPU and the TMA loads' L2 bytes as a floor. One constant is fitted
   (gpu_specs.FETCH_CYCLES_PER_COPY_TRIP, on run 1); docs/lab/2026-12-03-gpu-model-issue-terms.md.

    python tools/gpu_model.py --issue --run1 F552.o --run2 LIB --hopper LIB [--gpu h200]

FLOPs follow the FA papers: forward 4 N^2 d per head (halved when causal), backward 2.5x that.
"""
import argparse
import collections
import datetime
import glob
import hashlib
import heapq
import importlib.util
import json
import math
import os
import re
import runpy
import sys
import time
from fractions import Fraction

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import gpu_specs  # noqa: E402

SEQLEN = 4096
TOKENS = 16384
HIDDEN = 2048
FIT_SEQLENS = (256, 512)
CHECK_SEQLEN = 384
HEAD_DIMS = (64, 128, 256)
FAMILIES = ("fwd", "bwd", "bwd_deterministic")
ELEM = 2  # bf16 bytes


def load_module(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The compiled kernels: csrc/cuda/kernel_list.py, the one list of instantiations (run_path: no
# __pycache__ inside csrc/, which csrc_digest hashes).
KERNEL_LIST = runpy.run_path(os.path.join(REPO, "csrc", "cuda", "kernel_list.py"))


# ---- Our kernels' tile geometry (mirrors csrc/cuda/traits.h; checked against every launch, and
# against traits.h for every head-dim tile of the list by tests/test_kernel_list.py) ----

def fwd_tiles(d, dv=None):
    """FwdTile<d, dv, false> (no dropout: two m-tiles per warp up to d = 128 where dv = d; dv
    None: the v width tile d names, fwd_dim_v): kBlockM, kBlockN (64 keys up to d = 128 or a v of
    128, the (192, 128) tile's), threads (two warps per m-tile above a v of 256: each owns half of
    O's columns)."""
    dv = fwd_dim_v(d) if dv is None else dv
    return ((128 if d <= 128 and dv == d else 64), (64 if d <= 128 or dv <= 128 else 32),
            (256 if dv > 256 else 128))


def fwd_dim_v(d):
    """FwdTraits<d, *>::kHeadDimV: V's and O's width on the tile d names (512 on MLA's 576 tile;
    kernel_list.py named_head_dim_v)."""
    return KERNEL_LIST["named_head_dim_v"](d)


def dq_tiles(d):
    """BwdDqTraits: kBlockM, kBlockN, threads."""
    return 64, (64 if d <= 128 else 32), 128


def dkdv_tiles(d):
    """BwdTraits: kBlockN (keys), kBlockM (queries), threads."""
    return (128 if d <= 128 else 64), (128 if d <= 64 else 64), 256


def smem_fwd(d, dv=None):
    """Qi, one K tile, one V tile (of the tile (d, dv); dv None: the v width d names), and the
    one-m-tile kernel's table of paged rows up to d = 128 (traits.h kPagedRowTableBytes: 2 tiles
    x bn keys x K, V x 8 bytes), which (128, 64), one m-tile without dropout too, takes."""
    dv = fwd_dim_v(d) if dv is None else dv
    bm, bn, _ = fwd_tiles(d, dv)
    row_table = 2 * bn * 2 * 8 if bm == 64 and d <= 128 else 0
    return ((bm + bn) * (d + 8) + bn * (dv + 8)) * ELEM + row_table


def smem_dq(d, dv=None):
    """Qi, dOi, two stages of (K, V) tiles (of the tile (d, dv): Q and K d wide, dO and V dv;
    dv None: d)."""
    dv = d if dv is None else dv
    bm, bn, _ = dq_tiles(d)
    return (bm + 2 * bn) * ((d + 8) + (dv + 8)) * ELEM


def smem_dkdv(d, dv=None):
    """K, V, one stage of (Qi, dOi), P^T and dS^T; LSE_i and D_i in fp32 (tile (d, dv) as
    smem_dq)."""
    dv = d if dv is None else dv
    bn, bm, _ = dkdv_tiles(d)
    p_stride = bm + 8
    elems16 = (bn + bm) * ((d + 8) + (dv + 8)) + 2 * bn * p_stride
    return elems16 * ELEM + 2 * bm * 4


def query_tile_steps(n, bm, bn, causal):
    """Per CTA of bm queries: key tiles of bn visited (Sq = Sk, so causal = top-left)."""
    return [math.ceil(min(n, (m + 1) * bm) / bn) if causal else math.ceil(n / bn)
            for m in range(math.ceil(n / bm))]


def key_tile_steps(n, bn, bm, causal):
    """Per CTA of bn keys: query tiles of bm visited."""
    blocks = math.ceil(n / bm)
    return [blocks - (j * bn) // bm if causal else blocks for j in range(math.ceil(n / bn))]


def kernel_kind(name):
    for kind in ("fwd_kernel_16bit", "bwd_dkdv_kernel_16bit", "bwd_dq_kernel_16bit",
                 "bwd_dot_do_o_kernel", "bwd_convert_dq_kernel"):
        if kind in name:
            return kind
    raise ValueError(f"unknown kernel {name}")


def steps_per_cta(kind, d, n, causal):
    """[main-loop steps of each CTA], expected threads and dynamic smem of a launch."""
    if kind in ("fwd_kernel_16bit", "bwd_dq_kernel_16bit"):
        fwd = kind == "fwd_kernel_16bit"
        bm, bn, threads = fwd_tiles(d) if fwd else dq_tiles(d)
        smem = smem_fwd(d) if fwd else smem_dq(d)
        return query_tile_steps(n, bm, bn, causal), threads, smem
    if kind == "bwd_dkdv_kernel_16bit":
        bn, bm, threads = dkdv_tiles(d)
        return key_tile_steps(n, bn, bm, causal), threads, smem_dkdv(d)
    # Row kernels: one warp per row, 4 rows per CTA; no main loop.
    return [0] * math.ceil(n / 4), 128, 0


# ---- Counters from the shim ----

def flatten(tree, prefix=""):
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def run_family(ops, torch, family, d, causal, n):
    """[(kernel name, grid, block, smem, flat counters)] of one call at sequence length n."""
    gen = torch.Generator().manual_seed(1234 + n + d)
    q, k, v = (torch.randn(1, n, 1, d, generator=gen).to(torch.bfloat16) for _ in range(3))
    ops.counters_enable(False)
    ops.counters_reset()
    if family == "fwd":
        ops.counters_enable(True)
        ops.fwd(q, k, v, causal=causal)
    else:
        out, lse = ops.fwd(q, k, v, causal=causal)
        dout = torch.randn(out.shape, generator=gen).to(torch.bfloat16)
        ops.counters_enable(True)
        ops.bwd(dout, out, lse, None, q, k, v, causal=causal,
                deterministic=family == "bwd_deterministic")
    ops.counters_enable(False)
    data = json.loads(ops.counters_json())
    ops.counters_reset()
    return [(l["kernel"], l["grid"], l["block"], l["smem_bytes"], flatten(l["counters"]))
            for l in data["launches"]]


def features(kind, d, n, causal):
    steps, _, _ = steps_per_cta(kind, d, n, causal)
    return (sum(steps), len(steps))


def fit_launch(kind, d, causal, samples):
    """samples: {n: flat counters}. Returns {counter: (a, b)} with value = a*steps + b*ctas."""
    n1, n2 = FIT_SEQLENS
    f1, f2 = features(kind, d, n1, causal), features(kind, d, n2, causal)
    det = f1[0] * f2[1] - f1[1] * f2[0]
    coef = {}
    for key in samples[n1]:
        y1, y2 = Fraction(samples[n1][key]), Fraction(samples[n2][key])
        if det != 0:
            a = (y1 * f2[1] - y2 * f1[1]) / det
            b = (f1[0] * y2 - f2[0] * y1) / det
        else:  # no main loop (row kernels): per CTA only
            a, b = Fraction(0), y1 / f1[1]
        coef[key] = (a, b)
    return coef


def predict(coef, feats):
    return {key: a * feats[0] + b * feats[1] for key, (a, b) in coef.items()}


def count_family(ops, torch, family, d, causal, log):
    """Per launch of the family: kernel name, block threads, smem, fitted coefficients."""
    runs = {}
    for n in (*FIT_SEQLENS, CHECK_SEQLEN):
        start = time.time()
        runs[n] = run_family(ops, torch, family, d, causal, n)
        log(f"    {family:<18} d={d:<3} causal={int(causal)} N={n:<4} "
            f"{len(runs[n])} launches, {time.time() - start:5.1f} s")
    launches = []
    for i, (name, grid, block, smem, _) in enumerate(runs[FIT_SEQLENS[0]]):
        kind = kernel_kind(name)
        for n, launch in runs.items():
            steps, threads, smem_expected = steps_per_cta(kind, d, n, causal)
            lname, lgrid, lblock, lsmem, _ = launch[i]
            if lname != name or lgrid[0] != len(steps) or lblock[0] != threads or lsmem != smem_expected:
                raise RuntimeError(
                    f"{name} at N={n}: launch {lname} grid {lgrid} block {lblock} smem {lsmem} "
                    f"does not match the geometry in gpu_model.py ({len(steps)} CTAs, {threads} "
                    f"threads, {smem_expected} B): update it to csrc/cuda/traits.h")
        coef = fit_launch(kind, d, causal, {n: runs[n][i][4] for n in FIT_SEQLENS})
        predicted = predict(coef, features(kind, d, CHECK_SEQLEN, causal))
        measured = runs[CHECK_SEQLEN][i][4]
        wrong = {k: (float(predicted[k]), measured[k]) for k in measured if predicted[k] != measured[k]}
        if wrong:
            raise RuntimeError(f"{name}: counts are not linear in (steps, CTAs); predicted vs "
                               f"measured at N={CHECK_SEQLEN}: {wrong}")
        launches.append(dict(name=name, kind=kind, threads=block[0], smem=smem, coef=coef))
    return launches


# ---- Registers from the built library ----

def built_library():
    """The CUDA library `import flashattn` would load (an installed wheel first, as the tests have
    it), else this checkout's in-place build; None if there is neither."""
    spec = importlib.util.find_spec("flashattn")
    folders = list(spec.submodule_search_locations) if spec and spec.submodule_search_locations else []
    for folder in folders + [os.path.join(REPO, "flashattn")]:
        found = sorted(glob.glob(os.path.join(folder, "_C*.so")))
        if found:
            return found[0]
    return None


class BuiltKernels(dict):
    """{(arch, demangled kernel name): registers} of every kernel in the built library or cubins
    (.ci/sass_compare.py's build/sass/*/*.cubin), read back from them with cuobjdump; and their
    main loops in SASS (.ci/sass_loops.py), read on demand."""

    def __init__(self, binaries):
        self.gates = load_module("cuda_gates", os.path.join(REPO, ".ci", "cuda_gates.py"))
        self.sass = load_module("sass_loops", os.path.join(REPO, ".ci", "sass_loops.py"))
        self.binaries, self.cuobjdump = binaries, self.gates.find_tool("cuobjdump")
        rows = [(binary, row) for binary in binaries
                for row in self.gates.resource_usage(self.cuobjdump, binary)]
        names = self.gates.demangle([row["kernel"] for _, row in rows])
        super().__init__({(row["arch"], normalize(name)): row["regs"]
                          for (_, row), name in zip(rows, names)})
        self.where = {(row["arch"], normalize(name)): (binary, row["kernel"])
                      for (binary, row), name in zip(rows, names)}
        self.loops = {}

    def main_loops(self, arch, kernel):
        """.ci/sass_loops.py's main loops of (arch, demangled kernel name)."""
        key = (arch, kernel)
        if key not in self.loops:
            if key not in self.where:
                raise RuntimeError(f"{kernel} ({arch}) is not in the built library")
            binary, mangled = self.where[key]
            nvdisasm = self.gates.find_tool("nvdisasm")
            dumped = self.sass.dump_sass(self.cuobjdump, nvdisasm, binary, [mangled])
            self.loops[key] = self.sass.main_loops(dumped[(arch, mangled)])
        return self.loops[key]


def check_main_loops(built, launch, arches=("sm_80", "sm_90")):
    """{arch: [the loop's figures]} of a launch's kernel, after checking that each main loop in
    its SASS holds the mma.sync count the shim counts per main-loop step, per warp (a loop read
    wrong, or a kernel whose steps changed shape, fails here)."""
    per_step = sum(launch["coef"][k][0] for k in ("mma.m16n8k16.f16", "mma.m16n8k16.bf16"))
    if per_step == 0:  # the row kernels: no products, no main loop
        return {}
    warps = launch["threads"] // 32
    expected = per_step / warps
    figures = {}
    for arch in arches:
        loops = [l for l in built.main_loops(arch, normalize(launch["name"])) if l["role"] == "main"]
        paths = [l["tensor_per_iteration"] for l in loops]
        if not loops or any(expected not in p for p in paths):
            raise RuntimeError(
                f"{launch['name']} ({arch}): an iteration of its main loops in SASS executes "
                f"{paths or 'no'} HMMA per warp (one count per path), the shim counts "
                f"{float(expected)} mma.sync per warp per step ({float(per_step)} per CTA, "
                f"{warps} warps): .ci/sass_loops.py misreads the loop or the kernel's step changed")
        figures[arch] = [{k: l[k] for k in ("instructions", "hmma", "tensor_per_iteration",
                                            "mufu", "stall_cycles")} for l in loops]
    return figures


def normalize(name):
    name = re.sub(r"^void ", "", name.strip())
    return re.sub(r"\s+", "", name)


# ---- The model ----

def ctas_per_sm(gpu, threads, regs, smem):
    warps = math.ceil(threads / 32)
    regs_per_warp = math.ceil(regs * 32 / gpu.reg_alloc_unit_warp) * gpu.reg_alloc_unit_warp
    limits = [gpu.regs_per_sm // regs_per_warp // warps,
              gpu.smem_per_sm // (smem + gpu.smem_reserved_per_cta),
              gpu.max_threads_per_sm // threads, gpu.max_ctas_per_sm]
    return max(0, min(limits))


def wave_factor(work, slots):
    """Makespan of list-scheduling `work` (per CTA, launch order) on `slots`, over sum/slots."""
    if not work:
        return 1.0
    heap = [0.0] * min(slots, len(work))
    for w in work:
        heapq.heapreplace(heap, heap[0] + w)
    return max(heap) / (sum(work) / slots)


def kernel_time(gpu, c, cta_work, per_sm, l2_extra_bytes, hbm_bytes):
    """Modeled seconds of one kernel from its totals c (flat counters), and the bound."""
    clock = gpu.clock_ghz * 1e9
    parts = {
        "tensor": c["mma"] / gpu.mma_per_s(),
        "smem": c["smem_wavefronts"] * 128 / (gpu.sms * gpu.smem_bytes_per_clk_sm * clock),
        "l2": (c["global_sectors"] * 32 + l2_extra_bytes) / gpu.l2_bytes_per_s,
        "hbm": hbm_bytes / gpu.hbm_bytes_per_s,
    }
    bound = max(parts, key=parts.get)
    q = wave_factor(cta_work, gpu.sms * per_sm)
    return q * parts[bound] + gpu_specs.LAUNCH_OVERHEAD_S, bound, q, parts


def shape(d):
    heads = HIDDEN // d
    return TOKENS // SEQLEN, heads  # batch, heads


def flops(family, d, causal):
    batch, heads = shape(d)
    f = 4 * batch * heads * SEQLEN * SEQLEN * d / (2 if causal else 1)
    return f if family == "fwd" else 2.5 * f


def row_kernel_hbm(kind, d, d_tile, atomic):
    """Bytes per head of the backward's row kernels (plain loads/stores, not counted)."""
    n = SEQLEN
    if kind == "bwd_dot_do_o_kernel":
        return 2 * n * d * ELEM + n * 4 + (n * d_tile * 4 if atomic else 0)
    return n * d_tile * 4 + n * d * ELEM  # bwd_convert_dq_kernel


def compulsory_hbm(kind, d):
    """Bytes per head every kernel must move from/to HBM at least once."""
    n = SEQLEN
    if kind == "fwd_kernel_16bit":
        return 4 * n * d * ELEM + n * 4
    if kind == "bwd_dkdv_kernel_16bit":
        return 6 * n * d * ELEM + 2 * n * 4
    return 5 * n * d * ELEM + 2 * n * 4  # bwd_dq_kernel_16bit


def uncounted_l2(kind, d, causal):
    """Plain global loads/stores the shim cannot see, per head (LSE, D), in bytes."""
    steps, _, _ = steps_per_cta(kind, d, SEQLEN, causal)
    if kind == "fwd_kernel_16bit":
        return SEQLEN * 4
    if kind == "bwd_dkdv_kernel_16bit":
        return sum(steps) * 2 * dkdv_tiles(d)[1] * 4
    return len(steps) * 2 * dq_tiles(d)[0] * 4


def ldsm_x4_equiv(c):
    return (c["ldmatrix.x4"] + c["ldmatrix.x4.trans"] + (c["ldmatrix.x2"] + c["ldmatrix.x2.trans"]) / 2
            + (c["ldmatrix.x1"] + c["ldmatrix.x1.trans"]) / 4)


def model_ours(family, d, causal, launches, regs, gpus):
    batch, heads = shape(d)
    bh = batch * heads
    kernels, totals = [], {}
    time_by_gpu = {key: 0.0 for key in gpus}
    for launch in launches:
        kind = launch["kind"]
        steps, threads, smem = steps_per_cta(kind, d, SEQLEN, causal)
        per_head = predict(launch["coef"], (sum(steps), len(steps)))
        c = {k: float(v) * bh for k, v in per_head.items()}
        c["mma"] = c["mma.m16n8k16.f16"] + c["mma.m16n8k16.bf16"]
        for k, v in c.items():
            totals[k] = totals.get(k, 0.0) + v
        entry = dict(kernel=normalize(launch["name"]), kind=kind, threads=threads, smem_per_cta=smem,
                     mma=c["mma"], ldmatrix_x4_equiv=ldsm_x4_equiv(c),
                     smem_wavefronts=c["smem_wavefronts"],
                     smem_wavefronts_ideal=c["smem_wavefronts_ideal"],
                     global_sectors=c["global_sectors"], atomics=c["atomics.ops"],
                     barriers=c["barriers"], modeled={})
        for key, gpu in gpus.items():
            if kind in ("bwd_dot_do_o_kernel", "bwd_convert_dq_kernel"):
                d_tile = KERNEL_LIST["tile_for"](d, "bf16")  # what dispatch.h picks
                hbm = row_kernel_hbm(kind, d, d_tile, family == "bwd") * bh
                t = hbm / gpu.hbm_bytes_per_s + gpu_specs.LAUNCH_OVERHEAD_S
                entry["modeled"][key] = dict(seconds=t, bound="hbm")
            else:
                r = regs.get((gpu.arch, entry["kernel"]))
                if r is None:
                    raise RuntimeError(f"no registers for {entry['kernel']} ({gpu.arch}) in the "
                                       f"built library")
                per_sm = ctas_per_sm(gpu, threads, r, smem)
                work = [s + 1 for s in steps] * bh
                t, bound, q, parts = kernel_time(gpu, c, work, per_sm,
                                                 uncounted_l2(kind, d, causal) * bh,
                                                 compulsory_hbm(kind, d) * bh)
                entry["regs_per_thread_" + gpu.arch] = r
                entry["modeled"][key] = dict(seconds=t, bound=bound, wave_factor=q,
                                             ctas_per_sm=per_sm,
                                             parts_s={k: v for k, v in parts.items()})
            time_by_gpu[key] += entry["modeled"][key]["seconds"]
        kernels.append(entry)
    return kernels, totals, time_by_gpu


# ---- Issue, MUFU and latency terms per main-loop path (issue 31, stage 7) ----
#
# The time above bounds tensor, shared-memory and memory work; the first H200 run showed issue and
# latency were the limit (docs/lab/2026-12-01-h200-first-gpu-run.md). These terms take one main-loop
# step's path through the kernel's SASS (.ci/sass_loops.py path_figures: the leanest path with
# the step's tensor and cp.async counts) and model a round: every warp resident on a scheduler
# runs one step. Terms, in cycles of one scheduler (w warps on it):
#   tensor   w x the path's tensor FLOP / the scheduler's rate (mma.sync: gpu.mma_flops_per_clk_sm,
#            wgmma: WGMMA_FLOPS_PER_CLK_SM at the measured GEMM ceiling where there is one)
#   issue    w x the path's instructions (+ a producer warp's, on its scheduler): one per clock
#   mufu     w x MUFU instructions x 32 lanes / (MUFU_PER_CLK_SM / 4)
#   latency  one warp's own chain: the stall cycles in the path's control bits, + for wgmma the
#            S product it waits for, + FETCH_CYCLES_PER_COPY_TRIP per extra copy-loop trip
# mma.sync: round = max(tensor + max(w x non-tensor instructions, mufu), latency): the tensor
# pipe and the other instructions do not overlap (run 2 measured below the max() of the terms;
# the sum is the calibrated form). wgmma is asynchronous, so its round is the max() of the terms;
# the sum form is printed beside it as the bound if the softmax does not overlap the products.

MEASURED_H200 = {  # forward, bf16, d = 128, N = 4096, B 4, 16 heads (the lab entry of 2026-12-01)
    "run 1": dict(csrc="f552cd6", tflops=81.8, ncu_instructions_per_step=2048,
                  ncu_cycles_per_issue=11.2),
    "run 2": dict(csrc="b6fc51e", tflops=287.0, ncu_instructions_per_step=1056,
                  ncu_cycles_per_issue=5.3),
}


def steady_path(loop, tensor, copies):
    """One main-loop step's path figures (sass_loops path_figures' lean path): `tensor` tensor
    instructions and `copies` cp.async per warp. The path with the most of its copies in line
    (then the fewest instructions); the rest are extra trips of the body's copy loops, each adding
    one trip's figures per cp.async (path_figures counts an inner loop's blocks once)."""
    fitting = [p for p in loop["paths"] if p["tensor"] == tensor and p["ldgsts"] <= copies]
    if not fitting:
        raise RuntimeError(f"no path of the main loop executes {tensor} tensor instructions and "
                           f"at most {copies} cp.async: {[(p['tensor'], p['ldgsts']) for p in loop['paths']]}")
    best = max(fitting, key=lambda p: (p["ldgsts"], -p["lean"]["instructions"]))
    figures = dict(best["lean"], tensor=tensor, copy_loop_trips=copies - best["ldgsts"])
    trips = figures["copy_loop_trips"]
    if trips:
        loops = loop.get("copy_loops") or []
        if not loops:
            raise RuntimeError(f"{trips} cp.async per step are on no path and in no copy loop")
        per_copy = {k: sum(l["per_trip"][k] / l["wanted"] for l in loops) / len(loops)
                    for k in loops[0]["per_trip"]}
        for k, v in per_copy.items():
            figures[k] += trips * v
    return figures


def step_cycles(gpu, path, warps_per_scheduler, wgmma=False, tensor_fraction=1.0,
                producer_instructions=0, waited_fraction=0.5, overlap=True):
    """(cycles of a round, {term: cycles}, the binding term) for one scheduler running
    `warps_per_scheduler` warps through `path` (steady_path's figures) once each. tensor_fraction
    scales the tensor rate (the measured GEMM ceiling over the peak); waited_fraction: the part
    of a wgmma step's products a warp waits for before its other work (forward: S of S and PV;
    backward: S and dP of five). overlap=False: a wgmma round as mma.sync's, the sum form."""
    w = warps_per_scheduler
    per_scheduler = (gpu_specs.WGMMA_FLOPS_PER_CLK_SM if wgmma else gpu.mma_flops_per_clk_sm
                     ) / gpu_specs.SCHEDULERS_PER_SM * tensor_fraction
    own_tensor = path["tensor_flops"] / per_scheduler
    terms = dict(
        tensor=w * own_tensor,
        issue=w * path["instructions"] + producer_instructions,
        mufu=w * path["mufu"] * 32 / (gpu_specs.MUFU_PER_CLK_SM / gpu_specs.SCHEDULERS_PER_SM),
        # wgmma: a warp's softmax waits for its own S product; an mma.sync's latency is in the
        # stall bits already.
        latency=(path["stall_cycles"] + (own_tensor * waited_fraction if wgmma else 0)
                 + path["copy_loop_trips"] * gpu_specs.FETCH_CYCLES_PER_COPY_TRIP),
    )
    non_tensor = max(w * (path["instructions"] - path["tensor"]) + producer_instructions,
                     terms["mufu"])
    serial = terms["tensor"] + non_tensor
    if wgmma and overlap:
        bound = max(terms, key=terms.get)
        return terms[bound], dict(terms, serial=serial), bound
    if serial >= terms["latency"]:
        return serial, dict(terms, serial=serial), "tensor+issue"
    return terms["latency"], dict(terms, serial=serial), "latency"


def issue_model_time(gpu, cta_steps, per_sm, warps_per_cta, paths, wgmma=False, tensor_fraction=1.0,
                     producer_instructions=0, memory_seconds=None, longest_first=False,
                     waited_fraction=0.5, overlap=True):
    """Seconds of a kernel under the issue terms: cta_steps[i] = [path key of each main-loop step
    of CTA i]; paths = {key: steady_path figures}. Rounds are per SM (per_sm CTAs together), the
    wave factor as in kernel_time (longest_first: a persistent scheduler's order), and
    memory_seconds ({"l2": s, "hbm": s}) as a floor. Returns (seconds, {path key: (cycles,
    terms, bound)}, the binding term)."""
    w = per_sm * warps_per_cta / gpu_specs.SCHEDULERS_PER_SM
    rounds = {k: step_cycles(gpu, p, w, wgmma, tensor_fraction, producer_instructions * per_sm,
                             waited_fraction, overlap)
              for k, p in paths.items()}
    used = collections.Counter(k for steps in cta_steps for k in steps)
    cycles = sum(rounds[k][0] * n for k, n in used.items())
    work = [len(s) + 1 for s in cta_steps]
    q = wave_factor(sorted(work, reverse=True) if longest_first else work, gpu.sms * per_sm)
    loop_s = q * cycles / (gpu.sms * per_sm * gpu.clock_ghz * 1e9)
    main = rounds[max(used, key=lambda k: rounds[k][0] * used[k])][2]  # the path most cycles go to
    memory = max(memory_seconds, key=memory_seconds.get) if memory_seconds else None
    if memory is None or loop_s >= memory_seconds[memory]:
        return loop_s + gpu_specs.LAUNCH_OVERHEAD_S, rounds, main
    return memory_seconds[memory] + gpu_specs.LAUNCH_OVERHEAD_S, rounds, memory


def kernel_loops(binaries, pattern):
    """{mangled name: (arch, its main and producer loops, registers)} of the kernels matching the
    regex `pattern` in the given libraries, objects or cubins (.ci/sass_loops.py)."""
    gates = load_module("cuda_gates", os.path.join(REPO, ".ci", "cuda_gates.py"))
    sass = load_module("sass_loops", os.path.join(REPO, ".ci", "sass_loops.py"))
    cuobjdump, nvdisasm = gates.find_tool("cuobjdump"), gates.find_tool("nvdisasm")
    found = {}
    for binary in binaries:
        regs = {(r["arch"], r["kernel"]): r["regs"] for r in gates.resource_usage(cuobjdump, binary)}
        names = [k for _, k in regs if re.search(pattern, k)]
        if not names:
            continue
        for (arch, name), instructions in sass.dump_sass(cuobjdump, nvdisasm, binary, names).items():
            if arch in ("sm_90", "sm_90a"):
                found[name] = (arch, sass.main_loops(instructions), regs[arch, name])
    return found


def one_kernel(binaries, pattern):
    found = kernel_loops(binaries, pattern)
    if len(found) != 1:
        raise RuntimeError(f"{pattern}: {len(found)} sm_90 kernels match in {binaries}: {sorted(found)}")
    return next(iter(found.values()))


def fwd_bytes(d, ctas, steps, bm, bn, heads):
    """(L2 bytes, HBM bytes) of a forward: K and V tiles per step, Q and O per CTA (16-bit), and
    the compulsory Q, K, V, O and LSE once per head."""
    l2 = steps * bn * 2 * d * ELEM + ctas * bm * (2 * d * ELEM + 4)
    return l2, heads * (4 * SEQLEN * d * ELEM + SEQLEN * 4)


def mma_sync_fwd_issue(gpu, binaries, d=128):
    """The sm_80-family forward (FwdTraits<d, false>, bf16) at the issue terms, N = SEQLEN, the
    bench's shape: (TFLOP/s, seconds, path figures, round, per_sm)."""
    arch, loops, regs = one_kernel(binaries, rf"fwd_kernel_16bitINS0_9FwdTraitsILi{d}ELb0EEE13__nv_bfloat16EEv")
    bm, bn, threads = fwd_tiles(d)
    warps = threads // 32
    tensor = (bm // 16) * (bn // 8) * (d // 16) * 2 // warps      # S and PV, m16n8k16
    copies = bn * 2 * d * ELEM // 16 // threads                   # K and V tiles, 16-byte cp.async
    (main,) = [l for l in loops if l["role"] == "main"]
    path = steady_path(main, tensor, copies)
    batch, heads = shape(d)
    ctas = math.ceil(SEQLEN / bm) * batch * heads
    steps = query_tile_steps(SEQLEN, bm, bn, False) * batch * heads
    per_sm = ctas_per_sm(gpu, threads, regs, smem_fwd(d))
    l2, hbm = fwd_bytes(d, ctas, sum(steps), bm, bn, batch * heads)
    memory = dict(l2=l2 / gpu.l2_bytes_per_s, hbm=hbm / gpu.hbm_bytes_per_s)
    seconds, rounds, bound = issue_model_time(gpu, [["step"] * s for s in steps], per_sm, warps,
                                              {"step": path}, memory_seconds=memory)
    f = flops("fwd", d, False)
    return dict(tflops=f / seconds / 1e12, seconds=seconds, path=path, round=rounds["step"],
                per_sm=per_sm, regs=regs, bound=bound)


HOPPER_FWD = dict(block_m=128, consumers=2)  # csrc/cuda/hopper/fwd_sm90_config.h
HOPPER_BWD = dict(block_n=128, consumers=2)  # csrc/cuda/hopper/bwd_sm90_config.h


def hopper_fwd_issue(gpu, gpu_key, binaries, d, causal):
    """The sm_90a forward (fwd_sm90_kernel<bf16, d, causal, no other feature>) at N = SEQLEN."""
    name = rf"fwd_sm90_kernelI13__nv_bfloat16Li{d}ELb{int(causal)}E(Lb0E)+EEv"
    arch, loops, _ = one_kernel(binaries, name)
    main = sorted((l for l in loops if l["role"] == "main"), key=lambda l: l["instructions"])
    producer = [l for l in loops if l["role"] == "producer"]
    bm, bn = HOPPER_FWD["block_m"], (128 if d <= 128 else 64)    # fwd_sm90_key_tile
    tensor = main[0]["tensor_per_iteration"][-1]
    paths = {"unmasked": steady_path(main[0], tensor, 0), "masked": steady_path(main[-1], tensor, 0)}
    batch, heads = shape(d)
    per_cta = []
    for m in range(math.ceil(SEQLEN / bm)):
        n = math.ceil(min(SEQLEN, (m + 1) * bm) / bn) if causal else math.ceil(SEQLEN / bn)
        diagonal = bm // bn if causal else 0
        per_cta.append(["unmasked"] * (n - diagonal) + ["masked"] * diagonal)
    cta_steps = per_cta * batch * heads
    l2, hbm = fwd_bytes(d, len(cta_steps), sum(map(len, cta_steps)), bm, bn, batch * heads)
    memory = dict(l2=l2 / gpu.l2_bytes_per_s, hbm=hbm / gpu.hbm_bytes_per_s)
    ceiling = gpu_specs.GEMM_CEILING_TFLOPS.get(gpu_key)
    fraction = ceiling * 1e12 / (gpu.sms * gpu.clock_ghz * 1e9 * gpu_specs.WGMMA_FLOPS_PER_CLK_SM) \
        if ceiling else 1.0
    producer_instr = min(p["lean"]["instructions"] for p in producer[0]["paths"]) if producer else 0
    common = dict(per_sm=1, warps_per_cta=4 * HOPPER_FWD["consumers"], paths=paths, wgmma=True,
                  tensor_fraction=fraction, producer_instructions=producer_instr,
                  memory_seconds=memory, longest_first=True)
    seconds, rounds, bound = issue_model_time(gpu, cta_steps, **common)
    serial, _, serial_bound = issue_model_time(gpu, cta_steps, overlap=False, **common)
    f = flops("fwd", d, causal)
    return dict(tflops=f / seconds / 1e12, seconds=seconds, bound=bound, rounds=rounds,
                serial_tflops=f / serial / 1e12, serial_bound=serial_bound,
                memory_seconds=memory, paths=paths)


def hopper_bwd_issue(gpu, gpu_key, binaries, d, causal):
    """The sm_90a backward (bwd_sm90_kernel<bf16, d, causal, no other feature>) at N = SEQLEN,
    with its two row kernels from their HBM bytes as in model_ours."""
    name = rf"bwd_sm90_kernelI13__nv_bfloat16Li{d}ELb{int(causal)}E(Lb0E)+EEv"
    arch, loops, _ = one_kernel(binaries, name)
    (main,) = [l for l in loops if l["role"] == "main"]
    producer = [l for l in loops if l["role"] == "producer"]
    bn, bm = HOPPER_BWD["block_n"], (128 if d == 64 else 64)     # bwd_sm90_config.h
    path = steady_path(main, main["tensor_per_iteration"][-1], 0)
    batch, heads = shape(d)
    steps = key_tile_steps(SEQLEN, bn, bm, causal) * batch * heads
    # Per step: Q and dO tiles, LSE and D, dQ added in fp32 by the bulk reduce; K, V in and dK, dV
    # out per CTA.
    l2 = sum(steps) * (bm * (2 * d * ELEM + 2 * 4) + bm * d * 4) + len(steps) * bn * 4 * d * ELEM
    hbm = batch * heads * (6 * SEQLEN * d * ELEM + 2 * SEQLEN * 4)
    memory = dict(l2=l2 / gpu.l2_bytes_per_s, hbm=hbm / gpu.hbm_bytes_per_s)
    ceiling = gpu_specs.GEMM_CEILING_TFLOPS.get(gpu_key)
    fraction = ceiling * 1e12 / (gpu.sms * gpu.clock_ghz * 1e9 * gpu_specs.WGMMA_FLOPS_PER_CLK_SM) \
        if ceiling else 1.0
    producer_instr = min(p["lean"]["instructions"] for p in producer[0]["paths"]) if producer else 0
    seconds, rounds, bound = issue_model_time(
        gpu, [["step"] * s for s in steps], 1, 4 * HOPPER_BWD["consumers"], {"step": path},
        wgmma=True, tensor_fraction=fraction, producer_instructions=producer_instr,
        memory_seconds=memory, longest_first=True, waited_fraction=2 / 5)
    rows = sum(row_kernel_hbm(kind, d, d, True) * batch * heads / gpu.hbm_bytes_per_s
               + gpu_specs.LAUNCH_OVERHEAD_S for kind in ("bwd_dot_do_o_kernel", "bwd_convert_dq_kernel"))
    f = flops("bwd", d, causal)
    return dict(tflops=f / (seconds + rows) / 1e12, seconds=seconds + rows, bound=bound,
                rounds=rounds, path=path)


CUDNN_H200 = {  # run 2 of docs/lab/2026-12-01-h200-first-gpu-run.md, TFLOP/s
    ("fwd", 128, False): 556, ("fwd", 128, True): 415, ("fwd", 64, False): 428,
    ("fwd", 64, True): 354, ("fwd", 256, False): 624, ("fwd", 256, True): 476,
    ("fwd+bwd", 128, False): 557, ("fwd+bwd", 128, True): 450,
}


def issue_report(run1, run2, hopper, gpu_key):
    """The calibration (mma.sync forward, d = 128: run 1's and run 2's code against their H200
    measurements) and then the sm_90a kernels' modeled figures beside cuDNN's."""
    gpu = gpu_specs.GPUS[gpu_key]
    lines = [f"Issue terms, {gpu.name}, bf16, N = {SEQLEN}, batch x heads = {TOKENS // SEQLEN} x "
             f"{HIDDEN}/d; clock {gpu.clock_ghz} GHz; FETCH_CYCLES_PER_COPY_TRIP = "
             f"{gpu_specs.FETCH_CYCLES_PER_COPY_TRIP} (fitted on run 1)",
             "", "Calibration: forward d = 128 (fwd_kernel_16bit<FwdTraits<128, false>>, sm_90)",
             f"{'run':<6} {'csrc':<8} {'instr':>6} {'HMMA':>4} {'MUFU':>4} {'stall':>6} {'trips':>5} "
             f"{'tensor':>6} {'issue':>6} {'mufu':>5} {'latency':>7} {'round':>6} {'bound':<12} "
             f"{'model':>6} {'meas':>6} {'error':>6} | {'ncu cyc':>7} {'ncu instr':>9}"]
    for run, binaries in (("run 1", run1), ("run 2", run2)):
        if not binaries:
            continue
        m = mma_sync_fwd_issue(gpu, binaries)
        meas = MEASURED_H200[run]
        p, (cycles, terms, bound) = m["path"], m["round"]
        lines.append(
            f"{run:<6} {meas['csrc']:<8} {p['instructions']:>6.0f} {p['tensor']:>4} {p['mufu']:>4.0f} "
            f"{p['stall_cycles']:>6.0f} {p['copy_loop_trips']:>5} {terms['tensor']:>6.0f} "
            f"{terms['issue']:>6.0f} {terms['mufu']:>5.0f} {terms['latency']:>7.0f} {cycles:>6.0f} "
            f"{bound:<12} {m['tflops']:>6.1f} {meas['tflops']:>6.1f} "
            f"{m['tflops'] / meas['tflops'] - 1:>+6.0%} | "
            f"{meas['ncu_instructions_per_step'] * meas['ncu_cycles_per_issue']:>7.0f} "
            f"{meas['ncu_instructions_per_step']:>9}")
    if hopper:
        lines += ["", "sm_90a kernels (wgmma; GEMM ceiling "
                  f"{gpu_specs.GEMM_CEILING_TFLOPS.get(gpu_key)} TFLOP/s): modeled vs cuDNN measured",
                  f"{'kernel':<8} {'d':>3} {'causal':>6} {'instr':>6} {'MUFU':>4} {'stall':>6} "
                  f"{'tensor':>6} {'issue':>6} {'mufu':>5} {'latency':>7} {'bound':<8} {'model':>6} "
                  f"{'no-overlap':>10} {'cuDNN':>6}"]
        for d in HEAD_DIMS:
            for causal in (False, True):
                try:
                    m = hopper_fwd_issue(gpu, gpu_key, hopper, d, causal)
                except RuntimeError as error:
                    lines.append(f"fwd      {d:>3} {causal!s:>6}  not modeled: {error}")
                    continue
                cycles, terms, _ = m["rounds"]["unmasked"]
                p = m["paths"]["unmasked"]
                lines.append(
                    f"{'fwd':<8} {d:>3} {('yes' if causal else 'no'):>6} {p['instructions']:>6} "
                    f"{p['mufu']:>4} {p['stall_cycles']:>6} {terms['tensor']:>6.0f} "
                    f"{terms['issue']:>6.0f} {terms['mufu']:>5.0f} {terms['latency']:>7.0f} "
                    f"{m['bound']:<8} {m['tflops']:>6.1f} {m['serial_tflops']:>10.1f} "
                    f"{CUDNN_H200.get(('fwd', d, causal), float('nan')):>6}")
        for causal in (False, True):
            try:
                fwd = hopper_fwd_issue(gpu, gpu_key, hopper, 128, causal)
                bwd = hopper_bwd_issue(gpu, gpu_key, hopper, 128, causal)
            except RuntimeError as error:
                lines.append(f"fwd+bwd  128 {causal!s:>6}  not modeled: {error}")
                continue
            cycles, terms, _ = bwd["rounds"]["step"]
            p = bwd["path"]
            total = (flops("fwd", 128, causal) + flops("bwd", 128, causal)) / (
                fwd["seconds"] + bwd["seconds"]) / 1e12
            lines.append(
                f"{'bwd':<8} {128:>3} {('yes' if causal else 'no'):>6} {p['instructions']:>6} "
                f"{p['mufu']:>4} {p['stall_cycles']:>6} {terms['tensor']:>6.0f} "
                f"{terms['issue']:>6.0f} {terms['mufu']:>5.0f} {terms['latency']:>7.0f} "
                f"{bwd['bound']:<8} {bwd['tflops']:>6.1f} {'':>10} {'':>6}")
            lines.append(f"{'fwd+bwd':<8} {128:>3} {('yes' if causal else 'no'):>6} {'':>6} {'':>4} "
                         f"{'':>6} {'':>6} {'':>6} {'':>5} {'':>7} {'':<8} {total:>6.1f} {'':>10} "
                         f"{CUDNN_H200[('fwd+bwd', 128, causal)]:>6}")
    return "\n".join(lines)


# ---- FA2 on paper ----

def gemm_ldsm(m, n, k, warps_m, warps_n, a_smem=True, b_smem=True):
    """ldmatrix.x4 per CTA for C[m x n] += A[m x k] B[k x n] with FA2's TiledMMA: warps_m x
    warps_n warps, each 16 x 16 per repeat; per k-step of 16 a warp loads one x4 per 16-row A
    tile and one per 16-column B tile it covers."""
    rep_m, rep_n = m // (16 * warps_m), n // (16 * warps_n)
    assert rep_m * 16 * warps_m == m and rep_n * 16 * warps_n == n, (m, n, warps_m, warps_n)
    return warps_m * warps_n * (k // 16) * (rep_m * a_smem + rep_n * b_smem)


def gemm_mma(m, n, k):
    return (m // 16) * (n // 8) * (k // 16)


def fa2_counts(family, gpu, d, causal):
    """FA2's counts per head at N = SEQLEN, with its geometry: (per-CTA steps, counters,
    threads, smem per CTA, l2 extra bytes, hbm bytes)."""
    n = SEQLEN
    if family == "fwd":
        g = gpu_specs.fa2_fwd_geometry(gpu, d)
        bm, bn, w = g.block_m, g.block_n, g.warps
        steps = query_tile_steps(n, bm, bn, causal)
        it_mma = gemm_mma(bm, bn, d) + gemm_mma(bm, d, bn)
        it_ldsm = gemm_ldsm(bm, bn, d, w, 1) + gemm_ldsm(bm, d, bn, w, 1, a_smem=False)
        it_cp = 2 * bn * d * ELEM                       # K, V tiles
        cta_cp = bm * d * ELEM                          # Q
        cta_epi_smem = 2 * bm * d * ELEM // 128         # O through smem: st.shared, ld.shared.128
        cta_store_sectors = bm * d * ELEM // 32 + bm * 4 // 32
        it_other_smem = 0
        it_atomics = it_atomic_sectors = 0
        smem = (bm + 2 * bn) * d * ELEM
        threads = 32 * w
        l2_extra = 0
        hbm = 4 * n * d * ELEM + n * 4
    else:
        g = gpu_specs.fa2_bwd_geometry(gpu, d)
        bm, bn, w = g.block_m, g.block_n, g.warps
        steps = key_tile_steps(n, bn, bm, causal)
        it_mma = 5 * gemm_mma(bm, bn, d)
        sdp = 2 * gemm_ldsm(bm, bn, d, g.atom_m_sdp, w // g.atom_m_sdp)      # S, dP
        dkv = 2 * gemm_ldsm(bn, d, bm, g.atom_n_dkv, w // g.atom_n_dkv)      # dV, dK
        dq = gemm_ldsm(bm, d, bn, g.atom_m_dq, w // g.atom_m_dq)             # dQ
        it_ldsm = sdp + dkv + dq
        it_cp = 2 * bm * d * ELEM                       # Q, dO tiles
        cta_cp = 2 * bn * d * ELEM                      # K, V
        it_other_smem = 2 * bm * bn * ELEM // 128       # P and dS stored to smem
        cta_epi_smem = 2 * 2 * bn * d * ELEM // 128     # dK, dV through smem
        cta_store_sectors = 2 * bn * d * ELEM // 32
        it_atomics = bm * d                             # dQ, fp32, from the accumulator layout:
        it_atomic_sectors = bm * d // 4                 # 8 rows x 1 sector per warp instruction
        smem = (3 if g.double_buffer else 2) * bm * d * ELEM + 2 * bn * d * ELEM + 2 * bm * bn * ELEM
        threads = 32 * w
        l2_extra = sum(steps) * 2 * bm * 4              # LSE, dPsum: plain loads
        hbm = 6 * n * d * ELEM + 2 * n * 4
    total_steps, ctas = sum(steps), len(steps)
    c = {
        "mma": it_mma * total_steps,
        "ldmatrix_x4_equiv": it_ldsm * total_steps,
        "smem_wavefronts": (4 * it_ldsm + it_cp // 128 + it_other_smem) * total_steps
                           + (cta_cp // 128 + cta_epi_smem) * ctas,
        "global_sectors": (it_cp // 32 + it_atomic_sectors) * total_steps
                          + (cta_cp // 32 + cta_store_sectors) * ctas,
        "atomics": it_atomics * total_steps,
    }
    c["smem_wavefronts_ideal"] = c["smem_wavefronts"]  # swizzled: conflict-free (fa2_traits)
    per_iteration = dict(block_m=bm, block_n=bn, warps=w, mma=it_mma, ldmatrix_x4=it_ldsm,
                         ldmatrix_x4_per_mma=it_ldsm / it_mma)
    return steps, c, threads, smem, l2_extra, hbm, per_iteration


def model_fa2(family, gpu, d, causal):
    batch, heads = shape(d)
    bh = batch * heads
    steps, c, threads, smem, l2_extra, hbm, per_it = fa2_counts(family, gpu, d, causal)
    c = {k: v * bh for k, v in c.items()}
    per_sm = ctas_per_sm(gpu, threads, gpu_specs.FA2_REGS, smem)
    t, bound, q, _ = kernel_time(gpu, c, [s + 1 for s in steps] * bh, per_sm, l2_extra * bh,
                                 hbm * bh)
    if family == "bwd":  # the same row kernels as ours: D_i (+ zeroing dQaccum), dQ conversion
        for kind in ("bwd_dot_do_o_kernel", "bwd_convert_dq_kernel"):
            t += row_kernel_hbm(kind, d, d, True) * bh / gpu.hbm_bytes_per_s + \
                 gpu_specs.LAUNCH_OVERHEAD_S
    return dict(seconds=t, bound=bound, wave_factor=q, ctas_per_sm=per_sm, smem_per_cta=smem,
                per_iteration=per_it, **c)


# ---- A decoding step (issue 12) ----

# Issue 12's H200 target shape: B = 32 sequences of one new token, 32 query / 8 kv heads of 128,
# a dense bf16 cache every sequence fills. At B x Hkv = 256 CTAs >= the SMs no split is chosen.
DECODE = dict(batch=32, heads=32, heads_kv=8, head_dim=128, kv_lens=(8192, 32768))
DECODE_FIT_KEYS = (512, 1024)
DECODE_CHECK_KEYS = 768
DECODE_KEY_TILE = 64  # FwdTraits<128, *>::kBlockN


def count_decode(ops, torch, keys):
    """Flat counters of the forward launch(es) of one decoding step of one sequence, Sk keys."""
    d = DECODE
    gen = torch.Generator().manual_seed(keys)
    q = torch.randn(1, 1, d["heads"], d["head_dim"], generator=gen).to(torch.bfloat16)
    k_cache, v_cache = (torch.randn(1, keys, d["heads_kv"], d["head_dim"], generator=gen)
                        .to(torch.bfloat16) for _ in range(2))
    seqlens = torch.full((1,), keys, dtype=torch.int32)
    ops.counters_enable(False)
    ops.counters_reset()
    ops.counters_enable(True)
    ops.fwd_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, causal=True, num_splits=1)
    ops.counters_enable(False)
    launches = json.loads(ops.counters_json())["launches"]
    ops.counters_reset()
    assert len(launches) == 1 and "fwd_kernel_16bit" in launches[0]["kernel"], launches
    launch = launches[0]
    assert launch["grid"][0] * launch["grid"][1] * launch["grid"][2] == d["heads_kv"], launch["grid"]
    return launch["kernel"], launch["block"], launch["smem_bytes"], flatten(launch["counters"])


def decode_model(ops, torch, regs, log):
    """Counts one sequence's step on the shim at two cache lengths, fits each counter exactly as
    a * key_tiles + b per kv head (checked exactly at a third length), scales to the batch and
    models it: a decoding step moves its cache once, so HBM is the bound to reach."""
    d = DECODE
    samples = {n: count_decode(ops, torch, n) for n in (*DECODE_FIT_KEYS, DECODE_CHECK_KEYS)}
    name, block, smem, _ = samples[DECODE_FIT_KEYS[0]]
    (n1, n2), heads_kv = DECODE_FIT_KEYS, d["heads_kv"]
    t1, t2 = n1 // DECODE_KEY_TILE, n2 // DECODE_KEY_TILE
    coef = {}
    for key in samples[n1][3]:
        y1, y2 = Fraction(samples[n1][3][key]), Fraction(samples[n2][3][key])
        a = (y2 - y1) / (t2 - t1)
        coef[key] = (a, y1 - a * t1)  # per step of heads_kv CTAs: a per key tile, b per step
    tc = DECODE_CHECK_KEYS // DECODE_KEY_TILE
    bad = [k for k, (a, b) in coef.items() if a * tc + b != samples[DECODE_CHECK_KEYS][3][k]]
    if bad:
        raise RuntimeError(f"decode counts are not linear in key tiles: {bad}")
    threads = block[0] * block[1] * block[2]
    out = []
    for keys in d["kv_lens"]:
        tiles = keys // DECODE_KEY_TILE
        c = {k: float(a * tiles + b) * d["batch"] for k, (a, b) in coef.items()}
        c["mma"] = c["mma.m16n8k16.f16"] + c["mma.m16n8k16.bf16"]
        kv_bytes = 2 * d["batch"] * keys * heads_kv * d["head_dim"] * ELEM
        io_bytes = 2 * d["batch"] * d["heads"] * d["head_dim"] * ELEM  # q in, out
        lse_bytes = d["batch"] * d["heads"] * 4                        # plain stores, uncounted
        row = dict(kv_len=keys, kernel=normalize(name), mma=c["mma"],
                   smem_wavefronts=c["smem_wavefronts"], global_sectors=c["global_sectors"],
                   kv_bytes=kv_bytes, modeled={})
        for key, gpu in (("h100", gpu_specs.H100), ("h200", gpu_specs.H200)):
            r = regs.get((gpu.arch, row["kernel"]))
            if r is None:
                raise RuntimeError(f"no registers for {row['kernel']} ({gpu.arch}) in the built library")
            per_sm = ctas_per_sm(gpu, threads, r, smem)
            t, bound, q, parts = kernel_time(gpu, c, [tiles + 1] * d["batch"] * heads_kv, per_sm,
                                             lse_bytes, kv_bytes + io_bytes + lse_bytes)
            row["modeled"][key] = dict(seconds=t, bound=bound, wave_factor=q, ctas_per_sm=per_sm,
                                       kv_gb_s=kv_bytes / t / 1e9,
                                       hbm_share=kv_bytes / t / gpu.hbm_bytes_per_s,
                                       parts_s=parts)
        out.append(row)
    return out


def decode_table(rows):
    d = DECODE
    lines = [f"Decoding step (issue 12): B={d['batch']}, Sq=1, {d['heads']}/{d['heads_kv']} heads, "
             f"d={d['head_dim']}, bf16 dense cache, num_splits=1; counts fitted per key tile on "
             f"the shim ({DECODE_FIT_KEYS[0]}, {DECODE_FIT_KEYS[1]} keys; {DECODE_CHECK_KEYS} "
             f"checked exactly)",
             f"{'Sk':>6} {'mma/tile':>8} {'smem_wf/tile':>12} {'sectors/tile':>12} {'GPU':>5} "
             f"{'CTA/SM':>6} {'bound':>6} {'tensor/hbm':>10} {'modeled us':>10} {'KV GB/s':>8} "
             f"{'%HBM':>5}"]
    for r in rows:
        per_tile = d["batch"] * d["heads_kv"] * (r["kv_len"] // DECODE_KEY_TILE)
        for key, m in r["modeled"].items():
            lines.append(
                f"{r['kv_len']:>6} {r['mma'] / per_tile:>8.1f} {r['smem_wavefronts'] / per_tile:>12.1f} "
                f"{r['global_sectors'] / per_tile:>12.1f} {key:>5} {m['ctas_per_sm']:>6} "
                f"{m['bound']:>6} {m['parts_s']['tensor'] / m['parts_s']['hbm']:>10.2f} "
                f"{m['seconds'] * 1e6:>10.1f} {m['kv_gb_s']:>8.0f} {m['hbm_share']:>5.0%}")
    return "\n".join(lines)


# ---- Split-KV's count for a decoding step (issue 33) ----

# The split model's constants, read from csrc/cuda/plan_fwd.h (kSplit*, kMaxSplits), so the
# count the header chooses and the time modeled here come from one set of numbers.
PLAN_FWD_H = os.path.join(REPO, "csrc", "cuda", "plan_fwd.h")
SPLIT_DECODE = dict(heads=32, head_dim=128, batches=(1, 4, 32), seqlens_q=(1, 4),
                    kv_lens=(8192, 32768), heads_kv=8)


def split_constants(path=PLAN_FWD_H):
    """{name: value} of plan_fwd.h's `constexpr int[64_t] kSplit... = N;` and kMaxSplits."""
    with open(path) as f:
        text = f.read()
    found = dict(re.findall(r"constexpr int(?:64_t)? (kSplit\w+|kMaxSplits) = (\d+);", text))
    return {name: int(value) for name, value in found.items()}


def split_step_ns(c, *, batch, seqlen_q, heads, heads_kv, packed, seqlen_k, head_dim,
                  block_rows, key_tile, element_bytes, sms, splits, merge_columns=None,
                  hbm_bytes_per_ns=None, ctas_per_sm=None):
    """plan_fwd.h's split_step_ns: the modeled ns of a forward of `batch` x `heads` CTA rows
    (packed: heads = heads_kv, seqlen_q = tokens x group) in `splits`, with the merge. The
    keyword overrides give a GPU's own figures where the header uses one guess for all:
    HBM bytes per ns (header: sms x kSplitSmBytesPerNs), CTAs per SM (kSplitCtasPerSm), and the
    merge's columns per lane (ceil(head_dim / 32): split_merge_kernel.cuh spreads a row's
    columns over a warp; head_dim models the thread per row it replaced)."""
    ctas = batch * heads * math.ceil(seqlen_q / block_rows)
    tiles = math.ceil(seqlen_k / key_tile)
    slots = sms * (ctas_per_sm or c["kSplitCtasPerSm"])
    waves = math.ceil(ctas * splits / slots)
    t = waves * (c["kSplitCtaNs"] + math.ceil(tiles / splits) * c["kSplitTileNs"])
    kv_bytes = 2 * batch * heads_kv * seqlen_k * head_dim * element_bytes
    t = max(t, kv_bytes // (hbm_bytes_per_ns or sms * c["kSplitSmBytesPerNs"]))
    if splits > 1:
        warps = batch * (seqlen_q // packed) * heads * packed
        merge_waves = math.ceil(warps / (sms * c["kSplitMergeWarpsPerSm"]))
        columns = math.ceil(head_dim / 32) if merge_columns is None else merge_columns
        t += c["kSplitMergeLaunchNs"] + merge_waves * columns * splits * c["kSplitMergeStepNs"]
    return t


def decode_geometry(batch, seqlen_q, heads, heads_kv, head_dim):
    """The plan's packing and tiles for a 16-bit decode (gqa_decode.h, plan_fwd.h): keyword
    arguments of split_step_ns without the device and the split count."""
    group = heads // heads_kv
    # gqa_decode.h, can_pack_gqa_decode: packed while its 64-row tiles are fewer than the heads.
    packed = group if group > 1 and math.ceil(seqlen_q * group / 64) < group else 1
    rows = seqlen_q * packed
    one_m_tile = packed > 1 or rows <= 16 or head_dim > 128
    return dict(batch=batch, seqlen_q=rows, heads=heads_kv if packed > 1 else heads,
                heads_kv=heads_kv, packed=packed, head_dim=head_dim,
                block_rows=64 if one_m_tile or head_dim > 128 else 128,
                key_tile=64 if head_dim <= 128 else 32, element_bytes=ELEM)


def best_splits(c, geometry, seqlen_k, sms, **overrides):
    """The least modeled split count (choose_num_splits' rule) under `overrides`."""
    tiles = math.ceil(seqlen_k / geometry["key_tile"])
    if tiles < 2 * c["kSplitMinTiles"]:
        return 1
    most = min(tiles // c["kSplitMinTiles"], c["kMaxSplits"])
    times = {s: split_step_ns(c, **geometry, seqlen_k=seqlen_k, sms=sms, splits=s, **overrides)
             for s in range(1, most + 1)}
    return min(times, key=lambda s: (times[s], s))


def previous_splits(geometry, seqlen_k, sms):
    """The count before issue 33 (commit 6cbe316): ceil(SMs / CTAs), at most Sk / 128 and 64."""
    ctas = geometry["batch"] * geometry["heads"] * math.ceil(geometry["seqlen_q"] /
                                                             geometry["block_rows"])
    if ctas >= sms:
        return 1
    return max(1, min(math.ceil(sms / ctas), seqlen_k // 128, 64))


def split_model(ops, torch, regs):
    """Rows of the split table: for each GPU and decode shape, the plan's split count (the
    sim extension's plan_fwd with the GPU's SM count) and the step modeled with the GPU's HBM
    bandwidth, the kernel's CTAs per SM (ptxas registers, shared memory) and a launch overhead
    per kernel; next to it the same model at 1 split and at the previous heuristic's count, and
    what the model chose with the thread-per-row merge that the warp per row replaced (each
    thread walked head_dim columns; at these shapes its rows fit one wave either way)."""
    c = split_constants()
    d = SPLIT_DECODE
    rows = []
    for key, gpu in (("h200", gpu_specs.H200), ("a100", gpu_specs.A100)):
        device = dict(cc_major=int(gpu.arch[3]), cc_minor=0, sm_count=gpu.sms,
                      smem_optin_bytes=(227 if gpu.arch == "sm_90" else 163) * 1024)
        for batch in d["batches"]:
            for sq in d["seqlens_q"]:
                for sk in d["kv_lens"]:
                    q = torch.zeros(batch, sq, d["heads"], d["head_dim"], dtype=torch.bfloat16)
                    kv = torch.zeros(d["head_dim"], dtype=torch.bfloat16).expand(
                        batch, sk, d["heads_kv"], d["head_dim"])
                    plan = json.loads(ops.plan_fwd(q, kv, kv, causal=True, num_splits=0,
                                                   **device))
                    g = decode_geometry(batch, sq, d["heads"], d["heads_kv"], d["head_dim"])
                    assert plan["num_splits"] == best_splits(c, g, sk, gpu.sms), (plan, g)
                    kernel = (f"flashattn::cuda::fwd_kernel_16bit<flashattn::cuda::FwdTraits<"
                              f"{plan['head_dim_tile']},{str(plan['one_m_tile']).lower()}>,"
                              f"__nv_bfloat16>(flashattn::AttnParams,float*)")
                    if (gpu.arch, kernel) not in regs:
                        raise RuntimeError(f"no registers for {kernel} ({gpu.arch}) in the built library")
                    per_sm = ctas_per_sm(gpu, plan["block"][0], regs[gpu.arch, kernel],
                                         plan["smem_bytes"])
                    gpu_terms = dict(hbm_bytes_per_ns=gpu.hbm_bytes_per_s / 1e9,
                                     ctas_per_sm=per_sm)
                    launch_ns = gpu_specs.LAUNCH_OVERHEAD_S * 1e9

                    def modeled(splits, **extra):
                        return launch_ns + split_step_ns(c, **g, seqlen_k=sk, sms=gpu.sms,
                                                         splits=splits, **gpu_terms, **extra)

                    kv_bytes = 2 * batch * sk * d["heads_kv"] * d["head_dim"] * ELEM
                    thread_merge = dict(merge_columns=d["head_dim"])
                    s_thread = best_splits(c, g, sk, gpu.sms, **gpu_terms, **thread_merge)
                    prev = previous_splits(g, sk, gpu.sms)
                    grid = plan["grid"]
                    rows.append(dict(
                        gpu=key, batch=batch, seqlen_q=sq, kv_len=sk, splits=plan["num_splits"],
                        ctas=grid[0] * grid[1] * grid[2], ctas_per_sm=per_sm, kv_bytes=kv_bytes,
                        us=modeled(plan["num_splits"]) / 1e3, us_one=modeled(1) / 1e3,
                        previous=prev, us_previous=modeled(prev) / 1e3,
                        splits_thread_merge=s_thread,
                        us_thread_merge=modeled(s_thread, **thread_merge) / 1e3,
                        hbm_bytes_per_s=gpu.hbm_bytes_per_s))
    return c, rows


def split_table(c, rows):
    d = SPLIT_DECODE
    lines = [f"Split-KV (issue 33): Hq {d['heads']}, Hkv {d['heads_kv']}, d {d['head_dim']}, bf16, "
             f"dense cache; splits = the plan's num_splits=0 choice; modeled step = launch "
             f"{gpu_specs.LAUNCH_OVERHEAD_S * 1e6:.0f} us + max(waves x ({c['kSplitCtaNs']} + "
             f"ceil(tiles/s) x {c['kSplitTileNs']}) ns, KV bytes / HBM) + merge "
             f"({c['kSplitMergeLaunchNs']} ns + ceil(d/32) x s x {c['kSplitMergeStepNs']} ns); "
             f"TB/s of KV read, % of the GPU's HBM figure",
             f"{'GPU':<5} {'B':>3} {'Sq':>2} {'Sk':>6} {'splits':>6} {'CTAs':>5} {'CTA/SM':>6} "
             f"{'us':>7} "
             f"{'TB/s':>5} {'%HBM':>5} | {'s=1 us':>7} {'%HBM':>5} | {'prev':>4} {'us':>7} "
             f"{'%HBM':>5} | {'thread-merge s':>14} {'us':>6} {'%HBM':>5}"]
    for r in rows:
        def pct(us):
            return f"{r['kv_bytes'] / (us * 1e-6) / r['hbm_bytes_per_s']:>5.0%}"
        lines.append(
            f"{r['gpu']:<5} {r['batch']:>3} {r['seqlen_q']:>2} {r['kv_len']:>6} {r['splits']:>6} "
            f"{r['ctas']:>5} {r['ctas_per_sm']:>6} {r['us']:>7.1f} "
            f"{r['kv_bytes'] / (r['us'] * 1e-6) / 1e12:>5.2f} "
            f"{pct(r['us'])} | {r['us_one']:>7.1f} {pct(r['us_one'])} | {r['previous']:>4} "
            f"{r['us_previous']:>7.1f} {pct(r['us_previous'])} | {r['splits_thread_merge']:>14} "
            f"{r['us_thread_merge']:>6.1f} {pct(r['us_thread_merge'])}")
    return "\n".join(lines)


# ---- Driver ----

def build_sim(log):
    """torch.ops.flashattn_sim, built (or reused from torch's cache) by tests/sim_ext/build.py."""
    import torch

    os.environ.setdefault("CUDA_HOME", "/usr/local/cuda")
    build = load_module("sim_ext_build", os.path.join(REPO, "tests", "sim_ext", "build.py"))
    if build.cudasim_build.cuda_include_dir() is None:
        sys.exit("gpu_model: the shim needs cuda_fp16.h / vector_types.h: set CUDA_HOME")
    start = time.time()
    build.load()
    log(f"sim extension ready in {time.time() - start:.1f} s")
    return torch, torch.ops.flashattn_sim


def records(ops, torch, regs, head_dims, log):
    gpus = {"h100": gpu_specs.H100, "h200": gpu_specs.H200, "a100": gpu_specs.A100}
    out = []
    for d in head_dims:
        for causal in (False, True):
            for family in FAMILIES:
                launches = count_family(ops, torch, family, d, causal, log)
                sass_loops = {normalize(l["name"]): check_main_loops(regs, l) for l in launches}
                kernels, c, seconds = model_ours(family, d, causal, launches, regs, gpus)
                main = max((k for k in kernels if "regs_per_thread_sm_90" in k),
                           key=lambda k: k["modeled"]["h100"]["seconds"])
                f = flops(family, d, causal)
                fa2 = None if family == "bwd_deterministic" else {
                    key: model_fa2("fwd" if family == "fwd" else "bwd", gpu, d, causal)
                    for key, gpu in gpus.items() if key in ("h100", "h200")}
                mma = c["mma.m16n8k16.f16"] + c["mma.m16n8k16.bf16"]
                rec = dict(
                    kernel="+".join(re.sub(r"^flashattn::cuda::", "", k["kernel"]).split("(")[0]
                                    for k in kernels),
                    family=family, direction="fwd" if family == "fwd" else "bwd", dtype="bf16",
                    head_dim=d, causal=causal, seqlen=SEQLEN, batch=shape(d)[0],
                    heads=shape(d)[1], flops=f,
                    mma=mma, ldmatrix_x4_equiv=ldsm_x4_equiv(c),
                    ldmatrix_x4_equiv_per_mma=ldsm_x4_equiv(c) / mma,
                    smem_wavefronts=c["smem_wavefronts"],
                    smem_wavefronts_ideal=c["smem_wavefronts_ideal"],
                    global_sectors=c["global_sectors"], atomics=c["atomics.ops"],
                    barriers=c["barriers"],
                    regs_per_thread=main["regs_per_thread_sm_90"],
                    sass_main_loops=sass_loops[main["kernel"]],
                    smem_per_cta=main["smem_per_cta"],
                    ctas_per_sm_h100=main["modeled"]["h100"]["ctas_per_sm"],
                    bound_h100=main["modeled"]["h100"]["bound"],
                    modeled_seconds_h100=seconds["h100"],
                    modeled_seconds_h200=seconds["h200"],
                    modeled_tflops_h100=f / seconds["h100"] / 1e12,
                    modeled_tflops_h200=f / seconds["h200"] / 1e12,
                    modeled_tflops_a100=f / seconds["a100"] / 1e12,
                    fa2_modeled_tflops_h100=f / fa2["h100"]["seconds"] / 1e12 if fa2 else None,
                    fa2_modeled_tflops_h200=f / fa2["h200"]["seconds"] / 1e12 if fa2 else None,
                    fa2=fa2["h100"] if fa2 else None,
                    kernels=kernels,
                    extrapolation=dict(method="a*steps + b*ctas per launch, fitted exactly",
                                       fit_seqlens=list(FIT_SEQLENS), check_seqlen=CHECK_SEQLEN,
                                       check="exact"),
                )
                out.append(rec)
                log(f"  {family:<18} d={d:<3} causal={int(causal)}: "
                    f"{rec['modeled_tflops_h100']:6.1f} TFLOP/s H100 (FA2 "
                    f"{rec['fa2_modeled_tflops_h100'] or float('nan'):6.1f})")
    return out


def table(recs):
    lines = []
    head = (f"{'family':<18} {'d':>3} {'causal':>6} {'ldsm/mma':>8} {'smem_wf':>9} {'conflict':>8} "
            f"{'L2 GB':>6} {'atomics':>8} {'regs':>4} {'smemKB':>6} {'CTA/SM':>6} {'bound':>6} "
            f"{'H100':>6} {'H200':>6} {'A100':>6} {'FA2H100':>7} {'ours/FA2':>8}")
    lines.append(head)
    lines.append("-" * len(head))
    for r in recs:
        extra = r["smem_wavefronts"] / r["smem_wavefronts_ideal"] - 1
        fa2 = r["fa2_modeled_tflops_h100"]
        lines.append(
            f"{r['family']:<18} {r['head_dim']:>3} {('yes' if r['causal'] else 'no'):>6} "
            f"{r['ldmatrix_x4_equiv_per_mma']:>8.4f} {r['smem_wavefronts'] / 1e6:>8.1f}M "
            f"{extra:>7.1%} {r['global_sectors'] * 32 / 1e9:>6.1f} {r['atomics'] / 1e6:>7.1f}M "
            f"{r['regs_per_thread']:>4} {r['smem_per_cta'] / 1024:>6.1f} {r['ctas_per_sm_h100']:>6} "
            f"{r['bound_h100']:>6} {r['modeled_tflops_h100']:>6.1f} {r['modeled_tflops_h200']:>6.1f} "
            f"{r['modeled_tflops_a100']:>6.1f} "
            + (f"{fa2:>7.1f} {r['modeled_tflops_h100'] / fa2:>8.2f}" if fa2 else f"{'-':>7} {'-':>8}"))
    return "\n".join(lines)


def fa2_table(recs):
    lines = [f"{'FA2 (paper)':<12} {'d':>3} {'tile':>11} {'warps':>5} {'mma/it':>7} {'ldsm/it':>7} "
             f"{'ldsm/mma':>8} {'smemKB':>6} {'CTA/SM':>6} {'bound':>6}"]
    seen = set()
    for r in recs:
        if not r["fa2"] or (r["direction"], r["head_dim"]) in seen:
            continue
        seen.add((r["direction"], r["head_dim"]))
        it = r["fa2"]["per_iteration"]
        lines.append(f"{r['direction']:<12} {r['head_dim']:>3} {it['block_m']:>5}x{it['block_n']:<5} "
                     f"{it['warps']:>5} {it['mma']:>7} {it['ldmatrix_x4']:>7} "
                     f"{it['ldmatrix_x4_per_mma']:>8.4f} {r['fa2']['smem_per_cta'] / 1024:>6.1f} "
                     f"{r['fa2']['ctas_per_sm']:>6} {r['fa2']['bound']:>6}")
    return "\n".join(lines)


def csrc_digest():
    """sha256 of csrc/, so a stale model snapshot can be told from a current one."""
    h = hashlib.sha256()
    for root, _, files in sorted(os.walk(os.path.join(REPO, "csrc"))):
        for name in sorted(files):
            path = os.path.join(root, name)
            h.update(os.path.relpath(path, REPO).encode())
            with open(path, "rb") as f:
                h.update(f.read())
    return h.hexdigest()[:16]


def compare(bench_files, model_file, gpu):
    """Measured TFLOP/s (python -m flashattn.bench --json) next to the model's, for bench/
    gpu_check.sh: flashattn against our kernels' model, sdpa-flash (PyTorch's FA2) against
    FA2's. Forward+backward is modeled as the forward's and backward's times added."""
    with open(model_file) as f:
        model = json.load(f)
    stale = {r.get("csrc") for r in model} != {csrc_digest()}
    by = {(r["family"], r["head_dim"], r["causal"]): r for r in model}

    def modeled(kind, mode, d, causal):
        fwd, bwd = by.get(("fwd", d, causal)), by.get(("bwd", d, causal))
        key = f"modeled_tflops_{gpu}" if kind == "ours" else f"fa2_modeled_tflops_{gpu}"
        if fwd is None or bwd is None or fwd.get(key) is None:
            return None
        if mode == "fwd":
            return fwd[key]
        t = fwd["flops"] / fwd[key] + bwd["flops"] / bwd[key]
        return (fwd["flops"] + bwd["flops"]) / t

    rows = []
    for path in bench_files:
        if not os.path.isfile(path):
            continue
        with open(path) as f:
            results = json.load(f)["results"]
        for r in results:
            if r.get("tflops") is None or r["dtype"] != "bfloat16":
                continue
            kind = {"flashattn": "ours", "sdpa-flash": "fa2"}.get(r["impl"])
            if kind is None:
                continue
            m = modeled(kind, r["mode"], r["head_dim"], bool(r["causal"])) if r["seqlen"] == SEQLEN \
                else None
            rows.append((r["mode"], r["head_dim"], "yes" if r["causal"] else "no", r["seqlen"],
                         r["impl"], r["tflops"], m))
    if not rows:
        print("no bf16 benchmark results to compare")
        return 0
    print(f"{'mode':<7} {'d':>3} {'causal':>6} {'seqlen':>6} {'impl':<11} {'measured':>8} "
          f"{'modeled':>8} {'meas/model':>10}   TFLOP/s; modeled: {gpu.upper()}, N={SEQLEN} only"
          + ("  (model snapshot from another csrc: rerun tools/gpu_model.py)" if stale else ""))
    for mode, d, causal, n, impl, measured, m in rows:
        cells = f"{m:>8.1f} {measured / m:>10.2f}" if m else f"{'-':>8} {'-':>10}"
        print(f"{mode:<7} {d:>3} {causal:>6} {n:>6} {impl:<11} {measured:>8.1f} {cells}")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the records here")
    parser.add_argument("--quick", action="store_true",
                        help="head dim 128 only (the issue's targets): for CI")
    parser.add_argument("--head-dims", default=None, help="comma-separated, default 64,128,256")
    parser.add_argument("--binary", nargs="+", default=None,
                        help="the CUDA build whose registers to use: a flashattn/_C*.so (default: "
                             "the one `import flashattn` loads) or .ci/sass_compare.py's "
                             "build/sass/*/*.cubin")
    parser.add_argument("--compare", nargs="*", metavar="BENCH_JSON",
                        help="instead: print these flashattn.bench results next to --model's")
    parser.add_argument("--model", default=os.path.join(HERE, "gpu_model.json"))
    parser.add_argument("--gpu", default="h200", choices=sorted(gpu_specs.GPUS))
    parser.add_argument("--decode", action="store_true",
                        help="instead: count and model one KV-cache decoding step (issue 12)")
    parser.add_argument("--issue", action="store_true",
                        help="instead: the issue terms (issue 31, stage 7): calibration on "
                             "--run1/--run2 builds, then the --hopper kernels' figures; no shim")
    parser.add_argument("--run1", nargs="*", default=[],
                        help="with --issue: a build holding f552cd6's fwd_kernel_16bit<FwdTraits<128,false>> "
                             "(sm_90): run 1's code")
    parser.add_argument("--run2", nargs="*", default=[],
                        help="with --issue: the same kernel built from b6fc51e or later: run 2's")
    parser.add_argument("--hopper", nargs="*", default=[],
                        help="with --issue: builds holding the sm_90a fwd_sm90_kernel / bwd_sm90_kernel")
    args = parser.parse_args()
    if args.compare is not None:
        return compare(args.compare, args.model, args.gpu)
    if args.issue:
        print(issue_report(args.run1, args.run2, args.hopper, args.gpu))
        return 0

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    binaries = args.binary or [built_library()]
    missing = [p for p in binaries if not p or not os.path.isfile(p)]
    if missing:
        sys.exit(f"gpu_model: no built library ({missing}): install or build flashattn with its "
                 f"CUDA kernels, or pass --binary")
    regs = BuiltKernels(binaries)
    if not regs:
        sys.exit(f"gpu_model: {', '.join(binaries)} holds no CUDA kernels (a CPU-only build?)")
    head_dims = ([int(x) for x in args.head_dims.split(",")] if args.head_dims
                 else (128,) if args.quick else HEAD_DIMS)
    torch, ops = build_sim(log)
    if args.decode:
        print(decode_table(decode_model(ops, torch, regs, log)))
        print()
        print(split_table(*split_model(ops, torch, regs)))
        return 0
    start = time.time()
    recs = records(ops, torch, regs, head_dims, log)
    digest = csrc_digest()
    for r in recs:
        r["csrc"] = digest
    log(f"counted and modeled {len(recs)} records in {time.time() - start:.1f} s")
    print(f"GPU model (issue 15), bf16, N={SEQLEN}, batch x heads = {TOKENS // SEQLEN} x "
          f"{HIDDEN}/d; modeled TFLOP/s (FA convention); {datetime.date.today()}")
    print(table(recs))
    print()
    print(fa2_table(recs))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(recs, f, indent=1)
        log(f"wrote {len(recs)} records to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
