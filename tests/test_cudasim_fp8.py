"""FP8 (e4m3) on the shim (tests/cudasim/selftest/fp8_test.cpp): the wgmma m64nNk32 and
conversion layout cases of selftest/sm90_fp8_cases.h (the cases the GPU layout check runs) under
every schedule, the conversions against torch.float8_e4m3fn on every code and a sweep of f32
values (ties, saturation, underflow, NaN), and FP8 misuse named by the shim."""
import os
import struct
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "cudasim"))
from fixtures import CORRECT, SELFTEST_DIR, named_error, program, run, site_of  # noqa: E402

SOURCE = os.path.join(SELFTEST_DIR, "fp8_test.cpp")
SCHEDULES = ["forward", "reverse", "random:1"]
E4M3_MAX = 448.0


def run_case(case, schedule="forward", sanitize=False):
    return run(program("fp8_test", sanitize=sanitize), case, schedule=schedule)


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("case", ["layouts", "k_step_32", "read_before_wait"])
def test_correct_kernels_pass(case, schedule):
    out = run_case(case, schedule)
    assert out.returncode == CORRECT, out.stdout + out.stderr


def test_every_layout_case_runs():
    out = run_case("layouts")
    assert "30 cases, 0 failed" in out.stdout, out.stdout


@pytest.fixture(scope="module")
def table():
    out = run_case("conversion_table")
    assert out.returncode == CORRECT, out.stdout + out.stderr
    encode, decode = [], {}
    for line in out.stdout.splitlines():
        kind, a, b = line.split()
        if kind == "encode":
            encode.append((struct.unpack("<f", bytes.fromhex(a)[::-1])[0], int(b, 16)))
        else:
            decode[int(a, 16)] = int(b, 16)
    return encode, decode


def test_decode_matches_torch_on_every_code(table):
    """cvt.rn.f16x2.e4m3x2: each of the 256 codes to f16 exactly; NaN (S.1111.111) to f16's
    canonical NaN 0x7fff whatever its sign."""
    _, decode = table
    assert sorted(decode) == list(range(256))
    codes = torch.arange(256, dtype=torch.uint8)
    want = codes.view(torch.float8_e4m3fn).to(torch.float16)
    nan = torch.isnan(want)
    assert int(nan.sum()) == 2  # 0x7f and 0xff
    got = torch.tensor([decode[c] for c in range(256)], dtype=torch.int32).to(torch.int16)
    got_f16 = got.view(torch.float16)
    assert torch.equal(got_f16[~nan].view(torch.int16), want[~nan].view(torch.int16))
    assert all(decode[c] == 0x7fff for c in (0x7f, 0xff))


def test_encode_matches_torch_on_a_sweep(table):
    """cvt.rn.satfinite.e4m3x2.f32 against torch's float32 -> float8_e4m3fn: round to nearest
    even everywhere (ties included); .satfinite clamps magnitudes past 448 (and infinity) to
    +-448 where torch's conversion need not (so torch sees the clamped value); NaN to 0x7f."""
    encode, _ = table
    values = torch.tensor([v for v, _ in encode], dtype=torch.float32)
    got = torch.tensor([c for _, c in encode], dtype=torch.uint8)
    assert len(encode) > 9000
    nan = torch.isnan(values)
    want = values.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
    mismatch = (got != want) & ~nan
    assert not bool(mismatch.any()), [(float(v), int(g), int(w)) for v, g, w in
                                      zip(values[mismatch], got[mismatch], want[mismatch])][:10]
    assert bool((got[nan] == 0x7f).all())
    # The sweep holds what the rules decide: ties between neighbours, both saturation edges,
    # infinities, the underflow tie 2^-10, signed zeros.
    for v in (464.0, 480.0, float("inf"), -float("inf"), 2.0 ** -10, 0.0, -0.0, 1.0625, 1.1875):
        assert bool((values == v).any()), v
    by_value = {(v, struct.pack("<f", v)[3] >> 7): c for v, c in encode if v == v}
    assert by_value[(464.0, 0)] == 0x7e and by_value[(float("inf"), 0)] == 0x7e
    assert by_value[(-float("inf"), 1)] == 0xfe
    assert by_value[(2.0 ** -10, 0)] == 0x00 and by_value[(-0.0, 1)] == 0x80
    assert by_value[(1.0625, 0)] == 0x38 and by_value[(1.1875, 0)] == 0x3a  # ties to even


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_a_k_step_of_16_bytes_is_named(schedule):
    """An e4m3 wgmma consumes K = 32 per instruction (32 bytes of a K-major row): advancing the
    descriptors by 16 bytes (the 16-bit types' 16 elements) rereads half of each step."""
    out = run_case("k_step_16", schedule)
    named_error(out, r"wgmma\.mma_async\.m64nNk32\.f32\.e4m3\.e4m3 accumulates onto the MMA issued "
                     r"at \S+ and reads operand A at smem\+0x[0-9a-f]+ again: its descriptor "
                     r"stepped K by too little",
                [site_of(SOURCE, "k_step_wgmma")])


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_an_mn_major_8bit_operand_is_named(schedule):
    out = run_case("mn_major_operand", schedule)
    named_error(out, r"wgmma\.mma_async\.m64nNk32\.f32\.e4m3\.e4m3: operand B is M- or N-major, but "
                     r"8-bit operands must be K-major \(the ISA transposes only f16 and bf16\)",
                [site_of(SOURCE, "mn_major_wgmma")])


def test_counters():
    out = run_case("counters")
    assert out.returncode == CORRECT, out.stdout + out.stderr
    assert ('"wgmma": {"instructions": 2, "by_shape": {"m64n8k32.e4m3": 1, "m64n64k32.e4m3": 1}, '
            '"a_from_registers": 1, "macs": 147456,') in out.stdout, out.stdout
    assert '"cvt_e4m3x2_f32": 128, "cvt_f16x2_e4m3x2": 128' in out.stdout, out.stdout


@pytest.mark.parametrize("case", ["layouts", "k_step_16", "conversion_table"])
def test_clean_under_asan(case):
    out = run_case(case, "random:7", sanitize=True)
    assert out.returncode in (CORRECT, 3), out.stdout + out.stderr
    assert "Sanitizer" not in out.stderr and "runtime error" not in out.stderr, out.stderr


def test_primitives_test_runs_the_fp8_cases_for_the_layout_check():
    """primitives_test --sm90 is the shim side of layout_check.py --arch 90a: the FP8 cases are
    among the ones a lent H100/H200 compares bit for bit."""
    out = run(program("primitives_test"), "--hardware-safe", "--sm90")
    assert out.returncode == 0, out.stdout + out.stderr
    names = [line.split()[1] for line in out.stdout.splitlines() if line.startswith("PASS")]
    assert "cvt_rn_satfinite_e4m3x2_f32" in names and "cvt_rn_f16x2_e4m3x2" in names
    for a in ("AK", "AKsw32", "AKsw64", "AKsw128"):
        for b in ("BK", "BKsw32", "BKsw64", "BKsw128"):
            assert any(n.startswith(f"wgmma_m64n64k32_e4m3_ss_{a}_{b}_k64") for n in names), (a, b)
    assert sum(n.startswith("wgmma_m64n") and "k32_e4m3_rs_Areg" in n for n in names) == 5
    assert "e4m3_p_fragment_times_key_permuted_vt_m64n64k32" in names
