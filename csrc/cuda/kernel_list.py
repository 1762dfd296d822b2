"""The one list of the CUDA kernels' instantiations: (family, head-dim tile, dtype, architecture),
the 16-bit forward's and backward's tiles keyed by the pair (q's and k's head dim, v's head dim).

Everything that names a compiled kernel follows from KERNELS:
  - csrc/cuda/inst/*.cu (what nvcc compiles) and csrc/cuda/kernel_list.h (the head-dim tiles
    dispatch.h chooses from), and the CPU shim's tests/sim_ext/sim_kernels_{fwd,bwd}.cpp, are
    written by csrc/cuda/generate_kernels.py;
  - tools/gpu_model.py and tests/sanitizer_cases.py read this file when they run.

A new head-dim tile is one number in HEAD_DIMS_16BIT (or HEAD_DIMS_SIMT), or a (qk, v) pair in
HEAD_DIM_PAIRS_16BIT_FWD (and _BWD), plus, if its tiles need tuning, a case in
csrc/cuda/traits.h; then `python csrc/cuda/generate_kernels.py`.
tests/test_kernel_list.py checks that the generated files are current and that traits.h,
dispatch.h, gpu_model.py and the sanitizer cases agree with the list.

Load it with runpy.run_path (as the tools do), not import: an import would leave a __pycache__
inside csrc/, whose hash (tools/gpu_model.py csrc_digest, .ci/sass_compare.py) names a source tree.
"""
import collections

# head_dim: q's and k's tile width. head_dim_v: v's, for the families keyed by the pair (their
# template takes {head_dim_v}); None for the others, whose tiles are as wide for v as for q.
Kernel = collections.namedtuple("Kernel", "family head_dim dtype arch head_dim_v", defaults=(None,))

# How each architecture's kernels are built.
#   file_suffix: appended to an inst/ file's stem, so two architectures' files never collide.
#   gencode: nvcc's -gencode flags for its files; None means the build's own architecture list
#            (setup.py, FLASHATTN_CUDA_ARCHS).
#   build_with: the FLASHATTN_CUDA_ARCHS entry that brings its files into the build (None: always).
#   sim: the CPU shim runs its kernels (tests/sim_ext).
ARCHS = {
    # mma.sync.m16n8k16, cp.async and ldmatrix: sm_80 class, and run as built on sm_90 too.
    "sm80": dict(file_suffix="", gencode=None, build_with=None, sim=True),
    # wgmma, TMA, setmaxnreg (csrc/cuda/hopper/): sm_90a code runs on compute capability 9.0 only,
    # so these files get this one gencode (setup.py gives each its own flags) and join the build
    # when the architecture list holds 90. The plan picks them only with FLASHATTN_CUDA_HOPPER=1
    # (plan_fwd_sm90.h).
    "sm90a": dict(file_suffix="_sm90", gencode=["-gencode=arch=compute_90a,code=sm_90a"],
                  build_with="90", sim=True),
}

