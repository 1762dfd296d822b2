"""`python -m flashattn.bench small` runs end to end: every small shape of the quick grid has
flashattn's flash_attn_func (on FlashAttention's (B, S, H, D) layout) and every CPU SDPA backend,
each checked against float64 with small errors, timed in interleaved rounds (a fake probe checks
the blocks' order and sizing), with flashattn's per-round speedups (median and quartiles) and
their geometric mean against the best backend. Speed is not tested here."""
import json
import math
import statistics

import pytest

from test_bench import MAX_FLOAT32_ERROR, bench_main

CPU_IMPLS = {"flashattn", "sdpa-flash", "sdpa-math"}
QUICK = ["small", "--device", "cpu", "--quick"]


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("small") / "small.json"
    assert bench_main([*QUICK, "--json", str(out)]) == 0
    return json.loads(out.read_text())


def test_small_quick_grid_has_every_implementation(small_run):
    report = small_run
    assert report["subcommand"] == "small"
    meta = report["meta"]
    assert meta["seqlens"] == [16, 64] and meta["batches"] == [1]
    assert meta["heads"] == 8 and meta["head_dim"] == 64
    cases = {}
    for r in report["results"]:
        cases.setdefault((r["mode"], r["causal"], r["seqlen"], r["batch"]), set()).add(r["impl"])
    assert set(cases) == {(mode, causal, seqlen, 1) for mode in ("fwd", "fwdbwd")
                          for causal in (False, True) for seqlen in (16, 64)}
    assert all(impls == CPU_IMPLS for impls in cases.values()), cases


def test_small_results_are_right_and_timed(small_run):
    report = small_run
    for r in report["results"]:
        where = f"{r['impl']} {r['mode']} causal={r['causal']} S={r['seqlen']} B={r['batch']}"
        assert r["status"] == "ok", f"{where}: {r['reason']}"
        errors = [r["max_err"]] + ([r["dq_err"]] if r["mode"] == "fwdbwd" else [])
        for err in errors:
            assert isinstance(err, float) and math.isfinite(err), f"{where}: error {err}"
            assert err < MAX_FLOAT32_ERROR, f"{where}: error {err}"
        assert len(r["times_ms"]) == report["meta"]["repeats"], where
        assert r["time_ms"] == statistics.median(r["times_ms"]) > 0, where
        assert isinstance(r["calls_per_block"], int) and r["calls_per_block"] >= 1, where
        assert (r["speedup"] is None) == (r["impl"] == "flashattn"), where


def test_small_speedups_are_the_median_and_quartiles_of_per_round_ratios(small_run):
    assert small_run["meta"]["timing"]["rounds"] == small_run["meta"]["repeats"] == 11
    ours = {(r["mode"], r["causal"], r["seqlen"]): r for r in small_run["results"]
            if r["impl"] == "flashattn"}
    for r in small_run["results"]:
        fa = ours[(r["mode"], r["causal"], r["seqlen"])]
        assert r["calls_per_block"] == fa["calls_per_block"]  # one block size per case
        if r["impl"] == "flashattn":
            assert r["speedup_q1"] is None and r["speedup_q3"] is None
            continue
        ratios = [t / t_fa for t, t_fa in zip(r["times_ms"], fa["times_ms"])]
        q1, median, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
        assert r["speedup"] == pytest.approx(median)
        assert (r["speedup_q1"], r["speedup_q3"]) == pytest.approx((q1, q3))
        assert r["speedup_q1"] <= r["speedup"] <= r["speedup_q3"]


def test_small_summary_is_the_geomean_against_the_best_backend(small_run):
    report = small_run
    per_case = {}
    for r in report["results"]:
        if r["speedup"] is not None:
            key = (r["mode"], r["causal"], r["seqlen"], r["batch"])
            per_case[key] = min(per_case.get(key, math.inf), r["speedup"])
    summary = {s["mode"]: s for s in report["summary"]}
    assert summary.keys() == {"fwd", "fwdbwd"}
    for mode, s in summary.items():
        best = [speedup for key, speedup in per_case.items() if key[0] == mode]
        assert s["cases"] == len(best) == 4
        assert s["geomean_speedup_vs_best_sdpa"] == pytest.approx(
            statistics.geometric_mean(best))


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_small_default_grid_is_the_issues_case_set(device):
    # Issue 29's `small` case set, without --quick: S 1, 16, 64 and 128 at B 1 and 8, causal
    # and not, forward and forward+backward, each timed for flashattn and every SDPA backend.
    from flashattn.bench import cli, small

    _, parsers = cli.make_parsers()
    args = parsers["small"].parse_args(["--device", device])
    cases = small.enumerate_cases(args, small.DEFAULTS[device])
    assert len(cases) == len({(c.mode, c.causal, c.seqlen, c.batch) for c in cases})
    assert {(c.mode, c.causal, c.seqlen, c.batch) for c in cases} == {
        (mode, causal, seqlen, batch) for mode in ("fwd", "fwdbwd") for causal in (False, True)
        for seqlen in (1, 16, 64, 128) for batch in (1, 8)}
    assert {c.heads for c in cases} == {8} and {c.head_dim for c in cases} == {64}


