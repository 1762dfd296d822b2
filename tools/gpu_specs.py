"""The numbers tools/gpu_model.py models GPUs and FlashAttention-2 with, each with its source.

Nothing here is measured by this project: these are vendors' published figures, FA2's own
source, and, where no vendor figure exists, a stated assumption that the first GPU run must
calibrate (marked ASSUMED).
"""
from dataclasses import dataclass

# ---- Sources ----
SOURCES = {
    "hopper_blog": "NVIDIA Technical Blog, 'NVIDIA Hopper Architecture In-Depth' "
                   "(https://developer.nvidia.com/blog/nvidia-hopper-architecture-in-depth/): "
                   "H100 SXM5 132 SMs, 50 MB L2, 228 KB shared memory per SM, 989.4 dense "
                   "BF16 tensor TFLOPS, 4 tensor cores per SM",
    "h100_specs": "H100 SXM5 theoretical peaks and clocks (1.83 GHz for low-precision tensor "
                  "work; 989.4 BF16 dense TFLOPS = 132 SMs x 4096 FLOP/clk x 1.83 GHz), "
                  "https://glennklockwood.com/garden/processors/h100 citing NVIDIA's H100 "
                  "datasheet; 3.35 TB/s HBM3 (H100 SXM5 80 GB)",
    "h200_specs": "NVIDIA H200 product page (https://www.nvidia.com/en-us/data-center/h200/): "
                  "141 GB HBM3e at 4.8 TB/s, same GH100 compute as H100 SXM (132 SMs, "
                  "989 dense BF16 TFLOPS); e.g. https://lzwjava.github.io/nvidia-h200-gpu-specs-en",
    "a100_specs": "NVIDIA Ampere Architecture whitepaper (https://images.nvidia.com/aem-dam/"
                  "en-zz/Solutions/data-center/nvidia-ampere-architecture-whitepaper.pdf) and "
                  "A100 datasheet via https://glennklockwood.com/garden/processors/A100: 108 SMs, "
                  "1410 MHz, 312 dense BF16 TFLOPS (= 108 x 2048 FLOP/clk x 1.41 GHz), 40 MB L2, "
                  "L2 read bandwidth 5120 B/clk, 164 KB shared memory per SM, 2.039 TB/s HBM2e "
                  "(80 GB SXM4)",
    "cuda_guide": "CUDA C++ Programming Guide, 'Technical Specifications per Compute "
                  "Capability' (cc 8.0 and 9.0): 64K 32-bit registers per SM, 255 per thread, "
                  "2048 threads and 32 CTAs per SM, shared memory per SM 164 KB (8.0) / 228 KB "
                  "(9.0), 1 KB of it reserved per CTA; 32 banks of 4 bytes (128 B per clock)",
    "mma_sync_sm90": "ASSUMED: mma.sync (HMMA) on sm_90 at half the dense tensor peak, 2048 "
                     "FLOP/clk/SM, A100's rate per SM per clock: the full H100 rate needs "
                     "wgmma. FlashAttention-3 (https://arxiv.org/abs/2407.08608) reports FA2, an "
                     "mma.sync kernel, at 35% of H100's peak; a hand-written mma.sync GEMM reaches "
                     "about half of H100's peak "
                     "(https://it.cwl.best/waynehacking8/blackwell-tensorcore-kernels, and "
                     "https://reddit.gpgaming.de/r/CUDA/controversial: 'up to 50% of peak').",
    "l2_h100": "ASSUMED: H100 L2 bandwidth 5.5 TB/s. NVIDIA publishes none; Chips and Cheese "
               "measured H100 PCIe's L2 "
               "(https://chipsandcheese.com/2023/07/02/nvidias-h100-funny-l2-and-tons-of-bandwidth/). "
               "The least certain constant here: calibrate it on the first GPU run.",
    "fa2_launch": "FlashAttention-2's tile choices for sm80/sm90, csrc/flash_attn/src/"
                  "flash_fwd_launch_template.h and flash_bwd_launch_template.h "
                  "(github.com/Dao-AILab/flash-attention): forward hdim64 128x128/4 warps, "
                  "hdim128 128x64/4 warps, hdim256 64x64/4 warps where 228 KB/SM (H100), "
                  "128x64/8 warps on A100; backward hdim64 <128,128,8 warps, 4,4,4>, "
                  "hdim128 <64,128,8 warps, 2,4,2>, hdim256 <64,64,8 warps, 4,2,2>",
    "fa2_traits": "FlashAttention-2 csrc/flash_attn/src/kernel_traits.h: TiledMMA warp layouts "
                  "(forward kNWarps x 1; backward AtomLayoutMSdP/NdKV/MdQ x rest), each warp "
                  "16x16 per MMA repeat (ValLayoutMNK 1x2x1), swizzled smem (conflict-free "
                  "ldmatrix), backward smem = 3 Q/dO tiles + K, V + P + dS",
    "fa2_regs": "ASSUMED: FA2's kernels at 255 registers per thread (the cap under their "
                "__launch_bounds__; their ptxas figures are not available here)",
    "sm_issue": "CUDA C++ Programming Guide, 'Compute Capability 8.x / 9.0' (an SM has four "
                "warp schedulers, each issuing one warp instruction per clock) and 'Arithmetic "
                "Instructions' throughput table (32-bit reciprocal, rsqrt, log2, exp2, sin, cos: "
                "16 results per clock per SM on cc 8.0 and 9.0)",
    "gemm_h200": "Measured in this project, not fitted: torch.mm 8192^3 bf16 on the H200 reached "
                 "752-770 TFLOP/s in both runs of docs/lab/2026-12-01-h200-first-gpu-run.md "
                 "(clocks not locked): the wgmma kernels' sustained tensor ceiling, 78% of the "
                 "989 dense peak",
    "fetch_fit": "FITTED on run 1 of docs/lab/2026-12-01-h200-first-gpu-run.md (csrc of f552cd6, "
                 "forward d = 128: 81.8 TFLOP/s; Nsight: 7.0 of 11.2 cycles between a warp's "
                 "issues 'no instruction'): the cycles one extra trip of a copy loop inside a "
                 "main loop costs its warp in instruction fetch. One data point; the only "
                 "fitted constant of the issue model, and no kernel of today's tree has such a "
                 "loop on its steady path (docs/lab/2026-12-03-gpu-model-issue-terms.md)",
}


