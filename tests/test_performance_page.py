"""PERFORMANCE.md and README's results block are generated from bench/results/*.json by
bench/performance.py: the committed page must say what its JSON files say, and the generator
must read the benchmark's reports right."""
import copy
import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPEC = importlib.util.spec_from_file_location(
    "performance", os.path.join(ROOT, "bench", "performance.py"))
performance = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(performance)

ZEN4 = {"vendor": "AuthenticAMD", "cpu_family": 25, "cpu_model_number": 17,
        "cpu_model": "AMD EPYC 9R14", "cores": 2, "isa": ["avx2", "avx512f", "avx512_bf16"]}
META = {"command": "python -m flashattn.bench dense --json x.json", "date_utc":
        "2026-12-02T01:00:00+00:00", "flashattn": "0.1.0", "commit": "abc1234", "torch": "2.14.1",
        "device": "cpu", "device_name": "AMD EPYC 9R14", "threads": 2, "machine": ZEN4,
        "batch": 1, "heads": 8, "head_dim": 64}


def dense_row(impl, seqlen, speedup, peak_mb, mode="fwd", causal=False, status="ok"):
    return {"mode": mode, "dtype": "float32", "causal": causal, "seqlen": seqlen, "batch": 1,
            "heads": 8, "head_dim": 64, "impl": impl, "status": status, "time_ms": 1.0,
            "speedup": speedup, "peak_mb": peak_mb}


def dense_report():
    rows = []
    for mode in ("fwd", "fwdbwd"):
        for causal in (False, True):
            rows += [dense_row("flashattn", 512, None, 10.0, mode, causal),
                     dense_row("sdpa-flash", 512, 1.25, 20.0, mode, causal),
                     dense_row("sdpa-math", 512, 3.0, 80.0, mode, causal),
                     dense_row("sdpa-flash", 1024, None, None, mode, causal, status="n/a")]
    return {"subcommand": "dense", "meta": dict(META), "summary": [], "results": rows}


def decode_report():
    meta = dict(META, command="python -m flashattn.bench decode --json y.json", heads=32,
                heads_kv=8, head_dim=128)
    rows = [{"dtype": "bfloat16", "batch": 8, "q_len": 1, "kv_len": 16384, "impl": impl,
             "status": "ok", "copy_share": share, "speedup_vs_best_sdpa": vs}
            for impl, share, vs in (("flashattn-dense", 0.75, 20.0),
                                    ("flashattn-paged", 0.6, 17.0), ("sdpa-math", 0.04, None))]
    return {"subcommand": "decode", "meta": meta, "summary": [], "results": rows}


def test_the_committed_page_matches_its_json_files():
    """What `python bench/performance.py --check` checks: regenerate PERFORMANCE.md and README's
    block from bench/results/ and compare; the plots they show must exist."""
    assert performance.load_machines(), "bench/results/ holds no benchmark JSON"
    assert performance.main(["--check"]) == 0, "run: python bench/performance.py"


def test_each_case_is_against_its_fastest_sdpa_backend():
    page = performance.render_page([("zen4", {"dense": dense_report()})])
    # flashattn vs flash 1.25x, vs math 3x: the fastest backend (flash) is the one reported.
    assert "| float32 | 512 | 1.25× (flash) | 1.25× (flash) | 1.25× (flash) | 1.25× (flash) " \
           "| 0.50× |" in page
    # A case where no SDPA backend ran says so rather than inventing a ratio.
    assert "| float32 | 1024 | – | – | – | – | – |" in page


def test_tables_carry_the_machine_and_how_they_were_measured():
    page = performance.render_page([("zen4", {"dense": dense_report(),
                                              "decode": decode_report()})])
    assert "## AMD Zen 4 (AMD EPYC 9R14, 2 cores, AVX512-BF16)" in page
    for text in ("Measured 2026-12-02", "at abc1234", "torch 2.14.1", "2 threads",
                 "`python -m flashattn.bench dense --json x.json`",
                 "`python -m flashattn.bench decode --json y.json`",
                 "(bench/results/zen4/dense.json)", "(bench/results/zen4/decode.json)",
                 "![dense](bench/results/zen4/speedup.svg)"):
        assert text in page
    assert "| bfloat16 | 8 | 1 | 16384 | 75% | 60% | 20.0× |" in page


