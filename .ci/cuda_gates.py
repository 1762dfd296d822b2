#!/usr/bin/env python3
"""Gates on the CUDA kernels of the build of record, no GPU needed, nothing compiled twice.

Reads what the wheel build already produced, the built library (a FLASHATTN_PTXAS_STRICT=1
build, where -Werror on spills and local memory has already failed any kernel that spills):
  - prints each kernel's registers, shared memory and stack per architecture, from
    `cuobjdump --dump-resource-usage` of the library (the build log's ptxas report is not read:
    ninja's relayed ptxas output was once cut short mid-line there, losing kernels' lines);
  - checks its SASS with cuobjdump, that the 16-bit tensor-core kernels
    contain HMMA (mma.sync), LDSM (ldmatrix) and LDGSTS (cp.async), that the sm_90a kernels
    (fwd_sm90_kernel, bwd_sm90_kernel, compiled for sm_90a only) contain HGMMA (wgmma), UTMALDG
    (TMA loads) and SYNCS (mbarriers), and that no kernel contains LDL/STL (local memory), for
    every architecture built; that the sm_90a main kernels have no stack frame and each sm_90a
    forward file holds all its main loops (FWD_SM90_MAIN_LOOPS); and that the forward's paged K/V
    copy is as short as the dense one (.ci/sass_copy_loops.py).
Exit status 0 when every gate passes.

    python .ci/cuda_gates.py --binary path/to/flashattn/_C.abi3.so

cuobjdump and the nvdisasm it runs are not in the toolkit here: the script looks for them on
PATH, in $CUOBJDUMP/$NVDISASM, in any site-packages' nvidia/cu13/bin, and otherwise
pip-installs nvidia-cuda-cuobjdump / nvidia-cuda-nvdisasm into private folders under
~/.cache/flashattn-ci, never into the active environment.
"""
import argparse
import collections
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
# Each entry: the opcodes of which one must be present, by what they prove (wgmma is HGMMA in 16
# bits, QGMMA in FP8).
REQUIRED_SM90A_SASS = {("HGMMA", "QGMMA"): "wgmma on tensor cores", ("UTMALDG",): "TMA tensor loads",
                       ("SYNCS",): "mbarrier waits and arrivals"}
# The main kernels only: the backward's rows and dQ convert kernels (bwd_sm90_rows_kernel,
# bwd_sm90_convert_dq_kernel) are plain SIMT code, built for sm_90a beside them.
SM90A_KERNEL = re.compile(r"[fb]wd_sm90_kernel")
# The sm_90a forward's main loops per instantiation file, by head dim (kernel_list.py's comment,
# launch_fwd_sm90.cuh): fewer means a feature's loop was lost from the build.
FWD_SM90_MAIN_LOOPS = {64: 18, 128: 18, 256: 18}
# The FP8 (e4m3) forward's file (kernel_list.py fwd_sm90_fp8): no mask, causal or a local
# window, each with softcap or not; ALiBi with each of the three (softcap at run time);
# attn_mask with each of the three (softcap and ALiBi at run time); a gathered (paged or
# indexed) cache with each of the three.
FWD_SM90_FP8_MAIN_LOOPS = {128: 15}
FWD_SM90_NAME = re.compile(r"fwd_sm90_kernel<([^,<>]+), (\d+),")


def fwd_sm90_main_loops(dtype, d):
    """How many main loops the sm_90a forward file of (demangled element type, head dim) holds."""
    return (FWD_SM90_FP8_MAIN_LOOPS if "fp8" in dtype else FWD_SM90_MAIN_LOOPS).get(d)


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


RESOURCE_ARCH = re.compile(r"^arch = (sm_\d+a?)\s*$")
RESOURCE_FUNCTION = re.compile(r"^\s*Function (\S+):\s*$")
RESOURCE_USAGE = re.compile(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")


def parse_resource_usage(text):
    """[{kernel, arch, regs, smem (static), stack, local}] from `cuobjdump --dump-resource-usage`:
    the same figures as ptxas -v, read back from the cubins themselves."""
    rows, arch, kernel = [], None, None
    for line in text.splitlines():
        if m := RESOURCE_ARCH.match(line):
            arch, kernel = m.group(1), None
        elif m := RESOURCE_FUNCTION.match(line):
            kernel = m.group(1)
        elif kernel and (m := RESOURCE_USAGE.search(line)):
            regs, stack, smem, local = map(int, m.groups())
            rows.append({"kernel": kernel, "arch": arch, "regs": regs, "smem": smem,
                         "stack": stack, "local": local})
            kernel = None
    return rows


def resource_usage(cuobjdump, binary):
    """parse_resource_usage of a built library or cubin (every architecture it holds)."""
    result = subprocess.run([cuobjdump, "--dump-resource-usage", binary], capture_output=True,
                            text=True)
    if result.returncode != 0:
        if "does not contain device code" in result.stdout + result.stderr:
            return []  # a CPU-only build
        raise RuntimeError(f"cuobjdump --dump-resource-usage {binary} failed:\n{result.stderr}")
    rows = parse_resource_usage(result.stdout)
    if any(row["arch"] is None for row in rows):  # a lone cubin names its arch elsewhere
        elf = subprocess.run([cuobjdump, "-elf", binary], capture_output=True, text=True).stdout
        arch = re.search(r"-arch (sm_\d+a?)\b", elf)
        for row in rows:
            row["arch"] = row["arch"] or (arch.group(1) if arch else "sm_?")
    return rows


def sm90a_problems(rows, names):
    """The sm_90a main kernels' failures: a stack frame, or a forward file (type, head dim)
    without FWD_SM90_MAIN_LOOPS[d] main loops. rows: parse_resource_usage's; names: the same
    kernels demangled."""
    failures, loops = [], collections.Counter()
    for row, name in zip(rows, names):
        if row["arch"] != "sm_90a" or not SM90A_KERNEL.search(row["kernel"]):
            continue
        if row["stack"]:
            failures.append(f"{name} (sm_90a): a {row['stack']}-byte stack frame")
        if m := FWD_SM90_NAME.search(name):
            loops[m.group(1), int(m.group(2))] += 1
    for (dtype, d), count in sorted(loops.items()):
        want = fwd_sm90_main_loops(dtype, d)
        if count != want:
            table = "FWD_SM90_FP8_MAIN_LOOPS" if "fp8" in dtype else "FWD_SM90_MAIN_LOOPS"
            failures.append(f"fwd_sm90_kernel<{dtype}, {d}>: {count} main loops built, "
                            f"{table} says {want}")
    return failures


def opcode_names(required):
    """A required-SASS key as printed: "HMMA", or "HGMMA or QGMMA"."""
    return required if isinstance(required, str) else " or ".join(required)


def demangle(names):
    result = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True)
    return result.stdout.splitlines() if result.returncode == 0 else names


