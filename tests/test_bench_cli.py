"""The front door of `python -m flashattn.bench`: the subcommands and their help, the old mode
flags' errors that name the command replacing them, the report every subcommand writes with the
same meta, and the progress line that only a terminal gets."""
import datetime
import io
import json
import re
import shlex
import subprocess

import pytest

import flashattn
from test_bench import TINY_RUN, TINY_VARLEN, bench_main, run_python
from test_bench_decode import TINY_DECODE

SUBCOMMANDS = ("dense", "varlen", "decode", "sdpa-impl", "small", "context-parallel")
SHARED_META = ("command", "date_utc", "flashattn", "commit", "torch", "device", "device_name",
               "threads", "machine")
MACHINE_KEYS = {"cpu_model", "cpu_family", "cpu_model_number", "vendor", "cores", "isa"}
ISA_FLAGS = {"avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16"}
# The tiniest run of each subcommand.
TINY = {"dense": ["dense", *TINY_RUN], "varlen": TINY_VARLEN, "decode": TINY_DECODE,
        "sdpa-impl": ["sdpa-impl", "train", "--device", "cpu", "--quick", "--causal", "yes"],
        "small": ["small", "--device", "cpu", "--quick", "--seqlens", "16", "--mode", "fwd"],
        "context-parallel": ["context-parallel", "--device", "cpu", "--quick", "--seqlen", "32",
                             "--forward-only"]}


