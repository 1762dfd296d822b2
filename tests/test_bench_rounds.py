"""flashattn/bench/rounds.py, the interleaved timing of `bench small` and tools/small_targets.py:
every round times a block of each step, the order reversed every other round, each block's time
per call; the per-round ratios and their quartiles. A fake clock, so speed is not tested here."""
import pytest

from flashattn.bench import rounds


class FakeClock:
    """A timer that advances by what each call of a step costs, and logs the steps' order."""

    def __init__(self):
        self.now, self.calls = 0.0, []

    def __call__(self):
        return self.now

    def step(self, name, cost):
        def run():
            self.calls.append(name)
            self.now += cost
        return run

    def block(self, step, calls):
        return rounds.timed_block(step, calls, timer=self)


def blocks(calls, per_block):
    """The step of each block, from the log of single calls."""
    assert len(calls) % per_block == 0
    firsts = [calls[i] for i in range(0, len(calls), per_block)]
    assert all(calls[i:i + per_block] == [firsts[i // per_block]] * per_block
               for i in range(0, len(calls), per_block))
    return firsts


def test_two_steps_alternate_abba_and_each_block_is_timed_per_call():
    clock = FakeClock()
    steps = {"a": clock.step("a", 2.0), "b": clock.step("b", 3.0)}
    times = rounds.interleaved_rounds(steps, rounds=4, calls=3, time_block=clock.block)
    assert times == {"a": [2.0] * 4, "b": [3.0] * 4}
    assert blocks(clock.calls, 3) == ["a", "b", "b", "a", "a", "b", "b", "a"]


def test_three_steps_reverse_their_order_every_other_round():
    clock = FakeClock()
    steps = {name: clock.step(name, cost) for name, cost in (("a", 1.0), ("b", 2.0),
                                                             ("c", 4.0))}
    times = rounds.interleaved_rounds(steps, rounds=3, calls=2, time_block=clock.block)
    assert times == {"a": [1.0] * 3, "b": [2.0] * 3, "c": [4.0] * 3}
    assert blocks(clock.calls, 2) == ["a", "b", "c", "c", "b", "a", "a", "b", "c"]


def test_a_round_is_timed_by_the_time_block_it_is_given():
    # CUDA times a block by events: interleaved_rounds only calls time_block(step, calls).
    seen = []
    times = rounds.interleaved_rounds({"x": "step x", "y": "step y"}, rounds=2, calls=5,
                                      time_block=lambda step, calls: seen.append((step, calls))
                                      or len(seen))
    assert seen == [("step x", 5), ("step y", 5), ("step y", 5), ("step x", 5)]
    assert times == {"x": [1, 4], "y": [2, 3]}


def test_ratios_are_per_round_and_summarized_by_median_and_quartiles():
    ratios = rounds.round_ratios([1.0, 2.0, 1.0, 3.0, 0.5], [1.0, 1.0, 2.0, 1.0, 1.0])
    assert ratios == [1.0, 2.0, 0.5, 3.0, 0.5]
    assert rounds.quartiles(ratios) == (0.5, 1.0, 2.0)
    assert rounds.quartiles([1.25]) == (1.25, 1.25, 1.25)


@pytest.mark.parametrize("per_call,block,calls", [(0.010, 1.0, 100), (0.3, 1.0, 3),
                                                  (5.0, 1.0, 1), (0.0, 1.0, 1)])
def test_a_block_holds_enough_calls_to_last_the_block_time_and_at_least_one(per_call, block,
                                                                              calls):
    assert rounds.calls_per_block(per_call, block) == calls
