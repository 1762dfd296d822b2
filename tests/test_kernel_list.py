"""The one list of the CUDA kernels' instantiations, csrc/cuda/kernel_list.py (issue 30, item 4):
the files csrc/cuda/generate_kernels.py writes from it are current, and what is still written by
hand agrees with it: dispatch.h's tiles and traits.h's tile shapes (compiled with g++ here, no
GPU), tools/gpu_model.py's copy of those shapes, the sanitizer cases."""
import importlib.util
import os
import runpy
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GENERATOR = os.path.join(REPO, "csrc", "cuda", "generate_kernels.py")
KL = runpy.run_path(os.path.join(REPO, "csrc", "cuda", "kernel_list.py"))
TILES_16BIT = KL["head_dims"]("fwd_16bit")
PAIRS_16BIT = KL["head_dim_pairs"]("fwd_16bit")  # (qk, v) tiles, in (qk, v) order
# (head_dim, head_dim_v) pairs for the dispatch probe: each tile's own, one inside each, one past
# its v, one past its qk, and the pairs MLA names.
PROBE_PAIRS = sorted({p for qk, v in PAIRS_16BIT
                      for p in ((qk, v), (qk - 1, v - 1), (qk, v + 1), (qk + 1, v), (1, v))}
                     | {(192, 128), (128, 64), (64, 128), (576, 512), (1, 1)})
TILES_16BIT_BWD = KL["head_dims"]("bwd_16bit")
PAIRS_16BIT_BWD = KL["head_dim_pairs"]("bwd_16bit")
TILES_SIMT = KL["head_dims"]("fwd_simt")


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_generator(*args):
    return subprocess.run([sys.executable, GENERATOR, *args], capture_output=True, text=True)


def test_generated_files_are_current():
    result = run_generator("--check")
    assert result.returncode == 0, result.stdout + result.stderr


def test_check_names_a_stale_file_and_one_not_in_the_list(tmp_path):
    generator = runpy.run_path(GENERATOR)
    for rel, text in generator["expected"](KL).items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert run_generator("--check", "--root", str(tmp_path)).returncode == 0
    stale = tmp_path / "csrc/cuda/inst/fwd_hdim96_bf16.cu"
    stale.write_text(stale.read_text().replace("96>", "8>"))
    removed = tmp_path / "csrc/cuda/inst/fwd_hdim8_bf16.cu"
    shutil.copy(stale, removed)
    result = run_generator("--check", "--root", str(tmp_path))
    assert result.returncode == 1
    assert "stale: csrc/cuda/inst/fwd_hdim96_bf16.cu" in result.stdout
    assert "not in csrc/cuda/kernel_list.py: csrc/cuda/inst/fwd_hdim8_bf16.cu" in result.stdout
    # Regenerating repairs the one and deletes the other (it carries the generated header).
    assert run_generator("--root", str(tmp_path)).returncode == 0
    assert not removed.exists()
    assert run_generator("--check", "--root", str(tmp_path)).returncode == 0


def test_every_kernel_has_one_instantiation():
    generator = runpy.run_path(GENERATOR)
    files = generator["expected"](KL)
    for where in ("csrc/cuda/inst/", "tests/sim_ext/"):
        text = "".join(t for rel, t in files.items() if rel.startswith(where))
        assert text.count("template void run_") == len(KL["KERNELS"]), where


