"""tools/gpu_check.sh picks the GPU tests with `-k cuda -m "not slow and not shim"`. The CPU
shim's tests must not be among them: their names can match `-k cuda`
(test_cuda_kernels_on_the_shim), and on the first H200 run eight pytest workers building the shim
extension at once crashed. conftest.py marks them `shim`; this checks the selection."""
import os
import re
import subprocess
import sys

TESTS = os.path.dirname(os.path.abspath(__file__))
GPU_SELECTION = ["-k", "cuda", "-m", "not slow and not shim"]


def collect(*args):
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                          "--rootdir", os.path.dirname(TESTS), *args, TESTS],
                         capture_output=True, text=True, timeout=300, cwd=TESTS)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout


def test_gpu_selection_has_no_shim_test():
    # --fixtures-per-test lists, per selected test, the fixtures it uses ("sim -- file:line").
    listing = collect("--fixtures-per-test", *GPU_SELECTION)
    tests = re.findall(r"fixtures used by (.+?) -+$", listing, re.MULTILINE)
    assert len(tests) > 500, f"the GPU matrix is missing: {len(tests)} tests selected"
    assert not re.search(r"^sim -- ", listing, re.MULTILINE), "a selected test uses the sim fixture"
    with_sim_param = [t for t in tests if re.search(r"[\[-]sim[\]-]", t)]
    assert not with_sim_param, with_sim_param[:5]


def test_every_shim_test_is_marked():
    # The tests that use the sim executor, found without the marker, are all left out by it.
    marked = set(re.findall(r"^(\S+::.+)$", collect("--collect-only", "-m", "shim"), re.M))
    listing = collect("--fixtures-per-test", "-m", "not slow")
    uses_sim = set()
    for block in re.split(r"\n-+ fixtures used by ", listing)[1:]:
        name = re.match(r"(.+?) -+$", block, re.MULTILINE).group(1)
        if re.search(r"^sim -- ", block, re.MULTILINE) or re.search(r"[\[-]sim[\]-]", name):
            uses_sim.add(name)
    assert uses_sim, "no test uses the sim executor?"
    unmarked = {t for t in uses_sim if not any(m.endswith("::" + t) for m in marked)}
    assert not unmarked, sorted(unmarked)[:5]
