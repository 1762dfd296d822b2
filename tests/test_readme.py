"""README.md is the front door: its "Use" examples must run as written."""
import os
import re

import torch

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def use_examples():
    """The ```python blocks of the "## Use" section (up to the next "## " heading), in order."""
    with open(README) as f:
        text = f.read()
    section = text.split("\n## Use\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def test_use_section_runs_as_written():
    torch._dynamo.reset()
    examples = use_examples()
    assert len(examples) >= 2  # the dense example and the varlen one
    namespace = {}
    for number, example in enumerate(examples):
        exec(compile(example, f"README.md (Use, example {number + 1})", "exec"), namespace)
    assert namespace["q"].grad is not None  # the last example's backward ran
