"""The context-parallel benchmark runs end to end at a tiny size (2 gloo ranks)."""
from flashattn.bench import context_parallel


def test_context_parallel_bench_runs(capsys):
    result = context_parallel.main(["--seqlen", "64", "--heads", "2", "--head-dim", "16",
                                    "--repeats", "1", "--warmup", "0"])
    for name in ("single", "ring", "compute", "communicate"):
        assert result[name]["wall"] > 0 and result[name]["cpu"] >= 0, (name, result[name])
    printed = capsys.readouterr().out
    assert "ring, 2 ranks x 1 thread(s)" in printed and "hidden by the ring" in printed


def test_context_parallel_bench_times_the_forward_alone_in_float16(capsys):
    result = context_parallel.main(["--seqlen", "64", "--heads", "2", "--head-dim", "16",
                                    "--dtype", "float16", "--forward-only", "--repeats", "1",
                                    "--warmup", "0"])
    for name in ("single", "ring", "compute", "communicate"):
        assert result[name]["wall"] > 0 and result[name]["cpu"] >= 0, (name, result[name])
    assert "float16 causal forward, medians of 1" in capsys.readouterr().out
