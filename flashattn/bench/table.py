"""The tables `python -m flashattn.bench` prints: right-aligned columns under a title, and the
row of an implementation that could not run, which says why instead of showing numbers."""
from .common import MODE_TITLES, NOT_AVAILABLE


class Table:
    def __init__(self, columns, reason_width):
        self.columns = columns            # ((name, width), ...)
        self.reason_width = reason_width  # characters of an error's first line shown

    def header(self, title):
        names = "  ".join(name.rjust(width) for name, width in self.columns)
        return f"\n{title}\n{names}\n{'-' * len(names)}"

    def row(self, cells):
        return "  ".join(str(c).rjust(w) for c, (_, w) in zip(cells, self.columns))

    def not_available(self, cells, reason):
        """The leading cells (what the case is), then why it did not run."""
        return f"{self.row(cells)}  {NOT_AVAILABLE}: {reason[:self.reason_width]}"


def case_title(mode, dtype_name, heads, head_dim):
    return f"{MODE_TITLES[mode]}, {dtype_name}, heads={heads}, head_dim={head_dim}"


def fmt(value, spec):
    return "-" if value is None else format(value, spec)


def times(value):
    """A speedup or a ratio: 1.23x."""
    return "-" if value is None else f"{value:.2f}x"
