"""`python -m flashattn.bench --plot FILE`: time and peak memory against sequence length, drawn
with matplotlib in the format the file name asks for (png, svg, pdf, ...).

matplotlib is the optional `bench` extra, so it is imported only in these functions, and only
when --plot is given: the benchmark itself runs without it.
"""
import argparse
import os

MATPLOTLIB_MISSING = "needs matplotlib: pip install 'flashattn[bench]'"
METRICS = (("time_ms", "time (ms)"), ("peak_mb", "peak memory (MB)"))
PANEL_SIZE_IN = (6.4, 3.6)  # width, height of one panel, in inches
TITLE_HEIGHT_IN = 0.6
# Peak memory can be 0 MB (a call that fits in memory the process already holds), which a log
# axis cannot show; below this many MB the memory axis is linear instead.
MEMORY_LINEAR_BELOW_MB = 1


def plot_path(text):
    """argparse type of --plot: checks matplotlib and the format before minutes of benchmarking,
    not after them."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
    except ModuleNotFoundError as err:  # matplotlib or one of its own dependencies
        raise argparse.ArgumentTypeError(MATPLOTLIB_MISSING) from err
    extension = os.path.splitext(text)[1][1:].lower()
    supported = FigureCanvasAgg.get_supported_filetypes()
    if extension not in supported:
        # Without an extension matplotlib would write FILE.png rather than FILE: refuse that too.
        raise argparse.ArgumentTypeError(
            f"{text!r}: the extension picks the format; choose from {', '.join(sorted(supported))}")
    return text


def plot_results(path, results, title):
    """One row of panels per (dtype, mode, causal) group of bench.Result: time, then peak memory,
    against seqlen, a line per implementation. A value of None (the implementation did not run)
    is left out."""
    from matplotlib import rc_context
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullLocator

    groups = list(dict.fromkeys((r.dtype, r.mode, r.causal) for r in results))
    # The same colour for an implementation in every panel.
    colors = {impl: f"C{i}" for i, impl in enumerate(dict.fromkeys(r.impl for r in results))}
    width, height = PANEL_SIZE_IN
    fig = Figure(figsize=(len(METRICS) * width, len(groups) * height + TITLE_HEIGHT_IN),
                 layout="constrained")
    # Agg renders every format without a display, and an explicit canvas leaves the backend of
    # a caller's pyplot alone.
    FigureCanvasAgg(fig)
    fig.suptitle(title)
    axes = fig.subplots(len(groups), len(METRICS), squeeze=False)
    for row, (dtype, mode, causal) in zip(axes, groups):
        group = [r for r in results if (r.dtype, r.mode, r.causal) == (dtype, mode, causal)]
        for ax, (metric, label) in zip(row, METRICS):
            # Scales before the data, so that autoscaling leaves margins on these scales.
            # Time and attention memory grow up to the square of seqlen.
            ax.set_xscale("log", base=2)
            if metric == "peak_mb":
                ax.set_yscale("symlog", linthresh=MEMORY_LINEAR_BELOW_MB)
            else:
                ax.set_yscale("log")
            for impl, color in colors.items():
                points = sorted((r.seqlen, getattr(r, metric)) for r in group
                                if r.impl == impl and getattr(r, metric) is not None)
                if points:
                    ax.plot(*zip(*points), marker="o", color=color, label=impl)
            if metric == "peak_mb":
                ax.set_ylim(bottom=0)  # symlog would show negative memory below it
            # One tick at each length measured (powers of two by default).
            seqlens = sorted({r.seqlen for r in group})
            ax.set_xticks(seqlens, [str(s) for s in seqlens])
            ax.xaxis.set_minor_locator(NullLocator())
            ax.set_title(f"{mode}, {'causal' if causal else 'non-causal'}, {dtype}: {label}")
            ax.set_xlabel("seqlen")
            ax.set_ylabel(label)
            ax.grid(True, which="both", alpha=0.3)
            if ax.lines:
                ax.legend(fontsize="small")
            else:
                ax.text(0.5, 0.5, "not measured", transform=ax.transAxes, ha="center")
    # Text as text in an SVG: searchable, and smaller than glyphs drawn as paths.
    with rc_context({"svg.fonttype": "none"}):
        fig.savefig(path, format=os.path.splitext(path)[1][1:].lower())