def probe_source():
    """A C++ program printing, for the list's tiles, what dispatch.h picks and traits.h's
    shapes. Instantiating each traits class also runs its static_asserts."""
    lines = ['#include "cuda/dispatch.h"', '#include "cuda/traits.h"', "#include <cstdio>",
             "using namespace flashattn::cuda;", "int main() {",
             '  std::printf("max %d %d %d %d\\n", kMaxHeadDim, kMaxHeadDimV, kMaxHeadDimBwd,',
             "              kMaxHeadDimSimt);",
             "  for (int d = 1; d <= kMaxHeadDim + 1; ++d) {",
             "    int t16 = 0, t32 = 0;",
             "    dispatch_head_dims(HeadDimTilesFor<__half>{}, d, d, [&](auto t, auto) {",
             "      t16 = t.value;",
             "    });",
             "    dispatch_head_dims(HeadDimTilesFor<__nv_bfloat16>{}, d, d, [&](auto t, auto) {",
             "      if (t.value != t16) t16 = -1;",
             "    });",
             "    dispatch_head_dims(HeadDimTilesFor<float>{}, d, d, [&](auto t, auto) {",
             "      t32 = t.value;",
             "    });",
             '    std::printf("dispatch %d %d %d\\n", d, t16, t32);',
             "  }"]
    for i, (d, dv) in enumerate(PROBE_PAIRS):
        lines += [
            f"  dispatch_head_dims(HeadDimTilesFor<__half>{{}}, {d}, {dv}, [&](auto t, auto v) {{",
            f'    std::printf("pair {i} %d %d\\n", t.value, v.value);',
            "  });"]
    for i, (d, dv) in enumerate(PAIRS_16BIT):
        fwd, fwd_dropout = f"FwdTile<{d}, {dv}, false>", f"FwdTile<{d}, {dv}, true>"
        lines += [
            f'  std::printf("fwd {i} %d %d %d %d %d %d\\n", {fwd}::kBlockM, {fwd}::kBlockN, '
            f"{fwd}::kNThreads, {fwd}::kSmemBytes, {fwd}::kHeadDim, {fwd}::kHeadDimV);",
            f'  std::printf("fwd_dropout {i} %d\\n", {fwd_dropout}::kSmemBytes);',
            # The tiles q's width names keep their traits' type (and their kernels' symbols).
            f'  std::printf("named {i} %d\\n", std::is_same_v<{fwd}, FwdTraits<{d}, false>>);']
    for i, (d, dv) in enumerate(PROBE_PAIRS):
        lines += [
            f"  dispatch_head_dims(HeadDimTilesFor<__half, true>{{}}, {d}, {dv}, "
            "[&](auto t, auto v) {",
            f'    std::printf("bwd_pair {i} %d %d\\n", t.value, v.value);',
            "  });"]
    for i, (d, dv) in enumerate(PAIRS_16BIT_BWD):
        dq, dkdv = f"BwdDqTile<{d}, {dv}>", f"BwdTile<{d}, {dv}>"
        lines += [
            f'  std::printf("dq {i} %d %d %d %d %d %d\\n", {dq}::kBlockM, {dq}::kBlockN, '
            f"{dq}::kNThreads, {dq}::kSmemBytes, {dq}::kHeadDim, {dq}::kHeadDimV);",
            f'  std::printf("dkdv {i} %d %d %d %d %d %d\\n", {dkdv}::kBlockN, {dkdv}::kBlockM, '
            f"{dkdv}::kNThreads, {dkdv}::kSmemBytes, {dkdv}::kHeadDim, {dkdv}::kHeadDimV);",
            # The equal tiles keep their traits' type (and their kernels' symbols).
            f'  std::printf("bwd_named {i} %d\\n", std::is_same_v<{dkdv}, BwdTraits<{d}>> && '
            f"std::is_same_v<{dq}, BwdDqTraits<{d}>>);"]
    for d in TILES_SIMT:
        lines.append(f'  std::printf("simt {d} %d\\n", SimtTraits<{d}>::kDkdvSmemBytes);')
    return "\n".join(lines + ["}", ""])


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    """{(what, head dim): [ints]} printed by the probe."""
    cudasim_build = load("cudasim_build", os.path.join(REPO, "tests", "cudasim", "build.py"))
    cuda = cudasim_build.cuda_include_dir()
    assert cuda, "no cuda_fp16.h: set CUDA_HOME (the sim tests need it too)"
    out = tmp_path_factory.mktemp("kernel_list")
    src, exe = out / "probe.cpp", out / "probe"
    src.write_text(probe_source())
    compiled = subprocess.run([cudasim_build.CXX, "-std=c++17", "-O0", "-Wall", "-Werror",
                               "-I", os.path.join(REPO, "csrc"), "-isystem", cuda, str(src),
                               "-o", str(exe)], capture_output=True, text=True)
    assert compiled.returncode == 0, compiled.stderr
    printed = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    rows = {}
    for line in printed.splitlines():
        what, key, *values = line.split()
        rows[(what, int(key))] = [int(v) for v in values]
    return rows


