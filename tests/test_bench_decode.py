"""`python -m flashattn.bench decode` runs end to end: every case of the grid has every CPU
implementation with small errors against float64, KV bytes per second and shares of a positive
copy bandwidth that follow from the times (paired, repeat by repeat, with the copy timed in
the same rotation), and speedups only where they belong; its correctness check catches a
kernel that reads a key too many or too few; a budget cuts the largest cases and says so.
Speed is not tested here, only that it is measured."""
import json
import math
import statistics
from dataclasses import replace

import pytest
import torch

from test_bench import MAX_FLOAT32_ERROR, bench_main, run_python

# bfloat16 outputs are rounded to 8 bits of mantissa: |out| < 2 gives at most 2^-8 each, and
# a kernel that reads a wrong key is off by far more (see the planted bugs below).
MAX_BFLOAT16_ERROR = 2e-2
MAX_ERROR = {"float32": MAX_FLOAT32_ERROR, "bfloat16": MAX_BFLOAT16_ERROR}
CPU_IMPLS = {"flashattn-paged", "flashattn-dense", "sdpa-flash", "sdpa-math", "flashattn-mla"}
FLASHATTN_IMPLS = {"flashattn-paged", "flashattn-dense"}
SDPA_IMPLS = {"sdpa-flash", "sdpa-math"}
# One case: B=2, Sq=1, Sk=40 (not a multiple of the page: its last page is partly poison).
TINY_DECODE = ["decode", "--device", "cpu", "--quick", "--dtype", "float32",
               "--batch-sizes", "2", "--q-lens", "1", "--kv-lens", "40"]


@pytest.fixture(scope="module")
def decode_run():
    """One decode --quick run in float32 and bfloat16: JSON on stdout, table on stderr."""
    proc = run_python(["-m", "flashattn.bench", "decode", "--quick", "--device", "cpu",
                       "--dtype", "float32,bfloat16", "--json"])
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), proc.stderr


def expected_kv_bytes(batch, kv_len, heads_kv, head_dim, dtype, impl=None):
    """2·B·Sk·Hkv·d·itemsize, counted here independently of the bench; the MLA row's latent
    rows, B·Sk·576·itemsize (V is a view of them)."""
    itemsize = {"float32": 4, "bfloat16": 2}[dtype]
    if impl == "flashattn-mla":
        return batch * kv_len * 576 * itemsize
    return 2 * batch * kv_len * heads_kv * head_dim * itemsize


def test_decode_every_case_of_the_grid_has_every_implementation(decode_run):
    report, _ = decode_run
    assert list(report) == ["subcommand", "meta", "summary", "results", "bandwidth", "cut"]
    assert report["subcommand"] == "decode"
    meta = report["meta"]
    assert meta["device"] == "cpu" and meta["dtypes"] == ["float32", "bfloat16"]
    grid = {(dtype, b, sq, sk) for dtype in meta["dtypes"] for b in meta["batches"]
            for sq in meta["q_lens"] for sk in meta["kv_lens"]}
    assert len(grid) == 16  # the quick preset: 2 batch sizes, 2 Sq, 2 Sk, 2 dtypes
    assert meta["kv_lens"] and all(sk % meta["page_size"] for sk in meta["kv_lens"])
    cases = {}
    for r in report["results"]:
        cases.setdefault((r["dtype"], r["batch"], r["q_len"], r["kv_len"]), []).append(r["impl"])
    assert set(cases) == grid
    for case, impls in cases.items():
        assert sorted(impls) == sorted(CPU_IMPLS), case
    assert report["cut"] == []  # --quick has no budget


