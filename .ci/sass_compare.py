#!/usr/bin/env python3
"""Proves that a source change left the nvcc build alone: compiles csrc/cuda/inst/*.cu of two
source trees for one architecture (cubin, the wheel build's nvcc flags), dumps their SASS and
compares it kernel by kernel: the per-opcode counts (LDS, STS, LDSM, LDGSTS, HMMA, ...) and the
whole instruction text with addresses stripped.

    python .ci/sass_compare.py --before /tmp/before --after . [--arch 90] [--files 'fwd_*bf16.cu']

--before/--after are repository roots (or csrc/ parents); --before may be a git revision, which
is exported with `git archive` first. The cubins are cached under build/sass/<hash of the tree>-sm<arch>,
with each file's ptxas -v report next to it (*.ptxas.log: registers, stack, spills), so a second
comparison against the same tree compiles nothing. Exit status 0 when every kernel's
SASS is identical. Uses cuobjdump/nvdisasm like .ci/cuda_gates.py (pip-installed on demand).
"""
import argparse
import collections
import fnmatch
import glob
import hashlib
import importlib.util
import os
import re
import subprocess
import sys
import sysconfig
import tarfile
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _gates():
    spec = importlib.util.spec_from_file_location("cuda_gates", os.path.join(REPO, ".ci", "cuda_gates.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gates = _gates()


def export_revision(rev):
    """`git archive rev csrc` into a temporary folder; returns that folder."""
    out = tempfile.mkdtemp(prefix="sass-" + re.sub(r"\W", "_", rev) + "-")
    archive = subprocess.run(["git", "-C", REPO, "archive", "--format=tar", rev, "csrc"],
                             check=True, capture_output=True).stdout
    tar_path = os.path.join(out, "csrc.tar")
    with open(tar_path, "wb") as f:
        f.write(archive)
    with tarfile.open(tar_path) as tar:
        tar.extractall(out)
    os.remove(tar_path)
    return out


def nvcc_command(root, src, cubin, arch):
    """The wheel build's nvcc flags (setup.py + torch.utils.cpp_extension), one arch, -cubin."""
    import torch.utils.cpp_extension as ext

    includes = [os.path.join(root, "csrc")] + ext.include_paths()
    includes.append(sysconfig.get_paths()["include"])
    return [gates.find_nvcc(), "-cubin", f"-arch=sm_{arch}", *[f"-I{i}" for i in includes],
            "-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
            "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__",
            "--expt-relaxed-constexpr", "-O3", "--use_fast_math", "-Xptxas=-v",
            "-DTORCH_API_INCLUDE_EXTENSION_H", "-DTORCH_EXTENSION_NAME=_C", "-std=c++20",
            src, "-o", cubin]


def tree_hash(root):
    h = hashlib.sha256()
    for path in sorted(glob.glob(os.path.join(root, "csrc", "**", "*"), recursive=True)):
        if os.path.isfile(path):
            h.update(os.path.relpath(path, root).encode())
            with open(path, "rb") as f:
                h.update(f.read())
    return h.hexdigest()[:16]


def compile_tree(root, arch, pattern):
    out_dir = os.path.join(REPO, "build", "sass", f"{tree_hash(root)}-sm{arch}")
    os.makedirs(out_dir, exist_ok=True)
    cubins = []
    for src in sorted(glob.glob(os.path.join(root, "csrc", "cuda", "inst", "*.cu"))):
        if not fnmatch.fnmatch(os.path.basename(src), pattern):
            continue
        cubin = os.path.join(out_dir, os.path.basename(src).replace(".cu", ".cubin"))
        if not os.path.exists(cubin):
            print(f"  nvcc {os.path.relpath(src, root)} (sm_{arch})", flush=True)
            tmp = cubin + ".tmp"
            result = subprocess.run(nvcc_command(root, src, tmp, arch), capture_output=True, text=True)
            if result.returncode != 0:
                sys.exit(f"nvcc failed on {src}:\n{result.stderr}")
            # ptxas -v: registers, stack and spills per kernel, for a reader comparing two trees.
            with open(cubin.replace(".cubin", ".ptxas.log"), "w") as f:
                f.write(result.stdout + result.stderr)
            os.replace(tmp, cubin)
        cubins.append(cubin)
    return cubins


INSTRUCTION = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;")


def sass_text(cuobjdump, nvdisasm, cubin):
    """{kernel: [instruction text without addresses and encodings]}"""
    env = dict(os.environ, PATH=os.path.dirname(nvdisasm) + os.pathsep + os.environ.get("PATH", ""))
    result = subprocess.run([cuobjdump, "--dump-sass", cubin], capture_output=True, text=True,
                            env=env)
    if result.returncode != 0:
        raise RuntimeError(f"cuobjdump --dump-sass {cubin} failed:\n{result.stderr}")
    kernels, name = {}, None
    for line in result.stdout.splitlines():
        if m := re.search(r"Function : (\S+)", line):
            name = m.group(1)
            kernels[name] = []
        elif name and (m := INSTRUCTION.search(line)):
            kernels[name].append(m.group(1))
    return kernels


def opcode(instruction):
    text = re.sub(r"^@!?U?P\w+\s+", "", instruction)
    return text.split()[0].split(".")[0] if text else ""


COUNTED = ("LDS", "STS", "LDSM", "LDGSTS", "HMMA", "LDG", "STG", "RED", "ATOMG", "BAR", "LDL", "STL")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="a source tree or a git revision")
    parser.add_argument("--after", default=REPO)
    parser.add_argument("--arch", default="90")
    parser.add_argument("--files", default="*.cu", help="glob over csrc/cuda/inst/ file names")
    args = parser.parse_args()

    before = args.before if os.path.isdir(args.before) else export_revision(args.before)
    cuobjdump, nvdisasm = gates.find_tool("cuobjdump"), gates.find_tool("nvdisasm")
    print(f"before: {before}\nafter:  {args.after}")
    trees = {}
    for label, root in (("before", before), ("after", args.after)):
        kernels = {}
        for cubin in compile_tree(root, args.arch, args.files):
            for name, text in sass_text(cuobjdump, nvdisasm, cubin).items():
                kernels[(os.path.basename(cubin), name)] = text
        trees[label] = kernels

    names = sorted(set(trees["before"]) | set(trees["after"]))
    demangled = dict(zip(names, gates.demangle([n for _, n in names])))
    differ = 0
    print(f"\n{'same':>4} {'instrs':>6} " + " ".join(f"{c:>6}" for c in COUNTED) + "  kernel (sm_" + args.arch + ")")
    for key in names:
        a, b = trees["before"].get(key), trees["after"].get(key)
        same = a == b
        differ += not same
        counts_b = collections.Counter(opcode(i) for i in (b or []))
        counts_a = collections.Counter(opcode(i) for i in (a or []))
        cells = []
        for c in COUNTED:
            cells.append(f"{counts_b[c]:>6}" if counts_a[c] == counts_b[c]
                         else f"{counts_a[c]}>{counts_b[c]}".rjust(6))
        short = re.sub(r"\(.*\)$", "", demangled[key].replace("void ", "", 1))
        short = short.replace("flashattn::cuda::", "")
        print(f"{'yes' if same else 'NO':>4} {len(b or []):>6} " + " ".join(cells) + f"  {short}")
    print(f"\n{len(names)} kernels, {len(names) - differ} with identical SASS, {differ} different")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
