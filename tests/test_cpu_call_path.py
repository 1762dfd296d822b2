"""What a small CPU call costs besides its arithmetic (issue 29, "a lean call path"): the ATen
ops flashattn::fwd and flashattn::bwd call themselves, recorded by the torch profiler (it
records the C++ calls too). The forward allocates its two outputs and nothing else; the
backward its three gradients and three workspaces (the row terms D and LSE, and the partial
dQ), plus the packed transposes of Q, dO and K unless its products are small enough to read
them in place (csrc/cpu/bwd.cpp takes_products_in_place), each allocated once and reused from
head to head; neither
fills anything through ATen (scratch tiles are zeroed only where the products accumulate, in
the kernels). Measured in a subprocess with FLASHATTN_POISON_OUTPUTS=0, the production setting:
conftest.py turns poisoning on, which adds a NaN fill per output and workspace."""
import json
import os
import subprocess
import sys

import pytest

# The probe runs from tests/, as the suite does, so it imports the installed flashattn (the
# source tree's has no _C in a clean checkout).
HERE = os.path.dirname(os.path.abspath(__file__))

_PROBE = r"""
import json, sys, torch, flashattn
from torch.profiler import profile, ProfilerActivity
torch.set_num_threads(1)
shape, causal = json.loads(sys.argv[1])
q, k, v = (torch.randn(*shape, requires_grad=True) for _ in range(3))
do = torch.randn(*shape)
for _ in range(2):  # warm: the first call sets up oneDNN and the thread pool
    torch.autograd.grad(flashattn.flash_attn_func(q, k, v, causal=causal), (q, k, v), do)
with profile(activities=[ProfilerActivity.CPU]) as prof:
    torch.autograd.grad(flashattn.flash_attn_func(q, k, v, causal=causal), (q, k, v), do)
calls = {"flashattn::fwd": [], "flashattn::bwd": []}
for event in prof.events():
    parent = event.cpu_parent
    while parent is not None and parent.name not in calls:
        parent = parent.cpu_parent
    if parent is not None and event.name.startswith("aten::"):
        calls[parent.name].append(event.name)
print(json.dumps(calls))
"""

ALLOCATIONS = {"aten::empty", "aten::empty_strided", "aten::empty_like", "aten::zeros",
               "aten::zeros_like", "aten::full", "aten::new_empty", "aten::new_zeros"}
FILLS = {"aten::fill_", "aten::zero_", "aten::zeros", "aten::zeros_like", "aten::copy_"}


def _aten_calls(shape, causal):
    env = dict(os.environ, FLASHATTN_POISON_OUTPUTS="0")
    run = subprocess.run([sys.executable, "-c", _PROBE, json.dumps([shape, causal])], env=env,
                         cwd=HERE, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape, packed", [((1, 1, 8, 64), 0), ((2, 3, 4, 32), 0),
                                           ((1, 16, 8, 64), 2), ((1, 32, 2, 64), 3)])
def test_small_calls_allocate_outputs_and_workspaces_only(shape, packed, causal):
    calls = _aten_calls(list(shape), causal)
    fwd, bwd = calls["flashattn::fwd"], calls["flashattn::bwd"]
    assert [c for c in fwd if c in ALLOCATIONS] == ["aten::empty"] * 2, fwd  # out, lse
    assert not [c for c in fwd if c in FILLS], fwd
    # dq, dk, dv; D and the LSE shift; the partial dQ; dOᵀ and Kᵀ where packed, and Qᵀ too
    # past 16 query rows per kv head (below, the row dots take S without it).
    assert [c for c in bwd if c in ALLOCATIONS] == ["aten::empty"] * (6 + packed), bwd
    assert not [c for c in bwd if c in FILLS], bwd
