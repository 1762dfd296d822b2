"""Building a test kernel for sm_90a into a shared library that ctypes loads on an H100/H200
(hopper_gemm.py, hopper_fwd.py, hopper_fp8_fwd.py, hopper_bwd.py), timing a call on the GPU, and what the attention
runners share: their torch reference and their TFLOP/s rows beside SDPA.

A build is cached in build/cudasim under the hash of its inputs and flags. It is refused when
ptxas reports C7508 (setmaxnreg without a known entry register count), C7520 (wgmma serialized),
a spill or a stack frame, or (where cuobjdump is at hand) when the SASS lacks an instruction the
kernel is about or touches local memory.
"""
import argparse
import glob
import math
import os
import re
import subprocess

import build
from layout_check import nvcc_path

BUILD_DIR = build.DEFAULT_BUILD_DIR
CUDA_DIR = os.path.join(build.REPO_ROOT, "csrc", "cuda")


def library_headers(*subdirs):
    """csrc/cuda's *.cuh and *.h, and every file of csrc/cuda/<subdir>: what a build depends on."""
    return sorted(glob.glob(os.path.join(CUDA_DIR, "*.cuh")) + glob.glob(os.path.join(CUDA_DIR, "*.h"))
                  + [f for d in subdirs for f in glob.glob(os.path.join(CUDA_DIR, d, "*"))])


def build_library(source, name, sass_ops, inputs=(), include_dirs=()):
    """(path, ptxas log) of `source` built for sm_90a as build/cudasim/<name>_sm90a.<hash>.so;
    raises SystemExit on a failed or unfit build. `inputs`: the files it depends on besides
    itself; `sass_ops`: the SASS instructions it must hold."""
    nvcc = nvcc_path()
    if nvcc is None:
        raise SystemExit("nvcc not found: set CUDA_HOME")
    flags = ["-gencode=arch=compute_90a,code=sm_90a", "-std=c++17", "-O3", "-shared",
             "-Xcompiler", "-fPIC", "-Xptxas", "-v"]
    for directory in (*include_dirs, os.path.join(build.REPO_ROOT, "csrc")):
        flags += ["-I", directory]
    os.makedirs(BUILD_DIR, exist_ok=True)
    lib = os.path.join(BUILD_DIR,
                       f"{name}_sm90a.{build.digest([source, *inputs], [nvcc] + flags)}.so")
    log_path = lib + ".ptxas.txt"
    if not os.path.exists(lib) or not os.path.exists(log_path):
        out = subprocess.run([nvcc, *flags, source, "-o", lib + ".tmp"], capture_output=True,
                             text=True)
        log = out.stdout + out.stderr
        if out.returncode != 0:
            raise SystemExit(f"nvcc failed:\n{log}")
        problems = [line for line in log.splitlines()
                    if "C7508" in line or "C7520" in line
                    or re.search(r"[1-9]\d* bytes (spill stores|spill loads|stack frame)", line)]
        if problems:
            raise SystemExit("ptxas:\n" + "\n".join(problems))
        problem = sass_problems(lib + ".tmp", sass_ops)
        if problem:
            raise SystemExit(problem)
        with open(log_path, "w") as f:
            f.write(log)
        os.replace(lib + ".tmp", lib)
    with open(log_path) as f:
        return lib, f.read()


