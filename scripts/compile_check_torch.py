#!/usr/bin/env python3
"""Compiles the sources against another torch's headers, without a GPU or that torch installed:
the lent GPU box builds flashattn against its own torch (2.11.0+cu130, Python 3.12, C++17), and a
header or language incompatibility there would cost the whole device call.

    python scripts/compile_check_torch.py [--torch 2.11.0] [--all-cu]

Downloads that torch's wheel with pip (`pip download --no-deps`, cached under
~/.cache/flashattn-torch-headers) and extracts its include/ folder; then checks
  - every csrc/*.cpp and csrc/cpu/*.cpp with g++ -fsyntax-only,
  - csrc/cuda/api.cu and one forward, one backward and the fp32 instantiation (every inst/*.cu
    with --all-cu) with nvcc -cuda: the CUDA front end on host and device code, no cicc/ptxas,
under the C++ standard that torch's cpp_extension picks for that version (C++17 before 2.13,
C++20 from it), with the wheel build's defines. Python.h comes from this interpreter; the headers
used do not depend on the Python version. Exit status 0 when everything compiles.
"""
import argparse
import glob
import os
import shutil
import subprocess
import sys
import sysconfig
import time
import zipfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.path.expanduser("~/.cache/flashattn-torch-headers")
DEFINES = ["-DTORCH_API_INCLUDE_EXTENSION_H", "-DPy_LIMITED_API=0x030A0000",
           "-DTORCH_EXTENSION_NAME=_C"]
NVCC_DEFINES = ["-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
                "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__",
                "--expt-relaxed-constexpr"]
REPRESENTATIVE_CU = ["api.cu", "inst/fwd_hdim128_bf16.cu", "inst/bwd_hdim128_bf16.cu",
                     "inst/bwd_fp32.cu"]


def torch_headers(version):
    """Folder holding torch/include of torch==version, downloaded and extracted once."""
    home = os.path.join(CACHE, version)
    include = os.path.join(home, "torch", "include")
    if os.path.isdir(include):
        return home
    os.makedirs(home, exist_ok=True)
    wheels = glob.glob(os.path.join(home, f"torch-{version}*.whl"))
    if not wheels:
        print(f"compile_check: pip download torch=={version} --no-deps", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", f"torch=={version}",
                        "--no-deps", "-d", home], check=True)
        wheels = glob.glob(os.path.join(home, f"torch-{version}*.whl"))
    with zipfile.ZipFile(wheels[0]) as wheel:
        members = [m for m in wheel.namelist()
                   if m.startswith("torch/include/") or m == "torch/version.py"]
        wheel.extractall(home, members)
    os.remove(wheels[0])  # 0.5 GB; the headers are all we keep
    return home


def cxx_standard(version):
    major, minor = (int(x) for x in version.split(".")[:2])
    return "c++20" if (major, minor) >= (2, 13) else "c++17"


def run(cmd, label):
    start = time.time()
    result = subprocess.run(cmd, capture_output=True, text=True)
    status = "ok" if result.returncode == 0 else "FAILED"
    print(f"  {status:<6} {time.time() - start:5.1f} s  {label}", flush=True)
    if result.returncode != 0:
        print(result.stdout + result.stderr)
    return result.returncode == 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torch", default="2.11.0", help="torch version (default 2.11.0)")
    parser.add_argument("--all-cu", action="store_true", help="every csrc/cuda .cu, not four")
    args = parser.parse_args()

    home = torch_headers(args.torch)
    include = os.path.join(home, "torch", "include")
    with open(os.path.join(home, "torch", "version.py")) as f:
        version_line = next(line for line in f if line.startswith("__version__"))
    std = cxx_standard(args.torch)
    print(f"compile_check: torch {version_line.split('=')[1].strip()} headers, -std={std}")
    includes = ["-I", os.path.join(REPO, "csrc"), "-isystem", include,
                "-isystem", os.path.join(include, "torch", "csrc", "api", "include"),
                "-I", sysconfig.get_paths()["include"]]
    cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    ok = True
    for src in sorted(glob.glob(os.path.join(REPO, "csrc", "*.cpp")) +
                      glob.glob(os.path.join(REPO, "csrc", "cpu", "*.cpp"))):
        ok &= run(["g++", f"-std={std}", "-fsyntax-only", "-fopenmp", *DEFINES, *includes,
                   "-isystem", os.path.join(cuda_home, "include"), src],
                  os.path.relpath(src, REPO))
    nvcc = os.path.join(cuda_home, "bin", "nvcc")
    if not os.path.isfile(nvcc):
        nvcc = shutil.which("nvcc")
    if nvcc is None:
        print("compile_check: no nvcc, the .cu files are not checked")
        return 1
    cu = (sorted(os.path.relpath(p, os.path.join(REPO, "csrc", "cuda"))
                 for p in glob.glob(os.path.join(REPO, "csrc", "cuda", "**", "*.cu"), recursive=True))
          if args.all_cu else REPRESENTATIVE_CU)
    for rel in cu:
        src = os.path.join(REPO, "csrc", "cuda", rel)
        ok &= run([nvcc, "-cuda", f"-std={std}", "-gencode=arch=compute_90,code=sm_90",
                   *NVCC_DEFINES, *DEFINES, *[i.replace("-isystem", "-I") for i in includes],
                   src, "-o", os.devnull], os.path.join("csrc", "cuda", rel))
    print("compile_check: " + ("every source compiles" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
