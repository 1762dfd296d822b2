"""`python -m flashattn.bench` runs end to end, dense (also without naming it) and varlen: its
JSON has the promised structure with small, finite errors (and, for varlen, FLOPs that count only
the real tokens), and `--plot` draws with matplotlib in the format the file name asks for, or
fails before the benchmark. Speed is not tested here, only that it runs."""
import json
import math
import os
import statistics
import subprocess
import sys
import warnings
import xml.etree.ElementTree as ET

import pytest
import torch

import flashattn

# --quick takes seconds on an idle machine; this bound only stops a hung run.
BENCH_TIMEOUT_S = 600
# The quick preset runs float32; every implementation is far more accurate than this bound, so
# exceeding it means a broken kernel or a broken reference, not rounding.
MAX_FLOAT32_ERROR = 1e-3
CPU_IMPLS = {"flashattn", "sdpa-flash", "sdpa-math"}
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
MATPLOTLIB_MISSING = "argument --plot: needs matplotlib: pip install 'flashattn[bench]'"
# The smallest run there is: one case of three implementations.
TINY_RUN = ["--device", "cpu", "--quick", "--seqlens", "64", "--mode", "fwd", "--causal", "no"]


def run_python(args, cwd=None):
    """A fresh interpreter that imports the flashattn under test (source tree or installed wheel)
    and none of the modules this pytest process has imported."""
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(flashattn.__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [package_parent, os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=BENCH_TIMEOUT_S)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """One --quick run shared by the tests, no subcommand named (dense is the default): JSON on
    stdout, table on stderr, plot to an SVG."""
    plot = tmp_path_factory.mktemp("bench") / "bench.svg"
    proc = run_python(["-m", "flashattn.bench", "--quick", "--device", "cpu", "--json", "-",
                       "--plot", str(plot)])
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), proc.stderr, plot


def test_json_structure(quick_run):
    report, _, _ = quick_run
    assert list(report) == ["subcommand", "meta", "summary", "results"]
    assert report["subcommand"] == "dense"
    # The command names the subcommand it ran, even where it was left to its default.
    assert report["meta"]["command"].startswith("python -m flashattn.bench dense --quick ")
    assert report["meta"]["device"] == "cpu"
    assert report["meta"]["repeats"] >= 5
    cases = {}
    for r in report["results"]:
        cases.setdefault((r["mode"], r["causal"], r["seqlen"]), set()).add(r["impl"])
    assert {mode for mode, _, _ in cases} == {"fwd", "fwdbwd"}
    assert {causal for _, causal, _ in cases} == {False, True}
    assert all(impls == CPU_IMPLS for impls in cases.values()), cases


def test_every_implementation_ran_with_small_finite_errors(quick_run):
    report, _, _ = quick_run
    for r in report["results"]:
        where = f"{r['impl']} {r['mode']} causal={r['causal']} seqlen={r['seqlen']}"
        assert r["status"] == "ok", f"{where}: {r['reason']}"
        errors = [r["max_err"]] + ([r["dq_err"]] if r["mode"] == "fwdbwd" else [])
        for err in errors:
            assert isinstance(err, float) and math.isfinite(err), f"{where}: error {err}"
            assert err < MAX_FLOAT32_ERROR, f"{where}: error {err}"
        assert len(r["times_ms"]) == report["meta"]["repeats"]
        assert r["time_ms"] > 0 and r["tflops"] > 0, where
        assert (r["speedup"] is None) == (r["impl"] == "flashattn"), where
        assert r["speedup"] is None or r["speedup"] > 0, where


def test_summary_per_mode(quick_run):
    report, table, _ = quick_run
    summary = {s["mode"]: s for s in report["summary"]}
    assert summary.keys() == {"fwd", "fwdbwd"}
    for s in summary.values():
        assert s["cases"] > 0 and s["geomean_speedup_vs_best_sdpa"] > 0
    # The forward is also held against the machine's matmul rate, measured in the same run.
    assert summary["fwd"]["matmul_tflops"] > 0
    low, high = summary["fwd"]["noncausal_fwd_share_of_matmul"]
    assert 0 < low <= high
    assert "matmul ceiling (256x256x256, float32)" in table
    # The table went to stderr because the JSON took stdout; it ends with the summary lines.
    assert table.rstrip().splitlines()[-1].startswith("forward+backward, float32: flashattn vs")
    # stderr is not a terminal here: no progress line among the table's.
    assert "\r" not in table