def test_decode_results_are_right_and_measured(decode_run):
    report, _ = decode_run
    meta, bandwidth = report["meta"], report["bandwidth"]
    assert bandwidth["start_gb_per_s"] > 0 and bandwidth["end_gb_per_s"] > 0
    for r in report["results"]:
        where = f"{r['impl']} {r['dtype']} B={r['batch']} Sq={r['q_len']} Sk={r['kv_len']}"
        assert r["status"] == "ok", f"{where}: {r['reason']}"
        assert isinstance(r["max_err"], float) and math.isfinite(r["max_err"]), where
        assert r["max_err"] < MAX_ERROR[r["dtype"]], f"{where}: error {r['max_err']}"
        assert r["dq_err"] is None, where
        assert r["kv_bytes"] == expected_kv_bytes(r["batch"], r["kv_len"], meta["heads_kv"],
                                                  meta["head_dim"], r["dtype"], r["impl"]), where
        assert len(r["times_ms"]) == meta["repeats"] >= 5, where
        assert r["time_ms"] > 0 and r["gb_per_s"] > 0 and r["copy_share"] > 0, where
        assert r["gb_per_s"] == pytest.approx(r["kv_bytes"] / (r["time_ms"] / 1e3) / 1e9)
        # %copy is paired: each repeat's GB/s over the copy's in the same rotation.
        copy_ms = r["copy_times_ms"]
        assert len(copy_ms) == len(r["times_ms"]) and min(copy_ms) > 0, where
        copy_bytes = 2 * bandwidth["copy_bytes"]  # read + written
        assert r["copy_gb_per_s"] == pytest.approx(
            statistics.median(copy_bytes / (ms / 1e3) / 1e9 for ms in copy_ms))
        assert r["copy_share"] == pytest.approx(statistics.median(
            (r["kv_bytes"] / t) / (copy_bytes / t_copy)
            for t, t_copy in zip(r["times_ms"], copy_ms)))
        # %read likewise, against the sum of read_bytes (bytes read only).
        read_ms = r["read_times_ms"]
        assert len(read_ms) == len(r["times_ms"]) and min(read_ms) > 0, where
        read_bytes = bandwidth["read_bytes"]
        assert read_bytes == bandwidth["copy_bytes"] - bandwidth["copy_bytes"] % 4
        assert r["read_gb_per_s"] == pytest.approx(
            statistics.median(read_bytes / (ms / 1e3) / 1e9 for ms in read_ms))
        assert r["read_share"] == pytest.approx(statistics.median(
            (r["kv_bytes"] / t) / (read_bytes / t_read)
            for t, t_read in zip(r["times_ms"], read_ms)))
        assert r["speedup_vs_fa2"] is None, where  # FA2 is CUDA only
        if r["impl"] in FLASHATTN_IMPLS:
            assert r["speedup_vs_best_sdpa"] > 0, where
            assert r["best_sdpa"] in SDPA_IMPLS, where
        else:
            assert r["speedup_vs_best_sdpa"] is None and r["best_sdpa"] is None, where


def test_decode_speedup_is_against_the_best_sdpa_backend(decode_run):
    # The paired median against each backend, recomputed from the samples: the reported one is
    # the smallest of them.
    from flashattn.bench.measure import paired_speedup

    report, _ = decode_run
    cases = {}
    for r in report["results"]:
        cases.setdefault((r["dtype"], r["batch"], r["q_len"], r["kv_len"]), {})[r["impl"]] = r
    for case, rows in cases.items():
        for impl in FLASHATTN_IMPLS:
            ours = rows[impl]
            against = {name: paired_speedup(rows[name]["times_ms"], ours["times_ms"])
                       for name in SDPA_IMPLS}
            assert ours["speedup_vs_best_sdpa"] == pytest.approx(min(against.values())), case
            assert against[ours["best_sdpa"]] == pytest.approx(min(against.values())), case


def test_decode_summary_and_table(decode_run):
    report, table = decode_run
    summary = {(s["dtype"], s["impl"]): s for s in report["summary"]}
    assert set(summary) == {(dtype, impl) for dtype in ("float32", "bfloat16")
                            for impl in FLASHATTN_IMPLS}
    for s in summary.values():
        assert s["cases"] == 8 and s["not_available"] == 0
        low, high = s["copy_share"]
        assert 0 < low <= high
        low, high = s["read_share"]
        assert 0 < low <= high
        assert s["geomean_speedup_vs_best_sdpa"] > 0
        # The quick grid is far below the target's Sk >= 16384: no verdict, and it says so.
        assert s["target_cases"] == 0 and s["target_met"] == 0
    assert "copy bandwidth at the start:" in table and "read bandwidth:" in table
    assert "decode, bfloat16, heads=4, heads_kv=2, head_dim=32, page 16" in table
    assert table.count("issue 12 target (2 threads, Sk >= 16384") == 4
    assert "no case of the target ran" in table
    # The MLA row beside the dense GQA step (decode_mla.py), with its layout in the title.
    assert meta_mla_line(report) in table
    for dtype in ("float32", "bfloat16"):
        assert f"   flashattn-mla, {dtype}: " in table and "the dense GQA step beside it" in table