@dataclass(frozen=True)
class Gpu:
    name: str
    arch: str                 # ptxas architecture whose register counts apply
    sms: int
    clock_ghz: float          # the clock the tensor peak is quoted at
    mma_flops_per_clk_sm: int  # mma.sync m16n8k16 bf16, FLOP per clock per SM
    smem_bytes_per_clk_sm: int
    smem_per_sm: int          # bytes usable by CTAs
    smem_reserved_per_cta: int
    regs_per_sm: int
    reg_alloc_unit_warp: int  # registers are allocated per warp in units of this many
    max_threads_per_sm: int
    max_ctas_per_sm: int
    l2_bytes_per_s: float
    hbm_bytes_per_s: float
    sources: tuple

    def mma_per_s(self):
        """m16n8k16 instructions per second, GPU-wide (4096 FLOP each)."""
        return self.sms * self.clock_ghz * 1e9 * self.mma_flops_per_clk_sm / 4096


H100 = Gpu("H100 SXM5", "sm_90", sms=132, clock_ghz=1.83, mma_flops_per_clk_sm=2048,
           smem_bytes_per_clk_sm=128, smem_per_sm=228 * 1024, smem_reserved_per_cta=1024,
           regs_per_sm=65536, reg_alloc_unit_warp=256, max_threads_per_sm=2048,
           max_ctas_per_sm=32, l2_bytes_per_s=5.5e12, hbm_bytes_per_s=3.35e12,
           sources=("hopper_blog", "h100_specs", "cuda_guide", "mma_sync_sm90", "l2_h100"))
