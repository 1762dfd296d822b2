"""flash_attn_with_kvcache's append kernel (csrc/cuda/kv_append_kernel.cuh, a warp per row) on
the CPU shim: decode- and prefill-sized appends into dense and paged caches, rotary embedding
interleaved (GPT-J) and not (GPT-NeoX) over part or all of the head dim, head dims that leave
lanes idle (7, 63) or take several elements per lane (256), under every schedule. The caches
after the call equal the CPU executor's bit for bit (both run kv_append.h's per-element code in
float), and the attention over them is within PyTorch's error of the float64 reference
(test_kvcache.Case.check). The launch is a warp per row: ceil(rows / 4) blocks of 128 threads."""
import math

import pytest
import torch

from test_kvcache import Case


# name -> Case arguments. seqlen_q = seqlen_new: the queries are the appended tokens (prefill).
CASES = {
    "decode_gptj": dict(seqlen_q=1, seqlen_new=1, head_dim=128, rotary_dim=64),
    "decode_neox_full_dim": dict(seqlen_q=1, seqlen_new=1, head_dim=128, rotary_dim=128,
                                 interleaved=False),
    "prefill_129_neox_paged_16": dict(seqlen_q=129, seqlen_new=129, head_dim=64, rotary_dim=32,
                                      interleaved=False, page_size=16, seqlen_cache=400),
    "prefill_257_gptj_paged_1": dict(seqlen_q=257, seqlen_new=257, head_dim=32, rotary_dim=32,
                                     page_size=1, seqlen_cache=300),
    "d7_rotary_2": dict(seqlen_q=7, seqlen_new=7, head_dim=7, rotary_dim=2),
    "d63_no_rotary": dict(seqlen_q=3, seqlen_new=63, head_dim=63, rotary_dim=0,
                          seqlen_cache=200),
    "d256_neox_leftpad": dict(seqlen_q=2, seqlen_new=2, head_dim=256, rotary_dim=160,
                              interleaved=False, leftpad=True),
    "d65_fp32_batch_idx": dict(seqlen_q=1, seqlen_new=65, head_dim=65, rotary_dim=64,
                               batch_idx=True, dtype=torch.float32),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_append_as_the_cpu_and_the_reference(sim, schedule, name):
    config = dict(batch=2, heads=8, heads_kv=2, seqlen_cache=300, seed=len(name))
    config.update(CASES[name])
    on_sim, on_cpu = Case(**config), Case(**config)
    _, launches = sim.launches(lambda: on_sim.check(sim.ops), "kv_append_kernel")
    on_cpu.call(torch.ops.flashattn)
    assert torch.equal(on_sim.k_cache, on_cpu.k_cache)
    assert torch.equal(on_sim.v_cache, on_cpu.v_cache)
    # A warp per row: the new keys (one row each for K and V's pair) and, with rotary, the
    # queries.
    rows = config["batch"] * config["seqlen_new"] * config["heads_kv"]
    if config["rotary_dim"]:
        rows += config["batch"] * config["seqlen_q"] * config["heads"]
    (launch,) = launches
    assert launch["grid"] == [math.ceil(rows / 4), 1, 1] and launch["block"] == [128, 1, 1]
