"""What every mode of `python -m flashattn.bench` shares: SDPA's backends per device, the FLOP
convention, the device of a run, table and number formatting, argument types and the JSON
report. The modes (bench.py for dense batches, _bench_varlen, _bench_decode, _bench_sdpa_impl)
import it; it imports none of them.
"""
import argparse
import json
import math

import torch
from torch.nn.attention import SDPBackend

MODES = ("fwd", "fwdbwd")
MODE_TITLES = {"fwd": "forward", "fwdbwd": "forward+backward"}
NOT_AVAILABLE = "n/a"
MIN_REPEATS = 5

# FlashAttention's FLOP convention: the forward is two (Sq x Sk x d) matmuls of 2 FLOPs per
# multiply-add, halved under a causal mask when Sq == Sk; the backward does 2.5x the forward.
FWD_FLOPS_PER_QKD = 4
BWD_FLOPS_PER_FWD = 2.5
FLOPS_PER_TFLOP = 1e12

SDPA_BACKENDS = {
    "cuda": (("flash", SDPBackend.FLASH_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION),
             ("cudnn", SDPBackend.CUDNN_ATTENTION), ("math", SDPBackend.MATH)),
    "cpu": (("flash", SDPBackend.FLASH_ATTENTION), ("math", SDPBackend.MATH)),
}

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16,
          "float64": torch.float64, "fp64": torch.float64}


def resolve_device(args, parser):
    """The device of a run (--device, else CUDA where there is one) with --threads applied;
    every bench mode starts here."""
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.threads:
        torch.set_num_threads(args.threads)
    return device


def dtype_name(dtype):
    return str(dtype).replace("torch.", "")


def table_header(mode, dtype, settings, columns):
    """A table's title (mode, dtype name, heads, head dim) and its column names, right-aligned
    to (name, width) `columns`."""
    title = f"{MODE_TITLES[mode]}, {dtype}, heads={settings.heads}, head_dim={settings.head_dim}"
    names = "  ".join(name.rjust(width) for name, width in columns)
    return f"\n{title}\n{names}\n{'-' * len(names)}"


def fmt(value, spec):
    return "-" if value is None else format(value, spec)


def write_json(report, destination):
    """--json: the report to the file `destination`, or to stdout for "-"."""
    text = json.dumps(json_safe(report), indent=1)
    if destination == "-":
        print(text)
    else:
        with open(destination, "w") as f:
            f.write(text + "\n")


def json_safe(value):
    # NaN and infinity are not JSON: spell them out rather than hide a broken result.
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, list):
        return [json_safe(v) for v in value]
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    return value


# argparse types.
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
