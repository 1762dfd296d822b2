"""The process group a call runs on, and argument checks shared by the context-parallel
functions. Every error names the function, the argument, what was expected and what was given."""
import torch
import torch.distributed as dist

LAYOUTS = ("zigzag", "contiguous")


def resolve(fn, group):
    """(group, world size P, this process's rank in it). None is the default group."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(f"{fn}: torch.distributed is not initialized; call "
                           f"torch.distributed.init_process_group first")
    if group is None:
        group = dist.group.WORLD
    return group, dist.get_world_size(group), dist.get_rank(group)


def check_layout(fn, layout):
    if layout not in LAYOUTS:
        raise ValueError(f"{fn}: layout must be one of {LAYOUTS}, got {layout!r}")


def chunks_per_rank(layout):
    """Chunks of the global sequence each rank holds: 2 (head and tail) or 1."""
    return 2 if layout == "zigzag" else 1


def check_divides(fn, what, length, world, layout):
    """A length that the layout cannot cut into equal chunks is a ValueError that names it."""
    pieces = world * chunks_per_rank(layout)
    if length % pieces != 0:
        raise ValueError(
            f"{fn}: {what} is {length}, which does not divide into {pieces} equal chunks "
            f"(layout={layout!r} with {world} ranks cuts each sequence into {pieces}); pad it "
            f"to a multiple of {pieces}")


def check_tensor(fn, name, t, dims, layout_text):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{fn}: {name} must be a tensor {layout_text}, got {type(t).__name__}")
    if t.dim() != dims:
        raise ValueError(f"{fn}: {name} must be {dims}-D {layout_text}, got shape "
                         f"{tuple(t.shape)}")


def check_qkv(fn, q, k, v, varlen):
    """Shapes of local q, k, v: (B, S_local, H, D) or (total_local, H, D); heads of q a
    multiple of heads of k; k and v alike."""
    dims = 3 if varlen else 4
    text = "(total_local, heads, head_dim)" if varlen else "(batch, seqlen_local, heads, head_dim)"
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(fn, name, t, dims, text)
    if k.shape != v.shape:
        raise ValueError(f"{fn}: k and v must have the same shape, got {tuple(k.shape)} and "
                         f"{tuple(v.shape)}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"{fn}: q and k must have the same head_dim, got {q.shape[-1]} and "
                         f"{k.shape[-1]}")
    if not varlen and q.shape[0] != k.shape[0]:
        raise ValueError(f"{fn}: q and k must have the same batch size, got {q.shape[0]} and "
                         f"{k.shape[0]}")
    heads, heads_kv = q.shape[-2], k.shape[-2]
    if heads_kv == 0 or heads % heads_kv != 0:
        raise ValueError(f"{fn}: the heads of q ({heads}) must be a multiple of the heads of k "
                         f"and v ({heads_kv})")
    if q.dtype != k.dtype or q.dtype != v.dtype:
        raise ValueError(f"{fn}: q, k and v must have the same dtype, got {q.dtype}, {k.dtype} "
                         f"and {v.dtype}")


def window_pair(fn, window_size):
    try:
        left, right = (int(w) for w in window_size)
    except (TypeError, ValueError):
        raise ValueError(f"{fn}: window_size must be a pair of ints (left, right), -1 meaning "
                         f"unbounded, got {window_size!r}") from None
    return left, right


def real(fn, name, value):
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return float(value)
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{fn}: {name} must be a real number, got {value!r}") from None
