"""The repository's lab tools (tools/*.py) and CI scripts (.ci/*.py) as modules, for tests that
check the library against them (the split model in tools/gpu_model.py, say) or the scripts
themselves. Loaded from their files, not imported: neither folder is a package."""
import importlib.util
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_tool(name, folder="tools"):
    """<folder>/<name>.py as a module: tools/ by default, or ".ci"."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, folder, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
