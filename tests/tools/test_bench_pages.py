"""The benchmark pages (docs/benchmarks/, NOTE [benchmark pages]) agree with their result documents.

Fast: no subprocess, no benchmark run; it renders every page from ``docs/benchmarks/results/``
and compares, as ``cachepipe bench render --check`` does.
"""
from __future__ import annotations

import json
import re

import pytest

from tools.bench import BENCHMARKS
from tools.bench.harness.render import DOCS, render_all

_BLOCK = re.compile(r"<!-- render (?P<files>[^>]*?) -->\n")
_INDEX = re.compile(r"<!-- index -->\n(?P<body>.*?)<!-- /index -->", re.S)


def _pages() -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(DOCS.glob("*.md"))}


def test_every_page_equals_its_data():
    assert render_all(BENCHMARKS, check=True) == [], "run `cachepipe bench render` and commit the pages"


@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_every_benchmark_has_a_page_that_opens_with_current(name):
    page = DOCS / f"{name}.md"
    assert page.is_file(), f"{page} is missing"
    text = page.read_text()
    sections = re.findall(r"^## .*$", text, re.M)
    assert sections and sections[0] == "## Current", f"{page}: the first section must be '## Current', got {sections[:1]}"
    assert _BLOCK.search(text), f"{page}: no <!-- render results/... --> block"
    doc = json.loads((DOCS / "results" / f"{name}.json").read_text())
    assert doc["benchmark"] == name
    assert doc.get("headline"), f"results/{name}.json has no headline"


def test_every_result_document_is_drawn_on_a_page():
    drawn = {f for text in _pages().values() for m in _BLOCK.finditer(text) for f in m["files"].split()}
    kept = {f"results/{p.name}" for p in (DOCS / "results").glob("*.json")}
    assert kept - drawn == set(), "result documents no page renders"
    assert drawn - kept == set(), "render blocks naming missing documents"


def test_the_index_has_a_row_per_benchmark():
    body = _INDEX.search((DOCS / "README.md").read_text())["body"]
    rows = [line for line in body.splitlines() if line.startswith("| [`")]
    named = [re.match(r"\| \[`([^`]+)`\]", line)[1] for line in rows]
    assert named == list(BENCHMARKS)


def test_every_page_is_reachable_from_the_readme():
    readme = (DOCS / "README.md").read_text()
    linked = set(re.findall(r"\]\(([\w.-]+\.md)\)", readme))
    assert {p for p in _pages() if p != "README.md"} - linked == set()
