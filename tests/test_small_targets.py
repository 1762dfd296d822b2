"""tools/small_targets.py (issue 29's paired timing): each round gives its own ratio, the summary
is their median and quartiles, and a run over every target shape checks flashattn against SDPA
before it times them. The rounds themselves (flashattn/bench/rounds.py, shared with `bench
small`) are tested in test_bench_rounds.py. Speed is not tested here."""
import importlib.util
import os
import statistics

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "tools", "small_targets.py")


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("small_targets", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_summary_is_the_median_ratio_and_its_quartiles(tool):
    t_ours = [1.0, 1.0, 2.0, 1.0, 1.0]
    t_theirs = [1.0, 2.0, 1.0, 3.0, 0.5]   # ratios 1, 2, 0.5, 3, 0.5
    row = tool.summarize(t_ours, t_theirs)
    assert row["ratio"] == 1.0 and row["rounds"] == 5
    assert row["ratio_q1"] == 0.5 and row["ratio_q3"] == 2.0
    assert row["flashattn_us"] == pytest.approx(1e6)
    assert row["sdpa_us"] == pytest.approx(statistics.median(t_theirs) * 1e6)


def test_a_wrong_result_is_not_timed(tool):
    ours, theirs = tool.steps((1, 3, 2, 8), causal=True, mode="fwd")
    tool.agree(ours, theirs)
    with pytest.raises(AssertionError, match="differ"):
        tool.agree(lambda: ours() + 1e-2, theirs)


def test_every_target_case_runs_and_is_summarized(tool, capsys):
    threads = torch.get_num_threads()
    try:
        assert tool.main(["--threads", "1", "--rounds", "4"]) == 0
    finally:
        torch.set_num_threads(threads)
    lines = [l for l in capsys.readouterr().out.splitlines() if "threads=1:" in l]
    assert len(lines) == len(tool.SHAPES) * 2 * 2, lines
    for shape in tool.SHAPES:
        assert sum(str(shape) in l for l in lines) == 4


def test_too_few_rounds_is_a_clear_error(tool, capsys):
    with pytest.raises(SystemExit):
        tool.main(["--rounds", "3"])
    assert "--rounds: expected at least 4" in capsys.readouterr().err
