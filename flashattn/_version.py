"""The package's version, in one place: pyproject.toml reads it from here at build time."""
__version__ = "0.1.0"
