"""Compiles one CUDA source of csrc/ the way the wheel build does, with ptxas strict (spills,
local memory and stack are errors, every kernel's registers printed): the gate a kernel change
must pass before the whole build, in a fraction of its time.

    python tools/strict_compile.py csrc/cuda/inst/fwd_hdim128_bf16_sm90.cu [--out DIR] [--keep]

The flags are setup.py's (its extension(), ptxas_flags() and, for inst/*_sm90.cu, the
architecture's own -gencode from kernel_list.py) plus torch's own nvcc flags, so a file that
passes here passes in the build. The object goes to --out (default build/strict/), where
cuobjdump / .ci/sass_loops.py can read it; the ptxas report goes to <out>/<name>.log.
Exit status: nvcc's.
"""
import argparse
import os
import subprocess
import sys
import sysconfig
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def setup_helpers():
    """setup.py's functions without running setup(): its module text up to the setup() call."""
    with open(os.path.join(ROOT, "setup.py")) as f:
        text = f.read()
    head = text[: text.index("\nsetup(")]
    scope = {"__file__": os.path.join(ROOT, "setup.py"), "__name__": "flashattn_setup"}
    exec(compile(head, "setup.py", "exec"), scope)
    return scope


def nvcc_command(source, obj):
    os.environ["FLASHATTN_PTXAS_STRICT"] = "1"
    s = setup_helpers()
    if s["CUDA_HOME"] is None:
        raise SystemExit("tools/strict_compile.py: no CUDA toolkit found (set CUDA_HOME)")
    from torch.utils import cpp_extension

    ext = s["extension"]()
    nvcc_flags = list(ext.extra_compile_args["nvcc"])
    own = s["own_gencode_archs"]()
    for suffix, gencode in own.items():
        if source.endswith(f"{suffix}.cu") and suffix:
            nvcc_flags = [f for f in nvcc_flags if not f.startswith("-gencode")] + gencode
    try:
        torch_includes = cpp_extension.include_paths(device_type="cuda")
    except TypeError:  # torch < 2.6 took a bool
        torch_includes = cpp_extension.include_paths(True)
    includes = [os.path.join(ROOT, "csrc"), *torch_includes, sysconfig.get_paths()["include"]]
    torch_flags = list(cpp_extension.COMMON_NVCC_FLAGS)
    # torch picks the C++ standard its headers need (C++20 from torch 2.13; C++17 before).
    import torch
    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    std = "-std=c++20" if (major, minor) >= (2, 13) else "-std=c++17"
    cmd = [os.path.join(s["CUDA_HOME"], "bin", "nvcc"), "-c", source, "-o", obj,
           *[f"-I{p}" for p in includes], *torch_flags, std, "--compiler-options", "-fPIC",
           "-DTORCH_API_INCLUDE_EXTENSION_H", "-DTORCH_EXTENSION_NAME=_C",
           f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}", *nvcc_flags]
    return cmd


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source", help="a .cu file under csrc/")
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "strict"))
    ap.add_argument("--print", action="store_true", help="print the command, do not run it")
    args = ap.parse_args()
    source = os.path.abspath(args.source)
    if not os.path.isfile(source) or not source.endswith(".cu"):
        raise SystemExit(f"tools/strict_compile.py: source must be an existing .cu file, got "
                         f"{args.source!r}")
    os.makedirs(args.out, exist_ok=True)
    name = os.path.splitext(os.path.basename(source))[0]
    obj = os.path.join(args.out, name + ".o")
    cmd = nvcc_command(source, obj)
    if args.print:
        print(" ".join(cmd))
        return 0
    start = time.time()
    log = os.path.join(args.out, name + ".log")
    with open(log, "w") as f:
        rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)
    with open(log) as f:
        lines = f.read().splitlines()
    problems = [l for l in lines if "error" in l.lower() or "spill" in l.lower() and
                not l.strip().endswith("0 bytes spill stores, 0 bytes spill loads")]
    kernels = sum(1 for l in lines if "Compiling entry function" in l)
    print(f"{args.source}: rc={rc}, {kernels} kernels, {time.time() - start:.0f} s, log {log}")
    for line in problems[:20]:
        print("  " + line)
    return rc


if __name__ == "__main__":
    sys.exit(main())
