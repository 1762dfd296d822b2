"""The machine a benchmark ran on, for the report: the CPU from /proc/cpuinfo (its model,
family and the vector and matrix extensions flashattn's CPU kernels can use), and the GPU."""
import os

import torch

# The CPU features that decide flashattn's CPU speed: AVX2 and AVX-512 for the fp32 tile
# products, the bf16/fp16 dot products and AMX tiles for the 16-bit paths.
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16")
BYTES_PER_GIB = 2 ** 30


def cpuinfo():
    """The fields of the first processor in /proc/cpuinfo ({} where there is none)."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    if fields:
                        break  # the end of the first processor's block
                    continue
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        pass
    return fields


def cpu_model():
    return cpuinfo().get("model name", "unknown CPU")


def describe(device):
    """{"cpu_model", "cpu_family", "cpu_model_number", "vendor", "cores", "isa"}, and on CUDA
    the GPU's name, compute capability and memory; None for what the machine does not say."""
    info = cpuinfo()
    flags = set(info.get("flags", "").split())
    machine = {"cpu_model": info.get("model name"), "cpu_family": _number(info.get("cpu family")),
               "cpu_model_number": _number(info.get("model")), "vendor": info.get("vendor_id"),
               "cores": os.cpu_count(), "isa": [f for f in ISA_FLAGS if f in flags]}
    if device.type == "cuda":
        gpu = torch.cuda.get_device_properties(device)
        machine.update(gpu_name=gpu.name, gpu_capability=f"{gpu.major}.{gpu.minor}",
                       gpu_memory_gib=round(gpu.total_memory / BYTES_PER_GIB, 1))
    return machine


def _number(text):
    return int(text) if text is not None and text.isdigit() else text
