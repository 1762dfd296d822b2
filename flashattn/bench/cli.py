"""The command line of `python -m flashattn.bench [SUBCOMMAND] [OPTIONS]`: one subcommand per
kind of benchmark, dense when none is named. Each subcommand's module (dense.py, varlen.py, ...)
holds its HELP line, DESCRIPTION, what it PLOTS (or None), add_arguments(parser) and main(run)."""
import argparse
import shlex
import sys

from . import context_parallel, decode, dense, options, sdpa_impl, small, varlen
from .report import PROG
from .run import Run

SUBCOMMANDS = {"dense": dense, "varlen": varlen, "decode": decode, "sdpa-impl": sdpa_impl,
               "small": small, "context-parallel": context_parallel}
DEFAULT = "dense"
# The flags that chose a benchmark before the subcommands did.
REPLACED_FLAGS = {"--varlen": "varlen", "--decode": "decode", "--sdpa-impl": "sdpa-impl"}
HELP_FLAGS = ("-h", "--help")


def make_parsers():
    """The top-level parser and {subcommand: its parser}."""
    parser = argparse.ArgumentParser(
        prog=PROG, usage=f"{PROG} [SUBCOMMAND] [OPTIONS]",
        description="Benchmarks of flashattn against torch.nn.functional."
                    "scaled_dot_product_attention, each checked against a float64 reference "
                    "before it is timed.",
        epilog=f"Without a subcommand: {DEFAULT}. Every subcommand takes --device, --dtype, "
               f"--threads, --repeats, --quick, --json [FILE] and --plot FILE; "
               f"`{PROG} SUBCOMMAND --help` lists its options.")
    choices = parser.add_subparsers(title="subcommands", dest="subcommand", metavar="SUBCOMMAND",
                                    required=True)
    parsers = {}
    for name, module in SUBCOMMANDS.items():
        sub = choices.add_parser(name, prog=f"{PROG} {name}", help=module.HELP,
                                 description=module.DESCRIPTION,
                                 epilog=getattr(module, "EPILOG", None))
        module.add_arguments(sub)
        options.add_common_options(sub, name, module.PLOTS)
        parsers[name] = sub
    return parser, parsers


def with_subcommand(argv):
    """argv with the default subcommand in front where it starts with an option (or is
    empty); the top-level --help stays the top level's."""
    if not argv or (argv[0].startswith("-") and argv[0] not in HELP_FLAGS):
        return [DEFAULT, *argv]
    return argv


def refuse_replaced_flags(parser, argv):
    """An error naming the command that replaces --varlen, --decode or --sdpa-impl [PART]."""
    for i, token in enumerate(argv):
        flag, _, value = token.partition("=")
        if flag not in REPLACED_FLAGS:
            continue
        rest = argv[:i] + argv[i + 1:]
        if flag == "--sdpa-impl" and not value and rest[i:i + 1] and rest[i] in sdpa_impl.PARTS:
            value = rest.pop(i)
        if rest and rest[0] in SUBCOMMANDS:
            rest = rest[1:]
        command = [REPLACED_FLAGS[flag], *([value] if flag == "--sdpa-impl" and value else []),
                   *rest]
        parser.error(f"{flag} is now a subcommand: {PROG} {shlex.join(command)}")


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, parsers = make_parsers()
    refuse_replaced_flags(parser, argv)
    argv = with_subcommand(argv)
    args, unknown = parser.parse_known_args(argv)
    subparser = parsers[args.subcommand]
    if unknown:
        # The subcommand's error rather than the top level's: the options differ between them.
        subparser.error(f"unrecognized arguments: {' '.join(unknown)} (`{subparser.prog} --help` "
                        f"lists its options)")
    run = Run(args.subcommand, argv, args, subparser)
    return SUBCOMMANDS[args.subcommand].main(run)