# What one instantiation of a family is (the run_<family> template of its launch header), and
# how a family's instantiations are grouped into inst/ files:
#   one_per_file: a file per (head dim, dtype), named <prefix>_hdim<d>_<dtype>.cu, so the big
#                 kernels compile in parallel; otherwise one file, <prefix>.cu, holds them all.
#   template:     the template's arguments, from {element} (the C++ type), {head_dim} and, for a
#                 family keyed by (qk, v) pairs, {head_dim_v}.
#   params:       the function's parameter list.
#   direction:    which of the shim's two translation units holds it (sim_kernels_<direction>.cpp).
FAMILIES = {
    "fwd_16bit": dict(
        header="launch_fwd.cuh", prefix="fwd", one_per_file=True, direction="fwd",
        template="{element}, {head_dim}, {head_dim_v}",
        params="const AttnParams&, float*, cudaStream_t, LaunchCheck",
        comment="One instantiation per file so nvcc compiles them in parallel (budget: traits.h)."),
    "bwd_16bit": dict(
        header="launch_bwd.cuh", prefix="bwd", one_per_file=True, direction="bwd",
        template="{element}, {head_dim}, {head_dim_v}",
        params="const AttnBwdParams&, float*, cudaStream_t, LaunchCheck",
        comment="One instantiation per file so nvcc compiles them in parallel (budget: traits.h)."),
    "fwd_simt": dict(
        header="launch_simt.cuh", prefix="fwd_fp32", one_per_file=False, direction="fwd",
        template="{head_dim}", params="const AttnParams&, float*, cudaStream_t, LaunchCheck",
        comment="The fp32 SIMT forward on every fp32 head-dim tile (SimtHeadDimTiles in "
                "dispatch.h); small kernels, so one file holds them all (budget: traits.h)."),
    "bwd_simt": dict(
        header="launch_simt.cuh", prefix="bwd_fp32", one_per_file=False, direction="bwd",
        template="{head_dim}", params="const AttnBwdParams&, float*, cudaStream_t, LaunchCheck",
        comment="The fp32 SIMT backward on every fp32 head-dim tile (SimtHeadDimTiles in "
                "dispatch.h); small kernels, so one file holds them all (budget: traits.h)."),
    "fwd_sm90": dict(
        header="launch_fwd_sm90.cuh", prefix="fwd", one_per_file=True, direction="fwd",
        template="{element}, {head_dim}",
        params="const AttnParams&, float*, unsigned*, cudaStream_t, LaunchCheck",
        comment="The sm_90a forward (csrc/cuda/hopper/), its main loops (no mask, causal, "
                "local, each with softcap or not; ALiBi, "
                "no mask, causal or local, softcap or not at run time; "
                "attn_mask, no mask, causal or local, softcap and ALiBi or not at run time; a "
                "paged or indexed "
                "KV cache, no mask, causal or local; dropout, no mask, causal or local) for one (head "
                "dim, dtype): compiled for sm_90a only "
                "(kernel_list.py ARCHS)."),
    "fwd_sm90_fp8": dict(
        header="launch_fwd_sm90.cuh", prefix="fwd", one_per_file=True, direction="fwd",
        template="{element}, {head_dim}",
        params="const AttnParams&, const Fp8Descales&, float*, cudaStream_t, LaunchCheck",
        comment="The sm_90a FP8 forward (csrc/cuda/hopper/, e4m3 q, k, v, V^T written by the "
                "producer, out bf16), its twelve main loops (no mask, causal or a local window, each "
                "with softcap or not; ALiBi with each, softcap at run time; attn_mask with each, "
                "softcap and ALiBi at run time): compiled for sm_90a only (kernel_list.py ARCHS)."),
    "bwd_sm90": dict(
        header="launch_bwd_sm90.cuh", prefix="bwd", one_per_file=True, direction="bwd",
        template="{element}, {head_dim}",
        params="const AttnBwdParams&, float*, cudaStream_t, LaunchCheck",
        comment="The sm_90a backward (csrc/cuda/hopper/bwd_sm90_*), its main loops (no mask, "
                "causal, a local window, each with softcap or not; ALiBi, no mask, causal or local, "
                "softcap or not at run time at d = 128, each with softcap or not at d = 64; "
                "attn_mask, no mask, causal or local, each with softcap or not (with softcap "
                "at d = 128 in bwd_sm90_mask_softcap); "
                "dropout, no "
                "mask, causal or local, at "
                "d = 64 not local), with its rows and dQ convert kernels, for one (head dim, "
                "dtype): compiled for sm_90a only (kernel_list.py ARCHS)."),
    "bwd_sm90_mask_softcap": dict(
        header="launch_bwd_sm90_mask_softcap.cuh", prefix="bwd_mask_softcap", one_per_file=True,
        direction="bwd", template="{element}, {head_dim}",
        params="const AttnBwdParams&, float*, cudaStream_t, LaunchCheck",
        comment="The sm_90a backward's attn_mask main loops with softcap (no mask, causal or "
                "local; ALiBi at run time) at the head dims where they are compiled apart from "
                "the other loops of bwd_sm90 (hopper::bwd_sm90_attn_mask_softcap_apart): "
                "compiled for sm_90a only (kernel_list.py ARCHS)."),
    "split_merge": dict(
        header="split_merge_kernel.cuh", prefix="split_merge", one_per_file=False, direction="fwd",
        template="{element}", params="const AttnParams&, const float*, cudaStream_t, LaunchCheck",
        comment="Split-KV's merge kernel, for each element type."),
    "kv_append": dict(
        header="kv_append_kernel.cuh", prefix="kv_append", one_per_file=False, direction="fwd",
        template="{element}", params="const KvAppendParams&, cudaStream_t, LaunchCheck",
        comment="flash_attn_with_kvcache's append and rotary kernel, for each element type."),
}

# The C++ element type of each dtype.
ELEMENTS = {"fp16": "__half", "bf16": "__nv_bfloat16", "fp32": "float", "e4m3": "__nv_fp8_e4m3"}

