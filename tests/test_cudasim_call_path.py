"""The CUDA call path's cost in launches, device-to-host syncs and allocations (issue 29, "a lean
call path"), on the shim: torch.ops.flashattn_sim runs the CUDA executor's own host code
(csrc/cuda/executor.h, plan_*.h, launch_plan.h, launch_*.cuh, the shared csrc/*.cpp), so what it
launches and which ATen ops it calls are what torch.ops.flashattn does on a GPU.

Launches are the shim's counters (tests/cudasim/README.md, "Counters": one record per kernel
launch). ATen ops are the torch profiler's events nested under the op, which it records for the
C++ calls too. Every ATen op that runs a kernel on a GPU (fill_, zero_, add, copy_) is a launch
as well, so the totals below are kernel launches + such ATen ops.

No device-to-host sync: on CUDA a sync comes from
  - the CUDA runtime (cudaMemcpy, cudaStreamSynchronize, cudaDeviceSynchronize, ...): the shim
    (tests/cudasim/cudasim.h) defines none of them, so host code that called one would not
    compile into the sim extension at all; test_host_code_has_no_sync_calls also greps for them;
  - an ATen op that reads device memory on the host (item, _local_scalar_dense, nonzero,
    tolist, a copy to the CPU): asserted absent from the profiled op trees below;
  - host code that reads a CUDA tensor through data_ptr (cu_seqlens, seqused, cache_seqlens,
    block_table values): on CUDA those checks are off (ExecutorLimits::reads_lengths_on_host),
    which test_host_reads_of_lengths_are_behind_reads_lengths_on_host checks in the source.

The counts are measured in a subprocess with FLASHATTN_POISON_OUTPUTS=0, the production
setting: conftest.py turns poisoning on, which adds a NaN fill_ per output and workspace.
"""
import json
import os
import re
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
TIMEOUT_S = 600

# ATen ops that read device memory on the host, i.e. synchronize on CUDA.
SYNC_OPS = {"aten::item", "aten::_local_scalar_dense", "aten::nonzero", "aten::nonzero_static",
            "aten::is_nonzero", "aten::equal", "aten::tolist", "aten::allclose",
            "aten::unique", "aten::_unique2", "aten::masked_select"}
# Copies: to the CPU they sync. The shim's tensors are all CPU tensors, so any copy the op makes
# itself is refused; one ATen makes inside aten::add for its wrapped Python-scalar operand (the
# `cache_seqlens + S_new` of fwd_kvcache) is host-to-host on CUDA too and is allowed there.
COPY_OPS = {"aten::to", "aten::_to_copy", "aten::copy_", "aten::cpu", "aten::_copy_from"}
COPY_ALLOWED_UNDER = {"aten::add"}
ALLOC_OPS = {"aten::empty", "aten::empty_strided", "aten::empty_like", "aten::zeros",
             "aten::zeros_like", "aten::full", "aten::ones", "aten::new_empty",
             "aten::new_zeros", "aten::new_full", "aten::empty_permuted"}
# ATen ops that launch a kernel on a GPU (the ones these ops call; views launch nothing).
KERNEL_OPS = {"aten::fill_", "aten::zero_", "aten::add", "aten::copy_", "aten::mul",
              "aten::sub", "aten::index", "aten::cumsum", "aten::sum", "aten::clamp"}


# ---- measured in a subprocess (see the module docstring) ----