def meta_mla_line(report):
    meta = report["meta"]
    assert meta["mla_heads"] == 8 and meta["mla"] == "latent paged 64, 576/512, v=k[..., :512]"
    return f"flashattn-mla: heads=8, {meta['mla']}"


def test_decode_inputs_hold_the_same_values_in_every_layout():
    from flashattn.bench.decode import POISON, DEFAULTS, Case, Inputs

    settings = replace(DEFAULTS["cpu"], heads=4, heads_kv=2, head_dim=8, page_size=16)
    x = Inputs(Case(torch.float32, 3, 2, 40), settings, torch.device("cpu"),
               torch.Generator().manual_seed(0))
    assert x.block_table.dtype == torch.int32 and x.block_table.shape == (3, 3)
    # The pages are scattered over the pool, each used once.
    assert sorted(x.block_table.flatten().tolist()) == list(range(9))
    assert x.block_table.flatten().tolist() != list(range(9))
    gathered = x.k_pages[x.block_table.long()].flatten(1, 2)        # (B, 48, Hkv, d)
    assert torch.equal(gathered[:, :40], x.k)
    assert bool((gathered[:, 40:] == POISON).all())
    assert torch.equal(x.v_pages[x.block_table.long()].flatten(1, 2)[:, :40], x.v)
    assert torch.equal(x.k_sdpa, x.k.transpose(1, 2)) and x.k_sdpa.is_contiguous()
    assert x.cache_seqlens.tolist() == [40, 40, 40]


def test_decode_reference_is_gqa_attention_over_the_whole_cache():
    # The bench stacks each kv head's query heads as rows of one head; it must equal plain GQA
    # attention (the reference's own repeat_interleave) over all Sk keys.
    from flashattn.bench.decode import DEFAULTS, Case, Inputs, references
    from flashattn._reference import attention_reference

    settings = replace(DEFAULTS["cpu"], heads=6, heads_kv=2, head_dim=8)
    x = Inputs(Case(torch.float32, 3, 4, 37), settings, torch.device("cpu"),
               torch.Generator().manual_seed(1))
    refs = references(x, settings)
    assert sorted(refs) == [0, 2]  # the first and the last sequence
    full, _ = attention_reference(x.q.double(), x.k.double(), x.v.double())
    for b, ref in refs.items():
        assert ref.shape == (4, 6, 8)
        torch.testing.assert_close(ref, full[b], rtol=1e-12, atol=1e-12)


def test_decode_mla_reads_the_values_inside_the_latent_rows():
    """The MLA row's cache: one 576-wide latent row per token, paged (64) at scattered places,
    poisoned past Sk, V a view of its first 512 columns (no copy); its reference is MQA over
    that cache with v = k[..., :512]."""
    from flashattn.bench import decode_mla
    from flashattn.bench.decode import POISON, Case
    from flashattn._reference import attention_reference

    x = decode_mla.Inputs(Case(torch.float32, 3, 2, 70), 4, torch.device("cpu"),
                          torch.Generator().manual_seed(2), POISON)
    assert x.v_pages.data_ptr() == x.k_pages.data_ptr()
    assert x.v_pages.stride() == x.k_pages.stride() and x.v_pages.shape[-1] == 512
    assert x.block_table.shape == (3, 2) and sorted(x.block_table.flatten().tolist()) == list(range(6))
    gathered = x.k_pages[x.block_table.long()].flatten(1, 2)        # (B, 128, 1, 576)
    assert torch.equal(gathered[:, :70], x.latent)
    assert bool((gathered[:, 70:] == POISON).all())
    refs = decode_mla.references(x, [0, 2])
    full, _ = attention_reference(x.q.double(), x.latent.double(), x.latent[..., :512].double())
    for b, ref in refs.items():
        assert ref.shape == (2, 4, 512)
        torch.testing.assert_close(ref, full[b], rtol=1e-12, atol=1e-12)
    assert decode_mla.kv_bytes(3, 70, torch.bfloat16) == 3 * 70 * 576 * 2