def _load_ci(name):
    """.ci/<name>.py as a module (.ci is not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, ".ci", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binary", required=True, help="the built flashattn/_C*.so")
    parser.add_argument("--cuobjdump", default=None)
    parser.add_argument("--nvdisasm", default=None)
    args = parser.parse_args()

    cuobjdump = find_tool("cuobjdump", args.cuobjdump)
    nvdisasm = find_tool("nvdisasm", args.nvdisasm)
    rows = resource_usage(cuobjdump, args.binary)
    if not rows:
        print(f"cuda_gates: {args.binary} holds no CUDA kernels (a CPU-only build?)")
        return 1
    failures = [f"{row['kernel']} ({row['arch']}): {row['local']} bytes of local memory"
                for row in rows if row["local"]]
    # One SASS dump serves every gate below (a full library's takes ~30 s).
    sass_loops = _load_ci("sass_loops")
    sass = sass_loops.dump_sass(cuobjdump, nvdisasm, args.binary)
    kernels = {key: {sass_loops.opcode(text) for _, text, _ in listing}
               for key, listing in sass.items()}
    for (arch, kernel), opcodes in kernels.items():
        if bad := sorted(o for o in opcodes if o in FORBIDDEN_SASS):
            failures.append(f"{kernel} ({arch}): local memory in SASS: {bad}")
        for pattern, required in ((TENSOR_CORE_KERNEL, REQUIRED_16BIT_SASS),
                                  (SM90A_KERNEL, REQUIRED_SM90A_SASS)):
            if pattern.search(kernel):
                missing = [o for o in required if not opcodes.intersection(
                    (o,) if isinstance(o, str) else o)]
                if missing:
                    failures.append(f"{kernel} ({arch}): SASS lacks "
                                    + ", ".join(f"{opcode_names(o)} ({required[o]})"
                                                for o in missing))
        if SM90A_KERNEL.search(kernel) and arch != "sm_90a":
            failures.append(f"{kernel}: compiled for {arch}; the sm_90a kernels are built for "
                            "sm_90a only (kernel_list.py ARCHS)")
    # Issue 33: a paged cache's K/V copy no longer than a dense one (.ci/sass_copy_loops.py).
    copy_loops = _load_ci("sass_copy_loops")
    failures += copy_loops.check(copy_loops.without_control_words(sass), demangle)
    names = demangle([r["kernel"] for r in rows])
    failures += sm90a_problems(rows, names)
    archs = sorted({arch for arch, _ in kernels})
    tensor_core = sum(1 for _, k in kernels if TENSOR_CORE_KERNEL.search(k))
    if not tensor_core:
        failures.append("no 16-bit tensor-core kernel found in the binary")

    print(f"\n{'arch':<6} {'regs':>4} {'smem':>5} {'stack':>5} {'local':>5}  kernel")
    for row, name in zip(rows, names):
        name = re.sub(r"\(.*\)$", "", name.replace("void ", "", 1)).replace("flashattn::cuda::", "")
        print(f"{row['arch']:<6} {row['regs']:>4} {row['smem']:>5} {row['stack']:>5} "
              f"{row['local']:>5}  {name}")
    if failures:
        print("\nFAILED gates:\n" + "\n".join(failures))
        return 1
    sm90a = sum(1 for _, k in kernels if SM90A_KERNEL.search(k))
    print(f"all gates passed: {len(kernels)} kernels in SASS for {', '.join(archs)}, no local "
          f"memory; the {tensor_core} 16-bit kernel builds use {', '.join(REQUIRED_16BIT_SASS)}; "
          f"the {sm90a} sm_90a kernels use {', '.join(map(opcode_names, REQUIRED_SM90A_SASS))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