def _cases(torch):
    """name -> (op name, args, kwargs): tiny shapes, so the whole set runs in seconds."""
    g = torch.Generator().manual_seed(29)
    h = torch.float16

    def r(*shape, dtype=h):
        return torch.randn(*shape, generator=g, dtype=dtype)

    q, k, v = r(2, 16, 4, 64), r(2, 16, 2, 64), r(2, 16, 2, 64)
    cu = torch.tensor([0, 5, 16], dtype=torch.int32)
    # Paged: 4 blocks of 8 rows, 2 per sequence.
    kp, vp = r(4, 8, 2, 64), r(4, 8, 2, 64)
    table = torch.tensor([[2, 0], [1, 3]], dtype=torch.int32)
    # A KV cache for decoding: 2 sequences of 10 and 20 tokens out of 64, one new token each.
    q1 = r(2, 1, 4, 64)
    kc, vc = r(2, 64, 2, 64), r(2, 64, 2, 64)
    kn, vn = r(2, 1, 2, 64), r(2, 1, 2, 64)
    seqlens = torch.tensor([10, 20], dtype=torch.int32)
    cases = {
        "fwd_dense": ("fwd", (q, k, v), dict(causal=True)),
        "fwd_dense_fp32": ("fwd", (q.float(), k.float(), v.float()), {}),
        "fwd_gqa_decode": ("fwd", (q1, kc, vc), {}),
        "fwd_seqused_k": ("fwd", (q1, kc, vc), dict(seqused_k=seqlens)),
        "fwd_varlen": ("fwd", (q[0], k[0], v[0]),
                       dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=11, max_seqlen_k=11,
                            causal=True)),
        "fwd_paged": ("fwd", (q, kp, vp), dict(block_table=table)),
        "kvcache": ("fwd_kvcache", (q1, kc.clone(), vc.clone()),
                    dict(cache_seqlens=seqlens, num_splits=1)),
        "kvcache_append": ("fwd_kvcache", (q1, kc.clone(), vc.clone(), kn, vn),
                           dict(cache_seqlens=seqlens, num_splits=1)),
        "kvcache_append_splits": ("fwd_kvcache", (q1, kc.clone(), vc.clone(), kn, vn),
                                  dict(cache_seqlens=seqlens, num_splits=3)),
    }
    # The backward, from a forward's outputs.
    ops = torch.ops.flashattn_sim
    for name, (qq, kk, vv), kwargs in (
            ("bwd", (q, k, v), dict(causal=True)),
            ("bwd_deterministic", (q, k, v), dict(causal=True, deterministic=True)),
            ("bwd_fp32", (q.float(), k.float(), v.float()), {}),
            ("bwd_varlen", (q[0], k[0], v[0]),
             dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=11, max_seqlen_k=11))):
        fwd_kwargs = {key: val for key, val in kwargs.items() if key != "deterministic"}
        out, lse = ops.fwd(qq, kk, vv, **fwd_kwargs)
        cases[name] = ("bwd", (torch.randn(out.shape, generator=g, dtype=out.dtype), out, lse,
                               None, qq, kk, vv), kwargs)
    return cases


def _kernel_name(signature):
    """'void flashattn::cuda::fwd_kernel_16bit<...>(...)' -> 'fwd_kernel_16bit'."""
    head = signature.split("(")[0]
    head = re.sub(r"<.*", "", head)
    return head.split("::")[-1]