def test_small_check_sees_flashattn_output_in_its_own_layout(monkeypatch, tmp_path):
    # flash_attn_func ignoring the causal mask: its (B, S, H, D) output, compared in the
    # reference's (B, H, S, D), must be caught; a layout mix-up would show on every case.
    from flashattn import flash_attn_func
    from flashattn.bench import small

    monkeypatch.setattr(small, "flash_attn_func",
                        lambda q, k, v, causal: flash_attn_func(q, k, v, causal=False))
    out = tmp_path / "small.json"
    assert bench_main([*QUICK, "--seqlens", "64", "--mode", "fwd", "--json", str(out)]) == 0
    ours = {r["causal"]: r for r in json.loads(out.read_text())["results"]
            if r["impl"] == "flashattn"}
    assert ours[False]["max_err"] < MAX_FLOAT32_ERROR
    assert ours[True]["max_err"] > 1e-2


def test_small_table_is_in_microseconds(capsys):
    assert bench_main([*QUICK, "--seqlens", "16", "--mode", "fwd", "--causal", "no"]) == 0
    table = capsys.readouterr().out
    assert "time_us" in table and "forward, float32: flashattn vs the best SDPA backend" in table
    assert "11 interleaved rounds" in table and "speedup_IQR" in table


class FakeProbe:
    """A probe whose clock advances by each call's cost (per step: steps are named by their
    cost in ms), and logs the steps called."""

    def __init__(self):
        self.log = []

    def time_ms(self, step):
        start = len(self.log)
        step()
        return sum(self.log[start:])


def test_small_rounds_size_their_blocks_by_the_fastest_step_and_alternate():
    from flashattn.bench import small

    probe = FakeProbe()
    steps = {name: (lambda cost=cost: probe.log.append(cost))
             for name, cost in (("flashattn", 0.25), ("sdpa-flash", 0.5), ("sdpa-math", 2.0))}
    timing = small.InterleavedTiming(probe, round_count=4, block_ms=1.0, sizing_calls=3)
    times = timing(steps)
    assert timing.calls == 4  # 1 ms of the fastest step's 0.25 ms calls
    assert times == {"flashattn": [0.25] * 4, "sdpa-flash": [0.5] * 4, "sdpa-math": [2.0] * 4}
    sizing, timed = probe.log[:9], probe.log[9:]
    assert sizing == [0.25] * 3 + [0.5] * 3 + [2.0] * 3
    order = [timed[i] for i in range(0, len(timed), 4)]
    assert order == [0.25, 0.5, 2.0, 2.0, 0.5, 0.25, 0.25, 0.5, 2.0, 2.0, 0.5, 0.25]
    assert small.InterleavedTiming(probe, round_count=4)({}) == {}


# ---- host time per call (CUDA only; the code path is run here on the CPU) ----

def test_host_time_is_the_median_call_with_the_device_busy_and_no_sync_in_the_clock():
    from flashattn.bench import small

    events = []
    durations = iter([3e-6, 1e-6, 2e-6, 9e-6, 5e-6])  # seconds per timed call

    class Timer:
        now = 0.0

        def __call__(self):
            events.append("timer")
            return self.now

    timer = Timer()

    def step():
        events.append("step")
        if events.count("busy"):  # a timed call: the clock advances by its duration
            timer.now += next(durations)
        return object()

    host_us = small.host_time_us(step, sync=lambda: events.append("sync"),
                                 busy=lambda: events.append("busy"), timer=timer, calls=5,
                                 warmup=2)
    assert host_us == pytest.approx(3.0)  # the median of 3, 1, 2, 9, 5 µs
    # Warm-up, sync, busy, then timer/step/timer per call with no sync between, sync at the end.
    assert events == (["step"] * 2 + ["sync", "busy"] + ["timer", "step", "timer"] * 5
                      + ["sync"])


def test_host_times_in_the_report_and_table_where_calls_are_asynchronous(monkeypatch, tmp_path,
                                                                         capsys):
    # CUDA's path, on the CPU: every implementation that ran gets host_us, and flashattn's
    # ratio against each SDPA backend.
    from flashattn.bench import small

    monkeypatch.setattr(small, "HOST_TIMED_DEVICES", {"cpu", "cuda"})
    monkeypatch.setattr(small, "HOST_CALLS", 5)
    monkeypatch.setattr(small, "HOST_WARMUP", 1)
    out = tmp_path / "small.json"
    assert bench_main([*QUICK, "--seqlens", "16", "--causal", "no", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    rows = report["host_us"]
    assert {(r["mode"], r["impl"]) for r in rows} == {
        (mode, impl) for mode in ("fwd", "fwdbwd") for impl in CPU_IMPLS}
    for r in rows:
        assert r["causal"] is False and r["seqlen"] == 16 and r["batch"] == 1
        assert r["dtype"] == "float32" and r["host_us"] > 0
        ours = next(o["host_us"] for o in rows
                    if o["impl"] == "flashattn" and o["mode"] == r["mode"])
        if r["impl"] == "flashattn":
            assert r["fa_host_speedup"] is None
        else:
            assert r["fa_host_speedup"] == pytest.approx(r["host_us"] / ours)
    assert report["host_timing"]["calls"] == 5
    table = capsys.readouterr().out
    assert "host time per call: forward, float32" in table and "host_us" in table


def test_cpu_report_has_no_host_times(small_run):
    # On the CPU a call returns when its work is done: its time is in time_ms already.
    assert "host_us" not in small_run and "host_timing" not in small_run
