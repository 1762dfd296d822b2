"""Builds torch.ops.flashattn_test (ops.cpp, csrc/cpu/fwd.cpp and csrc/cpu/bwd.cpp compiled with
FLASHATTN_TEST_COUNTERS), the test-only CPU ops, with torch.utils.cpp_extension.load, and links
it against the flashattn._C that `import flashattn` found (the installed wheel in CI, the
in-place build in a checkout) for everything else the kernels call: three translation units
(about a minute on 2 cores), not the whole library.

    python tests/cpu_test_ext/build.py     # build (or reuse the cached build) and print the time

The build is cached by torch under TORCH_EXTENSIONS_DIR (default ~/.cache/torch_extensions),
one folder per torch version and flashattn._C; a rebuild happens only when a source or header
changes. -Bsymbolic-functions binds the extension's own fwd.cpp and bwd.cpp (the ones that count)
to its attention ops, whatever else the process has loaded; the 16-bit kernels' counters are
inline variables (tile_gemm.h), which the dynamic linker makes one object for both libraries, so
cpu_16bit_products_run counts what flashattn's own ops ran too.
"""
import functools
import glob
import hashlib
import os
import re
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
CSRC = os.path.join(REPO, "csrc")

# The kernels whose counters only this build keeps (kernels.h, FLASHATTN_TEST_COUNTERS).
COUNTING_SOURCES = [os.path.join(CSRC, "cpu", name) for name in ("fwd.cpp", "bwd.cpp")]


def shipped_library():
    """The flashattn._C shared object that `import flashattn` loads."""
    import flashattn
    found = glob.glob(os.path.join(os.path.dirname(flashattn.__file__), "_C*.so"))
    if len(found) != 1:
        raise RuntimeError(f"expected one flashattn/_C*.so beside {flashattn.__file__}, found "
                           f"{found}: build the extension first (README, 'Building')")
    return os.path.realpath(found[0])


@functools.cache
def ops():
    """torch.ops.flashattn_test, built and loaded once per process."""
    import torch
    from torch.utils.cpp_extension import load as torch_load

    library = shipped_library()
    # One build folder per torch version (torch 2.11 hangs on 2.14's lock file, see
    # tests/sim_ext/build.py) and per _C: the extension is linked against that file.
    version = re.sub(r"[^0-9A-Za-z]", "_", torch.__version__)
    which = hashlib.sha1(library.encode()).hexdigest()[:8]
    torch_load(
        name=f"flashattn_test_torch{version}_{which}",
        sources=[os.path.join(HERE, "ops.cpp"), *COUNTING_SOURCES],
        extra_include_paths=[CSRC],
        # The shipped build's flags (setup.py), and the counters.
        extra_cflags=["-O3", "-fopenmp", "-DFLASHATTN_TEST_COUNTERS"],
        extra_ldflags=["-fopenmp", library, "-Wl,-Bsymbolic-functions"],
        is_python_module=False,
    )
    return torch.ops.flashattn_test


if __name__ == "__main__":
    start = time.time()
    ops()
    print(f"flashattn_test: built/loaded in {time.time() - start:.1f} s")