def _measure():
    """Runs every case once, counted and profiled; prints {case: record} as JSON."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    sys.path.insert(0, HERE)
    from sim_ext import build
    build.load()
    ops = torch.ops.flashattn_sim
    results = {}
    for name, (op_name, args, kwargs) in _cases(torch).items():
        op = getattr(ops, op_name)
        op(*args, **kwargs)  # warm: one-time statics are not per-call costs
        ops.counters_enable(True)
        ops.counters_reset()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            op(*args, **kwargs)
        ops.counters_enable(False)
        launches = [_kernel_name(launch["kernel"])
                    for launch in json.loads(ops.counters_json())["launches"]]
        top = [e for e in prof.events() if e.name == "flashattn_sim::" + op_name]
        assert len(top) == 1, [e.name for e in prof.events()]
        nested = []

        def walk(event, depth):
            for child in event.cpu_children:
                nested.append({"name": child.name, "parent": event.name, "depth": depth})
                walk(child, depth + 1)

        walk(top[0], 0)
        results[name] = {"launches": launches, "aten": nested}
    ops.counters_reset()
    print(json.dumps(results))


@pytest.fixture(scope="module")
def measured():
    sys.path.insert(0, HERE)
    from sim_ext import build
    if build.cudasim_build.cuda_include_dir() is None:
        pytest.skip("the sim extension needs cuda_fp16.h / vector_types.h (set CUDA_HOME)")
    env = dict(os.environ, FLASHATTN_POISON_OUTPUTS="0", PYTHONPATH=HERE)
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--measure"],
                          capture_output=True, text=True, env=env, timeout=TIMEOUT_S, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def top_level(record, names):
    """The ATen ops in `names` the op calls itself (depth 0), in order."""
    return [e["name"] for e in record["aten"] if e["depth"] == 0 and e["name"] in names]


# ---- launches ----

FWD = "fwd_kernel_16bit"
# case -> (the shim's kernel launches in order, the ATen ops that launch a kernel on a GPU).
# A forward without splits is one kernel; what else each case launches, and why:
#   - varlen, seqused_k and every fwd_kvcache with cache_seqlens: out.fill_(0) and
#     lse.fill_(-inf) (attn_args.cpp, prepare_output: has_rows_outside_sequences), for rows no
#     kernel writes. For varlen those rows exist (past cu_seqlens[-1]); a seqused_k alone
#     leaves none (every query row is written, lse -inf where it sees no key), so for
#     seqused_k / cache_seqlens the two fills are needless (issue 29: reported, shared host
#     code, not changed here).
#   - fwd_kvcache with k, v: aten::add (seqused_k = cache_seqlens + S_new, kvcache_args.cpp),
#     then kv_append_kernel, then the forward.
#   - num_splits > 1: the forward, then split_merge_kernel. The split scratch is filled (zero_
#     and fill_ -inf) only where rows outside every sequence exist (varlen, seqused_q), which
#     no split writes; otherwise every split writes its part of every row (executor.h).
EXPECTED_LAUNCHES = {
    "fwd_dense": ([FWD], []),
    "fwd_dense_fp32": (["simt_fwd_kernel"], []),
    "fwd_gqa_decode": ([FWD], []),
    "fwd_seqused_k": ([FWD], ["aten::fill_", "aten::fill_"]),
    "fwd_varlen": ([FWD], ["aten::fill_", "aten::fill_"]),
    "fwd_paged": ([FWD], []),
    "kvcache": ([FWD], ["aten::fill_", "aten::fill_"]),
    "kvcache_append": (["kv_append_kernel", FWD], ["aten::add", "aten::fill_", "aten::fill_"]),
    "kvcache_append_splits": (["kv_append_kernel", FWD, "split_merge_kernel"],
                              ["aten::add", "aten::fill_", "aten::fill_"]),
    # The backward (launch_bwd.cuh, launch_simt.cuh): three kernels, whatever the shape:
    # D_i = rowsum(dO * O) (zeroing the dQ accumulator), dK/dV per key tile, then dQ (the
    # accumulator converted, or the deterministic / fp32 dQ kernel). Varlen fills dq, dk, dv
    # with 0 first for the rows outside sequences.
    "bwd": (["bwd_dot_do_o_kernel", "bwd_dkdv_kernel_16bit", "bwd_convert_dq_kernel"], []),
    "bwd_deterministic": (["bwd_dot_do_o_kernel", "bwd_dkdv_kernel_16bit",
                           "bwd_dq_kernel_16bit"], []),
    "bwd_fp32": (["bwd_dot_do_o_kernel", "simt_dkdv_kernel", "simt_dq_kernel"], []),
    "bwd_varlen": (["bwd_dot_do_o_kernel", "bwd_dkdv_kernel_16bit", "bwd_convert_dq_kernel"],
                   ["aten::fill_", "aten::fill_", "aten::fill_"]),
}
# The backward's bound, on any input: 3 kernels (+ the varlen fills).
MAX_BWD_KERNELS = 3


@pytest.mark.parametrize("case", sorted(EXPECTED_LAUNCHES))
def test_launches(measured, case):
    kernels, aten_kernels = EXPECTED_LAUNCHES[case]
    record = measured[case]
    assert record["launches"] == kernels
    assert top_level(record, KERNEL_OPS) == aten_kernels
    if case.startswith("bwd"):
        assert len(record["launches"]) <= MAX_BWD_KERNELS


def test_forward_without_splits_is_one_kernel(measured):
    for case, record in measured.items():
        if case.startswith("fwd_"):
            assert record["launches"] == [FWD if "fp32" not in case else "simt_fwd_kernel"], case


# ---- no device-to-host sync ----

@pytest.mark.parametrize("case", sorted(EXPECTED_LAUNCHES))
def test_no_sync_ops(measured, case):
    events = measured[case]["aten"]
    syncs = [e for e in events if e["name"] in SYNC_OPS]
    copies = [e for e in events
              if e["name"] in COPY_OPS and not _under(events, e, COPY_ALLOWED_UNDER)]
    assert syncs == [] and copies == [], events


def _under(events, event, parents):
    """Whether `event` is nested (at any depth) under an op in `parents`."""
    index = events.index(event)
    depth = event["depth"]
    for earlier in reversed(events[:index]):
        if earlier["depth"] < depth:
            if earlier["name"] in parents:
                return True
            depth = earlier["depth"]
    return False


# ---- allocations ----

@pytest.mark.parametrize("case", [c for c in sorted(EXPECTED_LAUNCHES) if c.startswith("fwd")])
def test_forward_allocates_only_its_outputs(measured, case):
    assert top_level(measured[case], ALLOC_OPS) == ["aten::empty", "aten::empty"]  # out, lse


# fwd_kvcache: out and lse; with k, v the add's result (the lengths with the new tokens); with
# splits the scratch.
EXPECTED_KVCACHE_ALLOCS = {"kvcache": 2, "kvcache_append": 2, "kvcache_append_splits": 3}


@pytest.mark.parametrize("case", sorted(EXPECTED_KVCACHE_ALLOCS))
def test_kvcache_allocations(measured, case):
    assert top_level(measured[case], ALLOC_OPS) == ["aten::empty"] * EXPECTED_KVCACHE_ALLOCS[case]


@pytest.mark.parametrize("case", [c for c in sorted(EXPECTED_LAUNCHES) if c.startswith("bwd")])
def test_backward_allocates_outputs_and_one_workspace(measured, case):
    # dq, dk, dv (check_and_alloc_bwd), then the fp32 workspace (executor.h): D_i and, for the
    # 16-bit non-deterministic kernels, the dQ accumulator.
    assert top_level(measured[case], ALLOC_OPS) == ["aten::empty"] * 4


# ---- the source: no sync calls, no host reads of device lengths ----

def _host_sources():
    csrc = os.path.join(REPO, "csrc")
    paths = [os.path.join(csrc, n) for n in sorted(os.listdir(csrc)) if n.endswith((".h", ".cpp"))]
    cuda = os.path.join(csrc, "cuda")
    paths += [os.path.join(cuda, n) for n in sorted(os.listdir(cuda))
              if n.endswith((".h", ".cu", ".cuh"))]
    return paths


def _code_lines(path):
    """(line number, line without // comments)."""
    with open(path) as f:
        for number, line in enumerate(f, start=1):
            yield number, line.split("//", 1)[0]


SYNC_PATTERNS = re.compile(
    r"\bcuda(Memcpy\w*|StreamSynchronize|DeviceSynchronize|EventSynchronize|StreamQuery|"
    r"ThreadSynchronize)\b|\.item\s*[<(]|\.cpu\s*\(|\btolist\b|_local_scalar_dense|"
    r"\.to\s*\(\s*(at::)?(kCPU|Device)|\bnonzero\b")


def test_host_code_has_no_sync_calls():
    found = [f"{os.path.relpath(path, REPO)}:{number}: {line.strip()}"
             for path in _host_sources() for number, line in _code_lines(path)
             if SYNC_PATTERNS.search(line)]
    assert found == []


# A host read of a tensor's values: indexing a data_ptr, or keeping an int pointer to index.
HOST_READ = re.compile(r"data_ptr<\w+>\(\)\s*\[|const int\*\s*\w+\s*=\s*[\w.\->*]*data_ptr<int>")
# Writes of device pointers into the parameter structs are not reads.
POINTER_TO_PARAMS = re.compile(r"^\s*(p|c|view)\.\w+(\.\w+)*\s*=")
GUARD = "reads_lengths_on_host"


def _functions(path):
    """[(name, [(line number, code)])] of the top-level functions of a C++ file."""
    functions, current, name = [], None, None
    for number, line in _code_lines(path):
        if current is None:
            match = re.match(r"^[A-Za-z][\w:<>,*& ]*?\b(\w+)\(", line)
            if match and not line.startswith(("namespace", "struct", "class", "template")):
                name, current = match.group(1), []
        if current is not None:
            current.append((number, line))
            if line.startswith("}"):
                functions.append((name, current))
                current = None
    return functions


def test_host_reads_of_lengths_are_behind_reads_lengths_on_host():
    """Every host read of a tensor's values in the shared csrc/*.cpp either follows
    `if (!limits.reads_lengths_on_host) return;` in its function, or is in a function whose every
    call is guarded so (false on CUDA: csrc/cuda/executor.h)."""
    csrc = os.path.join(REPO, "csrc")
    paths = [os.path.join(csrc, n) for n in sorted(os.listdir(csrc)) if n.endswith(".cpp")]
    functions = {os.path.relpath(p, REPO): _functions(p) for p in paths}
    readers = {}  # function -> where it reads without a guard of its own
    for path, funcs in functions.items():
        for name, lines in funcs:
            guarded_from = next((n for n, line in lines if GUARD in line and "return" in line),
                                None)
            for number, line in lines:
                if HOST_READ.search(line) and not POINTER_TO_PARAMS.search(line):
                    if guarded_from is None or number < guarded_from:
                        readers.setdefault(name, []).append(f"{path}:{number}")
    assert readers, "the pattern no longer finds the CPU executor's host checks"
    unguarded = []
    for reader, where in readers.items():
        calls = 0
        for path, funcs in functions.items():
            for name, lines in funcs:
                if name == reader:
                    continue
                guarded_from = next((n for n, line in lines if GUARD in line and "return" in line),
                                    None)
                for number, line in lines:
                    if re.search(rf"\b{reader}\(", line):
                        calls += 1
                        if GUARD not in line and (guarded_from is None or number < guarded_from):
                            unguarded.append(f"{path}:{number} calls {reader} ({where})")
        assert calls, f"{reader} ({where}) reads tensor values and is never called"
    assert unguarded == []


def test_executor_reads_no_lengths_on_host():
    with open(os.path.join(REPO, "csrc", "cuda", "executor.h")) as f:
        assert "/*reads_lengths_on_host=*/false" in f.read()


if __name__ == "__main__" and sys.argv[1:] == ["--measure"]:
    _measure()
