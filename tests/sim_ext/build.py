"""Builds torch.ops.flashattn_sim (sim_ops.cpp + the host code csrc/ shares + the CPU shim) with
torch.utils.cpp_extension.load and returns the loaded module.

    python tests/sim_ext/build.py        # build (or reuse the cached build) and print the time

The build is cached by torch under TORCH_EXTENSIONS_DIR (default ~/.cache/torch_extensions),
one folder per torch version; a rebuild happens only when a source or header changes. Two
translation units carry the kernels' instantiations (forward, backward), so 2 cores compile them
in parallel; the host code and the shim are one unit each.
"""
import importlib.util
import os
import re
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def _load_cudasim_build():
    """tests/cudasim/build.py (the shim's sources and include dirs), imported by path: it is
    also called build.py, so a plain import would find this file."""
    path = os.path.join(REPO, "tests", "cudasim", "build.py")
    spec = importlib.util.spec_from_file_location("cudasim_build", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


cudasim_build = _load_cudasim_build()


# csrc/*.cpp that define torch.ops.flashattn itself; the sim registers its own namespace.
FLASHATTN_LIBRARY_SOURCES = {"flashattn.cpp", "pymodule.cpp"}


def shared_host_sources():
    """The host code every executor shares (checks, parameters, masks): csrc/*.cpp but the
    files that define the flashattn library."""
    csrc = os.path.join(REPO, "csrc")
    return sorted(os.path.join(csrc, name) for name in os.listdir(csrc)
                  if name.endswith(".cpp") and name not in FLASHATTN_LIBRARY_SOURCES)


def load(verbose=False):
    from torch.utils.cpp_extension import load as torch_load

    if cudasim_build.cuda_include_dir() is None:
        raise RuntimeError("the sim executor needs cuda_fp16.h / vector_types.h: set CUDA_HOME")
    # Four translation units: the kernels' instantiations (forward, backward); the host code
    # (sim_ops.cpp and csrc's, each including torch's headers) as one unit and the shim as
    # another (cudasim/build.py unity_source: their shared headers parsed once, not per source).
    units_dir = os.path.join(cudasim_build.DEFAULT_BUILD_DIR, "sim_ext")
    sources = [os.path.join(HERE, name) for name in ("sim_kernels_fwd.cpp", "sim_kernels_bwd.cpp")]
    sources += [cudasim_build.unity_source(os.path.join(units_dir, "sim_host.cpp"),
                                           [os.path.join(HERE, "sim_ops.cpp"),
                                            *shared_host_sources()]),
                cudasim_build.shim_unit(units_dir)]
    # The shim's own flags (includes, -DFLASHATTN_CUDASIM, -O1: the kernels' unrolled loops stay
    # cheap to compile and the fibers fast enough), with torch's C++ standard (2.14 needs C++20).
    # No debug info: it doubles the compile time of the kernel translation units.
    # The shim runs the sm_90a forward too (kernel_list.py ARCHS sim=True): the plan may choose it
    # (plan_fwd_sm90.h kSm90KernelsBuilt) on a device set_device makes cc 9.0 and opted in.
    flags = cudasim_build.compile_flags(cxx_std=None) + ["-g0", "-DFLASHATTN_SM90_KERNELS"]
    # One build folder per torch version. Torch 2.14 keeps a folder's `lock` file (it locks it
    # with flock), and torch 2.11 waits, silently and forever, for that file to go away: a
    # folder shared by the two hung every test on 2.11 (seen on 2026-12-01). The library's name
    # is only the folder's and the .so's: the ops register as torch.ops.flashattn_sim either way.
    import torch
    version = re.sub(r"[^0-9A-Za-z]", "_", torch.__version__)
    return torch_load(
        name=f"flashattn_sim_torch{version}",
        sources=sources,
        extra_cflags=flags,
        is_python_module=False,
        verbose=verbose,
    )


if __name__ == "__main__":
    start = time.time()
    load(verbose=True)
    print(f"flashattn_sim: built/loaded in {time.time() - start:.1f} s")