def test_decode_read_share_where_measured():
    """A report that measured the read bandwidth gets its column and README's "of read"; an
    older one keeps the copy alone."""
    report = decode_report()
    for r, read in zip(report["results"], (1.5, 1.2, 0.1)):
        r["read_share"] = read
    page = performance.render_page([("zen4", {"decode": report})])
    assert "| dense cache | paged cache | dense cache, of read | vs SDPA (dense) |" in page
    assert "| bfloat16 | 8 | 1 | 16384 | 75% | 60% | 150% | 20.0× |" in page
    for r in report["results"]:
        r["dtype"] = "float32"  # the README block's rows are the dense report's dtypes
    block = performance.render_readme_block([("zen4", {"dense": dense_report(),
                                                       "decode": report})])
    assert "| 75%–75% of copy bandwidth (150%–150% of read) |" in block
    older = decode_report()
    for r in older["results"]:
        r["dtype"] = "float32"
    block = performance.render_readme_block([("zen4", {"dense": dense_report(),
                                                       "decode": older})])
    assert "| 75%–75% of copy bandwidth |" in block


def test_machines_without_json_point_to_the_lab_log():
    page = performance.render_page([("zen4", {"dense": dense_report()})])
    pending = page.split("## Not yet measured for this page", 1)[1]
    assert "AVX2" in pending and "H200" in pending and "AVX512-BF16" not in pending
    for entry in ("2026-11-29-cpu-default-after-softmax-tiling.md",
                  "2026-12-01-h200-first-gpu-run.md"):
        assert os.path.isfile(os.path.join(ROOT, "docs", "lab", entry)), entry
    h200 = copy.deepcopy(dense_report())
    h200["meta"].update(device="cuda", device_name="NVIDIA H200")
    page = performance.render_page([("h200", {"dense": h200})])
    assert "## NVIDIA H200" in page
    assert "H200" not in page.split("## Not yet measured for this page", 1)[1]


def test_readme_block_is_geomeans_over_cases():
    report = dense_report()
    report["results"] += [dense_row("flashattn", 2048, None, 1.0),
                          dense_row("sdpa-flash", 2048, 0.8, 1.0)]
    decode = decode_report()
    block = performance.render_readme_block([("zen4", {"dense": report, "decode": decode})])
    # forward float32: geomean of 1.25 (N 512, twice: causal and not) and 0.8 (N 2048); the
    # decode report has bfloat16 only, so float32's decode cell says there is none.
    geomean = (1.25 * 1.25 * 0.8) ** (1 / 3)
    assert f"| float32 | {geomean:.2f}× | 1.25× | – |" in block
    for row in decode["results"]:
        row["dtype"] = "float32"
    block = performance.render_readme_block([("zen4", {"dense": report, "decode": decode})])
    assert f"| float32 | {geomean:.2f}× | 1.25× | 75%–75% of copy bandwidth |" in block
    assert block.startswith(performance.README_BEGIN)
    assert block.endswith(performance.README_END)
    with pytest.raises(SystemExit, match="no results block"):
        performance.readme_with_block("# a README without the markers\n", block)


def test_plots_are_drawn_from_the_reports(tmp_path, monkeypatch):
    monkeypatch.setattr(performance, "RESULTS_DIR", str(tmp_path))
    (tmp_path / "zen4").mkdir()
    performance.draw_plots("zen4", {"dense": dense_report(), "decode": decode_report()})
    speedup = (tmp_path / "zen4" / "speedup.svg").read_text()
    decode = (tmp_path / "zen4" / "decode.svg").read_text()
    assert "<svg" in speedup and "AMD Zen 4" in speedup
    assert "<svg" in decode and "copy bandwidth" in decode


def reliability_report(passed=True):
    meta = dict(META, command="python tools/reliability.py --json r.json")
    campaigns = [
        {"campaign": "differential", "passed": passed, "examples": 21000,
         "mismatches": 0 if passed else 1,
         "tests": [{"test": "t", "draws": "flash_attn_func", "passing": 21000, "failing": 0}]},
        {"campaign": "malformed", "passed": True, "calls": 20000},
        {"campaign": "cache", "passed": True, "scenarios": 2000, "seed": 7, "entries_changed": 0},
        {"campaign": "rss", "passed": True, "calls": 10000,
         "functions": [{"function": "f", "growth_bytes": 4096}], "max_growth_bytes": 4096}]
    return {"subcommand": "reliability", "meta": meta, "summary": {"passed": passed},
            "results": campaigns}


