"""Docstrings point at sections of docs/architecture.md that exist, and at nothing outside the
repository."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ARCHITECTURE = ROOT / "docs" / "architecture.md"
SOURCES = ("common", "services", "jobq", "infra", "benchmark", "tests")


def anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives the headings of `markdown` (lower case, spaces to hyphens,
    punctuation other than hyphens and underscores dropped)."""
    found = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *$", markdown, flags=re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug)
    return found


def python_files() -> list[Path]:
    return [path for top in SOURCES for path in sorted((ROOT / top).rglob("*.py"))]


def test_anchors_follow_githubs_rules() -> None:
    assert anchors("## Job states\n### Retry and redrive\n## Q&A: why?\n") == {
        "job-states",
        "retry-and-redrive",
        "qa-why",
    }


def test_every_pointer_into_the_architecture_names_a_section() -> None:
    sections = anchors(ARCHITECTURE.read_text())
    cited: dict[str, list[str]] = {}
    for path in python_files():
        for anchor in re.findall(r"docs/architecture\.md#([\w-]+)", path.read_text()):
            cited.setdefault(anchor, []).append(str(path.relative_to(ROOT)))
    assert cited, "the code cites no section at all"
    missing = {anchor: files for anchor, files in cited.items() if anchor not in sections}
    assert missing == {}, "cited sections that docs/architecture.md does not have"


def test_links_inside_the_architecture_resolve() -> None:
    text = ARCHITECTURE.read_text()
    links = set(re.findall(r"\]\(#([\w-]+)\)", text))
    assert links, "the document links none of its sections"
    assert links - anchors(text) == set()


def test_no_pointer_leaves_the_repository() -> None:
    outside = [
        str(path.relative_to(ROOT))
        for path in python_files()
        if re.search(r"DESIGN\.md|\bthe seed\b|\bseeds?/", path.read_text())
    ]
    assert outside == [], "cite docs/architecture.md instead of documents not in the repository"
