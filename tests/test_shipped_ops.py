"""What the shipped flashattn._C registers beside torch.ops.flashattn: the two ops
`python -m flashattn.bench` reads, never the test-only ones, which tests/cpu_test_ext builds (as
torch.ops.flashattn_test, with the kernels' test counters) for the tests that need them."""
import subprocess
import sys

# csrc/cpu/bench_ops.cpp
BENCH_OPS = {"flashattn_internal::cpu_16bit_path", "flashattn_internal::cpu_tile_products_gflops"}

LIST_OPS = """
import torch, flashattn
print(" ".join(n for n in torch._C._dispatch_get_all_op_names()
               if n.split("::")[0] in ("flashattn_internal", "flashattn_test")))
"""


def test_shipped_library_registers_only_the_bench_ops():
    # A fresh process: this one may have loaded the test extension already.
    result = subprocess.run([sys.executable, "-c", LIST_OPS], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    assert set(result.stdout.split()) == BENCH_OPS

