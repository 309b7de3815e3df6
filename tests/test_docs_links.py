"""The README and docs/ point at what exists: every relative link names a file of the
repository and, with an anchor, one of its headings (as GitHub names them); every raw data
file a page cites is in docs/data; the README stays a quick start."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
CITED_DATA = re.compile(r"docs/data/([\w.-]+\.(?:jsonl|json|txt|log))\b")
README_BYTES = 10 * 1024


def _anchor(heading: str) -> str:
    """GitHub's id of a heading: lower case, punctuation dropped, spaces to hyphens."""
    kept = (ch for ch in heading.strip().lower()
            if ch in "-_ " or unicodedata.category(ch)[0] in "LN")
    return "".join(kept).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    return {_anchor(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")}


def _links(page: Path) -> list[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    return [m.group(1) for m in LINK.finditer(text)
            if not m.group(1).startswith(("http://", "https://", "mailto:"))]


def test_every_relative_link_of_the_readme_and_docs_names_a_file_and_heading_that_exist():
    broken = []
    for page in PAGES:
        for link in _links(page):
            path, _, anchor = link.partition("#")
            target = (page.parent / path).resolve() if path else page
            if not target.exists():
                broken.append(f"{page.relative_to(ROOT)}: {link} (no such file)")
            elif anchor and target.suffix == ".md" and anchor not in _anchors(target):
                broken.append(f"{page.relative_to(ROOT)}: {link} (no such heading)")
    assert broken == []


def test_every_data_file_a_page_cites_is_in_docs_data():
    missing = sorted({f"{page.relative_to(ROOT)}: {name}" for page in PAGES
                      for name in CITED_DATA.findall(page.read_text())
                      if not (ROOT / "docs" / "data" / name).exists()})
    assert missing == []


def test_the_readme_is_a_quick_start_of_at_most_10_kb():
    """It was a 37.7 KB reference manual; the reference lives in docs/."""
    assert len((ROOT / "README.md").read_bytes()) <= README_BYTES


def test_every_benchmark_page_the_readme_links_is_in_the_index_of_cited_figures():
    index = (ROOT / "docs" / "benchmarks" / "README.md").read_text()
    pages = {Path(link.partition("#")[0]).name for link in _links(ROOT / "README.md")
             if link.startswith("docs/benchmarks/") and not link.endswith("README.md")}
    assert pages and all(f"]({name}" in index for name in pages)