def test_dispatch_picks_the_lists_tiles(probe):
    (max_row,) = [k for k in probe if k[0] == "max"]
    max_head_dim = max_row[1]
    max_head_dim_v, max_bwd, max_simt = probe[max_row]
    for d in range(1, max_head_dim + 2):
        t16, t32 = probe[("dispatch", d)]
        assert t16 == (KL["tile_for"](d, "fp16") or 0) == (KL["tile_for"](d, "bf16") or 0), d
        assert t32 == (KL["tile_for"](d, "fp32") or 0), d
    # A pair takes the first tile in (qk, v) order that covers both dims.
    for i, (d, dv) in enumerate(PROBE_PAIRS):
        assert tuple(probe.get(("pair", i), (0, 0))) == (KL["pair_for"](d, dv, "fp16") or (0, 0)), \
            (d, dv)
        assert tuple(probe.get(("bwd_pair", i), (0, 0))) == \
            (KL["pair_for"](d, dv, "fp16", backward=True) or (0, 0)), (d, dv)
    assert KL["pair_for"](192, 128, "bf16") == (192, 128)
    assert KL["pair_for"](128, 64, "bf16") == (128, 64)
    assert KL["pair_for"](128, 65, "bf16") == (128, 128)
    assert KL["pair_for"](192, 128, "bf16", backward=True) == (192, 128)
    assert KL["pair_for"](192, 129, "bf16", backward=True) == (192, 192)
    assert KL["pair_for"](128, 64, "bf16", backward=True) == (128, 64)
    # Every head dim the input checks accept (<= kMaxHeadDim, traits.h) has a 16-bit forward
    # tile, whose V is kMaxHeadDimV wide (MLA's 576 / 512); the backward's tiles are the
    # forward's up to kMaxHeadDimBwd, the fp32 tiles stop at kMaxHeadDimSimt (executor.h refuses
    # wider heads there, naming them).
    assert TILES_16BIT[-1] == max_head_dim and probe[("fwd", len(PAIRS_16BIT) - 1)][4:] == \
        [max_head_dim, max_head_dim_v]
    assert [d for d, dv in PAIRS_16BIT_BWD if d == dv] == \
        [d for d, dv in PAIRS_16BIT if d == dv and d <= max_bwd]
    assert set(PAIRS_16BIT_BWD) <= set(PAIRS_16BIT)
    assert TILES_16BIT_BWD[-1] == max_bwd
    assert TILES_SIMT[-1] == max_simt


def test_traits_compile_for_every_listed_tile(probe):
    assert {tuple(probe[("fwd", i)][4:]) for i in range(len(PAIRS_16BIT))} == set(PAIRS_16BIT)
    assert len([k for k in probe if k[0] == "fwd"]) == len(PAIRS_16BIT)
    for i, (d, dv) in enumerate(PAIRS_16BIT):
        assert probe[("named", i)] == [int(dv == KL["named_head_dim_v"](d))], (d, dv)
    assert {tuple(probe[("dkdv", i)][4:]) for i in range(len(PAIRS_16BIT_BWD))} == \
        set(PAIRS_16BIT_BWD)
    assert len([k for k in probe if k[0] == "dkdv"]) == len(PAIRS_16BIT_BWD)
    for i, (d, dv) in enumerate(PAIRS_16BIT_BWD):
        assert probe[("dq", i)][4:] == [d, dv]
        assert probe[("bwd_named", i)] == [int(d == dv)], (d, dv)
    assert {d for what, d in probe if what == "simt"} == set(TILES_SIMT)


