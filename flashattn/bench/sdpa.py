"""F.scaled_dot_product_attention forced to each backend the device has: what every subcommand
measures flashattn against. Each subcommand hands the forced call its own layout and mask."""
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {
    "cuda": (("flash", SDPBackend.FLASH_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION),
             ("cudnn", SDPBackend.CUDNN_ATTENTION), ("math", SDPBackend.MATH)),
    "cpu": (("flash", SDPBackend.FLASH_ATTENTION), ("math", SDPBackend.MATH)),
}


def forced_backends(device_type):
    """[("sdpa-<backend>", sdpa)] for every backend of the device: sdpa takes
    F.scaled_dot_product_attention's arguments and runs that backend or raises (with SDPA's
    reason in a warning), never falling back to another one."""
    return [(f"sdpa-{label}", _forced_to(backend)) for label, backend in BACKENDS[device_type]]


def _forced_to(backend):
    def sdpa(*args, **kwargs):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(*args, **kwargs)
    return sdpa
