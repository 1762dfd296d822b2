"""The rates the dense forward is held against, measured in the same run: the machine's matmul
(torch.mm, another library's large product) and, on the CPU, flashattn's own tile products on a
hot tile (a ceiling the kernel can reach). Attention is two matmuls plus a softmax, so the share
of them that flashattn's non-causal forward reaches is how little the softmax and the tiling
cost."""
import torch

from . import measure
from .common import dtype_name

FLASHATTN = "flashattn"
# The largest square matmul whose rate is reported ("matmul ceiling" in the summary); smaller
# where the dtype is slow on the machine (see measure.matmul_tflops).
MATMUL_SIZE = {"cpu": 2048, "cuda": 8192}
QUICK_MATMUL_SIZE = 256
# CPU: seconds each of flashattn's own tile products is timed on a hot tile
# (measure.cpu_tile_products_tflops).
TILE_PRODUCTS_SECONDS = 1.0
QUICK_TILE_PRODUCTS_SECONDS = 0.05


def add_ceilings(summary, results, settings, run):
    """Measures the ceilings of every dtype of settings and adds them, with the shares, to the
    forward's summary entries (summary: dense.summarize's)."""
    quick = run.args.quick
    max_size = QUICK_MATMUL_SIZE if quick else MATMUL_SIZE[run.device.type]
    matmul = {dtype_name(dtype): measure.matmul_tflops(dtype, max_size, run.probe,
                                                       settings.repeats, run.device)
              for dtype in settings.dtypes}
    _add_matmul(summary, results, matmul)
    if run.device.type == "cpu":
        seconds = QUICK_TILE_PRODUCTS_SECONDS if quick else TILE_PRODUCTS_SECONDS
        tiles = {dtype_name(dtype): measure.cpu_tile_products_tflops(dtype, settings.head_dim,
                                                                     seconds)
                 for dtype in settings.dtypes if dtype != torch.float64}
        _add_tile_products(summary, results, tiles, settings.head_dim)


def _noncausal_forward_shares(results, dtype, tflops):
    """[min, max] over flashattn's non-causal forward cases of their TFLOP/s / tflops, or None
    where there is no such case."""
    shares = [r.tflops / tflops for r in results
              if (r.impl, r.mode, r.dtype, r.causal) == (FLASHATTN, "fwd", dtype, False)
              and r.tflops is not None]
    return [min(shares), max(shares)] if shares else None


def _forward_entries(summary, ceilings):
    return [s for s in summary if s["mode"] == "fwd" and s["dtype"] in ceilings]


def _add_matmul(summary, results, ceilings):
    for s in _forward_entries(summary, ceilings):
        tflops, size = ceilings[s["dtype"]]
        s["matmul_size"] = size
        s["matmul_tflops"] = tflops
        s["noncausal_fwd_share_of_matmul"] = _noncausal_forward_shares(results, s["dtype"],
                                                                       tflops)


def _add_tile_products(summary, results, ceilings, head_dim):
    """Each rate of measure.cpu_tile_products_tflops, and the share of the one the dtype takes
    now."""
    for s in _forward_entries(summary, ceilings):
        rates = ceilings[s["dtype"]]
        s["tile_head_dim"] = head_dim
        s["tile_products"] = [{"kernel": what, "tflops": tflops, "taken": taken}
                              for what, tflops, taken in rates]
        taken = [tflops for _, tflops, is_taken in rates if is_taken]
        s["noncausal_fwd_share_of_tile_products"] = (
            _noncausal_forward_shares(results, s["dtype"], taken[0]) if taken else None)


def lines(entry):
    """The summary's lines about the ceilings of one summary entry (none if it has none)."""
    out = []
    if entry.get("tile_products"):
        rates = ", ".join(f"{t['kernel']} {1e3 * t['tflops']:.3g} GFLOP/s"
                          f"{' (taken)' if t['taken'] else ''}" for t in entry["tile_products"])
        shares = _share_text(entry["noncausal_fwd_share_of_tile_products"], "the one taken")
        out.append(f"{'':>16}  tile-product ceiling (the forward's own Q·Kᵀ and P·V on a hot "
                   f"128x128 block, head_dim {entry['tile_head_dim']}): {rates}; {shares}")
    if entry.get("matmul_tflops"):
        size = entry["matmul_size"]
        shares = _share_text(entry["noncausal_fwd_share_of_matmul"], "it")
        out.append(f"{'':>16}  matmul ceiling ({size}x{size}x{size}, {entry['dtype']}): "
                   f"{1e3 * entry['matmul_tflops']:.3g} GFLOP/s (torch.mm); {shares}")
    return out


def _share_text(shares, of):
    if not shares:
        return "no non-causal forward in this run"
    low, high = shares
    span = f"{100 * low:.0f}%" + ("" if low == high else f"-{100 * high:.0f}%")
    return f"flashattn's non-causal forward reaches {span} of {of}"