def test_gpu_model_copies_the_traits(probe):
    model = load("gpu_model", os.path.join(REPO, "tools", "gpu_model.py"))
    for i, (d, dv) in enumerate(PAIRS_16BIT):
        assert [*model.fwd_tiles(d, dv), model.smem_fwd(d, dv)] == probe[("fwd", i)][:4], (d, dv)
    for i, (d, dv) in enumerate(PAIRS_16BIT_BWD):
        assert [*model.dq_tiles(d), model.smem_dq(d, dv)] == probe[("dq", i)][:4], (d, dv)
        assert [*model.dkdv_tiles(d), model.smem_dkdv(d, dv)] == probe[("dkdv", i)][:4], (d, dv)
    # The model sizes shared memory from the head dim itself, right only for a tile's own width.
    assert set(model.HEAD_DIMS) <= set(TILES_16BIT)


def test_sanitizer_cases_reach_every_kernel():
    cases = load("sanitizer_cases", os.path.join(REPO, "tests", "sanitizer_cases.py"))
    names = {v: k for k, v in cases.TORCH_DTYPES.items()}
    # A case reaches the forward's tile of its pair and, where it runs a backward, the backward's.
    dtypes = [t for t in cases.DTYPES if t != cases.FP8]
    covered = {("fwd", KL["pair_for"](*dims, names[t]), names[t]) for t in dtypes
               for dims in cases.HEAD_DIM_PAIRS if cases.runs(dims, t)}
    covered |= {("bwd", KL["pair_for"](*dims, names[t], backward=True), names[t])
                for t in dtypes for dims in cases.HEAD_DIM_PAIRS
                if cases.runs(dims, t, backward=True)}
    # The FP8 forward's tiles (fp8_cases), forward only.
    covered |= {("fwd", dims, "e4m3") for dims in cases.FP8_HEAD_DIM_PAIRS
                if cases.runs(dims, cases.FP8) and not cases.runs(dims, cases.FP8, backward=True)}
    listed = {(KL["FAMILIES"][k.family]["direction"],
               (k.head_dim, k.head_dim if k.head_dim_v is None else k.head_dim_v), k.dtype)
              for k in KL["KERNELS"] if k.head_dim is not None}
    assert listed <= covered, listed - covered
    assert {names[t] for t in cases.DTYPES} == {k.dtype for k in KL["KERNELS"]}


@pytest.mark.parametrize("change", ["duplicate", "one dtype short", "no head dim", "no v head dim",
                                    "v wider than q"])
def test_generator_refuses_a_list_the_dispatch_cannot_serve(change):
    generator = runpy.run_path(GENERATOR)
    kl = generator["load_list"]()
    kernel = kl["Kernel"]
    if change == "duplicate":
        kl["KERNELS"] = kl["KERNELS"] + [kernel("fwd_16bit", 64, "fp16", "sm80", 64)]
    elif change == "one dtype short":  # dispatch.h picks tiles by 16-bit vs fp32 only
        kl["KERNELS"] = [k for k in kl["KERNELS"] if (k.head_dim, k.dtype) != (96, "bf16")]
    elif change == "no head dim":
        kl["KERNELS"] = kl["KERNELS"] + [kernel("fwd_16bit", None, "fp16", "sm80", 64)]
    elif change == "no v head dim":  # the 16-bit forward is keyed by (qk, v) pairs
        kl["KERNELS"] = kl["KERNELS"] + [kernel("fwd_16bit", 160, dtype, "sm80")
                                         for dtype in ("fp16", "bf16")]
    else:  # the kernels stage O in Qi's rows
        kl["KERNELS"] = kl["KERNELS"] + [kernel("fwd_16bit", 64, dtype, "sm80", 128)
                                         for dtype in ("fp16", "bf16")]
    with pytest.raises(ValueError):
        generator["expected"](kl)