def test_reliability_campaigns_are_on_the_page():
    page = performance.render_page([("zen4", {"dense": dense_report(),
                                              "reliability": reliability_report()})])
    assert "### Reliability" in page
    for text in ("| 21,000 random examples | 0 mismatches |", "| 20,000 calls | 0 crashes",
                 "| 2,000 scenarios (seed 7) | 0 entries changed |",
                 "| 10,000 calls of each of 1 functions | at most 4 KiB growth |",
                 "`python tools/reliability.py --json r.json`",
                 "(bench/results/zen4/reliability.json)"):
        assert text in page, text
    # A failed campaign says so instead of a count of what it found.
    failed = performance.render_page([("zen4", {"reliability": reliability_report(False)})])
    assert "| 21,000 random examples | **failed**" in failed


def small_report():
    meta = dict(META, command="python -m flashattn.bench small --json s.json",
                dtypes=["float32"])
    rows = []
    for mode, fa_ms, flash_ms, math_ms in (("fwd", 0.010, 0.015, 0.030),
                                          ("fwdbwd", 0.080, 0.060, 0.200)):
        for impl, ms in (("flashattn", fa_ms), ("sdpa-flash", flash_ms), ("sdpa-math", math_ms)):
            rows.append({"mode": mode, "dtype": "float32", "causal": False, "seqlen": 16,
                         "batch": 1, "heads": 8, "head_dim": 64, "impl": impl, "status": "ok",
                         "time_ms": ms, "speedup": None if impl == "flashattn" else ms / fa_ms})
    summary = [{"mode": "fwd", "dtype": "float32", "geomean_speedup_vs_best_sdpa": 1.5},
               {"mode": "fwdbwd", "dtype": "float32", "geomean_speedup_vs_best_sdpa": 0.75}]
    return {"subcommand": "small", "meta": meta, "summary": summary, "results": rows}


def test_small_problems_are_per_call_against_the_fastest_backend():
    """`bench small`'s report: flashattn's and the fastest backend's µs per call, and the ratio
    against that backend (flash here, math being slower in both modes), with the footer."""
    page = performance.render_page([("zen4", {"small": small_report()})])
    assert ("| no | 16 | 1 | 10.0 / 15.0 | 1.50× (flash) | 80.0 / 60.0 | 0.75× (flash) |"
            in page)
    assert "Geometric means over the cases: forward 1.50×, forward+backward 0.75×." in page
    assert "`python -m flashattn.bench small --json s.json`" in page
    assert "(bench/results/zen4/small.json)" in page
    assert "![small]" not in page  # no plot for it


def context_parallel_report():
    meta = dict(META, command="python -m flashattn.bench context-parallel --json c.json",
                threads=2, threads_per_rank=1, ranks=2, seqlen=8192, causal=True, forward_only=False,
                dtypes=["float32"], launcher="spawn")
    row = {"dtype": "float32", "single": {"wall": 1.0, "cpu": 2.0},
           "ring": {"wall": 1.09, "cpu": 2.1}, "compute": {"wall": 0.98, "cpu": 1.9},
           "communicate": {"wall": 0.04, "cpu": 0.04}, "ring_over_single_wall": 1.09,
           "ring_over_single_cpu": 1.05, "hidden": 0.25}
    return {"subcommand": "context-parallel", "meta": meta,
            "summary": {"ring_over_single_wall": {"float32": 1.09}}, "results": [row]}


def test_small_problems_timed_in_rounds_show_the_interquartile_range():
    """A report timed in interleaved rounds (meta "timing", per-row quartiles) says so and
    gives each speedup's interquartile range; the older reports keep their text (above)."""
    report = small_report()
    report["meta"]["timing"] = {"method": "interleaved rounds", "rounds": 51, "block_ms": 1.0}
    for r in report["results"]:
        if r["speedup"] is not None:
            r["speedup_q1"], r["speedup_q3"] = r["speedup"] - 0.1, r["speedup"] + 0.2
    page = performance.render_page([("zen4", {"small": report})])
    assert ("| no | 16 | 1 | 10.0 / 15.0 | 1.50× [1.40–1.70] (flash) | 80.0 / 60.0 | "
            "0.75× [0.65–0.95] (flash) |" in page)
    assert "median over 51 interleaved rounds, each a block of ~1 ms" in page
    assert "median of single calls" not in page


def test_context_parallel_is_the_ring_against_one_process():
    page = performance.render_page([("zen4", {"context-parallel": context_parallel_report()})])
    assert "the zigzag ring on 2 ranks of 1 thread(s) against one process of 2 threads" in page
    assert "B 1, S 8192, 8 heads of 64, causal, forward+backward" in page
    assert "| float32 | 1000.0 | 1090.0 | 1.09× | 40.0 | 25% |" in page
    assert "`python -m flashattn.bench context-parallel --json c.json`" in page
    assert "(bench/results/zen4/context-parallel.json)" in page