def attention_runner_start(description, source, name, sass_ops):
    """The opening of hopper_fwd.py's and hopper_bwd.py's main: parses --iters, --compile-only
    and --ptxas, builds `source` against csrc/cuda (hopper/ included) and prints ptxas's summary
    if asked. Returns (args, library path), or None where main should stop and exit 0: after a
    --compile-only build, or (printing SKIP) without a compute capability 9.0 GPU."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--ptxas", action="store_true")
    args = parser.parse_args()
    lib_path, log = build_library(source, name, sass_ops, library_headers("hopper"))
    if args.ptxas:
        print("\n".join(ptxas_summary(log)))
    if args.compile_only:
        print(f"built {lib_path}")
        return None
    if not on_sm90():
        return None
    return args, lib_path


def sass_tool(name):
    """cuobjdump / nvdisasm: beside nvcc, or where .ci/cuda_gates.py pip-installs them."""
    candidates = [os.path.join(os.path.dirname(nvcc_path()), name)] + sorted(glob.glob(
        os.path.expanduser(f"~/.cache/flashattn-ci/{name}/nvidia/cu*/bin/{name}")))
    return next((c for c in candidates if os.path.isfile(c)), None)


def sass_problems(lib, sass_ops):
    """"" if the SASS holds every op of sass_ops and no local-memory access (or cuobjdump is not
    at hand)."""
    cuobjdump, nvdisasm = sass_tool("cuobjdump"), sass_tool("nvdisasm")
    if cuobjdump is None:
        return ""
    env = dict(os.environ)
    if nvdisasm is not None:
        env["PATH"] = os.path.dirname(nvdisasm) + os.pathsep + env.get("PATH", "")
    out = subprocess.run([cuobjdump, "-sass", lib], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        return ""
    missing = [op for op in sass_ops if op not in out.stdout]
    local = re.findall(r"\b(?:STL|LDL)\b", out.stdout)
    problems = []
    if missing:
        problems.append(f"SASS lacks {', '.join(missing)}")
    if local:
        problems.append(f"SASS uses local memory ({len(local)} STL/LDL)")
    return "; ".join(problems)


def ptxas_summary(log):
    """One line per kernel: its template arguments, registers, spills, shared memory."""
    lines, name = [], None
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '(\S+)'", line)
        if m:
            name = m.group(1)
        if name and ("registers" in line or "spill" in line):
            lines.append(f"{name}: {line.split('ptxas info    :')[-1].strip()}")
    return lines


def seconds_per_call(fn, iters, warmup=3):
    """fn()'s mean GPU time over `iters` calls on the current stream (CUDA events), after
    `warmup` calls."""
    import torch
    for _ in range(warmup):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters * 1e-3


def torch_attention(q, k, v, causal, softcap=0.0, window=None):
    """Attention by plain torch ops in the inputs' dtype, differentiable: q (batch, seqlen_q,
    heads_q, d), k and v (batch, seqlen_k, heads_kv, d) with heads_q a multiple of heads_kv;
    causal and window (left, right; -1 unbounded) bottom-right aligned. Returns O like q and the
    LSE (batch, heads_q, seqlen_q) in float32 (float64 for float64 inputs); fully masked rows
    give O = 0 and LSE = -inf."""
    import torch
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    g = qt.shape[1] // kt.shape[1]
    kt, vt = kt.repeat_interleave(g, 1), vt.repeat_interleave(g, 1)
    s = (qt @ kt.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    if softcap > 0:
        s = torch.tanh(s / softcap) * softcap
    sq, sk = s.shape[-2:]
    keep = torch.ones(sq, sk, dtype=torch.bool, device=s.device)
    if causal:
        keep = keep.tril(sk - sq)
    if window:
        left, right = window
        if right >= 0:
            keep = keep.tril(sk - sq + right)
        if left >= 0:
            keep = keep.triu(sk - sq - left)
    s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s if s.dtype == torch.float64 else s.float(), -1)
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return (p @ vt).transpose(1, 2), lse


def tflops_row(label, flops, ours, sdpa, iters):
    """A printed row "<label> hopper X cudnn Y flash Z TFLOP/s": ours() timed, and the call that
    sdpa() returns timed under SDPA's cuDNN and flash backends (sdpa() runs inside the backend's
    context, so a backward times the backend's own graph); a backend that refuses reads n/a."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    row = [label, f"hopper {flops / seconds_per_call(ours, iters) / 1e12:.0f}"]
    for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
        try:
            with sdpa_kernel(backend):
                t = seconds_per_call(sdpa(), iters)
            row.append(f"{name} {flops / t / 1e12:.0f}")
        except RuntimeError as e:
            row.append(f"{name} n/a ({str(e).splitlines()[0][:60]})")
    print(" ".join(row) + " TFLOP/s")


def on_sm90():
    """Whether torch sees a GPU of compute capability 9.0; prints SKIP if not."""
    import torch
    if torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0):
        return True
    print("SKIP: needs a GPU of compute capability 9.0 (sm_90a)")
    return False
