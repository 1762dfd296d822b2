"""The statistics of the summaries: geometric means of paired speedups, and spans."""
import math
import statistics


def geomean(values):
    return math.exp(statistics.fmean(math.log(x) for x in values)) if values else None


def span(values):
    return [min(values), max(values)] if values else None


def smallest_speedup_per_case(rows, group, case, speedup):
    """{group(row): [the smallest known speedup(row) of each case(row) in the group]}: flashattn
    against the fastest competitor of each case. Every group appears, without an entry for a
    case where no speedup is known (flashattn or every competitor could not run)."""
    cases = {}
    for r in rows:
        cases.setdefault(group(r), {}).setdefault(case(r), []).append(speedup(r))
    return {key: [min(known) for known in ([s for s in speedups if s is not None]
                                           for speedups in per_case.values()) if known]
            for key, per_case in cases.items()}


def geomean_text(value, cases):
    return (f"{value:.2f}x (geometric mean over {cases} cases)" if value
            else "n/a (flashattn or every SDPA backend could not run)")
