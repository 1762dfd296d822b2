"""`python -m flashattn.bench sdpa-impl` runs end to end: every training-step case checks that
flashattn ran (profiler) and gave PyTorch's loss and gradients before it is timed, the per-call
table covers the four ways to call the kernel, and a run in which flashattn does not run, or
gives other results, fails instead of reporting a speedup. Speed is not tested, only that the
numbers are consistent with the samples they come from."""
import json
import math
import statistics

import pytest
import torch

from test_bench import run_python

LAYERS = 2
VARIANTS = ("unmasked", "causal", "key-padding")
CPU_FLASH_OP = "aten::_scaled_dot_product_flash_attention_for_cpu"
CPU_FLASH_BWD_OP = "aten::_scaled_dot_product_flash_attention_for_cpu_backward"
OVERHEAD_IMPLS = ("op", "flashattn.sdpa", "F.sdpa+flashattn", "F.sdpa (pytorch)")
QUICK = ["sdpa-impl", "--device", "cpu", "--quick"]


@pytest.fixture(scope="module")
def quick_run():
    """One sdpa-impl --quick run shared by the tests: JSON on stdout, table on stderr."""
    proc = run_python(["-m", "flashattn.bench", *QUICK, "--json"])
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), proc.stderr


@pytest.fixture
def keep_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def bench_main(argv):
    from flashattn import bench
    return bench.main(argv)


def test_every_variant_of_every_size(quick_run):
    report, _ = quick_run
    assert list(report) == ["subcommand", "meta", "summary", "results", "overhead", "toggle_us",
                            "failed"]
    assert report["subcommand"] == "sdpa-impl"
    meta = report["meta"]
    assert meta["parts"] == ["train", "overhead"] and meta["layers"] == LAYERS
    cases = [(r["d_model"], r["nhead"], r["seqlen"], r["batch"], r["variant"])
             for r in report["results"]]
    assert cases == [(s["d_model"], s["nhead"], s["seqlen"], s["batch"], v)
                     for s in meta["sizes"] for v in VARIANTS]
    assert report["failed"] == 0


def test_flashattn_ran_with_and_pytorch_without(quick_run):
    report, _ = quick_run
    for r in report["results"]:
        where = f"{r['variant']} {r['d_model']}:{r['seqlen']}"
        assert r["status"] == "ok", f"{where}: {r['reason']}"
        assert r["flashattn_ran"] is True, where
        with_fa, without = r["events"]["flashattn"], r["events"]["pytorch"]
        # One forward+backward of a LAYERS-layer encoder: one attention call per layer, each
        # through ATen's CPU flash op, which flashattn replaces only while active.
        assert with_fa["flashattn::fwd"] == with_fa["flashattn::bwd"] == LAYERS, where
        assert with_fa[CPU_FLASH_OP] == with_fa[CPU_FLASH_BWD_OP] == LAYERS, where
        assert not any(name.startswith("flashattn::") for name in without), where
        assert without[CPU_FLASH_OP] == without[CPU_FLASH_BWD_OP] == LAYERS, where


def test_the_variants_reach_the_kernel_as_intended(quick_run):
    report, table = quick_run
    for r in report["results"]:
        call = (f"_scaled_dot_product_flash_attention_for_cpu(q ({r['batch']}, {r['nhead']}, "
                f"{r['seqlen']}, {r['d_model'] // r['nhead']}), ")
        mask = {"unmasked": "is_causal=False, attn_mask=None",
                "causal": "is_causal=True, attn_mask=None",
                "key-padding": f"is_causal=False, attn_mask=float32 ({r['batch']}, "
                               f"{r['nhead']}, 1, {r['seqlen']})"}[r["variant"]]
        assert r["sdpa_calls"] == f"{LAYERS}x {call}{mask})", r["sdpa_calls"]
        assert r["sdpa_calls"] in table


def test_same_loss_output_and_gradients(quick_run):
    report, _ = quick_run
    for r in report["results"]:
        assert r["same_results"] is True and r["tolerance"] == 1e-3
        for name in ("loss_rel", "out_rel", "grad_rel"):
            assert isinstance(r[name], float) and 0 <= r[name] <= r["tolerance"], (name, r)
        assert math.isfinite(r["loss"]) and r["loss"] > 0


