"""The progress line of a long run: "[12/48] decode bfloat16 B=8 Sq=1 Sk=16384" on stderr,
rewritten in place, so that a run of minutes shows where it is. Only on a terminal: in a log
file or a pipe every version of the line would pile up, so there it writes nothing at all."""
import shutil


class Progress:
    def __init__(self, stream, subcommand):
        self.stream = stream
        self.subcommand = subcommand
        self.live = stream.isatty()
        self.total = 0
        self.done = 0
        self.shown = 0  # characters of the line on screen now

    def expect(self, total):
        """The number of steps that follow, for the [done/total] count."""
        self.total, self.done = total, 0

    def step(self, label):
        """The next step starts: shows its number and label."""
        self.done += 1
        if not self.live:
            return
        text = f"[{self.done}/{self.total}] {self.subcommand} {label}"
        # A line longer than the terminal would wrap, and \r returns only to its last row.
        text = text[:shutil.get_terminal_size().columns - 1]
        self.stream.write("\r" + text.ljust(self.shown))
        self.stream.flush()
        self.shown = len(text)

    def clear(self):
        """Blanks the line, before the table prints to the same terminal."""
        if self.shown:
            self.stream.write("\r" + " " * self.shown + "\r")
            self.stream.flush()
            self.shown = 0
