"""flash_attn_with_kvcache (and block_table in flash_attn_varlen_func): appends into dense and
paged caches in place, rotary embeddings, cache_batch_idx, cache_leftpad, split-KV, against a
float64 reference built sequence by sequence from the logical (unpaged) cache."""
import json
import math

import pytest
import torch

import flashattn
from flashattn._reference import attention_reference
from cpu_test_ext.build import ops as cpu_test_ops
from executors import make_executor
from tolerance import assert_within_torch_error


def rotate(x, cos, sin, positions, interleaved):
    """x (..., D) rotated in x's dtype by the angles of positions (shape x.shape[:-1]); the
    first 2 * cos.shape[1] dims, as GPT-J pairs (2i, 2i + 1) or GPT-NeoX halves."""
    half = cos.shape[1]
    c, s = cos.to(x.dtype)[positions], sin.to(x.dtype)[positions]
    out = x.clone()
    first = slice(0, 2 * half, 2) if interleaved else slice(0, half)
    second = slice(1, 2 * half, 2) if interleaved else slice(half, 2 * half)
    a, b = x[..., first], x[..., second]
    out[..., first] = a * c - b * s
    out[..., second] = b * c + a * s
    return out


class Case:
    """One decoding call: random inputs for a configuration, the call, and its reference.
    head_dim_v: v's head dim (None: head_dim). values_in_keys: v_cache is k_cache[..., :head_dim_v]
    (MLA's latent cache), and the call appends k alone."""

    def __init__(self, batch=2, seqlen_q=1, heads=8, heads_kv=2, head_dim=64, seqlen_cache=300,
                 seqlen_new=1, page_size=None, batch_idx=False, leftpad=False, rotary_dim=32,
                 interleaved=True, causal=True, window=(-1, -1), softcap=0.0, alibi=False,
                 num_splits=0, dtype=torch.bfloat16, seed=0, device="cpu", head_dim_v=None,
                 values_in_keys=False):
        head_dim_v = head_dim if head_dim_v is None else head_dim_v
        g = torch.Generator().manual_seed(seed)
        rand = lambda *shape: torch.randn(*shape, generator=g).to(dtype)  # noqa: E731
        self.causal, self.window, self.softcap, self.interleaved = causal, window, softcap, interleaved
        self.num_splits, self.batch, self.seqlen_new = num_splits, batch, seqlen_new
        self.q = rand(batch, seqlen_q, heads, head_dim)
        cache_batch = 2 * batch if batch_idx else batch
        self.block_table = None
        if page_size is not None:
            blocks_per_seq = math.ceil(seqlen_cache / page_size)
            num_blocks = 2 * batch * blocks_per_seq  # a pool with unused blocks, shuffled
            self.k_cache = rand(num_blocks, page_size, heads_kv, head_dim)
            self.block_table = torch.randperm(num_blocks, generator=g, dtype=torch.int32)[
                :batch * blocks_per_seq].view(batch, blocks_per_seq)
            capacity = blocks_per_seq * page_size
        else:
            self.k_cache = rand(cache_batch, seqlen_cache, heads_kv, head_dim)
            capacity = seqlen_cache
        self.values_in_keys = values_in_keys
        if values_in_keys:
            self.v_cache = self.k_cache[..., :head_dim_v]
        else:
            self.v_cache = torch.randn(*self.k_cache.shape[:-1], head_dim_v, generator=g).to(dtype)
        self.k = rand(batch, seqlen_new, heads_kv, head_dim) if seqlen_new else None
        self.v = (rand(batch, seqlen_new, heads_kv, head_dim_v)
                  if seqlen_new and not values_in_keys else None)
        room = capacity - max(seqlen_new, seqlen_q)
        self.cache_seqlens = torch.randint(0, room + 1, (batch,), generator=g, dtype=torch.int32)
        self.cache_batch_idx = (torch.randperm(cache_batch, generator=g, dtype=torch.int32)[:batch]
                                if batch_idx else None)
        self.cache_leftpad = None
        if leftpad:
            self.cache_leftpad = torch.stack([torch.randint(0, int(n) + 1, (), generator=g)
                                              for n in self.cache_seqlens]).to(torch.int32)
        self.rotary_cos = self.rotary_sin = None
        if rotary_dim and seqlen_new:
            angle = torch.rand(capacity + seqlen_q, rotary_dim // 2, generator=g) * 2 * math.pi
            self.rotary_cos, self.rotary_sin = angle.cos().to(dtype), angle.sin().to(dtype)
        self.alibi_slopes = torch.rand(batch, heads, generator=g) * 0.3 if alibi else None
        for name in ("q", "k_cache", "v_cache", "k", "v", "block_table", "cache_seqlens",
                     "cache_batch_idx", "cache_leftpad", "rotary_cos", "rotary_sin",
                     "alibi_slopes"):
            if getattr(self, name) is not None:
                setattr(self, name, getattr(self, name).to(device))
        if values_in_keys:  # still a view of the moved k_cache
            self.v_cache = self.k_cache[..., :head_dim_v]
        # The logical caches before the call, per sequence (rows = key positions).
        self.keys_before = [self.logical(self.k_cache, b).clone() for b in range(batch)]
        self.values_before = [self.logical(self.v_cache, b).clone() for b in range(batch)]

    def logical(self, cache, b):
        if self.block_table is not None:
            return cache[self.block_table[b].long()].flatten(0, 1)
        return cache[b if self.cache_batch_idx is None else int(self.cache_batch_idx[b])]

    def call(self, ops=None, **overrides):
        """flash_attn_with_kvcache, or the fwd_kvcache op of another executor's `ops`."""
        kwargs = dict(k=self.k, v=self.v, rotary_cos=self.rotary_cos, rotary_sin=self.rotary_sin,
                      cache_seqlens=self.cache_seqlens, cache_batch_idx=self.cache_batch_idx,
                      cache_leftpad=self.cache_leftpad, block_table=self.block_table,
                      causal=self.causal, window_size=self.window, softcap=self.softcap,
                      rotary_interleaved=self.interleaved, alibi_slopes=self.alibi_slopes,
                      num_splits=self.num_splits, return_softmax_lse=True)
        kwargs.update(overrides)
        if ops is None:
            return flashattn.flash_attn_with_kvcache(self.q, self.k_cache, self.v_cache, **kwargs)
        left, right = kwargs.pop("window_size")
        del kwargs["return_softmax_lse"]
        return ops.fwd_kvcache(self.q, self.k_cache, self.v_cache, window_left=left,
                               window_right=right, **kwargs)

    def expected_new_values(self, b, dtype):
        """Sequence b's appended values: v, or with values_in_keys the keys' first columns."""
        if self.values_in_keys:
            return self.expected_new_keys(b, dtype)[..., :self.v_cache.shape[-1]]
        return self.v[b].to(dtype)

    def expected_new_keys(self, b, dtype):
        """Sequence b's appended keys, rotated in `dtype`."""
        k = self.k[b].to(dtype)
        if self.rotary_cos is None:
            return k
        positions = (int(self.cache_seqlens[b]) + torch.arange(self.seqlen_new))[:, None]
        return rotate(k, self.rotary_cos, self.rotary_sin, positions.expand(k.shape[:-1]),
                      self.interleaved)

    def reference(self, dtype):
        """(out, lse) of the call computed in `dtype` by the reference."""
        q = self.q.to(dtype)
        if self.rotary_cos is not None:
            per_token = self.causal or self.window != (-1, -1)
            positions = self.cache_seqlens.long()[:, None] + (
                torch.arange(q.shape[1])[None] if per_token else 0)
            q = rotate(q, self.rotary_cos, self.rotary_sin,
                       positions[:, :, None].expand(q.shape[:-1]), self.interleaved)
        outs, lses = [], []
        for b in range(self.batch):
            keys, values = self.keys_before[b].to(dtype).clone(), self.values_before[b].to(dtype).clone()
            end = int(self.cache_seqlens[b]) + self.seqlen_new
            if self.seqlen_new:
                keys[end - self.seqlen_new:end] = self.expected_new_keys(b, dtype)
                values[end - self.seqlen_new:end] = self.expected_new_values(b, dtype)
            begin = 0 if self.cache_leftpad is None else int(self.cache_leftpad[b])
            slopes = None if self.alibi_slopes is None else self.alibi_slopes[b:b + 1].to(dtype)
            out, lse = attention_reference(q[b:b + 1], keys[begin:end][None], values[begin:end][None],
                                           causal=self.causal, window_size=self.window,
                                           softcap=self.softcap, alibi_slopes=slopes)
            outs.append(out)
            lses.append(lse)
        return torch.cat(outs), torch.cat(lses)

    def check(self, ops=None):
        out, lse = self.call(ops)
        ref_out, ref_lse = self.reference(torch.float64)
        low_out, low_lse = self.reference(self.q.dtype)
        assert out.dtype == self.q.dtype and lse.dtype == torch.float32
        assert_within_torch_error("out", out, ref_out, low_out)
        assert_within_torch_error("lse", lse, ref_lse, low_lse.float())
        for b in range(self.batch):  # the append, in place
            end = int(self.cache_seqlens[b]) + self.seqlen_new
            keys, values = self.logical(self.k_cache, b), self.logical(self.v_cache, b)
            if self.seqlen_new:
                torch.testing.assert_close(keys[end - self.seqlen_new:end],
                                           self.expected_new_keys(b, torch.float32).to(self.q.dtype),
                                           rtol=0, atol=0 if self.rotary_cos is None else 1e-2)
                assert torch.equal(values[end - self.seqlen_new:end],
                                   self.expected_new_values(b, self.q.dtype))
            untouched = torch.ones(keys.shape[0], dtype=torch.bool)
            untouched[end - self.seqlen_new:end] = False
            assert torch.equal(keys[untouched], self.keys_before[b][untouched])
            assert torch.equal(values[untouched], self.values_before[b][untouched])
        return out, lse


CASES = {
    "decode": dict(),
    "decode_4_new": dict(seqlen_q=4, seqlen_new=4),
    "page_1": dict(page_size=1, seqlen_cache=40),
    "page_16": dict(page_size=16),
    "page_17": dict(page_size=17, seqlen_q=3, seqlen_new=2),
    "page_256": dict(page_size=256, seqlen_cache=600),
    "cache_batch_idx": dict(batch_idx=True),
    "leftpad": dict(leftpad=True, seqlen_q=2, seqlen_new=2),
    "leftpad_alibi": dict(leftpad=True, alibi=True),
    "no_append": dict(seqlen_new=0, rotary_dim=0),
    "neox_rotary_full_dim": dict(interleaved=False, rotary_dim=64),
    "not_causal": dict(causal=False, seqlen_q=3, seqlen_new=2),
    "local": dict(window=(20, 0), causal=False, seqlen_q=2),
    "softcap": dict(softcap=5.0),
    "mha": dict(heads_kv=8),
    "mqa": dict(heads=4, heads_kv=1),
    "long_q_prefill": dict(seqlen_q=200, seqlen_new=200, seqlen_cache=500, rotary_dim=0),
    "no_split": dict(num_splits=1),
    "three_splits": dict(num_splits=3, seqlen_cache=1000),
    "more_splits_than_blocks": dict(num_splits=7, seqlen_cache=200, page_size=16),
    "awkward": dict(batch=3, seqlen_q=7, seqlen_new=7, head_dim=65, seqlen_cache=257,
                    rotary_dim=16, heads=6, heads_kv=3),
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("case", CASES)
def test_kvcache_matches_the_reference(case, dtype):
    Case(dtype=dtype, **CASES[case]).check()


def runs_x86_64_v4():
    """Whether this CPU has AVX-512 as x86-64-v4 defines it (F, BW, CD, DQ, VL)."""
    with open("/proc/cpuinfo") as f:
        flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    return {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"} <= set(flags)


LANES = "FLASHATTN_CPU_ROW_LANES"


@pytest.fixture(params=["8", "16"])
def row_lanes(request, monkeypatch):
    """The CPU row products forced to 8 or 16 fp32 lanes. A CPU without AVX-512 refuses 16 (that
    is checked, then the test ends)."""
    monkeypatch.setenv(LANES, request.param)
    if request.param == "16" and not runs_x86_64_v4():
        with pytest.raises(RuntimeError, match="FLASHATTN_CPU_ROW_LANES=16 needs AVX-512"):
            Case(head_dim=16).call()
        pytest.skip("checked that this CPU, without AVX-512, refuses 16 lanes")
    return request.param


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("head_dim", [7, 24, 65, 300])
@pytest.mark.parametrize("seqlen_q, heads, heads_kv", [(1, 4, 1), (3, 8, 2), (1, 16, 1)])
def test_cpu_decode_tiles_of_any_head_dim(row_lanes, seqlen_q, heads, heads_kv, head_dim, dtype):
    """Tiles of at most 16 query rows take their products from the cache rows (row_products.h),
    in blocks of 4 rows x 4 keys, 8 or 16 lanes at a time, with tails of rows, keys and head dim
    (at 16 lanes: a last 8-lane piece, then scalars), and head dims past their 256-element row
    buffer in pieces."""
    Case(batch=2, seqlen_q=seqlen_q, seqlen_new=seqlen_q, heads=heads, heads_kv=heads_kv,
         head_dim=head_dim, seqlen_cache=203, rotary_dim=6, page_size=17, dtype=dtype).check()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_cpu_row_lanes_switch_the_products(monkeypatch, dtype):
    """FLASHATTN_CPU_ROW_LANES takes effect: 8 and 16 lanes sum in different orders, both within
    tolerance, and in fp32 their bits differ (16-bit products are exact in fp32, so their sums
    may not depend on the order); an unknown width is an error naming the variable."""
    if not runs_x86_64_v4():
        pytest.skip("this CPU has only 8 lanes (test_cpu_decode_tiles_of_any_head_dim checks "
                    "that it refuses 16)")
    case = Case(batch=2, seqlen_q=1, heads=8, heads_kv=2, head_dim=128, seqlen_cache=600,
                seqlen_new=0, rotary_dim=0, dtype=dtype)
    outs = {}
    for lanes in ("8", "16"):
        monkeypatch.setenv(LANES, lanes)
        outs[lanes] = case.check()
    if dtype == torch.float32:  # out or lse (the LSE's log-sum-exp may round both alike)
        assert not all(torch.equal(a, b) for a, b in zip(outs["8"], outs["16"]))
    monkeypatch.setenv(LANES, "32")
    with pytest.raises(RuntimeError, match="FLASHATTN_CPU_ROW_LANES must be 8, 16 or auto"):
        case.call()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("num_splits", [1, 3])
def test_cpu_decode_bits_do_not_depend_on_the_thread_count(num_splits, dtype):
    """How many kv heads share a decode tile follows the thread count (as many as leave a task
    for every thread: here 4, 2 or 1), and the sums do not depend on it: the same bits at 1, 2, 3
    and 8 threads for a given split count (float32: the fp32 row products; bfloat16: this CPU's
    default, on vdpbf16ps where the 16-bit products run on it)."""
    case = Case(batch=2, seqlen_q=1, heads=16, heads_kv=4, head_dim=64, seqlen_cache=700,
                seqlen_new=0, rotary_dim=0, num_splits=num_splits, dtype=dtype)
    case.check()
    threads = torch.get_num_threads()
    outs = []
    try:
        for n in (1, 2, 3, 8):
            torch.set_num_threads(n)
            outs.append(case.call())
    finally:
        torch.set_num_threads(threads)
    for out in outs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(out, outs[0]))


def cpu_has_avx512_bf16():
    """Whether the extension found AVX512-BF16 here, and its vdpbf16ps kernel multiplies
    correctly (test_cpu_gemm_16bit.py checks that against /proc/cpuinfo)."""
    return cpu_test_ops().cpu_16bit_features(torch.bfloat16)[2]


# (page_size, mask): leftpad applies to a dense cache only.
VDPBF16PS_LAYOUTS = [(page_size, mask) for page_size in (None, 17)
                     for mask in (dict(), dict(window=(5, 0)), dict(softcap=3.0, alibi=True))]
VDPBF16PS_LAYOUTS.append((None, dict(causal=False, leftpad=True)))


# row_products.h's kLaneRowsMin: from this many query rows per kv head the score product takes
# the rows in the lanes of a vector, below it blocks of (row, key) dots.
ROWS_IN_LANES_FROM = 9


@pytest.mark.parametrize("page_size, mask", VDPBF16PS_LAYOUTS, ids=str)
@pytest.mark.parametrize("head_dim", [7, 24, 65, 128, 300])
@pytest.mark.parametrize("seqlen_q, heads, heads_kv", [(1, 4, 1), (3, 8, 2), (1, 16, 1),
                                                       (4, 32, 8), (2, 6, 3)])
def test_cpu_decode_tiles_on_vdpbf16ps(monkeypatch, seqlen_q, heads, heads_kv, head_dim,
                                       page_size, mask):
    """bf16 decode tiles where the 16-bit products run on vdpbf16ps (the default on a Zen 4;
    forced here) take the vdpbf16ps row products (row_products_dot.cpp) and stay within
    tolerance: head dims in 32-element steps with an odd or partial tail, key blocks that end
    mid-pair, 1 to 8 kv heads a tile, masks, pages; 4 query rows per kv head (dot blocks) and
    12 or 16 (rows in lanes, each way counted)."""
    if not cpu_has_avx512_bf16():
        pytest.skip("this CPU has no AVX512-BF16 (test_cpu_gemm_16bit.py checks the dispatch "
                    "against /proc/cpuinfo)")
    monkeypatch.setenv("FLASHATTN_CPU_16BIT_PRODUCTS", "1")
    monkeypatch.setenv("FLASHATTN_CPU_16BIT_KERNEL", "avx512-dot")
    ops = cpu_test_ops()
    before, lanes_before = ops.cpu_bf16_row_products_run(), ops.cpu_bf16_query_lanes_run()
    Case(batch=2, seqlen_q=seqlen_q, seqlen_new=seqlen_q, heads=heads, heads_kv=heads_kv,
         head_dim=head_dim, seqlen_cache=203, rotary_dim=6, page_size=page_size,
         dtype=torch.bfloat16, **mask).check()
    assert ops.cpu_bf16_row_products_run() > before
    rows_per_kv_head = seqlen_q * heads // heads_kv
    assert ((ops.cpu_bf16_query_lanes_run() > lanes_before)
            == (rows_per_kv_head >= ROWS_IN_LANES_FROM))


# ---- the CUDA kernels: on a GPU, and their own source on the CPU shim ----

CUDA_CASES = CASES
# On the shim every GPU thread is a fiber: shorter caches, the same features.
SIM_CASES = {name: {**config, "seqlen_cache": min(config.get("seqlen_cache", 300), 140),
                    "seqlen_q": min(config.get("seqlen_q", 1), 7),
                    "seqlen_new": min(config.get("seqlen_new", 1), 7)}
             for name, config in CUDA_CASES.items()}


@pytest.fixture(scope="module")
def sim():
    return make_executor("sim")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("case", SIM_CASES)
def test_cuda_kernels_on_the_shim(sim, case, dtype):
    Case(dtype=dtype, **SIM_CASES[case]).check(sim.ops)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("case", CUDA_CASES)
def test_cuda_kernels_on_a_gpu(case, dtype):
    make_executor("cuda")  # skips without a GPU
    Case(dtype=dtype, device="cuda", **CUDA_CASES[case]).check()


@pytest.mark.parametrize("seqlen_q", [1, 4])
@pytest.mark.parametrize("page_size", [None, 16])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_cuda_decode_reads_the_cache_once_per_kv_head(sim, num_splits, page_size, seqlen_q):
    """A decoding step with GQA (4 query heads per kv head; 1 or 4 query tokens) copies each
    K/V byte into shared memory once, not once per query head (cuda/gqa_decode.h), counted by
    the shim: the forward's cp.async bytes are the cache's bytes plus q's, once per split. And it
    computes one m16 tile per key tile, the group's 4 or 16 rows: the tile's other warps skip
    their products (plan_fwd.h, kFwdFewRows)."""
    batch, heads, heads_kv, head_dim, keys = 2, 8, 2, 64, 256
    case = Case(batch=batch, heads=heads, heads_kv=heads_kv, head_dim=head_dim,
                seqlen_q=seqlen_q, seqlen_new=0, rotary_dim=0, seqlen_cache=keys,
                page_size=page_size, num_splits=num_splits)
    case.cache_seqlens.fill_(keys)
    sim.ops.counters_enable(False)
    sim.ops.counters_reset()
    sim.ops.counters_enable(True)
    try:
        case.check(sim.ops)
    finally:
        sim.ops.counters_enable(False)
        launches = json.loads(sim.ops.counters_json())["launches"]
        sim.ops.counters_reset()
    forward = [l["counters"] for l in launches if "fwd_kernel" in l["kernel"]]
    element = 2
    cache_bytes = 2 * batch * heads_kv * keys * head_dim * element  # K and V
    q_bytes = batch * seqlen_q * heads * head_dim * element
    assert sum(c["cp_async"]["bytes"] for c in forward) == cache_bytes + num_splits * q_bytes
    key_tile = 64
    # m16n8k16 products of one m16 tile per key tile: S (head_dim / 16 k-steps x key_tile / 8
    # columns), then PV (key_tile / 16 k-steps x head_dim / 8 columns).
    products = (head_dim // 16) * (key_tile // 8) + (key_tile // 16) * (head_dim // 8)
    mma = sum(sum(c["mma"].values()) for c in forward)
    assert mma == batch * heads_kv * (keys // key_tile) * products


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_cuda_split_counts_agree(sim, dtype):
    """Split-KV on the CUDA kernels: partial outputs merged by their LSEs (split_merge_kernel);
    every split count, empty splits included (7 splits of 5 key tiles), agrees with one split to
    rounding, and each is deterministic."""
    case = Case(batch=1, heads=4, heads_kv=1, seqlen_q=2, seqlen_new=0, rotary_dim=0,
                seqlen_cache=300, causal=False, dtype=dtype)
    one_out, one_lse = case.call(sim.ops, num_splits=1)
    # 0: the plan's count (plan_fwd.h, choose_num_splits), bitwise as that count given. 300 keys
    # are 5 16-bit tiles of 64, too few to split; fp32's SIMT tiles of 32 keys are 10, and on
    # the shim's 8 SMs its merge (a warp per row) costs less than the second split saves.
    auto = case.call(sim.ops, num_splits=0)
    planned = 2 if dtype == torch.float32 else 1
    assert json.loads(sim.ops.plan_fwd(case.q, case.k_cache, case.v_cache,
                                       num_splits=0))["num_splits"] == planned
    same = case.call(sim.ops, num_splits=planned)
    assert torch.equal(auto[0], same[0]) and torch.equal(auto[1], same[1])
    for splits in (2, 3, 7):
        out, lse = case.call(sim.ops, num_splits=splits)
        # The parts were really computed apart: their merge rounds differently.
        assert not torch.equal(lse, one_lse), splits
        again = case.call(sim.ops, num_splits=splits)
        assert torch.equal(out, again[0]) and torch.equal(lse, again[1])
        torch.testing.assert_close(lse, one_lse, rtol=0, atol=1e-5)
        tolerance = 1e-6 if dtype == torch.float32 else 1e-2
        torch.testing.assert_close(out.float(), one_out.float(), rtol=0, atol=tolerance)
    case.check(sim.ops)


def test_int_cache_seqlens_and_no_cache_seqlens():
    case = Case(batch=2, seqlen_new=0, rotary_dim=0)
    out, _ = case.call(cache_seqlens=100)
    case.cache_seqlens = torch.full((2,), 100, dtype=torch.int32)
    torch.testing.assert_close(out, case.reference(torch.float64)[0].to(out.dtype),
                               rtol=0, atol=2e-2)
    full, _ = case.call(cache_seqlens=None)
    case.cache_seqlens = torch.full((2,), 300, dtype=torch.int32)
    torch.testing.assert_close(full, case.reference(torch.float64)[0].to(out.dtype),
                               rtol=0, atol=2e-2)


# ---- split-KV ----

def test_split_counts_agree_and_each_is_bitwise_reproducible():
    base = Case(batch=1, heads=4, heads_kv=1, seqlen_cache=3000, seqlen_new=0, rotary_dim=0,
                dtype=torch.float32)
    results = {}
    threads = torch.get_num_threads()
    try:
        for splits in (1, 2, 5, 0):
            out, lse = base.call(num_splits=splits)
            torch.set_num_threads(1)
            again = base.call(num_splits=splits)
            torch.set_num_threads(threads)
            if splits:  # a fixed split count: the same bits on any thread count
                assert torch.equal(out, again[0]) and torch.equal(lse, again[1])
            results[splits] = (out, lse)
    finally:
        torch.set_num_threads(threads)
    for splits, (out, lse) in results.items():
        torch.testing.assert_close(out, results[1][0], rtol=0, atol=1e-6)
        torch.testing.assert_close(lse, results[1][1], rtol=0, atol=1e-6)


def test_an_empty_split_contributes_nothing():
    """A causal row that sees only the first keys leaves later splits empty."""
    case = Case(batch=1, seqlen_q=3, seqlen_new=0, seqlen_cache=600, rotary_dim=0, causal=False,
                window=(0, 0), num_splits=4, dtype=torch.float32)
    case.check()


# ---- paged KV in the varlen forward ----

@pytest.mark.parametrize("executor", ["cpu", "sim"])
@pytest.mark.parametrize("page_size", [1, 16, 17])
def test_varlen_forward_reads_a_paged_cache(page_size, executor):
    ops = make_executor(executor).ops
    torch.manual_seed(0)
    lengths_q, lengths_k = [3, 1, 5], [40, 7, 33]
    heads, heads_kv, dim = 4, 2, 32
    blocks_per_seq = math.ceil(max(lengths_k) / page_size)
    num_blocks = 3 * blocks_per_seq + 2
    k_pages = torch.randn(num_blocks, page_size, heads_kv, dim)
    v_pages = torch.randn(num_blocks, page_size, heads_kv, dim)
    table = torch.randperm(num_blocks, dtype=torch.int32)[:3 * blocks_per_seq].view(3, -1)
    q = torch.randn(sum(lengths_q), heads, dim)
    cu_q = torch.tensor([0, 3, 4, 9], dtype=torch.int32)
    cu_k = torch.tensor([0, 40, 47, 80], dtype=torch.int32)
    if executor == "cpu":  # the public function; its op below on the others
        out = flashattn.flash_attn_varlen_func(q, k_pages, v_pages, cu_q, cu_k, 5, 40,
                                               causal=True, block_table=table)
    else:
        out, _ = ops.fwd(q, k_pages, v_pages, causal=True, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                         max_seqlen_q=5, max_seqlen_k=40, block_table=table)
    for b in range(3):
        keys = k_pages[table[b].long()].flatten(0, 1)[:lengths_k[b]]
        values = v_pages[table[b].long()].flatten(0, 1)[:lengths_k[b]]
        rows = slice(int(cu_q[b]), int(cu_q[b + 1]))
        ref, _ = attention_reference(q[rows][None].double(), keys[None].double(),
                                     values[None].double(), causal=True)
        torch.testing.assert_close(out[rows].double(), ref[0], rtol=0, atol=1e-5)


def test_block_table_is_forward_only():
    """As in FA2: inputs that require grad run forward (FA2's own varlen tests do that with
    paged caches); a backward through the call is a clear error."""
    q = torch.randn(2, 4, 32, requires_grad=True)
    pages = torch.randn(4, 16, 4, 32)
    cu = torch.tensor([0, 2], dtype=torch.int32)
    table = torch.tensor([[0, 1]], dtype=torch.int32)
    out = flashattn.flash_attn_varlen_func(q, pages, pages, cu, cu, 2, 2, block_table=table)
    with torch.no_grad():
        expected = flashattn.flash_attn_varlen_func(q, pages, pages, cu, cu, 2, 2,
                                                    block_table=table)
    assert torch.equal(out, expected) and out.requires_grad
    with pytest.raises(RuntimeError, match="block_table, .* are forward only"):
        out.sum().backward()
    with pytest.raises(ValueError, match="dropout_p must be 0"):
        flashattn.flash_attn_varlen_func(q, pages, pages, cu, cu, 2, 2, dropout_p=0.1,
                                         block_table=table)


@pytest.mark.parametrize("needs_grad", ["q", "k", "v"])
def test_kvcache_call_is_forward_only(needs_grad):
    """Inputs that require grad run forward, with the same result; a backward through the
    outputs (out or lse) is a clear error, not autograd's silent fallback (no gradient)."""
    case = Case(batch=2, seqlen_q=1, heads=4, heads_kv=2, head_dim=16, seqlen_cache=40,
                rotary_dim=8, dtype=torch.float32)
    with torch.no_grad():
        expected = case.call()
    getattr(case, needs_grad).requires_grad_()
    out, lse = case.call()
    assert torch.equal(out, expected[0]) and torch.equal(lse, expected[1])
    assert out.requires_grad and lse.requires_grad
    for output in (out, lse):
        with pytest.raises(RuntimeError, match="flash_attn_with_kvcache is forward only"):
            output.sum().backward(retain_graph=True)


# ---- bad input: a clear error naming the argument, and the cache left as it was ----

def errors_case():
    return Case(batch=2, page_size=16, seqlen_cache=64, seqlen_new=2, seqlen_q=2)


@pytest.mark.parametrize("mutation, message", [
    (lambda c: c.block_table.__setitem__((1, 0), 10_000), r"block_table\[1, 0\] = 10000 is not a block"),
    (lambda c: c.block_table.__setitem__((0, 0), -1), r"block_table\[0, 0\] = -1 is not a block"),
    (lambda c: setattr(c, "block_table", c.block_table.long()), "block_table must be int32"),
    (lambda c: c.cache_seqlens.__setitem__(0, 63), r"cache_seqlens\[0\] \+ seqlen_new = 63 \+ 2 "
                                                   r"keys do not fit in the block_table's pages"),
    (lambda c: setattr(c, "cache_seqlens", c.cache_seqlens.long()), "cache_seqlens must be int32"),
    (lambda c: setattr(c, "k", c.k[..., :16]), r"k must have shape \[batch, seqlen_new, heads_kv, "
                                               r"k_cache's head_dim\] = \[2, seqlen_new, 2, 64\]"),
    (lambda c: setattr(c, "v", c.v[..., :16]), r"v must have shape \[batch, seqlen_new, heads_kv, "
                                               r"v_cache's head_dim\] = \[2, seqlen_new, 2, 64\]"),
    (lambda c: setattr(c, "v", None), "pass both k and v"),
    (lambda c: setattr(c, "rotary_sin", None), "pass both rotary_cos and rotary_sin"),
    (lambda c: setattr(c, "rotary_cos", c.rotary_cos[:10]), "rotary_sin must be 2-D"),
    (lambda c: (setattr(c, "rotary_cos", c.rotary_cos[:10]), setattr(c, "rotary_sin", c.rotary_sin[:10])),
     r"rotary_cos / rotary_sin have 10 rows \(positions\), but sequence"),
])
def test_bad_kvcache_input_is_a_clear_error(mutation, message):
    case = errors_case()
    mutation(case)
    k_before, v_before = case.k_cache.clone(), case.v_cache.clone()
    with pytest.raises(RuntimeError, match=message):
        case.call()
    assert torch.equal(case.k_cache, k_before) and torch.equal(case.v_cache, v_before)


def test_bad_dense_cache_input_is_a_clear_error():
    case = Case(batch=2, batch_idx=True, leftpad=True, seqlen_new=1)
    bad_idx = case.cache_batch_idx.clone()
    bad_idx[1] = 4
    with pytest.raises(RuntimeError, match=r"cache_batch_idx\[1\] = 4 is not an entry of the cache"):
        case.call(cache_batch_idx=bad_idx)
    bad_pad = case.cache_seqlens + 2
    with pytest.raises(RuntimeError, match=r"cache_leftpad\[0\] = \d+ must be in \[0, \d+\]"):
        case.call(cache_leftpad=bad_pad)
    with pytest.raises(RuntimeError, match=r"k_cache must have q's head_dim 32 in its last "
                                           r"dimension, got shape \[4, 300, 2, 64\]"):
        flashattn.flash_attn_with_kvcache(case.q[..., :32], case.k_cache, case.v_cache,
                                          cache_seqlens=case.cache_seqlens)
    with pytest.raises(RuntimeError, match="rotate the new keys"):
        case.call(k=None, v=None)
    with pytest.raises(RuntimeError, match="needs cache_seqlens"):
        case.call(cache_seqlens=None, rotary_cos=None, rotary_sin=None)


# ---- torch.compile: the in-place append is declared, so functionalization keeps it ----

def test_compile_appends_in_place():
    torch._dynamo.reset()
    case = Case(batch=2, page_size=16, seqlen_new=1)
    eager = Case(batch=2, page_size=16, seqlen_new=1)

    def step(q, k_cache, v_cache, k, v, cos, sin, seqlens, table):
        return flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cos, sin, seqlens,
                                                 block_table=table, causal=True)

    compiled = torch.compile(step, fullgraph=True)
    args = lambda c: (c.q, c.k_cache, c.v_cache, c.k, c.v, c.rotary_cos, c.rotary_sin,  # noqa: E731
                      c.cache_seqlens, c.block_table)
    got = compiled(*args(case))
    want = step(*args(eager))
    assert torch.equal(got, want)
    assert torch.equal(case.k_cache, eager.k_cache) and torch.equal(case.v_cache, eager.v_cache)
