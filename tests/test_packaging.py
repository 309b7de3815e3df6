"""What the wheel ships: pyproject.toml lists its packages one by one (the migrations
live outside the package tree), so a new package must be listed there too, or an
installed tunecache lacks it (the source tree, which the tests import, would not show
it)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_wheel_lists_every_package_of_the_source_tree():
    # The [tool.setuptools] packages list, read as text (tomllib is not in Python 3.10).
    text = (REPO / "pyproject.toml").read_text()
    block = re.search(r"^packages = \[(.*?)^\]", text, re.S | re.M)
    assert block is not None
    listed = set(re.findall(r'"([\w.]+)"', block.group(1)))
    in_tree = {".".join(init.parent.relative_to(REPO).parts)
               for init in (REPO / "tunecache").rglob("__init__.py")}
    assert in_tree - listed == set()
