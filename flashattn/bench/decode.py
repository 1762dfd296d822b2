"""`python -m flashattn.bench decode`: one KV-cache decoding step, in KV bytes read per second
against the machine's memory bandwidth, and against F.scaled_dot_product_attention on the padded
cache.

A case is (dtype, batch B, new query tokens Sq, cached keys Sk), with Hq query heads sharing Hkv
key/value heads (GQA) of head_dim d. Every sequence holds exactly Sk keys: the padded cache is
full, so SDPA needs no mask, and the queries attend to all Sk keys (non-causal: with Sq = 4, as
in speculative decoding's verification step, the last query sees all keys, the earlier ones the
same number of bytes). The step attends over the cache and appends nothing, so every
implementation reads the same 2·B·Sk·Hkv·d·itemsize bytes of keys and values (q and the output
are negligible beside them). Implementations, on the same values:

  flashattn-paged  flashattn.flash_attn_with_kvcache on a paged cache (num_blocks, page, Hkv, d)
                   of --page-size (16: vLLM's), each sequence's pages at random places in the
                   pool (a fixed-seed permutation), block_table int32 (B, pages per sequence);
                   past Sk, the last page holds large values that no correct kernel reads
  flashattn-paged-N  the same with pages of N tokens, for each N of --more-page-sizes
                   (CUDA: 1 and 64 beside 16; none on the CPU)
  flashattn-dense  the same on the dense cache (B, Sk, Hkv, d), FlashAttention's layout
  sdpa-<backend>   F.scaled_dot_product_attention forced to each backend of the device
                   (sdpa.py) on the padded cache in its own layout, contiguous
                   (B, Hkv, Sk, d), q (B, Hq, Sq, d), enable_gqa=True, no mask
  flashattn-mla    MLA's absorbed decode beside it (decode_mla.py): --mla-heads query heads on
                   one latent kv head, 576 / 512, V a view of K's paged cache (page 64); its
                   bytes are the latent rows, B·Sk·576·itemsize (--mla-heads 0: no such row)
  fa2-paged,       FlashAttention-2's flash_attn.flash_attn_with_kvcache on the same two caches,
  fa2-dense        when flash_attn is importable (CUDA only; FA2 takes pages that are multiples
                   of 256 only, so fa2-paged reports n/a at smaller pages)

Each output is checked against a float64 reference (flashattn._reference) on the first and the
last sequence of the batch, all heads. The memory bandwidth is measured in the same run, by a
large copy_ (1 GiB by default; measure.CopyStep) timed in every case's rotation next to its
implementations, so that %copy is a paired ratio: the median over the repeats of this call's
GB/s over the copy's in the same repeat (on a shared machine the bandwidth moves within a run:
by a third on a 2-core cloud VM, docs/lab/2026-12-01-backward-memory-row-prefetch.md). The copy
is also timed at the start and the end of the run, to show how much the machine drifted. So is
a read of as many bytes (the sum of a float32 buffer; measure.ReadStep), whose %read is the
yardstick of a step that only reads: where a copy's writes are dear, a decode runs above 100% of
the copy (a 2-vCPU Xeon VM, docs/lab/2026-12-02-avx512-softmax-intel-amx.md). Issue 12's
targets stay against the copy. Cases
run in increasing KV size, so that on the CPU a time budget (seconds per dtype, predicted from
the last case's seconds per byte) cuts the largest ones; the cut cases are listed.

On a GPU each flashattn row also gives the launch the CUDA executor makes for it: the split
count (num_splits=0: its model's choice for the device's SMs) and the forward's CTAs
(decode_plan.py restates the plan; bf16 and fp16 only).
"""
import statistics
import time
from dataclasses import dataclass, replace
from typing import Optional

import torch

from .._kvcache import flash_attn_with_kvcache
from .._reference import attention_reference
from . import decode_mla, decode_plan, measure, options, sdpa, summary
from .common import NOT_AVAILABLE, dtype_name
from .table import Table, fmt, times

PAGED = "flashattn-paged"
DENSE = "flashattn-dense"
FA2_PAGED = "fa2-paged"
FA2_DENSE = "fa2-dense"
FLASHATTN_IMPLS = (PAGED, DENSE)
COPY = "copy"  # the bandwidth's copy in each case's rotation
READ = "read"  # the read bandwidth's reduction, likewise
# Past each sequence's last key, its last page holds this: a kernel that read it would be far
# off the reference (scores and values of this size), one that masks it multiplies it by 0.
POISON = 1000.0


@dataclass(frozen=True)
class Settings:
    dtypes: tuple
    batches: tuple
    q_lens: tuple
    kv_lens: tuple
    heads: int
    heads_kv: int
    head_dim: int
    page_size: int
    more_page_sizes: tuple   # more paged caches, flashattn-paged-N
    num_splits: int
    mla_heads: int   # query heads of the MLA row (decode_mla.py); 0: none
    repeats: int
    warmup: int
    budget_s: Optional[float]   # per dtype; None: no budget
    copy_bytes: int
    copy_repeats: int
    seed: int