H200 = Gpu("H200 SXM", "sm_90", sms=132, clock_ghz=1.83, mma_flops_per_clk_sm=2048,
           smem_bytes_per_clk_sm=128, smem_per_sm=228 * 1024, smem_reserved_per_cta=1024,
           regs_per_sm=65536, reg_alloc_unit_warp=256, max_threads_per_sm=2048,
           max_ctas_per_sm=32, l2_bytes_per_s=5.5e12, hbm_bytes_per_s=4.8e12,
           sources=("h200_specs", "hopper_blog", "cuda_guide", "mma_sync_sm90", "l2_h100"))
A100 = Gpu("A100 SXM4 80GB", "sm_80", sms=108, clock_ghz=1.41, mma_flops_per_clk_sm=2048,
           smem_bytes_per_clk_sm=128, smem_per_sm=164 * 1024, smem_reserved_per_cta=1024,
           regs_per_sm=65536, reg_alloc_unit_warp=256, max_threads_per_sm=2048,
           max_ctas_per_sm=32, l2_bytes_per_s=5120 * 1.41e9, hbm_bytes_per_s=2.039e12,
           sources=("a100_specs", "cuda_guide"))
GPUS = {"h100": H100, "h200": H200, "a100": A100}

# A kernel launch's fixed cost in the model: launch latency, the first tile's load and the last
# CTA's epilogue, which nothing overlaps (ASSUMED, a typical figure; calibrate on a GPU).
LAUNCH_OVERHEAD_S = 4e-6

# Instruction issue (issue 31, stage 7; tools/gpu_model.py, "issue terms").
SCHEDULERS_PER_SM = 4                 # SOURCES["sm_issue"]
MUFU_PER_CLK_SM = 16                  # SOURCES["sm_issue"]
WGMMA_FLOPS_PER_CLK_SM = 4096         # dense bf16, SOURCES["h100_specs"] (989.4 TFLOP/s at 1.83 GHz)
GEMM_CEILING_TFLOPS = {"h100": None, "h200": 770.0}  # SOURCES["gemm_h200"]; None: not measured
FETCH_CYCLES_PER_COPY_TRIP = 1300     # FITTED, SOURCES["fetch_fit"]

# FA2's registers per thread (ASSUMED, see SOURCES["fa2_regs"]).
FA2_REGS = 255


@dataclass(frozen=True)
class Fa2Fwd:
    block_m: int
    block_n: int
    warps: int


@dataclass(frozen=True)
class Fa2Bwd:
    block_m: int   # queries
    block_n: int   # keys
    warps: int
    atom_m_sdp: int
    atom_n_dkv: int
    atom_m_dq: int
    double_buffer: bool = True


def fa2_fwd_geometry(gpu, head_dim):
    """FA2's forward tiles (SOURCES['fa2_launch']), non-dropout, for `gpu`."""
    if head_dim <= 64:
        return Fa2Fwd(128, 128, 4)
    if head_dim <= 128:
        return Fa2Fwd(128, 64, 4)
    # hdim256: 128x64 with 8 warps unless the SM holds two 64x64 CTAs (H100's 228 KB).
    two_small = gpu.smem_per_sm >= 4 * head_dim * (64 + 2 * 64)
    return Fa2Fwd(64, 64, 4) if two_small else Fa2Fwd(128, 64, 8)


def fa2_bwd_geometry(gpu, head_dim):
    """FA2's backward tiles (SOURCES['fa2_launch']); every GPU here has >= 144 KB per CTA."""
    if head_dim <= 64:
        return Fa2Bwd(128, 128, 8, 4, 4, 4)
    if head_dim <= 128:
        return Fa2Bwd(64, 128, 8, 2, 4, 2)
    return Fa2Bwd(64, 64, 8, 4, 2, 2, double_buffer=gpu.smem_per_sm - 1024 >= 176 * 1024)
