"""Do the GPU and the CPU shim agree on every wrapped primitive? Run this on a machine with a GPU.

The shim and the kernels share one reading of the PTX ISA's fragment layouts, so a misreading
is invisible on the CPU. This script runs the same primitive cases (selftest/primitive_cases.h:
ldmatrix x1/x2/x4 +-trans, mma m16n8k16 f16/bf16, shuffles, votes, cp.async, ex2.approx) with
identical inputs on the GPU (layout_check.cu built by nvcc) and on the shim (primitives_test
built by g++), and compares the outputs bit for bit. Exceptions, both documented: mma on
real-valued inputs (the tensor core's f32 accumulation order and truncation are not modelled;
the integer-valued mma cases are exact and compared bit for bit) and ex2.approx (about 2 ulp on
hardware): these are compared within a small f32 tolerance.

    python tests/cudasim/layout_check.py [--arch 90|90a|80] [--seed N] [--compile-only]

--arch 90a builds with -gencode arch=compute_90a,code=sm_90a and adds the sm_90 cases
(selftest/sm90_cases.h: TMA loads 2D-5D with each swizzle and out-of-bounds boxes, tensor stores
and add reductions, bulk copies, mbarrier phases, and the wgmma cases where they exist); it needs
an H100/H200. The shim side then runs primitives_test --sm90.

Prints PASS/FAIL per primitive; exit status 1 if any fails. --compile-only builds both sides
and stops (what a machine without a GPU can check).
"""
import argparse
import glob
import os
import shutil
import struct
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import build  # noqa: E402

BUILD_DIR = build.DEFAULT_BUILD_DIR
# |gpu - shim| <= ABS + REL * |shim| for the close_f32 cases.
CLOSE_ABS, CLOSE_REL = 1e-4, 4e-6


def nvcc_path():
    for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if home and os.path.isfile(os.path.join(home, "bin", "nvcc")):
            return os.path.join(home, "bin", "nvcc")
    return shutil.which("nvcc")


def is_sm90a(arch):
    """True for an arch-specific sm_90 target, whose build and shim run add the sm_90 cases."""
    return arch.startswith("9") and arch.endswith("a")


def build_gpu_side(arch):
    """nvcc build of layout_check.cu, reused while its sources and flags are unchanged."""
    nvcc = nvcc_path()
    if nvcc is None:
        raise SystemExit("nvcc not found: set CUDA_HOME")
    source = os.path.join(build.SHIM_DIR, "layout_check.cu")
    arch_flags = ([f"-gencode=arch=compute_{arch},code=sm_{arch}", "-DLAYOUT_CHECK_SM90"]
                  if is_sm90a(arch) else [f"-arch=sm_{arch}"])
    flags = arch_flags + ["-std=c++17", "-O2", "-I", build.SHIM_DIR,
             "-I", os.path.join(build.SHIM_DIR, "selftest"), "-I", os.path.join(build.REPO_ROOT, "csrc")]
    inputs = [source] + sorted(glob.glob(os.path.join(build.SHIM_DIR, "selftest", "*.h")) +
                               glob.glob(os.path.join(build.SHIM_DIR, "selftest", "*.cuh")) +
                               glob.glob(os.path.join(build.REPO_ROOT, "csrc", "cuda", "*.cuh")) +
                               glob.glob(os.path.join(build.REPO_ROOT, "csrc", "cuda", "*.h")))
    os.makedirs(BUILD_DIR, exist_ok=True)
    exe = os.path.join(BUILD_DIR, f"layout_check_gpu_sm{arch}.{build.digest(inputs, [nvcc] + flags)}")
    if not os.path.exists(exe):
        subprocess.run([nvcc, *flags, source, "-o", exe + ".tmp"], check=True)
        os.replace(exe + ".tmp", exe)
    return exe


def build_shim_side():
    return build.build_program([os.path.join(build.SHIM_DIR, "selftest", "primitives_test.cpp")],
                               "primitives_test", BUILD_DIR)


def read_dump(path):
    """{name: (compare, bytes)} from a case_dump.h file, in file order."""
    cases = {}
    with open(path, "rb") as f:
        while True:
            header = f.readline()
            if not header:
                return cases
            name, compare, size = header.decode().split()
            cases[name] = (compare, f.read(int(size)))


def compare_case(compare, gpu, shim):
    """None if they agree, else a short description of the first difference."""
    if len(gpu) != len(shim):
        return f"sizes differ: gpu {len(gpu)} bytes, shim {len(shim)}"
    if compare == "bitwise":
        for i, (g, s) in enumerate(zip(gpu, shim)):
            if g != s:
                return f"byte {i}: gpu 0x{g:02x}, shim 0x{s:02x}"
        return None
    count = len(gpu) // 4
    for i, (g, s) in enumerate(zip(struct.unpack(f"{count}f", gpu), struct.unpack(f"{count}f", shim))):
        if not abs(g - s) <= CLOSE_ABS + CLOSE_REL * abs(s):
            return f"float {i}: gpu {g!r}, shim {s!r}"
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arch", default="90",
                        help="SM version for nvcc, e.g. 80, 90 or 90a (90a adds the sm_90 cases)")
    parser.add_argument("--seed", default="20261129")
    parser.add_argument("--compile-only", action="store_true")
    args = parser.parse_args()

    gpu_exe = build_gpu_side(args.arch)
    shim_exe = build_shim_side()
    if args.compile_only:
        print(f"built {gpu_exe} and {shim_exe}")
        return 0

    gpu_dump = os.path.join(BUILD_DIR, "layout_check_gpu.dump")
    shim_dump = os.path.join(BUILD_DIR, "layout_check_shim.dump")
    subprocess.run([gpu_exe, "--dump", gpu_dump, args.seed], check=True)
    sm90 = ["--sm90"] if is_sm90a(args.arch) else []
    shim = subprocess.run([shim_exe, "--hardware-safe", *sm90, "--dump", shim_dump, args.seed],
                          capture_output=True, text=True)
    if not os.path.exists(shim_dump):
        raise SystemExit(f"shim side failed:\n{shim.stdout}{shim.stderr}")
    gpu_cases, shim_cases = read_dump(gpu_dump), read_dump(shim_dump)

    failures = 0
    for name, (compare, shim_bytes) in shim_cases.items():
        if name not in gpu_cases:
            problem = "missing on the GPU side"
        else:
            problem = compare_case(compare, gpu_cases[name][1], shim_bytes)
        failures += problem is not None
        print(f"{'PASS' if problem is None else 'FAIL'} {name} ({compare})"
              + ("" if problem is None else f": {problem}"))
    print(f"layout check: {len(shim_cases) - failures} of {len(shim_cases)} primitives agree")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
