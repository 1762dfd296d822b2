"""README.md is the front door: its "Use" example must run as written."""
import os
import re

import torch

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def use_example():
    """The first ```python block under the "## Use" heading."""
    with open(README) as f:
        text = f.read()
    section = text.split("\n## Use\n", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_use_section_runs_as_written():
    torch._dynamo.reset()
    namespace = {}
    exec(compile(use_example(), "README.md (Use)", "exec"), namespace)
    assert namespace["out"].shape == namespace["q"].shape
    assert namespace["q"].grad is not None  # the backward passes ran
