"""Compile the CPU shim (tests/cudasim) and programs built on it with g++.

Used by the shim's self-tests; a build of the CUDA kernel source against the shim (for
example the `sim` torch extension) needs the same SHIM_SOURCES and compile_flags().

Environment: CXX (default g++), CUDA_HOME (for cuda_fp16.h & co; else /usr/local/cuda, else
the headers of the nvidia-cuda-runtime wheel that a CUDA build of torch installs),
CUDASIM_BUILD_JOBS (parallel compiles of build_program, default 2).
"""
import glob
import hashlib
import os
import subprocess
import sysconfig
from concurrent.futures import ThreadPoolExecutor

SHIM_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(SHIM_DIR))
SHIM_SOURCES = sorted(glob.glob(os.path.join(SHIM_DIR, "src", "*.cpp")))
# Objects are cached here by content hash, so every user of the shim can share the folder.
DEFAULT_BUILD_DIR = os.path.join(REPO_ROOT, "build", "cudasim")
CXX = os.environ.get("CXX", "g++")
# Fibers switch stacks; frame pointers keep backtraces and ASan reports readable. g++ does not
# know nvcc's `#pragma unroll`, which kernels use everywhere.
BASE_FLAGS = ["-O1", "-g", "-fno-omit-frame-pointer", "-Wall", "-Wextra", "-Wno-unknown-pragmas",
              "-DFLASHATTN_CUDASIM=1"]
SANITIZE_FLAGS = ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined"]


def cuda_include_dir():
    """Folder holding cuda_fp16.h, cuda_bf16.h and vector_types.h, or None."""
    candidates = [os.path.join(os.environ[v], "include") for v in ("CUDA_HOME", "CUDA_PATH")
                  if os.environ.get(v)]
    candidates.append("/usr/local/cuda/include")
    site = sysconfig.get_paths()["purelib"]
    candidates += sorted(glob.glob(os.path.join(site, "nvidia", "cu*", "include")), reverse=True)
    candidates += [os.path.join(site, "nvidia", "cuda_runtime", "include")]
    for path in candidates:
        if os.path.isfile(os.path.join(path, "cuda_fp16.h")) and os.path.isfile(
                os.path.join(path, "vector_types.h")):
            return path
    return None


def compile_flags(sanitize=False, cxx_std="c++17"):
    """Flags for every translation unit compiled against the shim (kernels, host code, shim).

    The shim builds as C++17 and C++20; pass cxx_std=None where the build adds its own
    (torch 2.14's headers require C++20)."""
    cuda = cuda_include_dir()
    if cuda is None:
        raise RuntimeError("cudasim needs cuda_fp16.h / vector_types.h: set CUDA_HOME")
    flags = ([f"-std={cxx_std}"] if cxx_std else []) + BASE_FLAGS + [
        "-include", os.path.join(SHIM_DIR, "cudasim.h"), "-I", SHIM_DIR,
        "-I", os.path.join(REPO_ROOT, "csrc"), "-isystem", cuda]
    return flags + (SANITIZE_FLAGS if sanitize else [])


def link_flags(sanitize=False):
    # -rdynamic: kernels' symbols reach the dynamic table, so messages can name them.
    return ["-rdynamic"] + (SANITIZE_FLAGS if sanitize else [])


def sanitizer_available():
    """True when g++ can link an ASan+UBSan program here."""
    probe = subprocess.run([CXX, *SANITIZE_FLAGS, "-x", "c++", "-", "-o", os.devnull],
                           input="int main() { return 0; }", text=True, capture_output=True)
    return probe.returncode == 0


def digest(paths, flags):
    """Short content hash of files and flags, for cache names."""
    h = hashlib.sha256(" ".join(flags).encode())
    for path in paths:
        with open(path, "rb") as f:
            h.update(path.encode() + b"\0" + f.read())
    return h.hexdigest()[:16]


def _shim_headers():
    """Every header a program built on the shim may include: the shim's, the self-tests' and
    the kernels'."""
    return sorted(glob.glob(os.path.join(SHIM_DIR, "*.h")) +
                  glob.glob(os.path.join(SHIM_DIR, "src", "*.h")) +
                  glob.glob(os.path.join(SHIM_DIR, "selftest", "*.h")) +
                  glob.glob(os.path.join(SHIM_DIR, "selftest", "*.cuh")) +
                  glob.glob(os.path.join(REPO_ROOT, "csrc", "*.h")) +
                  glob.glob(os.path.join(REPO_ROOT, "csrc", "cuda", "*.h")) +
                  glob.glob(os.path.join(REPO_ROOT, "csrc", "cuda", "*.cuh")) +
                  # kernels in subfolders (csrc/cuda/hopper/): without them an edit there
                  # reused a stale object
                  glob.glob(os.path.join(REPO_ROOT, "csrc", "cuda", "*", "*.h")) +
                  glob.glob(os.path.join(REPO_ROOT, "csrc", "cuda", "*", "*.cuh")))


def _run(cmd):
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"compile failed: {' '.join(cmd)}\n{result.stdout}{result.stderr}")


def _write_if_changed(path, text):
    # Through a temporary file: pytest workers write the same file at the same time.
    if not os.path.exists(path) or open(path).read() != text:
        tmp = path + f".tmp{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)


def unity_source(path, sources):
    """Writes `path`, a file that #includes each of `sources`: them as one translation unit,
    whose shared headers are parsed once. Those dominate these sources' compile time (the
    shim's own headers; torch's for the host code), so one unit compiles several times faster
    than one per source. A build that tracks included files (ninja's depfiles, torch's
    cpp_extension) still rebuilds it when any of them changes."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    _write_if_changed(path, "".join(f'#include "{src}"\n' for src in sources))
    return path


def shim_unit(directory):
    """directory/cudasim_runtime.cpp: every shim source as one translation unit."""
    return unity_source(os.path.join(directory, "cudasim_runtime.cpp"), SHIM_SOURCES)


def build_program(sources, name, build_dir=DEFAULT_BUILD_DIR, sanitize=False, extra_flags=(),
                  jobs=None):
    """Compiles `sources` plus the shim into build_dir/<name>-plain (or -asan); reuses objects.

    Objects are cached by the hash of their source, every shim header and the flags, so a
    second test run (or a second program) recompiles only what changed. The shim's own sources
    are compiled as one translation unit (shim_unit)."""
    if jobs is None:  # CUDASIM_BUILD_JOBS=1 keeps a shared machine's other work undisturbed
        jobs = int(os.environ.get("CUDASIM_BUILD_JOBS", "2"))
    flags = compile_flags(sanitize) + list(extra_flags)
    headers = _shim_headers()
    mode = "asan" if sanitize else "plain"
    obj_dir = os.path.join(build_dir, "obj-" + mode)
    runtime_unit = shim_unit(obj_dir)

    def compile_one(src_and_deps):
        src, deps = src_and_deps
        obj = os.path.join(obj_dir, f"{os.path.basename(src)}.{digest(deps + headers, flags)}.o")
        if not os.path.exists(obj):
            tmp = obj + f".tmp{os.getpid()}"
            _run([CXX, *flags, "-c", src, "-o", tmp])
            os.replace(tmp, obj)
        return obj

    units = [(src, [src]) for src in sources] + [(runtime_unit, SHIM_SOURCES)]
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        objects = list(pool.map(compile_one, units))
    exe = os.path.join(build_dir, f"{name}-{mode}")
    tmp = exe + f".tmp{os.getpid()}"
    _run([CXX, *objects, *link_flags(sanitize), "-o", tmp])
    os.replace(tmp, exe)
    return exe
