"""What the wheel ships: pyproject.toml lists its packages one by one (the migrations
live outside the package tree), so a new package must be listed there too, or an
installed tunecache lacks it (the source tree, which the tests import, would not show
it)."""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_wheel_lists_every_package_of_the_source_tree():
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
                 ["packages"])
    in_tree = {".".join(init.parent.relative_to(REPO).parts)
               for init in (REPO / "tunecache").rglob("__init__.py")}
    assert in_tree - listed == set()
