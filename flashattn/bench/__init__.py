"""`python -m flashattn.bench`: flashattn against F.scaled_dot_product_attention."""
from .dense import main  # noqa: F401
