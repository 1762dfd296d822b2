#!/usr/bin/env python3
"""The sm_90a forward's wave factor in its launch order, without a GPU.

gpu_model.py models the mma.sync kernels only; this applies its list schedule (wave_factor: each
CTA weighted by its key tiles + 1, list-scheduled in launch order onto the SMs, one CTA per SM as
the Hopper forward's 384 threads and 165-198 KB of shared memory allow) to the Hopper forward's
CTAs, in the grid's own order (query block = blockIdx.x) and in the kernel's tile order
(csrc/cuda/hopper/fwd_sm90_tile_order.h). The CTAs' work comes from the C++ order itself, through
tests/cudasim/selftest/hopper_tile_order_test.cpp's work_list, built against the shim.

It also models a persistent kernel's static walk: one CTA per SM, CTA c taking tiles c, c + SMs,
c + 2 SMs, ... of the tile order, each CTA's tiles back to back. Without a mask that matches the
hardware's hand-out; for causal it is worse, since the hardware hands the next tile to the
first free SM and a static walk cannot (docs/lab/2026-12-03-hopper-persistent.md). And a
dynamic walk (not built): one CTA per SM, each taking the next place of the tile order from an
atomic counter whenever it finishes a tile. With the per-tile cost below it is the hardware's
hand-out again (the same list schedule), minus what the model does not see; it is here to show
that a dynamic walk keeps the heavy-first order's balance where a static one loses it.

    python tools/hopper_tile_order.py [--seqlens 1024,4096] [--head-dims 128] [--masks causal,none] [--gpu h200]

The shape is the FA papers' (16k tokens, hidden 2048: B = 16k / N, Hq = 2048 / d), Sq = Sk.
q is the makespan over the perfectly balanced time; L2 traffic is not modeled (the order's
sections keep each wave's K and V within 32 MB: fwd_sm90_tile_order.h). Each tile weighs its key
tiles + 1, in a walk as in a grid: the model cannot see what the walk saves (the CTA's setup once,
the next tile's first K and V loading during the last tile's epilogue).
"""
import argparse
import heapq
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "cudasim"))
import build  # noqa: E402
import gpu_model  # noqa: E402
import gpu_specs  # noqa: E402

TOKENS, HIDDEN = 16384, 2048
CTAS_PER_SM = 1  # __launch_bounds__(384, 1) and more than half an SM's shared memory


def work_list(exe, order, seqlen, d, causal, batch, heads):
    out = subprocess.run([exe, "work_list", order, str(seqlen), str(seqlen), str(d), str(int(causal)),
                          str(batch), str(heads)], capture_output=True, text=True, check=True)
    return [int(w) for w in out.stdout.split()]


def static_walk(work, slots):
    """q of the persistent kernel's static walk: CTA c runs tiles c, c + CTAs, ... back to back."""
    ctas = min(slots, len(work))
    if ctas == 0:
        return 1.0
    loads = [sum(work[c::ctas]) for c in range(ctas)]
    return max(loads) / (sum(work) / slots)


def dynamic_walk(work, slots):
    """q of a dynamic walk: one CTA per SM; the first CTA to finish a tile takes the next place."""
    ctas = min(slots, len(work))
    if ctas == 0:
        return 1.0
    free_at = [0.0] * ctas  # a heap of the times the CTAs finish their current tile
    for w in work:
        heapq.heapreplace(free_at, free_at[0] + w)
    return max(free_at) / (sum(work) / slots)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqlens", default="1024,4096")
    parser.add_argument("--head-dims", default="128")
    parser.add_argument("--masks", default="causal", help="causal and / or none, comma-separated")
    parser.add_argument("--gpu", choices=sorted(gpu_specs.GPUS), default="h200")
    args = parser.parse_args()
    gpu = gpu_specs.GPUS[args.gpu]
    slots = gpu.sms * CTAS_PER_SM
    exe = build.build_program([os.path.join(build.SHIM_DIR, "selftest", "hopper_tile_order_test.cpp")],
                              "hopper_tile_order_test")
    print(f"{gpu.name}: {gpu.sms} SMs x {CTAS_PER_SM} CTA; B = {TOKENS} / N, Hq = {HIDDEN} / d")
    print(f"{'mask':>6} {'N':>6} {'d':>4} {'CTAs':>6} {'q grid order':>13} {'q tile order':>13} {'q static walk':>14} {'q dynamic walk':>15}")
    for mask in args.masks.split(","):
        causal = mask == "causal"
        for seqlen in (int(s) for s in args.seqlens.split(",")):
            for d in (int(x) for x in args.head_dims.split(",")):
                batch, heads = max(1, TOKENS // seqlen), HIDDEN // d
                work = {order: work_list(exe, order, seqlen, d, causal, batch, heads) for order in ("natural", "ordered")}
                q = {order: gpu_model.wave_factor(w, slots) for order, w in work.items()}
                walk = static_walk(work["ordered"], slots)
                dynamic = dynamic_walk(work["ordered"], slots)
                print(f"{mask:>6} {seqlen:>6} {d:>4} {len(work['natural']):>6} {q['natural']:>13.3f} "
                      f"{q['ordered']:>13.3f} {walk:>14.3f} {dynamic:>15.3f}")

if __name__ == "__main__":
    main()
