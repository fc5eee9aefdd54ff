"""Every relative link of README.md and docs/*.md resolves: the file exists, and a `#section` names a heading the
target has (GitHub's anchors). The documents are split by reader and link to each other, so a renamed heading or a
moved page must fail here rather than leave a reader at a dead end."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks, with inline code removed (a link inside code is not a link)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(re.sub(r"`[^`\n]*`", "", line))
    return lines


def anchors(text: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens, repeats numbered."""
    seen: dict[str, int] = {}
    found = set()
    for line in prose_lines(text.replace("`", "")):
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        slug = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def broken_links(document: Path) -> list[str]:
    text = document.read_text(encoding="utf-8")
    broken = []
    for line in prose_lines(text):
        for target in LINK.findall(line):
            if EXTERNAL.match(target):
                continue
            path, _, anchor = target.partition("#")
            linked = (document.parent / path).resolve() if path else document
            if not linked.exists():
                broken.append(f"{target}: no such file")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked.read_text(encoding="utf-8")):
                broken.append(f"{target}: no heading #{anchor} in {linked.name}")
    return broken


def test_the_documents_are_there():
    names = {path.relative_to(ROOT).as_posix() for path in DOCUMENTS}
    assert {
        "README.md",
        "docs/architecture.md",
        "docs/configuration.md",
        "docs/operations.md",
        "docs/benchmarks.md",
        "docs/development.md",
        "docs/usage.md",
    } <= names


def test_every_relative_link_resolves():
    problems = {path.relative_to(ROOT).as_posix(): broken_links(path) for path in DOCUMENTS}
    assert {name: found for name, found in problems.items() if found} == {}


def test_every_page_of_docs_is_reachable_from_the_readme():
    readme = "\n".join(prose_lines((ROOT / "README.md").read_text(encoding="utf-8")))
    linked = {target.partition("#")[0] for target in LINK.findall(readme)}
    assert {f"docs/{path.name}" for path in DOCUMENTS[1:]} <= linked


def test_a_broken_link_is_found(tmp_path):
    (tmp_path / "other.md").write_text("# Other\n\n## A section: with `code`, punctuation\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md#a-section-with-code-punctuation) [file](missing.md) [anchor](other.md#nowhere)\n"
        "```\n[in code](missing.md)\n```\n[web](https://example.org/x) `[inline](missing.md)`\n"
        "[self](#page) [self-missing](#gone)\n\n# Page\n",
        encoding="utf-8",
    )
    assert broken_links(page) == [
        "missing.md: no such file",
        "other.md#nowhere: no heading #nowhere in other.md",
        "#gone: no heading #gone in page.md",
    ]
