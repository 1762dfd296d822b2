"""`python -m flashattn.bench context-parallel` runs end to end at tiny sizes: 2 spawned gloo
ranks, and 2 ranks launched by torchrun (the launcher GPUs use, here with gloo)."""
import json
import os
import subprocess
import sys

import pytest

import flashattn
from flashattn.bench import cli

# The flashattn under test (the source tree, or the installed wheel in CI) for subprocesses.
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(flashattn.__file__)))
TINY = ["--seqlen", "64", "--heads", "2", "--head-dim", "16", "--repeats", "5", "--warmup", "0"]
MEASURED = ("single", "ring", "compute", "communicate")


def _check_report(report, dtypes, launcher):
    assert report["subcommand"] == "context-parallel"
    meta = report["meta"]
    assert meta["launcher"] == launcher and meta["ranks"] == 2
    # meta's threads is the single process's, as in every report; the ranks' is per rank.
    assert meta["threads_per_rank"] == 1 and meta["threads"] == 2
    assert [r["dtype"] for r in report["results"]] == dtypes
    for result in report["results"]:
        for name in MEASURED:
            assert result[name]["wall"] > 0 and result[name]["cpu"] >= 0, (name, result[name])
        assert result["ring_over_single_wall"] > 0 and 0 <= result["hidden"] <= 1


def test_spawned_ranks_time_the_ring_and_its_parts(tmp_path, capsys):
    path = tmp_path / "cp.json"
    assert cli.main(["context-parallel", *TINY, "--dtype", "float32,bfloat16",
                     "--json", str(path)]) == 0
    _check_report(json.loads(path.read_text()), ["float32", "bfloat16"], "spawn")
    printed = capsys.readouterr().out
    assert "ring, 2 ranks x 1 thread(s)" in printed and "hidden by the ring" in printed
    assert "float32 causal forward+backward, medians of 5" in printed


def test_the_forward_alone_in_float16(tmp_path, capsys):
    path = tmp_path / "cp.json"
    assert cli.main(["context-parallel", *TINY, "--dtype", "float16", "--forward-only",
                     "--no-causal", "--json", str(path)]) == 0
    _check_report(json.loads(path.read_text()), ["float16"], "spawn")
    assert "float16 full forward, medians of 5" in capsys.readouterr().out


def test_ranks_launched_by_torchrun(tmp_path):
    path = tmp_path / "cp.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": PACKAGE_PARENT}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "2", "-m", "flashattn.bench", "context-parallel",
                           "--device", "cpu", *TINY, "--json", str(path)],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    _check_report(json.loads(path.read_text()), ["float32"], "torchrun")
    # Only rank 0 prints the table.
    assert done.stdout.count("ring, 2 ranks x 1 thread(s)") == 1, done.stdout


@pytest.mark.parametrize("argv, message", [
    (["--seqlen", "66"], "--seqlen 66: the zigzag layout cuts it into 2P = 4 equal chunks"),
    (["--ranks", "1"], "--ranks: a ring needs at least 2 ranks, got 1"),
])
def test_bad_settings_are_named(argv, message, capsys):
    with pytest.raises(SystemExit):
        cli.main(["context-parallel", *TINY, *argv])
    assert message in capsys.readouterr().err


def test_the_old_module_entry_point_runs_the_subcommand(tmp_path):
    done = subprocess.run([sys.executable, "-m", "flashattn.bench.context_parallel", "--help"],
                          env={**os.environ, "PYTHONPATH": PACKAGE_PARENT}, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "context-parallel" in done.stdout, done.stderr