# Head-dim tiles (traits.h explains the choice). A head dim d runs on the smallest tile >= d,
# and the largest tile must be kMaxHeadDim (traits.h), so every accepted d has one.
HEAD_DIMS_16BIT = (32, 64, 96, 128, 192, 256)  # tensor-core kernels, fp16 and bf16
# The 16-bit forward's tiles above those, forward only (the backward stops at kMaxHeadDimBwd,
# traits.h): MLA's 576 tile, q and k 576 wide and v 512 (FwdTraits::kHeadDimV), which also runs
# every equal head dim from 257 to 512 (docs/lab/2026-12-02-cuda-head-dim-512.md).
HEAD_DIMS_16BIT_FWD_ONLY = (576,)
# The 16-bit forward's tiles whose v is narrower than q and k (MLA), beside the equal pairs: the
# (192, 128) of DeepSeek's prefill and training, which on the (192, 192) tile spent a third of
# P V's mma and of V's ldmatrix on padding (docs/lab/2026-12-03-mla-pair-tiles.md).
# (128, 64), v half of q, one m-tile per warp (traits.h): a quarter of the mma of the (128, 128)
# tile's one-m-tile kernel were V's padding (docs/lab/2026-12-03-mla-pair-tiles.md).
HEAD_DIM_PAIRS_16BIT_FWD = ((192, 128), (128, 64))
# The 16-bit backward's unequal pairs (each one of the forward's, dispatch.h): (192, 128), whose
# dV, V and dO on the (192, 192) tile were a third padding (docs/lab/2026-12-03-mla-pair-tiles.md).
HEAD_DIM_PAIRS_16BIT_BWD = ((192, 128), (128, 64))
HEAD_DIMS_SIMT = (64, 128, 256)  # fp32 SIMT kernels
# The sm_90a forward and backward: exactly these head dims (FwdSm90Config, BwdSm90Config), fp16 and
# bf16; the forward also at d = 256 (HEAD_DIMS_SM90_FWD). Each forward file holds eighteen main
# loops (launch_fwd_sm90.cuh, launch_fwd_sm90_features): no mask, causal, a local window, each with
# softcap and without; ALiBi with no mask, causal or a local window, softcap or not at run time;
# attn_mask with no mask,
# causal or a local window, softcap and ALiBi or not at run time; a gathered (paged or indexed) KV cache with
# no mask, causal or a local window only, the masks a decode takes; dropout with no mask, causal
# or a local window, alone (at d = 256 the attn_mask loops and softcap's local window with lean S
# descriptors, hopper/fwd_sm90_kernel.cuh kLeanDescriptors: without them they spill). What is not built
# stays on the sm_80 kernels (plan_fwd_sm90.h, README's support table). Each backward file holds
# fifteen main loops at d = 128, twenty at d = 64 (launch_bwd_sm90.cuh, launch_bwd_sm90_masks):
# no mask, causal, a local window, each with softcap and without; ALiBi with no mask, causal or a
# local window, softcap or not at run time at d = 128 (at d = 64 each with softcap and without:
# hopper/bwd_sm90_config.h); attn_mask with no mask, causal or a local window, ALiBi or not at run
# time, each with softcap and without (at d = 128 the three with softcap in a file of their own,
# bwd_sm90_mask_softcap: hopper/bwd_sm90_config.h); dropout with no
# mask, causal or a local window, alone, at d = 64 without the local window (it spills:
# hopper/bwd_sm90_config.h) (and its rows and convert kernels). Six forward files and six backward: the build-time budget
# (docs/lab/2026-12-02-hopper-forward-features.md, docs/lab/2026-12-02-hopper-backward-wiring.md,
# docs/lab/2026-12-02-hopper-forward-d256.md, docs/lab/2026-12-03-hopper-backward-alibi.md).
HEAD_DIMS_SM90 = (64, 128)
HEAD_DIMS_SM90_FWD = HEAD_DIMS_SM90 + (256,)
# The sm_90a FP8 (e4m3) forward (fwd_sm90_fp8, launch_fwd_sm90.cuh run_fwd_sm90_fp8): d = 128 only
# (FwdSm90Config's one-byte case), fifteen main loops: no mask, causal or a local window, each with
# softcap or not; ALiBi with each of the three, softcap at run time; attn_mask with each of the
# three, softcap and ALiBi at run time; a gathered (paged, indexed or left-padded) cache with each
# of the three, nothing else; every other feature is refused (csrc/fp8_args.cpp). Two
# loops compiled in about 30 s (docs/lab/2026-12-04-hopper-fp8-forward.md), the six in
# docs/lab/2026-12-04-hopper-fp8-window-softcap.md, the nine and twelve in
# docs/lab/2026-12-04-hopper-fp8-decode.md, the fifteen in docs/lab/2026-12-04-hopper-fp8-paged.md.
HEAD_DIMS_SM90_FP8 = (128,)



