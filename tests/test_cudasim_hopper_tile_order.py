"""The sm_90a forward's tile order (csrc/cuda/hopper/fwd_sm90_tile_order.h) on the host
(selftest/hopper_tile_order_test.cpp): every launch place takes a distinct tile of the grid, for
awkward lengths (1 to 257 rows, Sq != Sk both ways), split-KV 1 and 3, several heads and batches,
GQA, causal (both alignments), local windows and neither; for causal and one-edged windows the
key tiles per CTA (the kernel's KeyTiles) never grow in launch order within a section of
(batch, head)s; the sections at the issue's shapes. That the kernel computes the right tiles in
this order is the forward's shim matrix (test_cudasim_hopper_fwd.py, *_call_path.py, *_paged.py)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "cudasim"))
from fixtures import assert_every_line_ok, program, run  # noqa: E402


@pytest.mark.parametrize("mode, lines", [("bijection", 2), ("work", 2), ("sections", 1)])
def test_tile_order(mode, lines):
    out = run(program("hopper_tile_order_test"), mode)
    assert_every_line_ok(out)
    assert len(out.stdout.splitlines()) == lines, out.stdout


def test_causal_issues_the_last_query_block_first():
    """One head, 3 query blocks of 128 keys: key tiles + 1 per CTA, 4 3 2 in the order (2 3 4 in
    the grid's own)."""
    exe = program("hopper_tile_order_test")
    ordered = run(exe, "work_list", "ordered", "300", "300", "128", "1", "1", "1")
    natural = run(exe, "work_list", "natural", "300", "300", "128", "1", "1", "1")
    assert ordered.stdout.split() == ["4", "3", "2"], ordered.stdout + ordered.stderr
    assert natural.stdout.split() == ["2", "3", "4"], natural.stdout + natural.stderr
    flat = run(exe, "work_list", "ordered", "300", "300", "128", "0", "1", "1")
    assert flat.stdout.split() == ["4", "4", "4"], flat.stdout + flat.stderr
