"""What every subcommand of `python -m flashattn.bench` starts from and ends with: the device
(--device, --threads), the probe that times and measures memory on it, its settings (defaults
per device, --quick's, then the options given), where the table goes, the progress line, and
the --json report."""
import dataclasses
import sys

import torch

from .. import __version__
from . import measure, report
from .progress import Progress


class Run:
    def __init__(self, subcommand, argv, args, parser):
        """argv: the command's arguments, starting with the subcommand."""
        self.subcommand, self.argv, self.args, self.parser = subcommand, argv, args, parser
        if args.device == "cuda" and not torch.cuda.is_available():
            parser.error("--device cuda: no CUDA device is available")
        self.device = torch.device(args.device
                                   or ("cuda" if torch.cuda.is_available() else "cpu"))
        if args.threads:
            torch.set_num_threads(args.threads)
        self.probe = measure.make_probe(self.device)
        # With the JSON on stdout, the table goes to stderr.
        self.table = sys.stderr if args.json == "-" else sys.stdout
        self.progress = Progress(sys.stderr, subcommand)

    def settings(self, defaults, quick):
        """The subcommand's Settings on this device: defaults[device type], with
        quick[device type] under --quick, then every option given whose dest is a field."""
        settings = defaults[self.device.type]
        if self.args.quick:
            settings = dataclasses.replace(settings, **quick[self.device.type])
        fields = {f.name for f in dataclasses.fields(settings)}
        given = {name: value for name, value in vars(self.args).items()
                 if name in fields and value is not None}
        return dataclasses.replace(settings, **given)

    def print(self, *lines):
        """Lines of the table (the progress line, on the same terminal, is blanked first)."""
        self.progress.clear()
        print(*lines, sep="\n", file=self.table, flush=True)

    def print_headline(self, what, repeats=None):
        self.print(f"flashattn {__version__} {what}, torch {torch.__version__}, "
                   f"{self.device.type} ({self.probe.describe()})"
                   + ("" if repeats is None else f", {repeats} timed repeats"))

    def write_report(self, settings, summary, results, **extra):
        """Under --json: the report (report.write), its meta the shared fields and `settings`
        (a dict of the subcommand's own)."""
        self.progress.clear()
        if self.args.json:
            meta = report.meta(self.argv, self.device, self.probe, settings)
            report.write(self.args.json, self.subcommand, meta, summary, results, **extra)
