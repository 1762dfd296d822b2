"""Interleaved rounds: how `bench small` and tools/small_targets.py time calls of microseconds
on a shared machine.

Best-of-N loops, one implementation after the other, moved by 0.65-1.02 between two runs of one
build (docs/lab/2026-12-03-small-problems-part-10.md): a burst of load that hits one
implementation's loops and not the other's skews the ratio. Here they are timed in rounds, each
round a block of calls of every implementation back to back, the order reversed every other
round (A B, B A, ...: ABBA for two; A B C, C B A for three), and each round gives its own ratio.
Load that lasts longer than a round moves every block of it alike; the median over many rounds
drops the rounds a burst split, and the interquartile range says how much the rounds agreed.
"""
import statistics
import time


def repeat(step, calls):
    """step() `calls` times; each result is dropped when the next call comes, as a caller's
    would be."""
    for _ in range(calls):
        step()


def timed_block(step, calls, timer=time.perf_counter):
    """Seconds per call of `calls` calls of step() back to back, by `timer`."""
    start = timer()
    repeat(step, calls)
    return (timer() - start) / calls


def interleaved_rounds(steps, rounds, calls, time_block=timed_block):
    """{name: [time per call, one per round]} of steps ({name: step}): every round times one
    block of `calls` calls of each step (time_block(step, calls) -> time per call), in the
    order of `steps` in even rounds and in the reverse order in odd ones, so that no step
    always goes first or last."""
    names = list(steps)
    times = {name: [] for name in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            times[name].append(time_block(steps[name], calls))
    return times


def calls_per_block(time_per_call, block_time):
    """How many calls of time_per_call fill a block of block_time (same unit), at least one: a
    block long against the clock's overhead and short against bursts of load."""
    return max(1, round(block_time / time_per_call)) if time_per_call > 0 else 1


def round_ratios(times, baseline):
    """t / t_baseline of each round, for two steps timed in the same rounds: > 1, the baseline
    is faster."""
    return [t / t_base for t, t_base in zip(times, baseline)]


def quartiles(values):
    """(first quartile, median, third quartile), by statistics.quantiles' inclusive method;
    a single value is all three."""
    if len(values) == 1:
        return values[0], values[0], values[0]
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, median, q3
