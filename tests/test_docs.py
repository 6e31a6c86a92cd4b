"""The documentation is self-contained: no citation of material outside the repository, no dead
anchor in a link to `docs/*.md`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent

#: Where the published text lives: the package, the top-level Markdown, docs, examples, benchmarks.
SCANNED = ["agenttx", "README.md", "docs", "examples", "bench", "campaigns"]
#: Phrases that cite material the repository does not hold (checked case-insensitively).
FORBIDDEN = [
    "the reference's",
    "the reference engine",
    "spec section",
    "spec appendix",
    "design notes",
    "DESIGN.md",
    "shared/",
]
_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_PUNCTUATION = re.compile(r"[^\w\- ]")
#: `docs/x.md#anchor`, optionally climbing out of a subdirectory (`../docs/x.md#anchor`).
_DOC_LINK = re.compile(r"(?<![\w/.-])((?:\.\./)*docs/[\w.-]+\.md)(?:#([\w-]+))?")
#: A link to a heading of the same Markdown file: `[text](#anchor)`.
_LOCAL_LINK = re.compile(r"\]\(#([\w-]+)\)")


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but `-`, `_` dropped, spaces `-`."""
    return _PUNCTUATION.sub("", heading.strip().lower()).replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    """Every heading anchor of a Markdown text (code blocks skipped; repeats get `-1`, `-2`)."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in markdown.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        heading = None if fenced else _HEADING.match(line)
        if heading is None:
            continue
        base = anchor(heading.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def scanned_files() -> list[Path]:
    """The text files under `SCANNED`: Python, Markdown and TOML sources."""
    files: list[Path] = []
    for name in SCANNED:
        path = ROOT / name
        if path.is_file():
            files.append(path)
        else:
            files.extend(
                p
                for p in sorted(path.rglob("*"))
                if p.suffix in {".py", ".md", ".toml", ".txt"} and "__pycache__" not in p.parts
            )
    return files


def citation_problems(relative: str, text: str) -> list[str]:
    """`file:line: phrase` for each forbidden phrase in `text`, pending ones excepted."""
    problems = []
    for number, line in enumerate(text.splitlines(), 1):
        lowered = line.lower()
        problems.extend(
            f"{relative}:{number}: {phrase!r}" for phrase in FORBIDDEN if phrase.lower() in lowered
        )
    return problems


def link_problems(path: Path, text: str) -> list[str]:
    """`file:line: link` for each link to a missing doc, or to a heading the doc does not have.

    A Markdown link, `[text](docs/x.md#anchor)`, is relative to the file's directory; any other
    mention of `docs/x.md` (in a docstring, a comment or inline code) is relative to the
    repository root. `[text](#anchor)` in a Markdown file must name one of its own headings.
    """
    relative = path.relative_to(ROOT).as_posix()
    problems = []
    for number, line in enumerate(text.splitlines(), 1):
        for match in _DOC_LINK.finditer(line):
            linked = path.suffix == ".md" and line[: match.start()].endswith("](")
            target = ((path.parent if linked else ROOT) / match.group(1)).resolve()
            if not target.is_file():
                problems.append(f"{relative}:{number}: {match.group(0)} (no such file)")
            elif match.group(2) and match.group(2) not in anchors(target.read_text("utf-8")):
                problems.append(f"{relative}:{number}: {match.group(0)} (no such heading)")
        if path.suffix == ".md":
            own = anchors(text)
            problems.extend(
                f"{relative}:{number}: #{name} (no such heading)"
                for name in _LOCAL_LINK.findall(line)
                if name not in own
            )
    return problems


# ---------------------------------------------------------------- the helpers themselves


@pytest.mark.parametrize(
    ("heading", "expected"),
    [
        ("Rollback controller", "rollback-controller"),
        ("Rollback, commit and abort", "rollback-commit-and-abort"),
        ("Built-in tools", "built-in-tools"),
        ("The agenttx protocol", "the-agenttx-protocol"),
        ("`kv` tools (v2)", "kv-tools-v2"),
        ("snake_case stays", "snake_case-stays"),
    ],
)
def test_anchor_follows_github(heading, expected):
    """Headings become GitHub's anchors: lower case, punctuation dropped, spaces to hyphens."""
    assert anchor(heading) == expected


def test_anchors_skip_code_blocks_and_number_repeats():
    """A `#` line in a code block is not a heading; a repeated heading gets `-1`."""
    text = "# Title\n\n```python\n# not a heading\n```\n\n## Notes\n\n### Notes\n"
    assert anchors(text) == {"title", "notes", "notes-1"}


def test_citation_problems_find_each_phrase_in_any_case():
    """Every forbidden phrase is found whatever its case, with its file and line."""
    text = "ok\nAs The Reference Engine does.\nsee spec Section 4 and Design Notes\n"
    assert citation_problems("x.py", text) == [
        "x.py:2: 'the reference engine'",
        "x.py:3: 'spec section'",
        "x.py:3: 'design notes'",
    ]


def test_link_problems_find_dead_anchors_and_files():
    """A link to a missing heading, a missing doc or a missing local heading is reported."""
    source = ROOT / "agenttx" / "x.py"
    text = (
        "`docs/protocol.md#rollback-controller`\n"
        "`docs/protocol.md#no-such-section`\n"
        "`docs/missing.md`\n"
    )
    assert link_problems(source, text) == [
        "agenttx/x.py:2: docs/protocol.md#no-such-section (no such heading)",
        "agenttx/x.py:3: docs/missing.md (no such file)",
    ]
    readme = ROOT / "README.md"
    assert link_problems(readme, "# Top\n[a](#top) [b](#gone)\n") == [
        "README.md:2: #gone (no such heading)"
    ]
    bench = ROOT / "bench" / "RESULTS.md"
    assert link_problems(bench, "[c](../docs/protocol.md#clean-hints)\n") == []
    assert link_problems(bench, "`docs/protocol.md#clean-hints`\n") == []
    assert link_problems(bench, "[c](docs/protocol.md#clean-hints)\n") == [
        "bench/RESULTS.md:1: docs/protocol.md#clean-hints (no such file)"
    ]


# ---------------------------------------------------------------- the repository


def test_no_citation_of_material_outside_the_repository():
    """No published file cites the reference engine, a spec section, design notes or shared/."""
    problems = []
    for path in scanned_files():
        relative = path.relative_to(ROOT).as_posix()
        problems.extend(citation_problems(relative, path.read_text("utf-8")))
    assert problems == []


def test_links_to_docs_point_to_existing_headings():
    """Every `docs/*.md#anchor` in the package, README, docs and benchmarks names a heading."""
    problems = []
    for path in scanned_files():
        problems.extend(link_problems(path, path.read_text("utf-8")))
    assert problems == []