def test_plot_is_an_svg_with_labels_and_title(quick_run):
    report, _, plot = quick_run
    root = ET.parse(plot).getroot()
    assert root.tag.endswith("svg")
    text = " ".join("".join(e.itertext()) for e in root.iter() if e.tag.endswith("text"))
    assert "seqlen" in text and "time (ms)" in text and "peak memory (MB)" in text
    assert f"torch {report['meta']['torch']}" in text
    assert f"heads={report['meta']['heads']}, head_dim={report['meta']['head_dim']}" in text
    assert all(impl in text for impl in CPU_IMPLS)  # the legends


def test_plot_writes_a_png_for_a_png_name(tmp_path):
    from flashattn.bench.dense import Result
    from flashattn.bench.plot import plot_results

    # sdpa-flash did not run (None); the causal group has no memory measured at all.
    results = [Result("fwd", "float32", causal, seqlen, 1, 2, 32, impl, time_ms=time_ms,
                      peak_mb=None if causal else peak_mb)
               for causal in (False, True) for seqlen in (128, 256)
               for impl, time_ms, peak_mb in
               (("flashattn", 1.0, 0.0), ("sdpa-math", 2.0, 3.0), ("sdpa-flash", None, None))]
    plot = tmp_path / "tiny.png"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. a legend with nothing in it
        plot_results(str(plot), results, title="tiny")
    assert plot.read_bytes().startswith(PNG_SIGNATURE)


@pytest.mark.parametrize("name", ["out.xyz", "out"])
def test_plot_with_an_unknown_format_fails_before_the_benchmark(name, tmp_path, capsys):
    from flashattn import bench

    with pytest.raises(SystemExit) as exit_:
        bench.main([*TINY_RUN, "--plot", str(tmp_path / name)])
    assert exit_.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""  # the benchmark prints its first line only once it starts
    assert "argument --plot" in err and "the extension picks the format" in err
    assert "png" in err and "svg" in err and "pdf" in err


