"""The repository's lab tools (tools/*.py) as modules, for tests that check the library against
them (the split model in tools/gpu_model.py, say). Loaded from their files, not imported: tools/
is not a package."""
import importlib.util
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_tool(name):
    """tools/<name>.py as a module."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, "tools", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
