"""`python -m flashattn.bench context-parallel`: the ring (flashattn.distributed.
ring_flash_attn_func, zigzag) on P ranks against one process on the whole sequence.

On the CPU it spawns P gloo ranks of T threads each (--ranks, --threads) and compares them with
one process of P*T threads running flash_attn_func. Under torchrun (WORLD_SIZE in the
environment) every launched process is a rank: NCCL with one GPU per rank on CUDA, gloo on the
CPU, and rank 0 runs the single-process baseline while the others wait.

Per repeat, every rank starts at a barrier and the slowest rank's time counts. Besides the ring
it times, on the same ranks, the communication alone (the ring's sends and receives, waited for
one by one) and the computation alone (the ring's blocks on the local K/V, nothing sent). The
share of the communication that the ring hides is (t_comm + t_compute - t_ring) / t_comm,
clamped to [0, 1]. Medians of the repeats. It also reports CPU seconds (time.process_time, all
threads, the ranks' summed): they measure the ring's overhead even where other jobs share the
cores and make wall times noisy.
"""
import datetime
import json
import os
import statistics
import tempfile
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .common import dtype_name
from .options import positive_int

HELP = "the context-parallel ring on P ranks against one process on the whole sequence"
DESCRIPTION = ("The zigzag ring of flashattn.distributed on P ranks (gloo processes on the CPU; "
               "under torchrun, one process per GPU with NCCL) against flash_attn_func in one "
               "process on the whole sequence: wall and CPU time, the communication alone, the "
               "computation alone, and the share of the communication the ring hides.")
EPILOG = ("Defaults: CPU float32, B 1, S 8192, 8 heads of 64, causal, forward+backward, 2 ranks "
          "of 1 thread (--threads is per rank); CUDA (under torchrun) bfloat16, S 32768, 16 "
          "heads of 128. --quick: S 256, 2 heads of 32. On GPUs: torchrun --nproc-per-node P -m "
          "flashattn.bench context-parallel.")
PLOTS = None
MS_PER_S = 1e3


@dataclass(frozen=True)
class Settings:
    dtypes: tuple
    batch: int
    seqlen: int
    heads: int
    head_dim: int
    ranks: int
    threads: int
    causal: bool
    forward_only: bool
    repeats: int
    warmup: int


DEFAULTS = {
    "cpu": Settings(dtypes=(torch.float32,), batch=1, seqlen=8192, heads=8, head_dim=64,
                    ranks=2, threads=1, causal=True, forward_only=False, repeats=5, warmup=1),
    "cuda": Settings(dtypes=(torch.bfloat16,), batch=1, seqlen=32768, heads=16, head_dim=128,
                     ranks=2, threads=1, causal=True, forward_only=False, repeats=10, warmup=2),
}
QUICK = {"cpu": {"seqlen": 256, "heads": 2, "head_dim": 32},
         "cuda": {"seqlen": 4096, "heads": 4, "head_dim": 64}}


def add_arguments(parser):
    parser.add_argument("--seqlen", type=positive_int, metavar="N", help="global sequence length")
    parser.add_argument("--batch", type=positive_int, metavar="N")
    parser.add_argument("--heads", type=positive_int, metavar="N")
    parser.add_argument("--head-dim", type=positive_int, dest="head_dim", metavar="N")
    parser.add_argument("--ranks", type=positive_int, metavar="P",
                        help="gloo ranks to spawn on the CPU; under torchrun, its world size")
    parser.add_argument("--no-causal", dest="causal", action="store_const", const=False,
                        help="no causal mask (default: causal)")
    parser.add_argument("--forward-only", dest="forward_only", action="store_const", const=True,
                        help="time the forward alone (no autograd), not forward+backward")
    parser.add_argument("--warmup", type=int, metavar="N", help="untimed calls first")


def under_torchrun():
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ


# ---------------------------------------------------------------------------------------------
# What every rank (and the single process) runs.

def _inputs(settings, dtype, device):
    g = torch.Generator().manual_seed(0)
    shape = (settings.batch, settings.seqlen, settings.heads, settings.head_dim)
    return [torch.randn(shape, generator=g).to(dtype=dtype, device=device) for _ in range(4)]


def _step(settings, forward, backward):
    """The timed step: forward(), then backward(result); or forward() alone without autograd."""
    if settings.forward_only:
        def step():
            with torch.no_grad():
                forward()
    else:
        def step():
            backward(forward())
    return step


