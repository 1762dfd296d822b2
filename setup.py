"""Build of record for flashattn's compiled library, flashattn._C.

Environment variables:
  FLASHATTN_CUDA=0|1      force the CPU-only (CppExtension) or the CUDA (CUDAExtension) build;
                          default: CUDA when a toolkit is found.
  FLASHATTN_CUDA_ARCHS    semicolon-separated SM versions, default "80;90". PTX of the newest
                          is embedded too, so newer GPUs can JIT it. With 90 in the list the
                          sm_90a kernels (csrc/cuda/hopper/, inst/*_sm90.cu) are built too, each
                          for sm_90a alone (kernel_list.py ARCHS; needs ninja).
  CUDA_HOME               the toolkit; else /usr/local/cuda; else the folder above nvcc on PATH.
  MAX_JOBS                parallel compile jobs (ninja), honoured by torch.utils.cpp_extension.
  FLASHATTN_PTXAS_STRICT=1  register spills or local memory in a kernel fail the build, and ptxas
                          reports every kernel's registers and shared memory.
"""
import glob
import os
import re
import runpy
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


def cuda_archs():
    archs = [a.strip() for a in os.environ.get("FLASHATTN_CUDA_ARCHS", "80;90").split(";")
             if a.strip()]
    if not archs or not all(a.isdigit() for a in archs):
        raise SystemExit(f"FLASHATTN_CUDA_ARCHS must look like '80;90', got "
                         f"{os.environ.get('FLASHATTN_CUDA_ARCHS')!r}")
    return archs


def cuda_arch_flags():
    archs = cuda_archs()
    flags = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    newest = max(archs, key=int)
    flags.append(f"-gencode=arch=compute_{newest},code=compute_{newest}")
    return flags


def ptxas_flags():
    """Spills and local memory always warn. FLASHATTN_PTXAS_STRICT=1 (the test script sets it)
    makes them errors and prints each kernel's registers and shared memory into the build log
    (.ci/cuda_gates.py reads the same figures back from the built library's cubins)."""
    if os.environ.get("FLASHATTN_PTXAS_STRICT") == "1":
        return "-Xptxas=-v,-warn-spills,-warn-lmem-usage,-Werror"
    return "-Xptxas=-warn-spills,-warn-lmem-usage"


# The kernel list's architectures (csrc/cuda/kernel_list.py, read with runpy: no __pycache__ in
# csrc/).
KERNEL_ARCHS = runpy.run_path(os.path.join(ROOT, "csrc", "cuda", "kernel_list.py"))["ARCHS"]


def own_gencode_archs():
    """{inst/ file suffix: gencode flags} of the architectures whose files get their own -gencode
    (sm_90a: its code runs on compute capability 9.0 only, so it is compiled for nothing else)
    and that this build includes (ARCHS build_with in FLASHATTN_CUDA_ARCHS)."""
    archs = cuda_archs()
    return {a["file_suffix"]: a["gencode"] for a in KERNEL_ARCHS.values()
            if a["gencode"] is not None and a["build_with"] in archs}


def is_own_gencode_source(path, suffixes):
    return any(path.endswith(f"{suffix}.cu") for suffix in suffixes)


def give_own_gencode(ninja_path, own):
    """Rewrites torch's build.ninja so that each inst/*<suffix>.cu of `own` compiles with the
    build's nvcc flags but its own -gencode: a per-build binding of cuda_post_cflags, which ninja
    scopes to that one build statement. torch's BuildExtension takes one flag list for every
    source; this keeps one extension and one parallel ninja run, and compiles the sm_80 files
    exactly as before (no extra device pass for them). The alternative, 90a in the common list
    with the Hopper files' bodies behind __CUDA_ARCH_FEAT_SM90_ALL, would add a device pass to
    every sm_80 file, and an architecture list without 90 would leave empty kernels."""
    with open(ninja_path) as f:
        lines = f.read().split("\n")
    common = next((line for line in lines if line.startswith("cuda_post_cflags = ")), None)
    if common is None:
        raise SystemExit(f"flashattn: {ninja_path} has no cuda_post_cflags line; this torch writes "
                         "its ninja file differently, which setup.py give_own_gencode must follow")
    flags = [t for t in common[len("cuda_post_cflags = "):].split(" ")
             if not t.startswith("-gencode")]
    out = []
    for line in lines:
        out.append(line)
        m = re.match(r"build (.+): cuda_compile (.+)$", line)
        if m:
            for suffix, gencode in own.items():
                if m.group(2).endswith(f"{suffix}.cu"):
                    out.append("  cuda_post_cflags = " + " ".join(flags + gencode))
    with open(ninja_path, "w") as f:
        f.write("\n".join(out))


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
        own = own_gencode_archs() if USE_CUDA else {}
        if own:
            if not self.use_ninja:
                raise SystemExit("flashattn: the sm_90a kernels need the ninja build (they take "
                                 "their own -gencode flags): install ninja, or leave 90 out of "
                                 "FLASHATTN_CUDA_ARCHS")
            import torch.utils.cpp_extension as cpp_extension
            write_ninja_file = cpp_extension._write_ninja_file

            def write_then_give_own_gencode(path, *args, **kwargs):
                write_ninja_file(path, *args, **kwargs)
                give_own_gencode(path, own)

            cpp_extension._write_ninja_file = write_then_give_own_gencode
            try:
                super().build_extensions()
            finally:
                cpp_extension._write_ninja_file = write_ninja_file
        else:
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
    cu = rel(glob.glob(os.path.join(ROOT, "csrc", "cuda", "**", "*.cu"), recursive=True))
    # An architecture with its own gencode that the list leaves out: its files are not built.
    left_out = [a["file_suffix"] for a in KERNEL_ARCHS.values()
                if a["gencode"] is not None and a["file_suffix"] not in own_gencode_archs()]
    return cpp + [path for path in cu if not is_own_gencode_source(path, left_out)]


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
    if own_gencode_archs():
        # The plans may choose the sm_90a kernels (plan_fwd_sm90.h, plan_bwd_sm90.h,
        # kSm90KernelsBuilt).
        cxx.append("-DFLASHATTN_SM90_KERNELS")
        nvcc.append("-DFLASHATTN_SM90_KERNELS")
    return CUDAExtension(extra_compile_args={"cxx": cxx, "nvcc": nvcc}, **common)


setup(
    ext_modules=[extension()],
    cmdclass={"build_ext": TimedBuildExtension},
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
)
