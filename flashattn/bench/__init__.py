"""`python -m flashattn.bench [SUBCOMMAND] [OPTIONS]`: flashattn against
torch.nn.functional.scaled_dot_product_attention, one subcommand per kind of benchmark (cli.py).

The package imports the library; no module of the library imports it.
"""
from .cli import main  # noqa: F401
