"""The float64 reference of the FP8 (e4m3) forward, one sequence at a time: attention on the
dequantized inputs with P rounded to e4m3 as the sm_90a kernel rounds it (relative to the running
max of the 128-key tiles visited so far, last tile first; l the sum of the unrounded P), beside the
unrounded attention and the bound P's rounding puts between them. The shim's FP8 suites
(test_cudasim_hopper_fp8_*.py) and the GPU sample (tests/cudasim/hopper_library_sample.py) check
against it; it runs on CPU tensors."""
import torch

FP8 = torch.float8_e4m3fn
BLOCK_N = 128  # the kernel's key tile at d = 128 (FwdSm90Config): where its running max moves


def reference(q, k, v, window, bottom_right, scale, qd=1.0, kd=1.0, vd=1.0, softcap=0.0,
              tile_part=None, slopes=None, bias=None):
    """One sequence: q [Sq, Hq, D], k, v [Sk, Hkv, D] (e4m3), the window (left, right) (causal is
    (-1, 0)), the descales per kv head ([Hkv] or 1.0), softcap (0: none; the logit is
    softcap * tanh(s * descales * scale / softcap)). tile_part: split-KV's part of each row's key
    tiles (int [Sq, tiles]: split_parts(); None: one part), where the kernel's running max
    starts anew. slopes: ALiBi's [Hq] (None: none), -slope |i + offset - j| added to the
    (softcapped) logit; bias: attn_mask's (float64, broadcast to [Hq, Sq, Sk]; -inf hides), added
    after it. Returns (out with P rounded as the kernel rounds it, out with P exact, the
    bound P's rounding puts on their difference, lse), float64, out [Sq, Hq, D], lse [Hq, Sq]."""
    sq, hq, _ = q.shape
    sk, hkv, _ = k.shape
    g = hq // hkv
    per_head = lambda x: (x.double().repeat_interleave(g)[:, None, None]  # noqa: E731
                          if torch.is_tensor(x) else torch.tensor(float(x), dtype=torch.float64))
    qq, kk, vv = (t.double().transpose(0, 1) for t in (q, k, v))  # [H, S, D]
    kk, vv = kk.repeat_interleave(g, 0), vv.repeat_interleave(g, 0)
    s = (qq @ kk.transpose(-1, -2)) * scale * per_head(qd) * per_head(kd)
    if softcap > 0:
        s = softcap * (s / softcap).tanh()
    left, right = window
    # Row i sees key j iff i + off - left <= j <= i + off + right (params.h), each bound only
    # where it is >= 0; off = Sk - Sq bottom-right, 0 top-left.
    diag = torch.arange(sq)[:, None] + (sk - sq if bottom_right else 0)
    j = torch.arange(sk)[None, :]
    if slopes is not None:
        s = s - slopes.double()[:, None, None] * (diag - j).abs()
    if bias is not None:
        s = s + bias
    keep = torch.ones(sq, sk, dtype=torch.bool)
    if left >= 0:
        keep &= j >= diag - left
    if right >= 0:
        keep &= j <= diag + right
    s = s.masked_fill(~keep, float("-inf"))
    m = s.amax(-1, keepdim=True) if sk else torch.full((hq, sq, 1), float("-inf"), dtype=torch.float64)
    tiles = max((sk + BLOCK_N - 1) // BLOCK_N, 1)
    tile_max = torch.stack([s[..., n * BLOCK_N:(n + 1) * BLOCK_N].amax(-1) if sk else m[..., 0]
                            for n in range(tiles)], -1)
    running = running_max(tile_max, tile_part)
    m_tile = running.repeat_interleave(BLOCK_N, -1)[..., :sk]
    seen = m_tile.isfinite()
    zeros = torch.zeros_like(s)
    p_exact = torch.where(m.isfinite(), (s - m).exp(), zeros)
    shifted = torch.where(seen, (s - m_tile).exp(), zeros)
    to_row_max = torch.where(seen, (m_tile - m).exp(), zeros)
    e4m3 = lambda x: x.float().to(FP8).double()  # noqa: E731
    p_rounded = e4m3(shifted) * to_row_max
    # The kernel's P (fp32 scores, exp2 in fp32) is this float64 one to about 1e-6 relative;
    # where that puts it across an e4m3 rounding boundary the kernel may round to the other
    # neighbour (one e4m3 step, up to 2^-3 of that P: a large share of out in a row of few keys).
    # ties: the bound that adds to out, nonzero only for P within 1e-4 of a boundary.
    near = 1e-4
    ties = (e4m3(shifted * (1 + near)) - e4m3(shifted * (1 - near))) * to_row_max
    l = p_exact.sum(-1, keepdim=True)
    l_safe = torch.where(l > 0, l, torch.ones_like(l))
    v_scale = per_head(vd)
    out_rounded = (p_rounded @ vv) / l_safe * v_scale
    out_exact = (p_exact @ vv) / l_safe * v_scale
    # Half an ulp of each P (2^-4 relative), 2^-10 for e4m3's subnormals.
    slack = (shifted * 2 ** -4).clamp(min=2 ** -10) * to_row_max
    bound = (slack @ vv.abs()) / l_safe * v_scale.abs()
    tie_bound = (ties @ vv.abs()) / l_safe * v_scale.abs()
    lse = torch.where(l > 0, m + l_safe.log(), torch.full_like(l, float("-inf"))).squeeze(-1)
    return (out_rounded.transpose(0, 1), out_exact.transpose(0, 1), bound.transpose(0, 1), lse,
            tie_bound.transpose(0, 1))


def running_max(tile_max, tile_part):
    """The kernel's running max at each key tile ([Hq, Sq, tiles]): the largest tile max of the
    tiles its CTA visited up to it (last tile first), within the tile's split part."""
    if tile_part is None:
        return tile_max.flip(-1).cummax(-1).values.flip(-1)
    running = torch.full_like(tile_max, float("-inf"))
    for part in tile_part.unique().tolist():
        mine = tile_part == part
        part_max = tile_max.masked_fill(~mine, float("-inf"))
        running = torch.where(mine, part_max.flip(-1).cummax(-1).values.flip(-1), running)
    return running
