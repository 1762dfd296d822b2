"""Build of record for flashattn's compiled library, flashattn._C.

Environment variables:
  FLASHATTN_CUDA=0|1      force the CPU-only (CppExtension) or the CUDA (CUDAExtension) build;
                          default: CUDA when a toolkit is found.
  FLASHATTN_CUDA_ARCHS    semicolon-separated SM versions, default "80;90". PTX of the newest
                          is embedded too, so newer GPUs can JIT it.
  CUDA_HOME               the toolkit; else /usr/local/cuda; else the folder above nvcc on PATH.
  MAX_JOBS                parallel compile jobs (ninja), honoured by torch.utils.cpp_extension.
  FLASHATTN_PTXAS_STRICT=1  register spills or local memory in a kernel fail the build, and ptxas
                          reports every kernel's registers and shared memory.
"""
import glob
import os
import shutil
import time

from setuptools import setup

ROOT = os.path.dirname(os.path.abspath(__file__))


def _is_toolkit(path):
    return bool(path) and os.path.isfile(os.path.join(path, "bin", "nvcc")) and os.path.isfile(
        os.path.join(path, "include", "cuda_runtime.h"))


def find_cuda_home():
    """CUDA_HOME, else /usr/local/cuda, else nvcc's grandparent, each only if it holds a
    toolkit. torch's own guess follows nvcc on PATH, which a wrapper script can mislead
    (/usr/local/bin/nvcc -> CUDA_HOME=/usr/local), so we look ourselves."""
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
    for path in candidates:
        if _is_toolkit(path):
            return os.path.realpath(path)
    return None


def want_cuda(cuda_home):
    flag = os.environ.get("FLASHATTN_CUDA")
    if flag is None:
        return cuda_home is not None
    if flag not in ("0", "1"):
        raise SystemExit(f"FLASHATTN_CUDA must be 0 or 1, got {flag!r}")
    if flag == "1" and cuda_home is None:
        raise SystemExit("FLASHATTN_CUDA=1 but no CUDA toolkit was found: set CUDA_HOME")
    return flag == "1"


def cuda_arch_flags():
    archs = [a.strip() for a in os.environ.get("FLASHATTN_CUDA_ARCHS", "80;90").split(";")
             if a.strip()]
    if not archs or not all(a.isdigit() for a in archs):
        raise SystemExit(f"FLASHATTN_CUDA_ARCHS must look like '80;90', got "
                         f"{os.environ.get('FLASHATTN_CUDA_ARCHS')!r}")
    flags = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    newest = max(archs, key=int)
    flags.append(f"-gencode=arch=compute_{newest},code=compute_{newest}")
    return flags


def ptxas_flags():
    """Spills and local memory always warn. FLASHATTN_PTXAS_STRICT=1 (the test script sets it)
    makes them errors and prints each kernel's registers and shared memory, which
    .ci/cuda_gates.py reads from the build log: the gates check the build of record itself."""
    if os.environ.get("FLASHATTN_PTXAS_STRICT") == "1":
        return "-Xptxas=-v,-warn-spills,-warn-lmem-usage,-Werror"
    return "-Xptxas=-warn-spills,-warn-lmem-usage"


CUDA_HOME = find_cuda_home()
USE_CUDA = want_cuda(CUDA_HOME)
if USE_CUDA:
    # torch.utils.cpp_extension reads CUDA_HOME when it is imported.
    os.environ["CUDA_HOME"] = CUDA_HOME

from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension  # noqa: E402


class TimedBuildExtension(BuildExtension):
    """Prints how long the compile took: build time is a feature we track in CI logs."""

    def build_extensions(self):
        start = time.time()
        super().build_extensions()
        kind = "CUDA" if USE_CUDA else "CPU-only"
        print(f"flashattn: {kind} build of _C took {time.time() - start:.1f} s", flush=True)


def rel(paths):
    return sorted(os.path.relpath(p, ROOT) for p in paths)


def sources():
    cpp = rel(glob.glob(os.path.join(ROOT, "csrc", "*.cpp")) +
              glob.glob(os.path.join(ROOT, "csrc", "cpu", "*.cpp")))
    if not USE_CUDA:
        return cpp
    return cpp + rel(glob.glob(os.path.join(ROOT, "csrc", "cuda", "**", "*.cu"), recursive=True))


def extension():
    # No -std here: torch.utils.cpp_extension picks the standard its headers need (C++20 for
    # torch >= 2.13, C++17 before).
    cxx = ["-O3", "-fopenmp"]
    # py_limited_api=True makes torch define Py_LIMITED_API for its minimum Python (3.10).
    common = dict(name="flashattn._C", sources=sources(), include_dirs=[os.path.join(ROOT, "csrc")],
                  extra_link_args=["-fopenmp"], py_limited_api=True)
    if not USE_CUDA:
        return CppExtension(extra_compile_args={"cxx": cxx}, **common)
    nvcc = ["-O3", "--use_fast_math", "--expt-relaxed-constexpr", ptxas_flags(),
            *cuda_arch_flags()]
    return CUDAExtension(extra_compile_args={"cxx": cxx, "nvcc": nvcc}, **common)


setup(
    ext_modules=[extension()],
    cmdclass={"build_ext": TimedBuildExtension},
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
)
