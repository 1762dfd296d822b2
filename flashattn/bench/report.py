"""--json: the report every subcommand writes, {"subcommand", "meta", "summary", "results", and
what else the subcommand measures}, with one "meta" for all of them: the command, when, which
flashattn (version and commit), torch, device and machine, then the subcommand's settings."""
import dataclasses
import datetime
import json
import math
import os
import shlex
import subprocess

import torch

from .. import __version__
from . import machine

PROG = "python -m flashattn.bench"
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # flashattn/
GIT_TIMEOUT_S = 10


def meta(argv, device, probe, settings):
    """The shared fields, then the subcommand's settings (a dict). argv starts with the
    subcommand, so the command repeats the run even when it was left to its default."""
    return {
        "command": shlex.join([*PROG.split(), *argv]),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "flashattn": __version__, "commit": source_commit(PACKAGE_DIR),
        "torch": torch.__version__, "device": device.type, "device_name": probe.describe(),
        "threads": torch.get_num_threads(), "machine": machine.describe(device),
        **settings,
    }


def source_commit(package_dir):
    """The short hash of HEAD, "-dirty" when tracked files have changes, where package_dir is
    tracked in a git checkout; None for an installed copy (even one in a virtual environment
    inside a checkout: its files are not tracked there) or without git."""
    def git(*args):
        return subprocess.run(["git", "-C", package_dir, *args], capture_output=True, text=True,
                              timeout=GIT_TIMEOUT_S)
    try:
        if git("ls-files", "--error-unmatch", "__init__.py").returncode:
            return None
        head = git("rev-parse", "--short", "HEAD")
        status = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):  # no git, or one that hangs
        return None
    if head.returncode or status.returncode:
        return None
    return head.stdout.strip() + ("-dirty" if status.stdout.strip() else "")


def write(destination, subcommand, meta, summary, results, **extra):
    """The report to the file `destination`, or to stdout for "-"; dataclasses (the results)
    as dicts of their fields."""
    report = {"subcommand": subcommand, "meta": meta, "summary": summary, "results": results,
              **extra}
    text = json.dumps(json_safe(report), indent=1)
    if destination == "-":
        print(text)
    else:
        with open(destination, "w") as f:
            f.write(text + "\n")


def json_safe(value):
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return json_safe(dataclasses.asdict(value))
    # NaN and infinity are not JSON: spell them out rather than hide a broken result.
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, list):
        return [json_safe(v) for v in value]
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    return value