def test_times_and_speedup_come_from_paired_samples(quick_run):
    report, table = quick_run
    repeats = report["meta"]["repeats"]
    for r in report["results"]:
        pt, fa = r["times_ms_pytorch"], r["times_ms_flashattn"]
        assert len(pt) == len(fa) == repeats >= 5
        assert all(t > 0 for t in pt + fa)
        assert r["time_ms_pytorch"] == statistics.median(pt)
        assert r["time_ms_flashattn"] == statistics.median(fa)
        ratios = [a / b for a, b in zip(pt, fa)]
        assert r["speedup"] == pytest.approx(statistics.median(ratios))
        assert r["speedup"] > 0
        low, high = r["speedup_quartiles"]
        assert 0 < low <= r["speedup"] <= high
        assert min(ratios) <= low and high <= max(ratios)
        # Profiled time inside the attention ops: on the CPU, both sides, part of the step.
        assert r["attn_ms_pytorch"] > 0 and r["attn_ms_flashattn"] > 0
        assert f"{r['speedup']:.3f}x" in table
    for variant in VARIANTS:
        assert f"float32, {variant:>11}: training step with flashattn: " in table


def test_summary_per_variant(quick_run):
    report, _ = quick_run
    assert [(s["dtype"], s["variant"]) for s in report["summary"]] == [
        ("float32", variant) for variant in VARIANTS]
    for s in report["summary"]:
        speedups = [r["speedup"] for r in report["results"] if r["variant"] == s["variant"]]
        assert s["sizes"] == len(speedups) == len(report["meta"]["sizes"])
        assert s["geomean_speedup"] == pytest.approx(statistics.geometric_mean(speedups))
        assert s["speedup_span"] == [min(speedups), max(speedups)]


def test_per_call_table(quick_run):
    report, table = quick_run
    meta = report["meta"]
    rows = report["overhead"]
    assert [(tuple(r["shape"]), r["impl"]) for r in rows] == [
        (tuple(shape), impl) for shape in meta["overhead_shapes"] for impl in OVERHEAD_IMPLS]
    assert meta["overhead_shapes"] == [[1, 2, 16, 16], [1, 4, 64, 64]]
    for r in rows:
        assert r["status"] == "ok", r["reason"]
        # Which kernel ran, from the profiler: flashattn's for three of them, PyTorch's for one.
        assert r["flashattn_fwd_events"] == (0 if r["impl"] == "F.sdpa (pytorch)" else 1), r
        if r["impl"] in ("F.sdpa+flashattn", "F.sdpa (pytorch)"):
            assert r["aten_events"][CPU_FLASH_OP] == 1, r
        else:
            assert CPU_FLASH_OP not in r["aten_events"], r
        assert 0 <= r["max_diff"] < 1e-5
        samples = r["us_samples"]
        assert len(samples) == meta["overhead_samples"] and all(t > 0 for t in samples)
        assert r["us_per_call"] == statistics.median(samples)
        assert r["us_min"] == min(samples)
    by = {(tuple(r["shape"]), r["impl"]): r for r in rows}
    for shape in meta["overhead_shapes"]:
        op, plain = by[(tuple(shape), "op")], by[(tuple(shape), "F.sdpa (pytorch)")]
        assert op["us_vs_op"] == 0 and plain["ratio_vs_pytorch"] == 1
        for impl in OVERHEAD_IMPLS:
            r = by[(tuple(shape), impl)]
            assert r["us_vs_op"] == pytest.approx(statistics.median(
                t - t_op for t, t_op in zip(r["us_samples"], op["us_samples"])))
            assert r["ratio_vs_pytorch"] == pytest.approx(statistics.median(
                t / t_pt for t, t_pt in zip(r["us_samples"], plain["us_samples"])))
    assert report["toggle_us"] > 0
    assert "per-call cost, CPU, 1 thread, float32" in table
    assert "activate_flash_attention_impl + restore_flash_attention_impl:" in table