KV_LENS = tuple(1024 * 2 ** i for i in range(8))   # 1k, 2k, ... 128k
CPU_KV_LENS = tuple(1024 * 4 ** i for i in range(4))   # 1k, 4k, 16k, 64k
# Issue 12's grid, with issue 33's batches (1 and 4: one or a few sequences, whose split count
# decides how many SMs work; 128: a server's) and page sizes (1, 16, 64) on CUDA. CUDA:
# bfloat16, Sk doubling from 1k to 128k, cut only by memory. CPU:
# bfloat16, the dtype of LLM caches (half the bytes of float32; --dtype float32 for the other),
# Sk in steps of 4x, cut by a minute per dtype: on two busy cores that reaches Sk = 16k at B = 1
# (issue 12's target starts there), most of the minute in SDPA's math backend, about 10x slower
# than the others; --budget and --kv-lens for more.
DEFAULTS = {
    "cpu": Settings(dtypes=(torch.bfloat16,), batches=(1, 8, 32), q_lens=(1, 4),
                    kv_lens=CPU_KV_LENS,
                    heads=32, heads_kv=8, head_dim=128, page_size=16, more_page_sizes=(),
                    num_splits=0, mla_heads=128, repeats=5,
                    warmup=1, budget_s=60.0, copy_bytes=1 << 30, copy_repeats=5, seed=0),
    "cuda": Settings(dtypes=(torch.bfloat16,), batches=(1, 4, 8, 32, 128), q_lens=(1, 4),
                     kv_lens=KV_LENS, heads=32, heads_kv=8, head_dim=128, page_size=16,
                     more_page_sizes=(1, 64), num_splits=0, mla_heads=128, repeats=20, warmup=3, budget_s=None, copy_bytes=1 << 30,
                     copy_repeats=10, seed=0),
}
# --quick: seconds, for CI. Lengths that are not multiples of the page: the last page is partly
# poison (see POISON).
QUICK = {
    "cpu": dict(batches=(1, 3), q_lens=(1, 2), kv_lens=(40, 100), heads=4, heads_kv=2,
                head_dim=32, mla_heads=8, budget_s=None, copy_bytes=32 << 20),
    "cuda": dict(batches=(1, 3), q_lens=(1, 2), kv_lens=(40, 1000), heads=8, heads_kv=2,
                 head_dim=64, more_page_sizes=(1,), mla_heads=16, budget_s=None,
                 copy_bytes=64 << 20),
}
# Issue 12's targets. CPU: 2 threads, Sk >= 16k, >= 70% of the measured copy bandwidth and >= 2x
# F.sdpa on the padded cache. CUDA (H200): >= 80% of HBM bandwidth at B = 32, Sk >= 8k, measured
# here against the copy bandwidth of the same run.
TARGETS = {
    "cpu": dict(min_kv_len=16384, batches=None, share=0.70, speedup=2.0,
                text="2 threads, Sk >= 16384: >= 70% of the copy bandwidth and >= 2x the best "
                     "SDPA backend"),
    "cuda": dict(min_kv_len=8192, batches=(32,), share=0.80, speedup=None,
                 text="B = 32, Sk >= 8192: >= 80% of the bandwidth (here: of the copy "
                      "bandwidth measured in the run)"),
}
# What one case holds at once, in multiples of its KV bytes: the paged pool, the dense cache and
# SDPA's layout of it (3), SDPA math's GQA expansion of k and v to Hq heads (Hq / Hkv = 4 in
# the default grid) and its float temporaries; plus one per --more-page-sizes pool. A case is
# not run (and said so) when this is above MEMORY_SHARE of the memory available at its start.
MEMORY_FACTOR = 8
# The MLA row's latent pool and its float64 reference: less than one KV size more at the default
# grid (576 bytes per token against 2·8·128), counted as one.
MEMORY_FACTOR_MLA = 1
MEMORY_SHARE = 0.6
# The float64 reference checks these sequences of each batch.
CHECKED = ("first", "last")

HELP = ("one KV-cache decoding step (paged and dense cache) in KV bytes per second, as a share "
        "of the copy bandwidth")
DESCRIPTION = (
    "One step of flash_attn_with_kvcache over a paged and a dense cache that every sequence "
    "fills (Sk keys), against F.sdpa on the padded cache (every backend of the device, "
    "enable_gqa, no mask needed) and FA2's flash_attn_with_kvcache when flash_attn is "
    "importable (CUDA). Headline: KV bytes read per second as a share of the copy bandwidth "
    "and of the read bandwidth, both measured in the same run.")
EPILOG = ("Defaults: bfloat16, B 1,8,32, Sq 1,4, 32 query heads, 8 kv heads, head_dim 128, page "
          "16, Sk 1k-128k doubling (CPU: 1k, 4k, 16k, 64k, cut by --budget, 60 s per dtype; the "
          "cut cases are listed); an MLA row per case (128 query heads, one latent kv head, "
          "576 / 512, page 64).")
PLOTS = None