def named_head_dim_v(head_dim):
    """V's width of a 16-bit forward tile named by its q width alone (traits.h FwdTraits<d, *>,
    inst/fwd_hdim<d>_<dtype>.cu): d, and 512 on MLA's 576 tile. Other pairs carry their v in their
    names (fwd_hdim192v128_bf16.cu, FwdPairTraits<192, 128, *>)."""
    return 512 if head_dim == 576 else head_dim


KERNELS = (
    [Kernel("fwd_16bit", d, dtype, "sm80", named_head_dim_v(d))
     for d in HEAD_DIMS_16BIT + HEAD_DIMS_16BIT_FWD_ONLY for dtype in ("fp16", "bf16")]
    + [Kernel("fwd_16bit", d, dtype, "sm80", dv) for d, dv in HEAD_DIM_PAIRS_16BIT_FWD
       for dtype in ("fp16", "bf16")]
    + [Kernel("bwd_16bit", d, dtype, "sm80", d) for d in HEAD_DIMS_16BIT
       for dtype in ("fp16", "bf16")]
    + [Kernel("bwd_16bit", d, dtype, "sm80", dv) for d, dv in HEAD_DIM_PAIRS_16BIT_BWD
       for dtype in ("fp16", "bf16")]
    + [Kernel(family, d, "fp32", "sm80") for family in ("fwd_simt", "bwd_simt")
       for d in HEAD_DIMS_SIMT]
    + [Kernel("fwd_sm90", d, dtype, "sm90a") for d in HEAD_DIMS_SM90_FWD for dtype in ("fp16", "bf16")]
    + [Kernel("fwd_sm90_fp8", d, "e4m3", "sm90a") for d in HEAD_DIMS_SM90_FP8]
    + [Kernel("bwd_sm90", d, dtype, "sm90a") for d in HEAD_DIMS_SM90 for dtype in ("fp16", "bf16")]
    + [Kernel("bwd_sm90_mask_softcap", 128, dtype, "sm90a") for dtype in ("fp16", "bf16")]
    # Not per head dim: one kernel per element type.
    + [Kernel(family, None, dtype, "sm80") for family in ("split_merge", "kv_append")
       for dtype in ("fp16", "bf16", "fp32")]
    # flash_attn_with_kvcache's append into an FP8 cache: the row copy of one-byte elements
    # (no rotary for FP8, csrc/kvcache_args.cpp).
    + [Kernel("kv_append", None, "e4m3", "sm80")]
)


def head_dims(family, dtype=None, arch="sm80"):
    """Sorted head-dim tiles of a family (and dtype) on an architecture."""
    return sorted({k.head_dim for k in KERNELS if k.family == family and k.arch == arch
                   and (dtype is None or k.dtype == dtype) and k.head_dim is not None})


def dtypes(family, arch="sm80"):
    """The dtypes a family is compiled for, in the order of ELEMENTS."""
    present = {k.dtype for k in KERNELS if k.family == family and k.arch == arch}
    return [d for d in ELEMENTS if d in present]


def head_dim_pairs(family, dtype=None, arch="sm80"):
    """Sorted (qk, v) tiles of a family: its listed pairs, or (d, d) for a family keyed by one
    head dim."""
    return sorted({(k.head_dim, k.head_dim if k.head_dim_v is None else k.head_dim_v)
                   for k in KERNELS if k.family == family and k.arch == arch
                   and (dtype is None or k.dtype == dtype) and k.head_dim is not None})


def pair_for(head_dim, head_dim_v, dtype, arch="sm80", backward=False):
    """The forward's (or backward's) (qk, v) tile the dispatch (dispatch.h, dispatch_head_dims)
    picks for a pair: the first in (qk, v) order that covers both, or None."""
    family = ("bwd_" if backward else "fwd_") + ("simt" if dtype == "fp32" else "16bit")
    return next((t for t in head_dim_pairs(family, dtype, arch)
                 if t[0] >= head_dim and t[1] >= head_dim_v), None)


def tile_for(head_dim, dtype, arch="sm80"):
    """The forward's head-dim tile (q's width) for equal head dims: the smallest >= it, or None."""
    pair = pair_for(head_dim, head_dim, dtype, arch)
    return pair and pair[0]