def test_help_lists_every_subcommand_with_its_line():
    from flashattn.bench import cli

    proc = run_python(["-m", "flashattn.bench", "--help"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: python -m flashattn.bench [SUBCOMMAND] [OPTIONS]")
    assert tuple(cli.SUBCOMMANDS) == SUBCOMMANDS
    text = " ".join(proc.stdout.split())  # argparse wraps the lines
    for name, module in cli.SUBCOMMANDS.items():
        assert f" {name} {' '.join(module.HELP.split())}" in text, name
    assert "Without a subcommand: dense." in text


def test_a_subcommand_help_gives_its_options_and_the_shared_ones():
    proc = run_python(["-m", "flashattn.bench", "decode", "--help"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: python -m flashattn.bench decode ")
    for option in ("--kv-lens", "--batch-sizes", "--heads-kv", "--page-size", "--budget",
                   "--device", "--dtype", "--threads", "--repeats", "--quick", "--json",
                   "--plot"):
        assert option in proc.stdout, option
    assert "--seqlens" not in proc.stdout and "--causal" not in proc.stdout


@pytest.mark.parametrize("argv, flag, replacement", [
    (["--decode", "--device", "cpu", "--quick"], "--decode", "decode --device cpu --quick"),
    (["--device", "cpu", "--varlen", "--total-tokens", "64"], "--varlen",
     "varlen --device cpu --total-tokens 64"),
    (["--sdpa-impl"], "--sdpa-impl", "sdpa-impl"),
    (["--sdpa-impl", "train", "--quick"], "--sdpa-impl", "sdpa-impl train --quick"),
    (["--sdpa-impl=overhead"], "--sdpa-impl", "sdpa-impl overhead"),
])
def test_an_old_mode_flag_names_the_subcommand_that_replaces_it(argv, flag, replacement,
                                                                 capsys):
    with pytest.raises(SystemExit) as exit_:
        bench_main(argv)
    assert exit_.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert f"{flag} is now a subcommand: python -m flashattn.bench {replacement}\n" in err


@pytest.mark.parametrize("subcommand", SUBCOMMANDS)
def test_every_report_has_the_shared_frame_and_meta(subcommand, tmp_path, capsys):
    out = tmp_path / "report.json"
    argv = [*TINY[subcommand], "--json", str(out)]
    assert bench_main(argv) == 0
    report = json.loads(out.read_text())
    assert list(report)[:4] == ["subcommand", "meta", "summary", "results"]
    assert report["subcommand"] == subcommand
    meta = report["meta"]
    assert list(meta)[:len(SHARED_META)] == list(SHARED_META)
    assert meta["command"] == shlex.join(["python", "-m", "flashattn.bench", *argv])
    assert datetime.datetime.fromisoformat(meta["date_utc"]).tzinfo is not None
    assert meta["flashattn"] == flashattn.__version__
    assert meta["commit"] is None or re.fullmatch(r"[0-9a-f]{4,}(-dirty)?", meta["commit"])
    assert meta["device"] == "cpu" and meta["threads"] >= 1 and meta["device_name"]
    machine = meta["machine"]
    assert machine.keys() == MACHINE_KEYS
    assert machine["cores"] >= 1 and set(machine["isa"]) <= ISA_FLAGS
    assert isinstance(report["results"], list) and report["results"]
    assert "\r" not in capsys.readouterr().err  # no terminal here: no progress line


def test_the_library_does_not_import_the_benchmark():
    proc = run_python(["-c", "import sys, flashattn\n"
                             "print(sorted(m for m in sys.modules\n"
                             "             if m.split('.')[:2] == ['flashattn', 'bench']))"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def git(repo, *args):
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                   check=True, capture_output=True)


def test_commit_is_the_checkout_head_dirty_only_for_tracked_changes(tmp_path):
    from flashattn.bench.report import source_commit

    package = tmp_path / "repo" / "pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    assert source_commit(str(package)) is None  # not in a checkout
    git(tmp_path / "repo", "init", "-q")
    assert source_commit(str(package)) is None  # in a checkout, not tracked: an installed copy
    git(tmp_path / "repo", "add", "pkg/__init__.py")
    git(tmp_path / "repo", "commit", "-q", "-m", "one")
    head = subprocess.run(["git", "-C", str(package), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()
    assert source_commit(str(package)) == head
    (package / "untracked.py").write_text("")
    assert source_commit(str(package)) == head  # untracked files do not make it dirty
    (package / "__init__.py").write_text("x = 1\n")
    assert source_commit(str(package)) == head + "-dirty"


class FakeStream(io.StringIO):
    def __init__(self, tty):
        super().__init__()
        self.tty = tty

    def isatty(self):
        return self.tty


def test_progress_line_is_rewritten_in_place_on_a_terminal():
    from flashattn.bench.progress import Progress

    stream = FakeStream(tty=True)
    progress = Progress(stream, "decode")
    progress.expect(2)
    progress.step("bfloat16 B=8 Sk=16384")
    line = "[1/2] decode bfloat16 B=8 Sk=16384"
    assert stream.getvalue() == "\r" + line
    progress.step("B=1")
    # The shorter line is padded over the longer one it replaces, on the same row.
    assert stream.getvalue() == "\r" + line + "\r" + "[2/2] decode B=1".ljust(len(line))
    progress.clear()
    assert stream.getvalue().endswith("\r" + " " * len("[2/2] decode B=1") + "\r")
    assert "\n" not in stream.getvalue()


def test_progress_line_is_not_written_where_stderr_is_no_terminal():
    from flashattn.bench.progress import Progress

    stream = FakeStream(tty=False)
    progress = Progress(stream, "dense")
    progress.expect(3)
    for label in ("a", "b", "c"):
        progress.step(label)
    progress.clear()
    assert stream.getvalue() == ""
    assert progress.done == 3


def test_the_table_blanks_the_progress_line_before_it_prints(monkeypatch, capsys):
    # The table and the progress line share a terminal: each table line starts on a blank row.
    from flashattn.bench import cli, run as run_module

    terminal = FakeStream(tty=True)
    monkeypatch.setattr(run_module.sys, "stderr", terminal)
    parser, parsers = cli.make_parsers()
    args = parser.parse_args(["dense", "--device", "cpu", "--json", "-"])
    run = run_module.Run("dense", ["dense"], args, parsers["dense"])
    run.progress.expect(1)
    run.progress.step("fwd float32")
    run.print("a table line")
    assert terminal.getvalue() == ("\r[1/1] dense fwd float32" + "\r" + " " * 23 + "\r"
                                   + "a table line\n")