def test_plot_without_matplotlib_fails_before_the_benchmark(tmp_path):
    proc = run_python(["-c", "import sys; sys.modules['matplotlib'] = None  # unimportable\n"
                             "from flashattn.bench import main\n"
                             f"main({[*TINY_RUN, '--plot', 'out.png']!r})"], cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert MATPLOTLIB_MISSING in proc.stderr
    assert proc.stdout == "" and not (tmp_path / "out.png").exists()


def test_the_benchmark_without_plot_does_not_import_matplotlib(tmp_path):
    proc = run_python(["-c", "import sys\n"
                             "from flashattn.bench import main\n"
                             f"main({[*TINY_RUN, '--json', 'out.json']!r})\n"
                             "print(sorted(m for m in sys.modules if m.startswith('matplotlib')))"],
                      cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "[]"


def test_an_implementation_that_cannot_run_is_reported_not_available(monkeypatch, tmp_path):
    # As on a GPU before the CUDA kernels exist: flashattn raises, the SDPA backends still run.
    from flashattn import bench
    from flashattn.bench import dense

    def not_built(*args, **kwargs):
        raise NotImplementedError("flashattn::fwd: no kernel for this device\nsecond line")

    monkeypatch.setattr(dense, "flashattn_sdpa", not_built)
    out = tmp_path / "bench.json"
    assert bench.main(["--device", "cpu", "--quick", "--seqlens", "64", "--mode", "fwd",
                       "--causal", "no", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    by_impl = {r["impl"]: r for r in report["results"]}
    assert by_impl["flashattn"]["status"] == "n/a"
    assert by_impl["flashattn"]["reason"] == "flashattn::fwd: no kernel for this device"
    assert by_impl["sdpa-math"]["status"] == "ok" and by_impl["sdpa-math"]["speedup"] is None
    (summary,) = report["summary"]
    assert summary["cases"] == 0 and summary["geomean_speedup_vs_best_sdpa"] is None
    assert summary["matmul_tflops"] > 0 and summary["noncausal_fwd_share_of_matmul"] is None


def test_flops_follow_the_flashattention_convention():
    from flashattn.bench.dense import Case

    def flops(mode, causal):
        return Case(mode, torch.float32, causal, seqlen=1024, batch=2, heads=4,
                    head_dim=64).flops()

    forward = 4 * 2 * 4 * 1024 * 1024 * 64
    assert flops("fwd", False) == forward
    assert flops("fwd", True) == forward / 2
    assert flops("fwdbwd", False) == 3.5 * forward


# varlen: a packed batch of variable-length sequences against padding and nested tensors.
VARLEN_IMPLS = {"flashattn-varlen", "flashattn-padded", "sdpa-flash", "sdpa-math", "sdpa-nested"}
# Ours run every case on the CPU; torch's may refuse one (a mask, nested tensors), with a reason.
VARLEN_MUST_RUN = {"flashattn-varlen", "flashattn-padded"}
# The smallest varlen run: one case, a handful of short sequences, a tiny thread-balance batch.
TINY_VARLEN = ["varlen", "--device", "cpu", "--quick", "--mode", "fwd", "--causal", "no",
               "--total-tokens", "96", "--max-seqlen", "32", "--median-seqlen", "8"]


@pytest.fixture(scope="module")
def varlen_run():
    """One varlen --quick run shared by the tests: JSON on stdout, table on stderr. Two
    threads even on a one-core machine, so that the thread balance is measured."""
    proc = run_python(["-m", "flashattn.bench", "varlen", "--quick", "--device", "cpu",
                       "--threads", "2", "--json"])
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), proc.stderr


def expected_flops(lengths, heads, head_dim, causal, mode):
    """FlashAttention's convention, counted here independently of the bench: per sequence
    4·H·L²·d forward, halved when causal; 3.5x for forward+backward; summed."""
    total = 0
    for length in lengths:
        forward = 4 * heads * length * length * head_dim
        if causal:
            forward = forward / 2
        total += forward * 3.5 if mode == "fwdbwd" else forward
    return total


def test_varlen_batch_is_the_promised_lengths(varlen_run):
    report, table = varlen_run
    meta = report["meta"]
    lengths = meta["lengths"]
    assert sum(lengths) == meta["total_tokens"]
    assert all(1 <= n <= meta["max_seqlen"] for n in lengths)
    assert len(set(lengths)) > 1  # variable lengths, not one repeated
    summary = meta["lengths_summary"]
    assert summary == {"count": len(lengths), "min": min(lengths), "max": max(lengths),
                       "median": statistics.median(lengths), "total": sum(lengths)}
    assert (f"count {summary['count']}, min {summary['min']}, median {summary['median']:g}, "
            f"max {summary['max']}") in table
    # A fixed seed: the same options draw the same batch.
    from flashattn.bench.varlen import sample_lengths
    assert sample_lengths(meta["total_tokens"], meta["max_seqlen"], meta["median_seqlen"],
                          meta["sigma"], meta["seed"]) == lengths


def test_varlen_every_implementation_in_every_case(varlen_run):
    report, _ = varlen_run
    cases = {}
    for r in report["results"]:
        cases.setdefault((r["mode"], r["dtype"], r["causal"]), []).append(r["impl"])
    assert set(cases) == {(mode, "float32", causal)
                          for mode in ("fwd", "fwdbwd") for causal in (False, True)}
    for case, impls in cases.items():
        assert sorted(impls) == sorted(VARLEN_IMPLS), case


def test_varlen_results_are_right_or_say_why_not(varlen_run):
    report, _ = varlen_run
    meta = report["meta"]
    for r in report["results"]:
        where = f"{r['impl']} {r['mode']} causal={r['causal']}"
        if r["impl"] in VARLEN_MUST_RUN:
            assert r["status"] == "ok", f"{where}: {r['reason']}"
        assert r["status"] in ("ok", "n/a"), where
        if r["status"] == "n/a":
            assert isinstance(r["reason"], str) and r["reason"].strip(), where
            assert r["time_ms"] is None and r["tflops"] is None, where
            continue
        errors = [r["max_err"]] + ([r["dq_err"]] if r["mode"] == "fwdbwd" else [])
        assert r["dq_err"] is None or r["mode"] == "fwdbwd", where
        for err in errors:
            assert isinstance(err, float) and math.isfinite(err), f"{where}: error {err}"
            assert err < MAX_FLOAT32_ERROR, f"{where}: error {err}"
        assert len(r["times_ms"]) == meta["repeats"], where
        assert r["time_ms"] > 0 and r["tokens_per_s"] > 0 and r["tflops"] > 0, where
        assert r["tokens_per_s"] == pytest.approx(meta["total_tokens"] / (r["time_ms"] / 1e3))
        assert r["tflops"] == pytest.approx(r["flops"] / (r["time_ms"] / 1e3) / 1e12)
        assert (r["varlen_speedup"] is None) == (r["impl"] == "flashattn-varlen"), where
        assert r["varlen_speedup"] is None or r["varlen_speedup"] > 0, where


def test_varlen_summary_against_the_best_sdpa_way_and_padding(varlen_run):
    report, table = varlen_run
    assert report["subcommand"] == "varlen"
    rows = {}
    for r in report["results"]:
        rows.setdefault((r["mode"], r["dtype"]), {}).setdefault(r["causal"], {})[r["impl"]] = r
    summary = {(s["mode"], s["dtype"]): s for s in report["summary"]}
    assert summary.keys() == rows.keys()
    for key, cases in rows.items():
        # Recomputed from the results: per case the smallest speedup over the SDPA ways.
        best = [min(r["varlen_speedup"] for impl, r in case.items()
                    if impl.startswith("sdpa-") and r["varlen_speedup"] is not None)
                for case in cases.values()]
        padded = [case["flashattn-padded"]["varlen_speedup"] for case in cases.values()]
        s = summary[key]
        assert s["cases"] == len(best) == 2
        assert s["geomean_speedup_vs_best_sdpa"] == pytest.approx(statistics.geometric_mean(best))
        assert s["geomean_speedup_vs_flashattn_padded"] == pytest.approx(
            statistics.geometric_mean(padded))
    assert "flashattn-varlen vs the best SDPA way (padded backends, nested): " in table


def test_varlen_flops_count_only_the_real_tokens(varlen_run):
    report, _ = varlen_run
    meta = report["meta"]
    for r in report["results"]:
        # Padded implementations are credited with the real work too: their TFLOP/s shows
        # the waste.
        assert r["flops"] == expected_flops(meta["lengths"], meta["heads"], meta["head_dim"],
                                            r["causal"], r["mode"]), r["impl"]
    padded = meta["lengths_summary"]["count"] * meta["lengths_summary"]["max"]
    assert meta["padded_tokens"] == padded > meta["total_tokens"]


def test_varlen_thread_balance(varlen_run):
    report, table = varlen_run
    balance = report["thread_balance"]
    assert {(b["mode"], b["causal"]) for b in balance} == {
        (mode, causal) for mode in ("fwd", "fwdbwd") for causal in (False, True)}
    batch = report["meta"]["thread_balance_batch"]
    assert batch["lengths"][0] > batch["lengths"][1] and len(set(batch["lengths"][1:])) == 1
    for b in balance:
        assert b["status"] == "ok", b["reason"]
        assert b["threads"] == 2
        assert b["same_output"] is True  # the CPU kernels' results do not depend on threads
        assert b["time_ms_1_thread"] > 0 and b["time_ms_all_threads"] > 0
        assert b["speedup"] > 0 and b["tflops_all_threads"] > 0
        assert len(b["times_ms_1_thread"]) == len(b["times_ms_all_threads"]) == 5
    assert "thread balance: flashattn-varlen on one" in table


def test_varlen_sample_lengths():
    from flashattn.bench.varlen import sample_lengths

    lengths = sample_lengths(16384, 8192, 512, 1.0, seed=0)
    assert sum(lengths) == 16384 and all(1 <= n <= 8192 for n in lengths)
    assert sample_lengths(16384, 8192, 512, 1.0, seed=0) == lengths
    assert sample_lengths(16384, 8192, 512, 1.0, seed=1) != lengths
    clipped = sample_lengths(5000, 100, 512, 1.0, seed=0)
    assert sum(clipped) == 5000 and max(clipped) == 100


def test_varlen_flops_follow_the_flashattention_convention():
    from flashattn.bench.common import attention_flops

    lengths = [1000, 37, 1]
    forward = sum(4 * 16 * n * n * 128 for n in lengths)
    assert attention_flops("fwd", False, 16, 128, lengths) == forward
    assert attention_flops("fwd", True, 16, 128, lengths) == forward / 2
    assert attention_flops("fwdbwd", False, 16, 128, lengths) == 3.5 * forward
    assert attention_flops("fwdbwd", True, 16, 128, lengths) == 3.5 * forward / 2


def test_varlen_check_catches_padded_keys_that_take_part(monkeypatch, tmp_path):
    # flash_attn_func without a key mask lets the real queries see the padded (zero) keys:
    # the check on the real rows must see that, or it would pass any padding bug.
    from flashattn import flash_attn_func
    from flashattn.bench import varlen

    monkeypatch.setattr(varlen, "_padded",
                        lambda batch, q, k, v, causal: flash_attn_func(q, k, v, causal=causal))
    out = tmp_path / "varlen.json"
    assert bench_main([*TINY_VARLEN, "--json", str(out)]) == 0
    by_impl = {r["impl"]: r for r in json.loads(out.read_text())["results"]}
    assert by_impl["flashattn-padded"]["max_err"] > 1e-2
    assert by_impl["flashattn-varlen"]["max_err"] < MAX_FLOAT32_ERROR


def test_varlen_an_implementation_that_cannot_run_is_reported_not_available(monkeypatch,
                                                                            tmp_path):
    from flashattn.bench import varlen

    def not_built(*args, **kwargs):
        raise NotImplementedError("flashattn::fwd: no kernel for this device\nsecond line")

    monkeypatch.setattr(varlen, "flash_attn_varlen_func", not_built)
    out = tmp_path / "varlen.json"
    assert bench_main([*TINY_VARLEN, "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    by_impl = {r["impl"]: r for r in report["results"]}
    assert by_impl["flashattn-varlen"]["status"] == "n/a"
    assert by_impl["flashattn-varlen"]["reason"] == "flashattn::fwd: no kernel for this device"
    assert by_impl["sdpa-math"]["status"] == "ok"
    assert by_impl["sdpa-math"]["varlen_speedup"] is None
    for b in report["thread_balance"]:
        assert b["status"] == "n/a" and "no kernel" in b["reason"]


@pytest.mark.parametrize("args, message", [
    (["varlen", "--seqlens", "64"],
     "flashattn.bench varlen: error: unrecognized arguments: --seqlens 64"),
    (["varlen", "--batch", "2"], "flashattn.bench varlen: error: unrecognized arguments: --batch"),
    (["varlen", "--plot", "out.svg"], "argument --plot: the varlen subcommand draws no plot"),
    (["--total-tokens", "64"], "flashattn.bench dense: error: unrecognized arguments: "
                               "--total-tokens 64"),
    (["dense", "--thread-balance"], "unrecognized arguments: --thread-balance"),
])
def test_varlen_options_of_the_other_mode_are_errors(args, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        bench_main([*args, "--device", "cpu", "--quick"])
    assert exit_.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and message in err


def bench_main(argv):
    from flashattn import bench
    return bench.main(argv)


def test_varlen_thread_balance_alone(tmp_path):
    out = tmp_path / "balance.json"
    assert bench_main(["varlen", "--thread-balance", "--device", "cpu", "--quick", "--threads",
                       "2", "--mode", "fwd", "--causal", "yes", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["results"] == []
    (balance,) = report["thread_balance"]
    assert (balance["mode"], balance["causal"], balance["status"]) == ("fwd", True, "ok")
    assert balance["speedup"] > 0 and balance["same_output"] is True