def test_decode_check_catches_an_mla_kernel_that_reads_the_wrong_value_columns(monkeypatch,
                                                                              tmp_path):
    from flashattn.bench import decode_mla

    real = decode_mla.flash_attn_with_kvcache

    def values_from_the_rotary_end(q, k_cache, v_cache, **kw):
        return real(q, k_cache, k_cache[..., 64:], **kw)

    monkeypatch.setattr(decode_mla, "flash_attn_with_kvcache", values_from_the_rotary_end)
    by_impl = {r["impl"]: r for r in _tiny_report(tmp_path)["results"]}
    assert by_impl["flashattn-mla"]["max_err"] > 10 * MAX_FLOAT32_ERROR
    assert by_impl["flashattn-dense"]["max_err"] < MAX_FLOAT32_ERROR


def test_decode_mla_heads_0_leaves_the_row_out(tmp_path):
    report = _tiny_report(tmp_path, "--mla-heads", "0")
    assert "flashattn-mla" not in {r["impl"] for r in report["results"]}
    assert report["meta"]["mla"] is None


def _tiny_report(tmp_path, *extra):
    out = tmp_path / "decode.json"
    assert bench_main([*TINY_DECODE, *extra, "--json", str(out)]) == 0
    return json.loads(out.read_text())


def test_decode_check_catches_a_paged_kernel_that_reads_past_the_last_key(monkeypatch,
                                                                          tmp_path):
    # One key too many: the poisoned tail of the last page takes part.
    from flashattn.bench import decode

    real = decode.flash_attn_with_kvcache

    def reads_one_more(q, k_cache, v_cache, cache_seqlens=None, block_table=None, **kw):
        if block_table is not None:
            cache_seqlens = cache_seqlens + 1
        return real(q, k_cache, v_cache, cache_seqlens=cache_seqlens, block_table=block_table,
                    **kw)

    monkeypatch.setattr(decode, "flash_attn_with_kvcache", reads_one_more)
    by_impl = {r["impl"]: r for r in _tiny_report(tmp_path)["results"]}
    assert by_impl["flashattn-paged"]["max_err"] > 1.0
    assert by_impl["flashattn-dense"]["max_err"] < MAX_FLOAT32_ERROR


def test_decode_check_catches_a_kernel_that_misses_the_last_key(monkeypatch, tmp_path):
    from flashattn.bench import decode

    real = decode.flash_attn_with_kvcache

    def reads_one_less(q, k_cache, v_cache, cache_seqlens=None, **kw):
        return real(q, k_cache, v_cache, cache_seqlens=cache_seqlens - 1, **kw)

    monkeypatch.setattr(decode, "flash_attn_with_kvcache", reads_one_less)
    by_impl = {r["impl"]: r for r in _tiny_report(tmp_path)["results"]}
    for impl in FLASHATTN_IMPLS:
        assert by_impl[impl]["max_err"] > 10 * MAX_FLOAT32_ERROR, impl
    assert by_impl["sdpa-math"]["max_err"] < MAX_FLOAT32_ERROR


def test_decode_an_implementation_that_cannot_run_is_reported_not_available(monkeypatch,
                                                                           tmp_path):
    from flashattn.bench import decode

    def not_built(*args, **kwargs):
        raise NotImplementedError("flashattn::fwd_kvcache: no kernel for this device\nsecond")

    monkeypatch.setattr(decode, "flash_attn_with_kvcache", not_built)
    report = _tiny_report(tmp_path)
    by_impl = {r["impl"]: r for r in report["results"]}
    for impl in FLASHATTN_IMPLS:
        assert by_impl[impl]["status"] == "n/a"
        assert by_impl[impl]["reason"] == "flashattn::fwd_kvcache: no kernel for this device"
        assert by_impl[impl]["time_ms"] is None and by_impl[impl]["speedup_vs_best_sdpa"] is None
    assert by_impl["sdpa-math"]["status"] == "ok" and by_impl["sdpa-math"]["gb_per_s"] > 0
    for s in report["summary"]:
        assert s["cases"] == 0 and s["not_available"] == 1 and s["copy_share"] is None


