"""The README is a short guide, and it and the docs/ pages it links hold together: every
relative link reaches a file (and a heading, for an #anchor), every page is linked from the
README, the quick start's commands are the ones CI runs, and the Python examples on the
shipped weights run as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_packaging import without_the_demo

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]

FENCE = re.compile(r"^\s*(```|~~~)")
# [text](target) and ![alt](target); the text may hold one level of brackets. A target is
# one token (no spaces), as in all our links; an optional "title" after it is ignored.
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE_SPAN = re.compile(r"`+[^`]*`+")


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks and outside a leading YAML front matter (the
    Spaces metadata), where a `#` or a `[...](...)` is code, not markdown."""
    lines = text.split("\n")
    if lines and lines[0] == "---":
        end = lines.index("---", 1)
        lines = [""] * (end + 1) + lines[end + 1 :]
    kept, in_code = [], False
    for line in lines:
        if FENCE.match(line):
            in_code = not in_code
            kept.append("")
        else:
            kept.append("" if in_code else line)
    return kept


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, every character but letters, digits, `_`,
    `-` and spaces dropped, each space a `-` (so "a — b" gives "a--b")."""
    text = re.sub(r"[`*]", "", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The #anchors GitHub makes for a page's headings (a repeated slug gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    found = set()
    for line in prose_lines(page.read_text()):
        heading = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not heading:
            continue
        slug = github_slug(heading.group(1))
        found.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return found


def relative_links(page: Path) -> list[tuple[int, str]]:
    """(line number, target) of every link in the page that is not to another site."""
    links = []
    for number, line in enumerate(prose_lines(page.read_text()), start=1):
        for target in LINK.findall(CODE_SPAN.sub("", line)):
            if not re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):  # http:, mailto:, ...
                links.append((number, target))
    return links


def resolve(page: Path, target: str) -> tuple[Path, str]:
    """The file a link in `page` points at, and its #anchor ("" when none)."""
    path, _, anchor = target.partition("#")
    return (page.parent / path).resolve() if path else page, anchor


def section(text: str, heading: str) -> str:
    """The body of the `## heading` section, up to the next heading of level 1 or 2."""
    found = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^#{{1,2}} |\Z)", text, re.M | re.S)
    assert found, f"README has no '## {heading}' section"
    return found.group(1)


def test_readme_is_at_most_250_lines():
    lines = README.read_text().splitlines()
    assert lines[0] == "---", "the Spaces front matter must stay first"
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move detail to docs/"


@pytest.mark.parametrize(
    "heading, slug",
    [
        # our own headings, as GitHub links them
        ("Where memory matters: the Watch tab's examples",
         "where-memory-matters-the-watch-tabs-examples"),
        ("Inside the attention: the paper's Figures 5 and 7",
         "inside-the-attention-the-papers-figures-5-and-7"),
        ("How far back can it recall?", "how-far-back-can-it-recall"),
        ("txl — a Transformer-XL you can watch remember",
         "txl--a-transformer-xl-you-can-watch-remember"),
        ("txl.Session API (the contract between txl/session.py and the app)",
         "txlsession-api-the-contract-between-txlsessionpy-and-the-app"),
        ("Long work beside Steps", "long-work-beside-steps"),
        ("`/recall`'s numbers", "recalls-numbers"),
    ],
)
def test_github_slug(heading, slug):
    assert github_slug(heading) == slug


def test_anchors_number_repeated_headings(tmp_path):
    page = tmp_path / "repeats.md"
    page.write_text("# Title\n\n## Speed\n\n```\n# not a heading\n```\n\n## Speed\n")
    assert anchors(page) == {"title", "speed", "speed-1"}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_reaches_a_file_and_a_heading(page):
    broken = []
    for number, target in relative_links(page):
        path, anchor = resolve(page, target)
        where = f"{page.relative_to(ROOT)}:{number}: {target}"
        if not path.is_file() or ROOT not in path.parents:
            broken.append(f"{where}: no such file in the repo")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{where}: no heading with that anchor in {path.name}")
    assert broken == []


def test_link_checker_sees_a_broken_link_and_anchor(tmp_path):
    (tmp_path / "README.md").write_text("# Guide\n\n## Quick start\n")
    page = tmp_path / "docs" / "links.md"
    page.parent.mkdir()
    page.write_text(
        "# Here\n\n[ok](#here) [gone](#nowhere) ![pic](../assets/none.png)\n"
        "`[code](not/a/link.md)` [site](https://example.com/x.md)\n"
        "[readme](../README.md#quick-start) [readme](../README.md#quick-stop)\n"
    )
    targets = [t for _, t in relative_links(page)]
    assert targets == ["#here", "#nowhere", "../assets/none.png",
                       "../README.md#quick-start", "../README.md#quick-stop"]
    bad = [t for t in targets
           if not resolve(page, t)[0].is_file()
           or resolve(page, t)[1] not in {"", *anchors(resolve(page, t)[0])}]
    assert bad == ["#nowhere", "../assets/none.png", "../README.md#quick-stop"]


def test_every_docs_page_is_linked_from_the_readme():
    linked = {resolve(README, target)[0] for _, target in relative_links(README)}
    orphans = [p.name for p in DOCS if p.resolve() not in linked]
    assert orphans == []


def test_every_docs_page_links_back_to_the_readme():
    for page in DOCS:
        first_lines = "\n".join(page.read_text().splitlines()[:6])
        assert "](../README.md)" in first_lines, f"{page.name} does not link back at its top"


def test_quick_start_names_the_two_commands_and_ci_runs_the_test_command():
    quick_start = section(README.read_text(), "Quick start")
    commands = [line.split("#")[0].strip() for line in quick_start.splitlines()]
    assert "make run" in commands and "make test" in commands
    ci_commands = [
        line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert "make test" in ci_commands


def python_examples(page: Path) -> list[str]:
    """The ```python blocks of a page."""
    return re.findall(r"^```python\n(.*?)^```", page.read_text(), re.M | re.S)


# The examples a reader can run from a checkout as they stand: those on the shipped weights
# (the others need a Hub token, a running app or the WikiText-103 download).
SHIPPED_EXAMPLES = [
    pytest.param(example, id=f"{page.name}-{i}")
    for page in PAGES
    for i, example in enumerate(python_examples(page))
    if 'from_pretrained("weights/shakespeare-char")' in example
]


def test_the_readme_and_the_api_pages_have_examples_on_the_shipped_weights():
    assert {p.id.rsplit("-", 1)[0] for p in SHIPPED_EXAMPLES} >= {
        "README.md", "api.md", "session_api.md"
    }


@pytest.mark.parametrize("example", SHIPPED_EXAMPLES)
def test_python_example_runs_as_written_with_txl_alone(example):
    # From the checkout, as a reader would, with the demo and its web stack unimportable:
    # the package's examples must need the package only.
    run = subprocess.run(
        [sys.executable, "-c", without_the_demo(example)], cwd=ROOT, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
