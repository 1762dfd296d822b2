"""The conventions every subcommand of `python -m flashattn.bench` shares: the directions of a
case, the FLOP count of attention, the names of dtypes and of an implementation that cannot run.
"""
MODES = ("fwd", "fwdbwd")
MODE_TITLES = {"fwd": "forward", "fwdbwd": "forward+backward"}
NOT_AVAILABLE = "n/a"

# FlashAttention's FLOP convention: the forward is two (Sq x Sk x d) matmuls of 2 FLOPs per
# multiply-add, halved under a causal mask when Sq == Sk; the backward does 2.5x the forward.
FWD_FLOPS_PER_QKD = 4
BWD_FLOPS_PER_FWD = 2.5
FLOPS_PER_TFLOP = 1e12


def attention_flops(mode, causal, heads, head_dim, lengths):
    """FlashAttention's convention summed over sequences of the given lengths (Sq == Sk each)."""
    forward = sum(FWD_FLOPS_PER_QKD * heads * length ** 2 * head_dim for length in lengths)
    if causal:
        forward /= 2
    return forward * (1 + BWD_FLOPS_PER_FWD) if mode == "fwdbwd" else forward


def dtype_name(dtype):
    return str(dtype).replace("torch.", "")