def add_arguments(parser):
    options.add_head_options(parser, heads_help="query heads (default 32)",
                             head_dim_help="default 128")
    parser.add_argument("--batch-sizes", type=options.int_list, dest="batches", metavar="LIST",
                        help="comma list of batch sizes (default 1,8,32)")
    parser.add_argument("--q-lens", type=options.int_list, dest="q_lens", metavar="LIST",
                        help="comma list of new query tokens per sequence, Sq (default 1,4)")
    parser.add_argument("--kv-lens", type=options.int_list, dest="kv_lens", metavar="LIST",
                        help="comma list of cached keys per sequence, Sk (default cpu 1024,"
                             "4096,16384,65536; cuda 1024 ... 131072, doubling)")
    parser.add_argument("--heads-kv", type=options.positive_int, dest="heads_kv", metavar="N",
                        help="key/value heads; must divide --heads (default 8)")
    parser.add_argument("--page-size", type=options.positive_int, dest="page_size", metavar="N",
                        help="tokens per page of the paged cache (default 16)")
    parser.add_argument("--more-page-sizes", type=options.int_list, dest="more_page_sizes",
                        metavar="LIST",
                        help="comma list of more page sizes, each a paged cache of its own "
                             "(flashattn-paged-N; default cuda 1,64, cpu none)")
    parser.add_argument("--num-splits", type=options.non_negative_int, dest="num_splits",
                        metavar="N",
                        help="flash_attn_with_kvcache's num_splits (default 0: its heuristic)")
    parser.add_argument("--mla-heads", type=options.non_negative_int, dest="mla_heads",
                        metavar="N",
                        help="query heads of the MLA row (flashattn-mla: one latent kv head, "
                             "576 / 512, V a view of K's cache, page 64; default 128, "
                             "DeepSeek-V3's; 0: no MLA row)")
    parser.add_argument("--budget", type=options.non_negative_float, dest="budget_s",
                        metavar="SECONDS", help="per dtype: cases that would end past it are not "
                                                "run (default: cpu 60, cuda none; 0: none)")


def resolve_settings(run):
    settings = run.settings(DEFAULTS, QUICK)
    if settings.budget_s == 0:
        settings = replace(settings, budget_s=None)
    if settings.heads % settings.heads_kv:
        run.parser.error(f"--heads-kv {settings.heads_kv} must divide --heads {settings.heads}")
    return settings


def kv_bytes(batch, kv_len, heads_kv, head_dim, dtype):
    """The keys and values one step reads: 2·B·Sk·Hkv·d·itemsize."""
    return 2 * batch * kv_len * heads_kv * head_dim * torch.empty((), dtype=dtype).element_size()


@dataclass(frozen=True)
class Case:
    dtype: torch.dtype
    batch: int
    q_len: int
    kv_len: int

    def kv_bytes(self, settings):
        return kv_bytes(self.batch, self.kv_len, settings.heads_kv, settings.head_dim,
                        self.dtype)

    def label(self):
        return f"{dtype_name(self.dtype)} B={self.batch} Sq={self.q_len} Sk={self.kv_len}"


def enumerate_cases(settings):
    """Per dtype, in increasing KV size (then Sq), so that a budget cuts the largest."""
    cases = [Case(dtype, b, sq, sk) for dtype in settings.dtypes for b in settings.batches
             for sq in settings.q_lens for sk in settings.kv_lens]
    order = {dtype: i for i, dtype in enumerate(settings.dtypes)}
    return sorted(cases, key=lambda c: (order[c.dtype], c.kv_bytes(settings), c.batch, c.q_len))


@dataclass
class Result:
    dtype: str
    batch: int
    q_len: int
    kv_len: int
    impl: str
    layout: str
    kv_bytes: int
    status: str = "ok"                   # or NOT_AVAILABLE, with the reason
    reason: Optional[str] = None
    max_err: Optional[float] = None      # max |out - float64 reference|, checked sequences
    dq_err: Optional[float] = None       # always None: forward only (measure's interface)
    time_ms: Optional[float] = None      # median of times_ms
    times_ms: Optional[list] = None
    gb_per_s: Optional[float] = None     # kv_bytes / time_ms
    copy_share: Optional[float] = None   # median over repeats of GB/s / the copy's GB/s
    copy_gb_per_s: Optional[float] = None   # median of the case's copies
    copy_times_ms: Optional[list] = None    # the copy's samples, repeat by repeat with times_ms
    read_share: Optional[float] = None   # likewise against the read (measure.ReadStep)
    read_gb_per_s: Optional[float] = None
    read_times_ms: Optional[list] = None
    speedup_vs_best_sdpa: Optional[float] = None  # flashattn rows: min over SDPA backends of
    best_sdpa: Optional[str] = None               # the paired median t_sdpa / t_this
    speedup_vs_fa2: Optional[float] = None        # flashattn rows: t_fa2 / t_this, same layout
    peak_mb: Optional[float] = None
    splits: Optional[int] = None   # flashattn rows on a GPU: the forward's split count
    ctas: Optional[int] = None     # and its grid's CTAs (decode_plan.py)


