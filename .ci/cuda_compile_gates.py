#!/usr/bin/env python3
"""Compile gates for the CUDA kernels, no GPU needed.

Compiles every csrc/cuda/**/*.cu for sm_80 and sm_90 with the flags of the build of record
plus -Xptxas -v,-warn-spills,-warn-lmem-usage,-Werror (so any spill or local-memory use fails),
prints each kernel's registers / shared memory / spills, and checks the SASS with cuobjdump:
  - the 16-bit tensor-core kernels contain HMMA (mma.sync), LDSM (ldmatrix) and LDGSTS (cp.async);
  - no kernel contains LDL/STL (local memory).
Prints the wall time of the compile. Exit status 0 when every gate passes.

    python .ci/cuda_compile_gates.py [--jobs 2] [--archs 80;90] [--cuobjdump PATH]

cuobjdump and the nvdisasm it runs are not in the toolkit here: the script looks for them on
PATH, in $CUOBJDUMP/$NVDISASM, in any site-packages' nvidia/cu13/bin, and otherwise
pip-installs nvidia-cuda-cuobjdump / nvidia-cuda-nvdisasm into private folders under
~/.cache/flashattn-ci, never into the active environment.
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# cuobjdump --dump-sass runs nvdisasm; neither is in this machine's toolkit. Each comes from
# PyPI into its own private folder (pip --target refuses to merge two packages' nvidia/ trees).
TOOLS = {"cuobjdump": "nvidia-cuda-cuobjdump==13.2.51", "nvdisasm": "nvidia-cuda-nvdisasm==13.2.51"}
TOOLS_HOME = os.path.expanduser("~/.cache/flashattn-ci")
# SASS opcodes each 16-bit tensor-core kernel must use, by what they prove.
REQUIRED_16BIT_SASS = {"HMMA": "mma.sync on tensor cores", "LDSM": "ldmatrix",
                       "LDGSTS": "cp.async global->shared"}
FORBIDDEN_SASS = ("LDL", "STL")  # local memory: spills or dynamically indexed register arrays
TENSOR_CORE_KERNEL = re.compile(r"16bit")  # kernel names of the mma.sync kernels


def find_nvcc():
    for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if home and os.path.isfile(os.path.join(home, "bin", "nvcc")):
            return os.path.join(home, "bin", "nvcc")
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        sys.exit("cuda_compile_gates: nvcc not found (set CUDA_HOME)")
    return nvcc


def find_tool(tool, explicit=None):
    """Path of cuobjdump or nvdisasm: explicit, $CUOBJDUMP/$NVDISASM, PATH, the toolkit, any
    site-packages' nvidia/cu*/bin, our private folder; else pip-install it there."""
    home = os.path.join(TOOLS_HOME, tool)
    pattern = os.path.join("nvidia", "cu*", "bin", tool)
    candidates = [explicit, os.environ.get(tool.upper()), shutil.which(tool),
                  os.path.join(os.path.dirname(find_nvcc()), tool)]
    candidates += glob.glob(os.path.join(home, pattern))
    for path in sys.path:
        candidates += glob.glob(os.path.join(path, pattern))
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    print(f"cuda_compile_gates: installing {TOOLS[tool]} into {home}", flush=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target", home, TOOLS[tool]],
                   check=True)
    found = glob.glob(os.path.join(home, pattern))
    if not found:
        sys.exit(f"cuda_compile_gates: {TOOLS[tool]} has no {tool} binary")
    return found[0]


def nvcc_flags(archs):
    # The build of record's nvcc flags (setup.py) and what torch's CUDAExtension adds.
    from torch.utils.cpp_extension import COMMON_NVCC_FLAGS, include_paths
    flags = ["-std=c++20", "-O3", "--use_fast_math", *COMMON_NVCC_FLAGS,
             "-Xptxas=-v,-warn-spills,-warn-lmem-usage,-Werror", "-DFLASHATTN_WITH_CUDA",
             "-Xcompiler", "-fPIC", "-I", os.path.join(REPO, "csrc")]
    for inc in include_paths("cuda"):
        flags += ["-isystem", inc]
    for arch in archs:
        flags.append(f"-gencode=arch=compute_{arch},code=sm_{arch}")
    return flags


def compile_one(nvcc, flags, source, out_dir):
    obj = os.path.join(out_dir, os.path.relpath(source, REPO).replace(os.sep, "_") + ".o")
    start = time.time()
    result = subprocess.run([nvcc, *flags, "-c", source, "-o", obj], capture_output=True,
                            text=True)
    return source, obj, result.returncode, result.stdout + result.stderr, time.time() - start


PTXAS_ENTRY = re.compile(r"Compiling entry function '(\S+)' for '(sm_\d+)'")
PTXAS_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
PTXAS_USAGE = re.compile(r"Used (\d+) registers(?:, used \d+ barriers)?(?:, (\d+) bytes smem)?")