def _times(fn, settings, device, before=lambda: None):
    """[(wall seconds, CPU seconds of this process, all its threads)] of the timed calls; on CUDA
    each call is waited for, so its wall time is the GPU's."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times = []
    for i in range(settings.warmup + settings.repeats):
        before()
        sync()
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        sync()
        if i >= settings.warmup:
            times.append((time.perf_counter() - wall, time.process_time() - cpu))
    return times


def _medians(times):
    return {"wall": statistics.median(w for w, _ in times),
            "cpu": statistics.median(c for _, c in times)}


def single_process(settings, dtype, device):
    """flash_attn_func forward+backward on the whole sequence; on the CPU with ranks*threads
    threads."""
    from .. import flash_attn_func
    if device.type == "cpu":
        torch.set_num_threads(settings.ranks * settings.threads)
    q, k, v, dout = _inputs(settings, dtype, device)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    step = _step(settings, lambda: flash_attn_func(q, k, v, causal=settings.causal),
                 lambda out: out.backward(dout))
    return _medians(_times(step, settings, device))


def ring_measurements(settings, dtype, device):
    """On every rank of the default group: the ring, its computation alone and its
    communication alone, as medians of the slowest rank's wall time and of the ranks' CPU time
    summed."""
    from ..distributed import ring_flash_attn_func, shard
    from ..distributed.comm import RingStep
    from ..distributed.ring import _Config, _Plan, _RingAttention
    world, rank = dist.get_world_size(), dist.get_rank()
    if device.type == "cpu":
        torch.set_num_threads(settings.threads)
    q, k, v, dout = (shard(t, layout="zigzag") for t in _inputs(settings, dtype, device))
    q, k, v = (t.requires_grad_() for t in (q, k, v))

    def summary(times):
        wall = torch.tensor([w for w, _ in times], dtype=torch.float64, device=device)
        cpu = torch.tensor([c for _, c in times], dtype=torch.float64, device=device)
        dist.all_reduce(wall, op=dist.ReduceOp.MAX)
        dist.all_reduce(cpu, op=dist.ReduceOp.SUM)
        return {"wall": statistics.median(wall.tolist()), "cpu": statistics.median(cpu.tolist())}

    ring = _step(settings, lambda: ring_flash_attn_func(q, k, v, causal=settings.causal),
                 lambda out: out.backward(dout))

    window = (-1, 0) if settings.causal else (-1, -1)  # what the ring's plan skips by
    plan = _Plan(world, rank, "zigzag", window, seqlen_q=q.shape[1], seqlen_k=k.shape[1],
                 batch=q.shape[0], device=q.device)
    local = _Config(dist.group.WORLD, world, rank, plan, {"causal": settings.causal},
                    communicate=False)
    compute = _step(settings, lambda: _RingAttention.apply(q, k, v, local)[0],
                    lambda out: out.backward(dout))

    dkv = [torch.zeros(k.shape, dtype=torch.float32, device=device) for _ in range(2)]

    def communicate():  # the ring's transfers: K/V P-1 times each pass, dK/dV P times
        transfers = [((k, v), world - 1)]
        if not settings.forward_only:
            transfers += [((k, v), world - 1), (dkv, world)]
        for tensors, steps in transfers:
            for _ in range(steps):
                RingStep(dist.group.WORLD, world, rank, [t.detach() for t in tensors], 1).wait()

    return {name: summary(_times(fn, settings, device, dist.barrier))
            for name, fn in (("ring", ring), ("compute", compute), ("communicate", communicate))}


def _spawned_rank(rank, settings, dtype, rendezvous, result_path):
    dist.init_process_group("gloo", init_method="file://" + rendezvous, rank=rank,
                            world_size=settings.ranks, timeout=datetime.timedelta(seconds=600))
    try:
        result = ring_measurements(settings, dtype, torch.device("cpu"))
        if rank == 0:
            with open(result_path, "w") as f:
                json.dump(result, f)
    finally:
        dist.destroy_process_group()


def _spawn_ranks(settings, dtype):
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory() as tmp:
        result_path = os.path.join(tmp, "result.json")
        mp.spawn(_spawned_rank, args=(settings, dtype, os.path.join(tmp, "rendezvous"),
                                      result_path), nprocs=settings.ranks)
        with open(result_path) as f:
            return json.load(f)


def _measure(settings, dtype, device):
    """{"single", "ring", "compute", "communicate"}: medians of wall and CPU seconds. Spawned
    gloo ranks, or (under torchrun) this process's rank of the default group."""
    if not under_torchrun():
        single = single_process(settings, dtype, device)
        return {"single": single, **_spawn_ranks(settings, dtype)}
    single = single_process(settings, dtype, device) if dist.get_rank() == 0 else None
    dist.barrier()
    return {"single": single, **ring_measurements(settings, dtype, device)}


# ---------------------------------------------------------------------------------------------
# The subcommand.

