"""The README is a front page and the docs hold together: every relative link of README.md and docs/*.md leads to
a file that exists (and a heading that exists, for a `#anchor`), every docs page is reachable from the README,
and the README stays short."""
from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]+\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
CODE = re.compile(r"`[^`\n]*`")  # an inline code span: a regex or a path there is no link


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@functools.lru_cache(maxsize=None)
def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.M)}


def links(path: Path) -> list[str]:
    text = CODE.sub("", FENCE.sub("", path.read_text()))
    return [t for t in LINK.findall(text) if not re.match(r"^[a-z]+:", t)]


def broken(path: Path) -> list[str]:
    out = []
    for target in links(path):
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            out.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            out.append(f"{target}: no such heading there")
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_dead_link(page):
    assert broken(page) == []


def test_every_docs_page_is_reachable_from_the_readme():
    seen, todo = set(), [ROOT / "README.md"]
    while todo:
        page = todo.pop()
        if page in seen:
            continue
        seen.add(page)
        for target in links(page):
            dest = (page.parent / target.partition("#")[0]).resolve()
            if dest.suffix == ".md" and dest.exists() and (ROOT / "docs") in dest.parents:
                todo.append(dest)
    assert {p for p in PAGES if p.parent.name == "docs"} - seen == set()


def test_the_readme_is_a_front_page():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) < 200, len(lines)
    assert lines[0] == "# deepseek-spark"
    assert "bash .ci/setup" in lines[11] or any(ln.startswith("bash .ci/setup") for ln in lines[:20])


def test_a_dead_link_is_found(tmp_path):
    page = tmp_path / "p.md"
    (tmp_path / "q.md").write_text("# Here it is\n")
    page.write_text("[a](q.md#here-it-is) [b](q.md#there) [c](r.md) [d](https://example.com)\n```\n[e](nope.md)\n```\n")
    assert broken(page) == ["q.md#there: no such heading there", "r.md: no such file"]
