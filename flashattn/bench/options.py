"""The command-line options that mean the same in every subcommand of `python -m flashattn.bench`
(or in every one that has them), and the argparse types of all options.

An option's dest is the name of the field of the subcommand's Settings it overrides (run.Run.
settings applies every option given whose dest is a field), so no subcommand lists them twice.
"""
import argparse

import torch

from . import plot
from .common import MODES

MIN_REPEATS = 5
DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16,
          "float64": torch.float64, "fp64": torch.float64}
MODE_CHOICES = {"both": MODES, "fwd": ("fwd",), "fwdbwd": ("fwdbwd",)}
CAUSAL_CHOICES = {"both": (False, True), "yes": (True,), "no": (False,)}


def add_common_options(parser, subcommand, plots):
    """--device, --dtype, --threads, --repeats, --quick, --json and --plot. plots: what --plot
    draws in this subcommand, or None where it draws nothing (then --plot is an error that says
    so, rather than a flag silently ignored)."""
    group = parser.add_argument_group("options of every subcommand")
    group.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda if available")
    group.add_argument("--dtype", type=dtype_list, dest="dtypes", metavar="LIST",
                       help="comma list: float32, bfloat16, float16, float64 (or fp32, bf16, ...)")
    group.add_argument("--threads", type=positive_int, metavar="N",
                       help="CPU threads (torch.set_num_threads)")
    group.add_argument("--repeats", type=repeats, metavar="N",
                       help=f"timed calls each, >= {MIN_REPEATS}")
    group.add_argument("--quick", action="store_true", help="tiny sizes, a few seconds (CI)")
    group.add_argument("--json", nargs="?", const="-", metavar="FILE",
                       help="machine-readable results to FILE, or to stdout (the table then goes "
                            "to stderr)")
    if plots:
        group.add_argument("--plot", type=plot.plot_path, metavar="FILE",
                           help=f"draw {plots}, in the format of FILE's extension (png, svg, "
                                f"pdf, ...); needs matplotlib, the bench extra")
    else:
        group.add_argument("--plot", type=_draws_no_plot(subcommand), metavar="FILE",
                           help=f"{subcommand} draws no plot (an error)")


def add_mode_options(parser):
    """--mode and --causal: which of forward and forward+backward, causal and not, to run."""
    parser.add_argument("--mode", choices=tuple(MODE_CHOICES), default="both")
    parser.add_argument("--causal", choices=tuple(CAUSAL_CHOICES), default="both")


def add_head_options(parser, heads_help=None, head_dim_help=None):
    parser.add_argument("--heads", type=positive_int, metavar="N", help=heads_help)
    parser.add_argument("--head-dim", type=positive_int, dest="head_dim", metavar="N",
                        help=head_dim_help)


def modes(args):
    return MODE_CHOICES[args.mode]


def causal_flags(args):
    return CAUSAL_CHOICES[args.causal]


def _draws_no_plot(subcommand):
    def refuse(text):
        raise argparse.ArgumentTypeError(f"the {subcommand} subcommand draws no plot")
    refuse.__name__ = "plot"
    return refuse


def int_at_least(minimum, name):
    """An argparse type: an int >= minimum (argparse names `name` in its "invalid" message)."""
    def parse(text):
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value
    parse.__name__ = name
    return parse


positive_int = int_at_least(1, "positive_int")
non_negative_int = int_at_least(0, "non_negative_int")


def non_negative_float(text):
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def repeats(text):
    value = int(text)
    if value < MIN_REPEATS:
        raise argparse.ArgumentTypeError(f"medians need at least {MIN_REPEATS} repeats")
    return value


def int_list(text):
    return tuple(positive_int(part) for part in text.split(","))


def dtype_list(text):
    try:
        return tuple(DTYPES[part.strip().lower()] for part in text.split(","))
    except KeyError as err:
        raise argparse.ArgumentTypeError(f"unknown dtype {err}; choose from {', '.join(DTYPES)}")
