#!/usr/bin/env python3
"""Gates on the CUDA kernels of the build of record, no GPU needed, nothing compiled twice.

Reads what the wheel build already produced:
  - its log, built with FLASHATTN_PTXAS_STRICT=1 (ptxas -v, and -Werror on spills and local
    memory, so a spill has already failed the build): prints each kernel's registers, shared
    memory and stack per architecture;
  - the built library: checks its SASS with cuobjdump, that the 16-bit tensor-core kernels
    contain HMMA (mma.sync), LDSM (ldmatrix) and LDGSTS (cp.async), that the sm_90a kernels
    (fwd_sm90_kernel, bwd_sm90_kernel, compiled for sm_90a only) contain HGMMA (wgmma), UTMALDG
    (TMA loads) and SYNCS (mbarriers), and that no kernel contains LDL/STL (local memory), for
    every architecture built; and that the forward's paged K/V copy is as short as the dense one
    (.ci/sass_copy_loops.py).
Exit status 0 when every gate passes.

    python .ci/cuda_gates.py --build-log build/wheel.log --binary path/to/flashattn/_C.abi3.so

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
# The same for the sm_90a kernels (csrc/cuda/hopper/, kernel_list.py arch sm90a).
REQUIRED_SM90A_SASS = {"HGMMA": "wgmma on tensor cores", "UTMALDG": "TMA tensor loads",
                       "SYNCS": "mbarrier waits and arrivals"}
# The main kernels only: the backward's rows and dQ convert kernels (bwd_sm90_rows_kernel,
# bwd_sm90_convert_dq_kernel) are plain SIMT code, built for sm_90a beside them.
SM90A_KERNEL = re.compile(r"[fb]wd_sm90_kernel")


def find_nvcc():
    for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if home and os.path.isfile(os.path.join(home, "bin", "nvcc")):
            return os.path.join(home, "bin", "nvcc")
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        sys.exit("cuda_gates: nvcc not found (set CUDA_HOME)")
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
    print(f"cuda_gates: installing {TOOLS[tool]} into {home}", flush=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target", home, TOOLS[tool]],
                   check=True)
    found = glob.glob(os.path.join(home, pattern))
    if not found:
        sys.exit(f"cuda_gates: {TOOLS[tool]} has no {tool} binary")
    return found[0]


PTXAS_ENTRY = re.compile(r"Compiling entry function '(\S+)' for '(sm_\d+a?)'")
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
        if m := re.search(r"arch = (sm_\d+a?)\b", line):
            arch = m.group(1)
        elif m := re.search(r"Function : (\S+)", line):
            name = m.group(1)
            kernels[(arch, name)] = set()
        elif name and (m := re.search(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", line)):
            kernels[(arch, name)].add(m.group(1).split(".")[0])
    return kernels


def _copy_loops():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "sass_copy_loops", os.path.join(REPO, ".ci", "sass_copy_loops.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build-log", required=True, help="log of the FLASHATTN_PTXAS_STRICT=1 build")
    parser.add_argument("--binary", required=True, help="the built flashattn/_C*.so")
    parser.add_argument("--cuobjdump", default=None)
    parser.add_argument("--nvdisasm", default=None)
    args = parser.parse_args()

    with open(args.build_log, errors="replace") as f:
        rows = parse_ptxas(f.read())
    if not rows:
        print("cuda_gates: the build log has no ptxas report; build with FLASHATTN_PTXAS_STRICT=1")
        return 1
    cuobjdump = find_tool("cuobjdump", args.cuobjdump)
    nvdisasm = find_tool("nvdisasm", args.nvdisasm)
    failures = []
    kernels = sass_by_kernel(cuobjdump, nvdisasm, args.binary)
    for (arch, kernel), opcodes in kernels.items():
        if bad := sorted(o for o in opcodes if o in FORBIDDEN_SASS):
            failures.append(f"{kernel} ({arch}): local memory in SASS: {bad}")
        for pattern, required in ((TENSOR_CORE_KERNEL, REQUIRED_16BIT_SASS),
                                  (SM90A_KERNEL, REQUIRED_SM90A_SASS)):
            if pattern.search(kernel):
                missing = [o for o in required if o not in opcodes]
                if missing:
                    failures.append(f"{kernel} ({arch}): SASS lacks "
                                    + ", ".join(f"{o} ({required[o]})" for o in missing))
        if SM90A_KERNEL.search(kernel) and arch != "sm_90a":
            failures.append(f"{kernel}: compiled for {arch}; the sm_90a kernels are built for "
                            "sm_90a only (kernel_list.py ARCHS)")
    # Issue 33: a paged cache's K/V copy no longer than a dense one (.ci/sass_copy_loops.py).
    copy_loops = _copy_loops()
    failures += copy_loops.check(copy_loops.dump_sass(cuobjdump, nvdisasm, args.binary), demangle)
    archs = sorted({arch for arch, _ in kernels})
    tensor_core = sum(1 for _, k in kernels if TENSOR_CORE_KERNEL.search(k))
    if not tensor_core:
        failures.append("no 16-bit tensor-core kernel found in the binary")

    print(f"\n{'arch':<6} {'regs':>4} {'smem':>5} {'stack':>5} {'spill st/ld':>11}  kernel")
    for row, name in zip(rows, demangle([r["kernel"] for r in rows])):
        name = re.sub(r"\(.*\)$", "", name.replace("void ", "", 1)).replace("flashattn::cuda::", "")
        print(f"{row['arch']:<6} {row['regs']:>4} {row['smem']:>5} {row.get('stack', 0):>5} "
              f"{row.get('spill_st', 0):>5}/{row.get('spill_ld', 0):<5}  {name}")
    if failures:
        print("\nFAILED gates:\n" + "\n".join(failures))
        return 1
    sm90a = sum(1 for _, k in kernels if SM90A_KERNEL.search(k))
    print(f"all gates passed: {len(kernels)} kernels in SASS for {', '.join(archs)}, no local "
          f"memory; the {tensor_core} 16-bit kernel builds use {', '.join(REQUIRED_16BIT_SASS)}; "
          f"the {sm90a} sm_90a kernels use {', '.join(REQUIRED_SM90A_SASS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