class Inputs:
    """One case's q and its cache in three layouts, holding the same values."""

    def __init__(self, case, settings, device, generator):
        b, sk, dtype = case.batch, case.kv_len, case.dtype
        hkv, d = settings.heads_kv, settings.head_dim

        def randn(*shape):
            return torch.randn(shape, generator=generator, dtype=torch.float32,
                               device=device).to(dtype)
        # Fresh random values: zeros would hide a key read twice or not at all.
        self.q = randn(b, case.q_len, settings.heads, d)
        self.k, self.v = randn(b, sk, hkv, d), randn(b, sk, hkv, d)
        self.cache_seqlens = torch.full((b,), sk, dtype=torch.int32, device=device)
        page = settings.page_size
        pages = -(-sk // page)
        order = torch.randperm(b * pages, generator=generator, device=device)
        # block_table[s, i] = order[s * pages + i]: the page that holds keys i*page ... of s.
        self.block_table = order.view(b, pages).to(torch.int32)
        self.k_pages, self.v_pages = (self._paged(t, order, pages, page) for t in (self.k, self.v))
        # {page size: (block_table, k pool, v pool)} of --more-page-sizes, laid out alike.
        self.more_pages = {}
        for page in settings.more_page_sizes:
            pages = -(-sk // page)
            order = torch.randperm(b * pages, generator=generator, device=device)
            self.more_pages[page] = (order.view(b, pages).to(torch.int32),
                                     *(self._paged(t, order, pages, page) for t in (self.k, self.v)))
        # SDPA's padded cache in its own layout, contiguous; q as a (B, Hq, Sq, d) view.
        self.k_sdpa, self.v_sdpa = (t.transpose(1, 2).contiguous() for t in (self.k, self.v))
        self.q_sdpa = self.q.transpose(1, 2)

    @staticmethod
    def _paged(dense, order, pages, page):
        b, sk, hkv, d = dense.shape
        padded = torch.full((b, pages * page, hkv, d), POISON, dtype=dense.dtype,
                            device=dense.device)
        padded[:, :sk] = dense
        pool = torch.empty((b * pages, page, hkv, d), dtype=dense.dtype, device=dense.device)
        pool[order] = padded.view(b * pages, page, hkv, d)
        return pool


@dataclass(frozen=True)
class Impl:
    name: str
    layout: str
    attend: object    # (inputs) -> out (B, Sq, Hq, d)


def implementations(device_type, settings, fa2):
    paged = f"paged, page {settings.page_size}"
    impls = [
        Impl(PAGED, paged, lambda x: flash_attn_with_kvcache(
            x.q, x.k_pages, x.v_pages, cache_seqlens=x.cache_seqlens, block_table=x.block_table,
            num_splits=settings.num_splits)),
        *(Impl(f"{PAGED}-{page}", f"paged, page {page}", _paged_with(page, settings))
          for page in settings.more_page_sizes),
        Impl(DENSE, "dense (B,Sk,Hkv,d)", lambda x: flash_attn_with_kvcache(
            x.q, x.k, x.v, cache_seqlens=x.cache_seqlens, num_splits=settings.num_splits)),
        *(Impl(name, "dense (B,Hkv,Sk,d)", _sdpa_padded(forced))
          for name, forced in sdpa.forced_backends(device_type)),
    ]
    if fa2 is not None:
        impls += [
            Impl(FA2_PAGED, paged, lambda x: fa2(x.q, x.k_pages, x.v_pages,
                                                 cache_seqlens=x.cache_seqlens,
                                                 block_table=x.block_table,
                                                 num_splits=settings.num_splits)),
            Impl(FA2_DENSE, "dense (B,Sk,Hkv,d)", lambda x: fa2(
                x.q, x.k, x.v, cache_seqlens=x.cache_seqlens, num_splits=settings.num_splits)),
        ]
    return impls


def _paged_with(page, settings):
    def attend(x):
        block_table, k_pages, v_pages = x.more_pages[page]
        return flash_attn_with_kvcache(x.q, k_pages, v_pages, cache_seqlens=x.cache_seqlens,
                                       block_table=block_table, num_splits=settings.num_splits)
    return attend


def _sdpa_padded(forced):
    def attend(x):
        return forced(x.q_sdpa, x.k_sdpa, x.v_sdpa, enable_gqa=True).transpose(1, 2)
    return attend


def find_fa2(device_type):
    """(FA2's flash_attn_with_kvcache or None, a line saying which or why not)."""
    if device_type != "cuda":
        return None, "FA2 (flash_attn): not compared, CUDA only"
    try:
        import flash_attn
        from flash_attn import flash_attn_with_kvcache as fa2
    except Exception as err:  # ImportError, or a build that fails to load
        return None, f"FA2 (flash_attn): not compared, not importable: {measure.first_line(err)}"
    return fa2, f"FA2: flash_attn {getattr(flash_attn, '__version__', '?')}"


def checked_sequences(batch):
    return sorted({0, batch - 1})


def references(inputs, settings):
    """{sequence: float64 reference output (Sq, Hq, d)}, from flashattn._reference one kv head at
    a time: its query heads' rows stacked as the rows of one head (the attention is not causal,
    so rows are independent), which keeps the float64 keys to one head's (Sk, d)."""
    group = settings.heads // settings.heads_kv
    refs = {}
    for b in checked_sequences(inputs.q.shape[0]):
        per_head = []
        for h in range(settings.heads_kv):
            q = inputs.q[b, :, h * group:(h + 1) * group].double()           # (Sq, g, d)
            rows = q.reshape(1, -1, 1, q.shape[-1])                           # (1, Sq·g, 1, d)
            k, v = (t[b:b + 1, :, h:h + 1].double() for t in (inputs.k, inputs.v))
            out, _ = attention_reference(rows, k, v)
            per_head.append(out.view(q.shape))
        refs[b] = torch.cat(per_head, dim=1)                                  # (Sq, Hq, d)
    return refs


def make_check(refs):
    def check(out, grads):
        return max((out[b].double() - ref).abs().max().item() for b, ref in refs.items()), None
    return check


def sm_count(device):
    """The GPU's SMs, which the CUDA executor's split count is chosen for; None on the CPU."""
    if device.type != "cuda":
        return None
    return torch.cuda.get_device_properties(device).multi_processor_count


def cache_capacity(case, impl, settings):
    """The keys the call's cache holds per sequence: Sk dense, whole pages paged."""
    if not impl.startswith(PAGED):
        return case.kv_len
    page = settings.page_size if impl == PAGED else int(impl.rsplit("-", 1)[1])
    return -(-case.kv_len // page) * page


def launch_of(case, impl, settings, sms):
    """(splits, CTAs) of a flashattn row's forward on a GPU of `sms` SMs, or (None, None): not
    flashattn, not a GPU, or fp32 (the SIMT kernels, which decode_plan.py does not restate)."""
    if sms is None or not impl.startswith("flashattn-") or case.dtype == torch.float32:
        return None, None
    if impl == decode_mla.MLA:
        return decode_plan.decode_launch(case.batch, case.q_len, settings.mla_heads, 1,
                                         decode_mla.HEAD_DIM, -(-case.kv_len // decode_mla.PAGE)
                                         * decode_mla.PAGE, sms, settings.num_splits,
                                         head_dim_v=decode_mla.HEAD_DIM_V)
    return decode_plan.decode_launch(case.batch, case.q_len, settings.heads, settings.heads_kv,
                                     settings.head_dim, cache_capacity(case, impl, settings),
                                     sms, settings.num_splits)


def measure_case(case, settings, probe, device, fa2, copy, read):
    """The case's results; copy and read (a measure.CopyStep, a measure.ReadStep) are timed in
    the same rotation."""
    generator = torch.Generator(device=device).manual_seed(settings.seed)
    inputs = Inputs(case, settings, device, generator)
    refs = references(inputs, settings)
    nbytes = case.kv_bytes(settings)
    candidates = [(impl.name,
                   Result(dtype_name(case.dtype), case.batch, case.q_len, case.kv_len,
                          impl.name, impl.layout, nbytes),
                   (lambda impl=impl: (impl.attend(inputs), None)), make_check(refs))
                  for impl in implementations(device.type, settings, fa2)]
    if settings.mla_heads:
        mla = decode_mla.Inputs(case, settings.mla_heads, device, generator, POISON)
        mla_refs = decode_mla.references(mla, checked_sequences(case.batch))
        candidates.append((decode_mla.MLA,
                           Result(dtype_name(case.dtype), case.batch, case.q_len, case.kv_len,
                                  decode_mla.MLA, decode_mla.LAYOUT,
                                  decode_mla.kv_bytes(case.batch, case.kv_len, case.dtype)),
                           lambda: (mla.attend(settings.num_splits), None), make_check(mla_refs)))
    results, samples = measure.check_then_time(candidates, probe, settings, NOT_AVAILABLE,
                                               companions={COPY: copy, READ: read})
    copy_ms, read_ms = samples.pop(COPY), samples.pop(READ)
    sms = sm_count(device)
    for r in results.values():
        r.splits, r.ctas = launch_of(case, r.impl, settings, sms)
    for name in samples:
        r = results[name]  # its own bytes: the MLA row reads the latent rows
        r.gb_per_s = r.kv_bytes / (r.time_ms / measure.MS_PER_S) / 1e9
        r.copy_times_ms = copy_ms
        r.copy_gb_per_s = statistics.median(copy.gb_per_s(ms) for ms in copy_ms)
        r.copy_share = bandwidth_share(r.kv_bytes, samples[name], copy, copy_ms)
        r.read_times_ms = read_ms
        r.read_gb_per_s = statistics.median(read.gb_per_s(ms) for ms in read_ms)
        r.read_share = bandwidth_share(r.kv_bytes, samples[name], read, read_ms)
    sdpa_names = [name for name in samples if name.startswith("sdpa-")]
    for name, fa2_name in ((PAGED, FA2_PAGED), (DENSE, FA2_DENSE)):
        if name not in samples:
            continue
        r = results[name]
        if sdpa_names:
            r.speedup_vs_best_sdpa, r.best_sdpa = min(
                (measure.paired_speedup(samples[s], samples[name]), s) for s in sdpa_names)
        if fa2_name in samples:
            r.speedup_vs_fa2 = measure.paired_speedup(samples[fa2_name], samples[name])
    return list(results.values())


def bandwidth_share(nbytes, times_ms, step, step_ms):
    """Median over the repeats of (nbytes / this repeat's time) / (the GB/s of `step`, a
    measure.CopyStep or ReadStep, in the same repeat)."""
    return statistics.median(nbytes / (t / measure.MS_PER_S) / 1e9 / step.gb_per_s(t_step)
                             for t, t_step in zip(times_ms, step_ms))


def available_memory_bytes(device):
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


@dataclass
class Cut:
    dtype: str
    batch: int
    q_len: int
    kv_len: int
    kv_bytes: int
    reason: str


class Budget:
    """Seconds per dtype: a case is cut when the last case's seconds per KV byte, times its
    bytes, would end it past the budget (cases come in increasing size, so this is a lower bound
    when costs grow with size)."""

    def __init__(self, seconds):
        self.seconds = seconds
        self.spent = {}
        self.rate = {}

    def reason_to_cut(self, case, nbytes):
        if self.seconds is None or case.dtype not in self.rate:
            return None
        predicted = self.rate[case.dtype] * nbytes
        spent = self.spent[case.dtype]
        if spent + predicted > self.seconds:
            return (f"budget: {spent:.0f} s spent of {self.seconds:g} s, this case predicted "
                    f"at {predicted:.0f} s")
        return None

    def record(self, case, nbytes, seconds):
        self.spent[case.dtype] = self.spent.get(case.dtype, 0.0) + seconds
        self.rate[case.dtype] = seconds / nbytes


def summarize(results, cuts, device_type, threads):
    """Per (dtype, flashattn implementation): its share of the copy bandwidth and speedup over
    the best SDPA backend, over all cases and over the cases of issue 12's target."""
    target = TARGETS[device_type]
    entries = []
    for dtype in dict.fromkeys(r.dtype for r in results):
        for impl in FLASHATTN_IMPLS:
            rows = [r for r in results if (r.dtype, r.impl) == (dtype, impl)]
            ok = [r for r in rows if r.status == "ok"]
            in_target = [r for r in ok if r.kv_len >= target["min_kv_len"]
                         and (target["batches"] is None or r.batch in target["batches"])]
            fast = (lambda r: target["speedup"] is None or (
                r.speedup_vs_best_sdpa is not None
                and r.speedup_vs_best_sdpa >= target["speedup"]))
            met = [r for r in in_target if r.copy_share >= target["share"] and fast(r)]
            speedups = [r.speedup_vs_best_sdpa for r in ok if r.speedup_vs_best_sdpa is not None]
            target_speedups = [r.speedup_vs_best_sdpa for r in in_target
                               if r.speedup_vs_best_sdpa is not None]
            entries.append({
                "dtype": dtype, "impl": impl, "cases": len(ok),
                "not_available": len(rows) - len(ok),
                "copy_share": summary.span([r.copy_share for r in ok]),
                "read_share": summary.span([r.read_share for r in ok
                                            if r.read_share is not None]),
                "gb_per_s": summary.span([r.gb_per_s for r in ok]),
                "speedup_vs_best_sdpa": summary.span(speedups),
                "geomean_speedup_vs_best_sdpa": summary.geomean(speedups),
                "target": target["text"], "target_threads": 2 if device_type == "cpu" else None,
                "threads": threads,
                "target_cases": len(in_target), "target_met": len(met),
                "target_copy_share": summary.span([r.copy_share for r in in_target]),
                "target_speedup_vs_best_sdpa": summary.span(target_speedups),
                "target_cases_cut": sum(1 for c in cuts if c.dtype == dtype
                                        and c.kv_len >= target["min_kv_len"]
                                        and (target["batches"] is None
                                             or c.batch in target["batches"])),
            })
    return entries


COLUMNS = (("B", 3), ("Sq", 3), ("Sk", 7), ("KV_MB", 8), ("impl", 16), ("max_err", 8),
           ("time_ms", 10), ("GB/s", 7), ("copy", 6), ("%copy", 6), ("read", 6), ("%read", 6),
           ("vs_sdpa", 8),
           ("vs_fa2", 7), ("peak_MB", 9), ("splits", 6), ("CTAs", 6))
REASON_WIDTH = 100


def make_table(with_fa2):
    """The table, with a vs_fa2 column only where FA2 runs."""
    return Table([c for c in COLUMNS if with_fa2 or c[0] != "vs_fa2"], REASON_WIDTH)


def table_title(dtype_name, settings):
    return (f"decode, {dtype_name}, heads={settings.heads}, heads_kv={settings.heads_kv}, "
            f"head_dim={settings.head_dim}, page {settings.page_size}"
            + "".join(f", {page}" for page in settings.more_page_sizes)
            + f", num_splits={settings.num_splits}"
            + (f"; {decode_mla.MLA}: heads={settings.mla_heads}, {decode_mla.LAYOUT}"
               if settings.mla_heads else ""))


def table_row(table, r, with_fa2):
    cells = [r.batch, r.q_len, r.kv_len, f"{r.kv_bytes / measure.BYTES_PER_MB:.1f}", r.impl]
    if r.status == NOT_AVAILABLE:
        return table.not_available(cells, r.reason)
    cells += [fmt(r.max_err, ".1e"), fmt(r.time_ms, ".3f"), fmt(r.gb_per_s, ".3g"),
              fmt(r.copy_gb_per_s, ".3g"), f"{100 * r.copy_share:.1f}",
              fmt(r.read_gb_per_s, ".3g"), f"{100 * r.read_share:.1f}",
              times(r.speedup_vs_best_sdpa)]
    if with_fa2:
        cells.append(times(r.speedup_vs_fa2))
    cells += [fmt(r.peak_mb, ".1f"), fmt(r.splits, "d"), fmt(r.ctas, "d")]
    return table.row(cells)


def _percent_span(span):
    if span is None:
        return "-"
    low, high = (100 * x for x in span)
    return f"{low:.1f}%" if low == high else f"{low:.1f}-{high:.1f}%"


def _times_span(span):
    if span is None:
        return "-"
    return f"{span[0]:.2f}x" if span[0] == span[1] else f"{span[0]:.2f}-{span[1]:.2f}x"


def summary_lines(entries, bandwidth, cuts, settings, results=()):
    lines = ["",
             f"copy bandwidth: {bandwidth['start_gb_per_s']:.3g} GB/s at the start, "
             f"{bandwidth['end_gb_per_s']:.3g} GB/s at the end (copy_ of "
             f"{settings.copy_bytes / measure.BYTES_PER_MB:.0f} MB, bytes read + written / "
             f"time, median of {settings.copy_repeats}); read bandwidth: "
             f"{bandwidth['read_start_gb_per_s']:.3g} GB/s at the start, "
             f"{bandwidth['read_end_gb_per_s']:.3g} GB/s at the end (the sum of as many bytes "
             f"of float32, bytes read / time)",
             "GB/s = KV bytes read (2·B·Sk·Hkv·d·itemsize) / median time; copy = the median "
             "GB/s of the copy_ timed in the case's rotation; %copy = the median over the "
             "repeats of this call's GB/s / that copy's in the same repeat; read, %read: the same "
             "against the read bandwidth's sum, the yardstick of a step that only reads (a "
             "copy also writes; where writes are dear, a decode exceeds 100% of it); "
             "vs_sdpa = min over "
             "the SDPA backends of the median over repeats of t_sdpa / t_flashattn, calls back "
             "to back (> 1: flashattn is faster). Every sequence holds Sk keys: the padded "
             "cache is full, no mask."]
    for s in entries:
        head = f"{s['impl']:>16}, {s['dtype']}:"
        if not s["cases"]:
            lines.append(f"{head} did not run")
            continue
        geomean = s["geomean_speedup_vs_best_sdpa"]
        lines.append(f"{head} {_percent_span(s['copy_share'])} of the copy bandwidth, "
                     f"{_percent_span(s.get('read_share'))} of the read bandwidth; "
                     f"{_times_span(s['speedup_vs_best_sdpa'])} the best SDPA backend"
                     + (f" (geometric mean {geomean:.2f}x)" if geomean else "")
                     + f" over {s['cases']} cases")
        verdict = ("no case of the target ran" if not s["target_cases"] else
                   f"met in {s['target_met']} of {s['target_cases']} cases "
                   f"({_percent_span(s['target_copy_share'])} of the copy bandwidth, "
                   f"{_times_span(s['target_speedup_vs_best_sdpa'])} the best SDPA)")
        if s["target_cases_cut"]:
            verdict += f"; {s['target_cases_cut']} target cases cut"
        threads = ("" if s["target_threads"] in (None, s["threads"])
                   else f" [this run: {s['threads']} threads]")
        lines.append(f"{'':>16}  issue 12 target ({s['target']}){threads}: {verdict}")
    lines += mla_summary_lines(results)
    reasons = {}
    for c in cuts:
        reasons.setdefault(c.reason.split(":")[0], []).append(c)
    for why, group in reasons.items():
        cases = ", ".join(f"{c.dtype} B={c.batch} Sq={c.q_len} Sk={c.kv_len}" for c in group)
        budget = (f" ({settings.budget_s:g} s per dtype)" if why == "budget" else
                  f" (over {100 * MEMORY_SHARE:.0f}% of the available memory)")
        lines.append(f"not run, {why}{budget}: {len(group)} cases: {cases}")
    return lines


def mla_summary_lines(results):
    """Per dtype, the MLA row's shares of the copy and read bandwidths, next to the dense GQA
    step's (flashattn-dense) over the same cases."""
    lines = []
    for dtype in dict.fromkeys(r.dtype for r in results):
        mla = [r for r in results if (r.dtype, r.impl, r.status) == (dtype, decode_mla.MLA, "ok")]
        if not mla:
            continue
        dense = [r for r in results if (r.dtype, r.impl, r.status) == (dtype, DENSE, "ok")]
        lines.append(
            f"{decode_mla.MLA:>16}, {dtype}: "
            f"{_percent_span(summary.span([r.copy_share for r in mla]))} of the copy bandwidth, "
            f"{_percent_span(summary.span([r.read_share for r in mla]))} of the read bandwidth "
            f"over {len(mla)} cases (the dense GQA step beside it: "
            f"{_percent_span(summary.span([r.copy_share for r in dense]))} of the copy, "
            f"{_percent_span(summary.span([r.read_share for r in dense]))} of the read); "
            f"GB/s = latent bytes read (B·Sk·{decode_mla.HEAD_DIM}·itemsize) / median time")
    return lines


def reason_to_cut(case, nbytes, budget, device, settings):
    """Why the case is not run (the budget, or memory), or None."""
    reason = budget.reason_to_cut(case, nbytes)
    available = available_memory_bytes(device)
    factor = (MEMORY_FACTOR + len(settings.more_page_sizes)
              + (MEMORY_FACTOR_MLA if settings.mla_heads else 0))
    if (reason is None and available is not None
            and factor * nbytes > MEMORY_SHARE * available):
        reason = (f"memory: needs about {factor * nbytes / 2 ** 30:.1f} GiB, "
                  f"{available / 2 ** 30:.1f} GiB available")
    return reason


def main(run):
    settings = resolve_settings(run)
    device, probe = run.device, run.probe
    fa2, fa2_line = find_fa2(device.type)
    with_fa2 = fa2 is not None
    table = make_table(with_fa2)

    run.print_headline("KV-cache decode vs F.scaled_dot_product_attention on the padded cache",
                       settings.repeats)
    run.print(fa2_line)
    copy = measure.CopyStep(settings.copy_bytes, device)
    read = measure.ReadStep(settings.copy_bytes, device)
    start = statistics.median(measure.copy_bandwidth(copy, probe, settings.copy_repeats))
    read_start = statistics.median(measure.copy_bandwidth(read, probe, settings.copy_repeats))
    run.print(f"copy bandwidth at the start: {start:.3g} GB/s; read bandwidth: "
              f"{read_start:.3g} GB/s")

    results, cuts, dtype = [], [], None
    budget = Budget(settings.budget_s)
    cases = enumerate_cases(settings)
    run.progress.expect(len(cases))
    for case in cases:
        run.progress.step(case.label())
        if case.dtype != dtype:
            dtype = case.dtype
            run.print(table.header(table_title(dtype_name(dtype), settings)))
        nbytes = case.kv_bytes(settings)
        reason = reason_to_cut(case, nbytes, budget, device, settings)
        if reason:
            cuts.append(Cut(dtype_name(case.dtype), case.batch, case.q_len, case.kv_len, nbytes,
                            reason))
            continue
        began = time.perf_counter()
        for result in measure_case(case, settings, probe, device, fa2, copy, read):
            run.print(table_row(table, result, with_fa2))
            results.append(result)
        budget.record(case, nbytes, time.perf_counter() - began)

    end = statistics.median(measure.copy_bandwidth(copy, probe, settings.copy_repeats))
    read_end = statistics.median(measure.copy_bandwidth(read, probe, settings.copy_repeats))
    bandwidth = {"start_gb_per_s": start, "end_gb_per_s": end,
                 "read_start_gb_per_s": read_start, "read_end_gb_per_s": read_end,
                 "copy_bytes": settings.copy_bytes, "read_bytes": read.nbytes,
                 "repeats": settings.copy_repeats}
    entries = summarize(results, cuts, device.type, torch.get_num_threads())
    run.print(*summary_lines(entries, bandwidth, cuts, settings, results))

    run.write_report({
        "fa2": fa2_line, "dtypes": [dtype_name(d) for d in settings.dtypes],
        "batches": list(settings.batches), "q_lens": list(settings.q_lens),
        "kv_lens": list(settings.kv_lens), "heads": settings.heads,
        "heads_kv": settings.heads_kv, "head_dim": settings.head_dim,
        "page_size": settings.page_size, "more_page_sizes": list(settings.more_page_sizes),
        "num_splits": settings.num_splits, "sm_count": sm_count(device),
        "mla_heads": settings.mla_heads,
        "mla": decode_mla.LAYOUT if settings.mla_heads else None,
        "causal": False, "cache": "every sequence holds kv_len keys (full cache, no mask)",
        "repeats": settings.repeats, "warmup": settings.warmup,
        "budget_s_per_dtype": settings.budget_s, "seed": settings.seed,
        "checked_sequences": list(CHECKED), **measure.memory_meta(probe),
    }, entries, results, bandwidth=bandwidth, cut=cuts)
    return 0