def test_decode_budget_cuts_the_largest_cases_and_lists_them(tmp_path, capsys):
    report = _tiny_report(tmp_path, "--batch-sizes", "1,2", "--kv-lens", "40,100",
                          "--budget", "0.001")
    ran = {(r["batch"], r["kv_len"]) for r in report["results"]}
    cut = {(c["batch"], c["kv_len"]) for c in report["cut"]}
    # The smallest case runs (nothing to predict from yet); the budget is then spent.
    assert ran == {(1, 40)}
    assert cut == {(2, 40), (1, 100), (2, 100)}
    assert all(c["reason"].startswith("budget: ") for c in report["cut"])
    assert report["meta"]["budget_s_per_dtype"] == 0.001
    assert "not run, budget (0.001 s per dtype): 3 cases:" in capsys.readouterr().out


def test_decode_cases_that_do_not_fit_in_memory_are_listed(monkeypatch, tmp_path):
    from flashattn.bench import decode

    monkeypatch.setattr(decode, "available_memory_bytes", lambda device: 1000)
    report = _tiny_report(tmp_path)
    assert report["results"] == []
    (cut,) = report["cut"]
    assert cut["reason"].startswith("memory: ") and cut["kv_bytes"] == 2 * 2 * 40 * 2 * 32 * 4


def test_decode_cases_run_in_increasing_kv_size():
    from flashattn.bench.decode import DEFAULTS, enumerate_cases

    settings = DEFAULTS["cpu"]
    cases = enumerate_cases(settings)
    assert len(cases) == 3 * 2 * 4
    sizes = [c.kv_bytes(settings) for c in cases]
    assert sizes == sorted(sizes)
    assert sizes[0] == 2 * 1 * 1024 * 8 * 128 * 2 and sizes[-1] == 2 * 32 * 65536 * 8 * 128 * 2
    # Issue 12's target starts at Sk = 16k: the smallest such case comes before the larger
    # batches' (a budget reaches it first).
    first_target = min(i for i, c in enumerate(cases) if c.kv_len >= 16384)
    assert (cases[first_target].batch, cases[first_target].kv_len) == (1, 16384)
    assert {c.batch for c in cases[:first_target]} == {1, 8}


def test_decode_target_verdict():
    from flashattn.bench.decode import Result, summarize

    def row(kv_len, share, speedup, impl="flashattn-paged"):
        return Result("bfloat16", 1, 1, kv_len, impl, "paged", 1, copy_share=share,
                      gb_per_s=share, speedup_vs_best_sdpa=speedup, best_sdpa="sdpa-flash")

    results = [row(8192, 0.9, 3.0),     # below Sk 16k: not a target case
               row(16384, 0.75, 2.5),   # met
               row(32768, 0.75, 1.5),   # too slow against SDPA
               row(65536, 0.5, 3.0)]    # too far from the bandwidth
    paged = {s["impl"]: s for s in summarize(results, [], "cpu", 2)}["flashattn-paged"]
    assert (paged["target_cases"], paged["target_met"]) == (3, 1)
    assert paged["target_copy_share"] == [0.5, 0.75]
    assert paged["target_speedup_vs_best_sdpa"] == [1.5, 3.0]
    assert paged["cases"] == 4 and paged["copy_share"] == [0.5, 0.9]