def parse_ptxas(log):
    """[(kernel, arch, registers, static smem, stack, spill stores, spill loads)]"""
    rows, current = [], None
    for line in log.splitlines():
        if m := PTXAS_ENTRY.search(line):
            current = {"kernel": m.group(1), "arch": m.group(2)}
        elif current and (m := PTXAS_SPILL.search(line)):
            current.update(stack=int(m.group(1)), spill_st=int(m.group(2)), spill_ld=int(m.group(3)))
        elif current and (m := PTXAS_USAGE.search(line)):
            current.update(regs=int(m.group(1)), smem=int(m.group(2) or 0))
            rows.append(current)
            current = None
    return rows


def demangle(names):
    result = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True)
    return result.stdout.splitlines() if result.returncode == 0 else names


def sass_by_kernel(cuobjdump, nvdisasm, obj):
    """{(arch, mangled kernel): set of opcodes}"""
    env = dict(os.environ, NVDISASM_PATH=os.path.dirname(nvdisasm),
               PATH=os.path.dirname(nvdisasm) + os.pathsep + os.environ.get("PATH", ""))
    result = subprocess.run([cuobjdump, "--dump-sass", obj], capture_output=True, text=True,
                            env=env)
    if result.returncode != 0:
        raise RuntimeError(f"cuobjdump --dump-sass {obj} failed:\n{result.stderr}")
    sass = result.stdout
    kernels, arch, name = {}, None, None
    for line in sass.splitlines():
        if m := re.search(r"arch = (sm_\d+)", line):
            arch = m.group(1)
        elif m := re.search(r"Function : (\S+)", line):
            name = m.group(1)
            kernels[(arch, name)] = set()
        elif name and (m := re.search(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", line)):
            kernels[(arch, name)].add(m.group(1).split(".")[0])
    return kernels


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=int(os.environ.get("MAX_JOBS", "2")))
    parser.add_argument("--archs", default=os.environ.get("FLASHATTN_CUDA_ARCHS", "80;90"))
    parser.add_argument("--cuobjdump", default=None)
    parser.add_argument("--nvdisasm", default=None)
    parser.add_argument("--only", default="", help="compile only sources whose path contains this")
    args = parser.parse_args()
    archs = [a for a in args.archs.split(";") if a]

    nvcc = find_nvcc()
    cuobjdump = find_tool("cuobjdump", args.cuobjdump)
    nvdisasm = find_tool("nvdisasm", args.nvdisasm)
    flags = nvcc_flags(archs)
    sources = sorted(s for s in glob.glob(os.path.join(REPO, "csrc", "cuda", "**", "*.cu"),
                                          recursive=True) if args.only in s)
    failures = []
    with tempfile.TemporaryDirectory(prefix="flashattn-gates-") as out_dir:
        start = time.time()
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            results = list(pool.map(lambda s: compile_one(nvcc, flags, s, out_dir), sources))
        build_s = time.time() - start

        rows = []
        for source, obj, rc, log, seconds in results:
            rel = os.path.relpath(source, REPO)
            if rc != 0:
                failures.append(f"{rel}: nvcc failed (exit {rc}; spills/local memory fail too)\n{log}")
                continue
            print(f"compiled {rel} in {seconds:.1f} s")
            rows += parse_ptxas(log)
            for (arch, kernel), opcodes in sass_by_kernel(cuobjdump, nvdisasm, obj).items():
                if bad := sorted(o for o in opcodes if o in FORBIDDEN_SASS):
                    failures.append(f"{kernel} ({arch}): local memory in SASS: {bad}")
                if TENSOR_CORE_KERNEL.search(kernel):
                    missing = [o for o in REQUIRED_16BIT_SASS if o not in opcodes]
                    if missing:
                        failures.append(f"{kernel} ({arch}): SASS lacks "
                                        + ", ".join(f"{o} ({REQUIRED_16BIT_SASS[o]})" for o in missing))

    print(f"\n{'arch':<6} {'regs':>4} {'smem':>5} {'stack':>5} {'spill st/ld':>11}  kernel")
    for row, name in zip(rows, demangle([r["kernel"] for r in rows])):
        name = re.sub(r"\(.*\)$", "", name.replace("void ", "", 1)).replace("flashattn::cuda::", "")
        print(f"{row['arch']:<6} {row['regs']:>4} {row['smem']:>5} {row.get('stack', 0):>5} "
              f"{row.get('spill_st', 0):>5}/{row.get('spill_ld', 0):<5}  {name}")
    print(f"\nnvcc build of {len(sources)} files for sm_{', sm_'.join(archs)} with {args.jobs} "
          f"jobs: {build_s:.1f} s wall")
    if failures:
        print("\nFAILED gates:\n" + "\n".join(failures))
        return 1
    print(f"all gates passed: {len(rows)} kernel builds, no spills or local memory; 16-bit kernels "
          f"use {', '.join(REQUIRED_16BIT_SASS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
