"""Context parallelism on the CPU: the ring (flashattn.distributed.ring_flash_attn_func, zigzag)
on P gloo ranks of T threads each, against one process of P*T threads running flash_attn_func
on the whole sequence, forward+backward (or the forward alone, --forward-only).

    python -m flashattn.bench.context_parallel [--seqlen 8192] [--ranks 2] [--threads-per-rank 1]

Per repeat, every rank starts at a barrier and the slowest rank's time counts. Besides the
ring itself it times, on the same ranks, the communication alone (the ring's sends and
receives, waited for one by one) and the computation alone (the ring's blocks on the local
K/V, nothing sent); the share of the communication that the ring hides is
(t_comm + t_compute - t_ring) / t_comm, clamped to [0, 1]. Medians of the repeats. It also
reports CPU seconds (time.process_time, all threads; the ranks' summed), which measure the
ring's overhead even where other jobs share the cores and make wall times noisy.
On GPUs the same functions run under torchrun with NCCL (README, "Context parallelism").
"""
import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _inputs(args, dtype):
    g = torch.Generator().manual_seed(0)
    shape = (args.batch, args.seqlen, args.heads, args.head_dim)
    return [torch.randn(shape, generator=g).to(dtype) for _ in range(4)]


def _pass(args, forward, backward):
    """The timed step: forward(), then backward(result); or forward() alone without autograd."""
    if args.forward_only:
        def step():
            with torch.no_grad():
                forward()
    else:
        def step():
            backward(forward())
    return step


def _times(fn, repeats, warmup, sync=lambda: None):
    """[(wall seconds, CPU seconds of this process, all its threads)] of the timed calls."""
    times = []
    for i in range(warmup + repeats):
        sync()
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        if i >= warmup:
            times.append((time.perf_counter() - wall, time.process_time() - cpu))
    return times


def single_process(args):
    """flash_attn_func forward+backward on the whole sequence, ranks*threads threads."""
    from .. import flash_attn_func
    torch.set_num_threads(args.ranks * args.threads_per_rank)
    q, k, v, dout = _inputs(args, DTYPES[args.dtype])
    q, k, v = (t.requires_grad_() for t in (q, k, v))

    step = _pass(args, lambda: flash_attn_func(q, k, v, causal=args.causal),
                 lambda out: out.backward(dout))
    times = _times(step, args.repeats, args.warmup)
    return {"wall": statistics.median(w for w, _ in times),
            "cpu": statistics.median(c for _, c in times)}


def _worker(rank, args, rendezvous, result_path):
    from ..distributed import ring_flash_attn_func, shard
    from ..distributed.comm import RingStep
    from ..distributed.ring import _Config, _Plan, _RingAttention
    torch.set_num_threads(args.threads_per_rank)
    dist.init_process_group("gloo", init_method="file://" + rendezvous, rank=rank,
                            world_size=args.ranks, timeout=datetime.timedelta(seconds=600))
    world = args.ranks
    q, k, v, dout = (shard(t, layout="zigzag") for t in _inputs(args, DTYPES[args.dtype]))
    q, k, v = (t.requires_grad_() for t in (q, k, v))

    def summary(times):
        """Medians of the slowest rank's wall time and of the ranks' CPU time summed."""
        wall = torch.tensor([w for w, _ in times], dtype=torch.float64)
        cpu = torch.tensor([c for _, c in times], dtype=torch.float64)
        dist.all_reduce(wall, op=dist.ReduceOp.MAX)
        dist.all_reduce(cpu, op=dist.ReduceOp.SUM)
        return {"wall": statistics.median(wall.tolist()), "cpu": statistics.median(cpu.tolist())}

    ring = _pass(args, lambda: ring_flash_attn_func(q, k, v, causal=args.causal),
                 lambda out: out.backward(dout))

    window = (-1, 0) if args.causal else (-1, -1)  # what the ring's plan skips by
    plan = _Plan(world, rank, "zigzag", window, seqlen_q=q.shape[1], seqlen_k=k.shape[1],
                 batch=q.shape[0], device=q.device)
    local = _Config(dist.group.WORLD, world, rank, plan, {"causal": args.causal},
                    communicate=False)

    compute = _pass(args, lambda: _RingAttention.apply(q, k, v, local)[0],
                    lambda out: out.backward(dout))

    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    dkv = [torch.zeros(k.shape, dtype=acc) for _ in range(2)]

    def communicate():  # the ring's transfers: K/V P-1 times each pass, dK/dV P times
        transfers = [((k, v), world - 1)]
        if not args.forward_only:
            transfers += [((k, v), world - 1), (dkv, world)]
        for tensors, steps in transfers:
            for _ in range(steps):
                RingStep(dist.group.WORLD, world, rank, [t.detach() for t in tensors], 1).wait()

    barrier = dist.barrier
    result = {name: summary(_times(fn, args.repeats, args.warmup, barrier))
              for name, fn in (("ring", ring), ("compute", compute),
                               ("communicate", communicate))}
    if rank == 0:
        with open(result_path, "w") as f:
            json.dump(result, f)
    dist.destroy_process_group()


def context_parallel(args):
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory() as tmp:
        result_path = os.path.join(tmp, "result.json")
        mp.spawn(_worker, args=(args, os.path.join(tmp, "rendezvous"), result_path),
                 nprocs=args.ranks)
        with open(result_path) as f:
            return json.load(f)


def parse(argv):
    parser = argparse.ArgumentParser(prog="python -m flashattn.bench.context_parallel",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--seqlen", type=int, default=8192, help="global sequence length")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--threads-per-rank", type=int, default=1)
    parser.add_argument("--no-causal", dest="causal", action="store_false")
    parser.add_argument("--forward-only", action="store_true",
                        help="time the forward alone (no autograd), not forward+backward")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse(sys.argv[1:] if argv is None else argv)
    single = single_process(args)
    cp = context_parallel(args)
    wall = {name: t["wall"] for name, t in cp.items()}
    hidden = (wall["communicate"] + wall["compute"] - wall["ring"]) / wall["communicate"]
    print(f"B {args.batch} S {args.seqlen} H {args.heads} D {args.head_dim} {args.dtype} "
          f"{'causal' if args.causal else 'full'} "
          f"{'forward' if args.forward_only else 'forward+backward'}, medians of {args.repeats}; "
          f"wall ms (CPU ms, all threads / ranks summed)")
    print(f"single process, {args.ranks * args.threads_per_rank} threads: "
          f"{single['wall'] * 1e3:9.1f} ({single['cpu'] * 1e3:.1f})")
    ring = cp["ring"]
    print(f"ring, {args.ranks} ranks x {args.threads_per_rank} thread(s): "
          f"{ring['wall'] * 1e3:9.1f} ({ring['cpu'] * 1e3:.1f}); "
          f"{ring['wall'] / single['wall']:.3f}x the single process's wall time, "
          f"{ring['cpu'] / single['cpu']:.3f}x its CPU time")
    print(f"  its computation alone:   {wall['compute'] * 1e3:9.1f} "
          f"({cp['compute']['cpu'] * 1e3:.1f})")
    print(f"  its communication alone: {wall['communicate'] * 1e3:9.1f}; hidden by the ring: "
          f"{min(1.0, max(0.0, hidden)):.0%}")
    return {"single": single, **cp}


if __name__ == "__main__":
    main()