def test_flashattn_not_running_is_a_failure_not_a_speedup(monkeypatch, tmp_path, keep_threads):
    """If activation did nothing, both sides would run PyTorch's kernel: the profiler check must
    see it, and nothing may be timed."""
    import contextlib

    from flashattn.bench import sdpa_impl

    monkeypatch.setattr(sdpa_impl, "activated", lambda active: contextlib.nullcontext())
    out = tmp_path / "sdpa.json"
    assert bench_main([*QUICK, "--causal", "yes", "--json", str(out)]) == 1
    report = json.loads(out.read_text())
    (r,) = report["results"]
    assert r["status"] == "failed" and r["flashattn_ran"] is False
    assert "flashattn did not run" in r["reason"]
    assert r["speedup"] is None and r["times_ms_flashattn"] is None
    assert "flashattn::fwd" not in r["events"]["flashattn"]
    by_impl = {}
    for row in report["overhead"]:
        by_impl.setdefault(row["impl"], []).append(row)
    for row in by_impl["F.sdpa+flashattn"]:
        assert row["status"] == "failed" and row["us_per_call"] is None
        assert row["flashattn_fwd_events"] == 0
    for impl in ("op", "flashattn.sdpa", "F.sdpa (pytorch)"):
        assert all(row["status"] == "ok" for row in by_impl[impl])
    assert report["failed"] == 1 + len(by_impl["F.sdpa+flashattn"])


def test_different_results_are_a_failure(monkeypatch, tmp_path, keep_threads):
    """A flashattn side that computes something else (here: weights off by 1%) must be caught by
    the loss and gradient check, and not timed."""
    from flashattn.bench import sdpa_impl

    clone = sdpa_impl.clone_model

    def perturbed(model):
        copy = clone(model)
        with torch.no_grad():
            copy.layers[0].self_attn.in_proj_weight.mul_(1.01)
        return copy

    monkeypatch.setattr(sdpa_impl, "clone_model", perturbed)
    out = tmp_path / "sdpa.json"
    assert bench_main([*QUICK[:1], "train", *QUICK[1:], "--causal", "no", "--json",
                       str(out)]) == 1
    report = json.loads(out.read_text())
    assert report["overhead"] == [] and report["failed"] == 2
    for r in report["results"]:
        assert r["status"] == "failed" and r["flashattn_ran"] is True
        assert r["same_results"] is False and "results differ" in r["reason"]
        assert r["grad_rel"] > r["tolerance"]
        assert r["speedup"] is None and r["times_ms_pytorch"] is None


def test_overhead_part_alone(tmp_path, keep_threads):
    out = tmp_path / "sdpa.json"
    assert bench_main(["sdpa-impl", "overhead", "--device", "cpu", "--quick", "--threads",
                       "2", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["results"] == [] and len(report["overhead"]) == 8
    assert torch.get_num_threads() == 2  # the table's one thread was given back


@pytest.mark.parametrize("args, message", [
    # With "=": a value after an unknown option would be taken for the positional PART.
    (["sdpa-impl", "--seqlens=64"],
     "flashattn.bench sdpa-impl: error: unrecognized arguments: --seqlens=64"),
    (["sdpa-impl", "--mode=fwd"], "unrecognized arguments: --mode=fwd"),
    (["sdpa-impl", "--heads=2", "--head-dim=8"], "unrecognized arguments: --heads=2 --head-dim=8"),
    (["sdpa-impl", "--plot", "x.svg"], "argument --plot: the sdpa-impl subcommand draws no plot"),
    (["sdpa-impl", "everything"], "argument part: invalid choice: 'everything'"),
    (["--sdpa-sizes", "64:4:48:2"], "flashattn.bench dense: error: unrecognized arguments: "
                                    "--sdpa-sizes"),
    (["sdpa-impl", "--sdpa-sizes", "64:5:48:2"], "nhead must divide d_model"),
    (["sdpa-impl", "--sdpa-sizes", "64:4:48"], "expected d_model:nhead:seqlen:batch"),
])
def test_options_that_do_not_apply_are_errors(args, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        bench_main([*args, "--device", "cpu", "--quick"])
    assert exit_.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and message in err


def test_sizes_option_and_padding_lengths():
    from flashattn.bench.sdpa_impl import Size, _sizes, padding_lengths

    assert _sizes("256:4:128:8,512:8:1024:1") == (Size(256, 4, 128, 8), Size(512, 8, 1024, 1))
    assert padding_lengths(48, 2) == [48, 24]
    assert padding_lengths(100, 5) == [100, 88, 75, 62, 50]
    assert padding_lengths(7, 1) == [7]