def _start_torchrun_rank(run):
    """Joins the group torchrun launched: NCCL on this rank's GPU, or gloo on the CPU."""
    if run.device.type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=600))
    else:
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))


def _check(run):
    """The launcher's errors, before any process group starts."""
    if run.device.type == "cuda" and not under_torchrun():
        run.parser.error("--device cuda: the ring needs one process per GPU; run it under "
                         "torchrun: torchrun --nproc-per-node P -m flashattn.bench "
                         "context-parallel")
    if under_torchrun():
        world = int(os.environ["WORLD_SIZE"])
        if run.args.ranks is not None and run.args.ranks != world:
            run.parser.error(f"--ranks {run.args.ranks}: under torchrun the ranks are its "
                             f"{world} processes (--nproc-per-node)")


def _check_settings(run, settings):
    if settings.ranks < 2:
        run.parser.error(f"--ranks: a ring needs at least 2 ranks, got {settings.ranks}")
    chunks = 2 * settings.ranks
    if settings.seqlen % chunks:
        run.parser.error(f"--seqlen {settings.seqlen}: the zigzag layout cuts it into 2P = "
                         f"{chunks} equal chunks; choose a multiple of {chunks}")
    if settings.warmup < 0:
        run.parser.error(f"--warmup: must be >= 0, got {settings.warmup}")


def _lines(settings, dtype, result):
    single, ring = result["single"], result["ring"]
    wall = {name: result[name]["wall"] for name in ("ring", "compute", "communicate")}
    return [
        f"B {settings.batch} S {settings.seqlen} H {settings.heads} D {settings.head_dim} "
        f"{dtype_name(dtype)} {'causal' if settings.causal else 'full'} "
        f"{'forward' if settings.forward_only else 'forward+backward'}, medians of "
        f"{settings.repeats}; wall ms (CPU ms, all threads / ranks summed)",
        f"single process, {settings.ranks * settings.threads} threads: "
        f"{single['wall'] * MS_PER_S:9.1f} ({single['cpu'] * MS_PER_S:.1f})",
        f"ring, {settings.ranks} ranks x {settings.threads} thread(s): "
        f"{ring['wall'] * MS_PER_S:9.1f} ({ring['cpu'] * MS_PER_S:.1f}); "
        f"{result['ring_over_single_wall']:.3f}x the single process's wall time, "
        f"{result['ring_over_single_cpu']:.3f}x its CPU time",
        f"  its computation alone:   {wall['compute'] * MS_PER_S:9.1f} "
        f"({result['compute']['cpu'] * MS_PER_S:.1f})",
        f"  its communication alone: {wall['communicate'] * MS_PER_S:9.1f}; hidden by the "
        f"ring: {result['hidden']:.0%}",
    ]


def main(run):
    torchrun = under_torchrun()
    _check(run)
    if torchrun:
        _start_torchrun_rank(run)
        run.args.ranks = dist.get_world_size()
    settings = run.settings(DEFAULTS, QUICK)
    _check_settings(run, settings)
    leader = not torchrun or dist.get_rank() == 0
    if leader:
        run.print_headline("context-parallel ring vs one process on the whole sequence")
    results = []
    try:
        for dtype in settings.dtypes:
            if leader:
                run.progress.step(dtype_name(dtype))
            result = _measure(settings, dtype, run.device)
            if not leader:
                continue
            wall = {name: result[name]["wall"] for name in ("ring", "compute", "communicate")}
            hidden = (wall["communicate"] + wall["compute"] - wall["ring"]) / wall["communicate"]
            result.update(dtype=dtype_name(dtype),
                          ring_over_single_wall=wall["ring"] / result["single"]["wall"],
                          ring_over_single_cpu=result["ring"]["cpu"] / result["single"]["cpu"],
                          hidden=min(1.0, max(0.0, hidden)))
            run.print(*_lines(settings, dtype, result))
            results.append(result)
    finally:
        if torchrun:
            dist.destroy_process_group()
    if leader:
        # meta's own "threads" stays the single process's count; the ranks' is threads_per_rank.
        fields = {name: getattr(settings, name) for name in Settings.__dataclass_fields__
                  if name not in ("dtypes", "threads")}
        torch.set_num_threads(settings.ranks * settings.threads)
        run.write_report({**fields, "threads_per_rank": settings.threads,
                          "dtypes": [dtype_name(d) for d in settings.dtypes],
                          "launcher": "torchrun" if torchrun else "spawn"},
                         {"ring_over_single_wall": {r["dtype"]: r["ring_over_single_wall"]
                                                    for r in results}}, results)
    return 0


if __name__ == "__main__":
    import sys
    from .cli import main as cli_main
    sys.exit(cli_main(["context-parallel", *sys.argv[1:]]))
