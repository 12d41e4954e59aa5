"""The documentation: README.md stays a short front page, docs/ is a strict mkdocs site whose nav
lists every page, and every relative link in README.md points at a file that exists.

`mkdocs build --strict` fails on any warning, so the build also checks what the site's pages link:
each relative link must reach a page inside docs/ and each anchor (`page.md#section`) must exist
(mkdocs.yml's `validation` turns those checks into warnings).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO

pytestmark = pytest.mark.quick

README = REPO / "README.md"
DOCS = REPO / "docs"
README_LIMIT = 12_000  # bytes


def nav_pages(config: Path = REPO / "mkdocs.yml") -> list[str]:
    """Every page mkdocs.yml's nav names (paths relative to docs/), in nav order."""
    def walk(entry) -> list[str]:
        if isinstance(entry, str):
            return [entry]
        if isinstance(entry, list):
            return [page for item in entry for page in walk(item)]
        if isinstance(entry, dict):
            return [page for value in entry.values() for page in walk(value)]
        raise AssertionError(f"unexpected nav entry {entry!r}")

    nav = yaml.safe_load(config.read_text())["nav"]
    return [page for page in walk(nav) if "://" not in page]


def without_code(markdown: str) -> str:
    """The text outside fenced code blocks and inline code spans (links inside code are not links)."""
    kept, fence = [], None
    for line in markdown.splitlines():
        opening = re.match(r"^\s*(`{3,}|~{3,})", line)
        if fence is None and opening:
            fence = opening.group(1)
            continue
        if fence is not None:
            if line.strip().startswith(fence):
                fence = None
            continue
        kept.append(re.sub(r"(`+).*?\1", "", line))
    return "\n".join(kept)


def relative_links(markdown: str) -> list[str]:
    """The targets of inline (`[text](target)`) and reference (`[label]: target`) links that are
    neither addresses with a scheme nor anchors of the same page."""
    text = without_code(markdown)
    targets = re.findall(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", text)
    targets += re.findall(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", text, re.MULTILINE)
    return [t for t in targets if not re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", t) and not t.startswith("#")]


def test_mkdocs_builds_the_site_in_strict_mode(tmp_path):
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")  # Material's banner about its successor
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    for page in nav_pages():
        built = tmp_path / "site" / ("index.html" if page == "index.md" else Path(page).with_suffix("") / "index.html")
        assert built.is_file(), f"{page} was not built as {built}"


def test_the_readme_is_at_most_12000_bytes():
    size = len(README.read_bytes())
    assert size <= README_LIMIT, f"README.md is {size:,} bytes, over {README_LIMIT:,}: move the detail to a page under docs/"


def test_every_page_under_docs_is_in_the_nav_and_every_nav_entry_exists():
    pages = nav_pages()
    on_disk = sorted(str(path.relative_to(DOCS)) for path in DOCS.rglob("*.md"))
    assert len(pages) == len(set(pages)), f"pages listed twice in mkdocs.yml's nav: {sorted(p for p in pages if pages.count(p) > 1)}"
    assert not sorted(set(on_disk) - set(pages)), f"pages under docs/ missing from mkdocs.yml's nav: {sorted(set(on_disk) - set(pages))}"
    assert not sorted(set(pages) - set(on_disk)), f"mkdocs.yml's nav names pages that do not exist: {sorted(set(pages) - set(on_disk))}"


def test_every_relative_link_in_the_readme_points_at_an_existing_file():
    links = relative_links(README.read_text())
    assert links, "README.md links no page: the table of docs pages is missing"
    missing = [link for link in links if not (REPO / link.split("#", 1)[0]).exists()]
    assert not missing, f"README.md links files that do not exist: {missing}"


def test_the_readme_links_every_docs_page():
    linked = {link.split("#", 1)[0] for link in relative_links(README.read_text())}
    unlinked = [page for page in nav_pages() if f"docs/{page}" not in linked]
    assert not unlinked, f"README.md's table of docs pages misses: {unlinked}"


def test_the_link_finder_sees_links_and_skips_code():
    text = "see [a](docs/a.md#x) and [b](https://x.org) and `[c](c.md)` and [d](#here)\n```\n[e](e.md)\n```\n[f]: docs/f.md\n"
    assert relative_links(text) == ["docs/a.md#x", "docs/f.md"]