@pytest.mark.parametrize("args, message", [
    (["decode", "--seqlens", "64"],
     "flashattn.bench decode: error: unrecognized arguments: --seqlens 64"),
    (["decode", "--causal", "yes"], "flashattn.bench decode: error: unrecognized arguments: "
                                    "--causal yes"),
    (["decode", "--plot", "out.svg"], "argument --plot: the decode subcommand draws no plot"),
    (["decode", "--varlen"], "--varlen is now a subcommand: python -m flashattn.bench varlen"),
    (["--kv-lens", "64"], "flashattn.bench dense: error: unrecognized arguments: --kv-lens 64"),
    (["varlen", "--page-size", "16"], "unrecognized arguments: --page-size 16"),
    (["--budget", "5"], "unrecognized arguments: --budget 5"),
])
def test_decode_options_of_another_mode_are_errors(args, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        bench_main([*args, "--device", "cpu", "--quick"])
    assert exit_.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and message in err


def test_decode_heads_kv_must_divide_heads(capsys):
    with pytest.raises(SystemExit) as exit_:
        bench_main([*TINY_DECODE, "--heads", "4", "--heads-kv", "3"])
    assert exit_.value.code == 2
    assert "--heads-kv 3 must divide --heads 4" in capsys.readouterr().err


def test_decode_more_page_sizes_are_paged_caches_of_their_own(tmp_path, capsys):
    """--more-page-sizes 1,64 (CUDA's default beside 16): flashattn-paged-1 and -64 run the same
    case on pools of 1- and 64-token pages, as right as the 16-token one; on the CPU no row
    has a split or CTA count (the CUDA executor's launch)."""
    report = _tiny_report(tmp_path, "--more-page-sizes", "1,64")
    by_impl = {r["impl"]: r for r in report["results"]}
    assert {"flashattn-paged", "flashattn-paged-1", "flashattn-paged-64"} <= set(by_impl)
    for page in (1, 64):
        r = by_impl[f"flashattn-paged-{page}"]
        assert r["status"] == "ok" and r["layout"] == f"paged, page {page}"
        assert r["max_err"] < MAX_FLOAT32_ERROR and r["gb_per_s"] > 0
    assert all(r["splits"] is None and r["ctas"] is None for r in report["results"])
    assert report["meta"]["more_page_sizes"] == [1, 64] and report["meta"]["sm_count"] is None
    assert "page 16, 1, 64, num_splits=0" in capsys.readouterr().out


def test_decode_inputs_page_the_same_values_at_every_page_size():
    from flashattn.bench.decode import DEFAULTS, Case, Inputs
    settings = replace(DEFAULTS["cpu"], heads=4, heads_kv=2, head_dim=8, page_size=16,
                       more_page_sizes=(1, 64))
    x = Inputs(Case(torch.float32, 3, 1, 40), settings, torch.device("cpu"),
               torch.Generator().manual_seed(0))
    for page, (table, k_pages, v_pages) in x.more_pages.items():
        assert table.shape == (3, math.ceil(40 / page)) and k_pages.shape[1] == page
        for b in range(3):
            keys = k_pages[table[b].long()].flatten(0, 1)[:40]
            values = v_pages[table[b].long()].flatten(0, 1)[:40]
            assert torch.equal(keys, x.k[b]) and torch.equal(values, x.v[b]), (page, b)


def test_decode_reports_the_cuda_launch_of_flashattn_rows():
    """On a GPU of 132 SMs (the H200), a flashattn row carries the CUDA executor's split count
    and CTAs for its case (decode_plan.py; tests/test_bench_decode_plan.py checks them against
    the C++ plan); SDPA rows and fp32 carry none. B = 1, Sk = 32k: 18 splits x 8 kv heads."""
    from flashattn.bench.decode import DEFAULTS, Case, launch_of
    settings = DEFAULTS["cuda"]
    one = Case(torch.bfloat16, 1, 1, 32768)
    assert launch_of(one, "flashattn-dense", settings, 132) == (18, 144)
    assert launch_of(one, "flashattn-paged-64", settings, 132) == (18, 144)
    assert launch_of(Case(torch.bfloat16, 32, 1, 32768), "flashattn-paged", settings, 132) == (
        1, 256)
    assert launch_of(one, "sdpa-flash", settings, 132) == (None, None)
    assert launch_of(Case(torch.float32, 1, 1, 32768), "flashattn-dense", settings, 132) == (
        None, None)
    assert launch_of(one, "flashattn-dense", settings, None) == (None, None)


def test_decode_cuda_grid_has_issue_33s_batches_and_pages():
    from flashattn.bench.decode import DEFAULTS
    assert {1, 4, 128} <= set(DEFAULTS["cuda"].batches)
    assert (DEFAULTS["cuda"].page_size, *DEFAULTS["cuda"].more_page_sizes) == (16, 1, 64)
    assert DEFAULTS["cpu"].more_page_sizes == ()  # the CPU default stays quick
