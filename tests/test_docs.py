"""The README stays short and undated, and every link in it and in docs/ resolves (no TensorFlow import)."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
README_LIMIT = 15_000

# [text](target) and ![alt](target); the target ends at whitespace or the closing parenthesis,
# so an optional "title" after it is ignored.
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_EXTERNAL = re.compile(r"^(?:[a-z][a-z0-9+.-]*:|//)", re.IGNORECASE)  # http:, https:, mailto:, ...
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
_ISO_DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")
_LOAD = re.compile(r"load average|\bload\s+(?:of\s+|up to\s+|about\s+)?\d", re.IGNORECASE)


def _prose(text: str) -> str:
    """The text without fenced code blocks, whose brackets are code, not links."""
    return _FENCE.sub("", text)


def relative_links(text: str) -> list:
    """Every relative link target in `text`, its #fragment stripped; external and pure #anchor links left out."""
    targets = []
    for target in _LINK.findall(_prose(text)):
        if target.startswith("#") or _EXTERNAL.match(target):
            continue
        targets.append(target.split("#", 1)[0])
    return targets


def broken_links(path: Path) -> list:
    """The relative links in `path` that name no existing file or folder, relative to `path`'s folder."""
    return [target for target in relative_links(path.read_text(encoding="utf-8"))
            if not (path.parent / target).exists()]


def test_readme_is_short():
    size = len(README.read_text(encoding="utf-8"))
    assert size < README_LIMIT, f"README.md has {size} characters; keep it under {README_LIMIT} (move detail to docs/)"


def test_there_are_docs():
    assert DOCS, "docs/ holds no .md file"


@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda path: str(path.relative_to(ROOT)))
def test_relative_links_resolve(path):
    assert broken_links(path) == [], f"{path.relative_to(ROOT)} links to missing files"


def test_readme_holds_no_dated_measurement():
    text = README.read_text(encoding="utf-8")
    dates = _ISO_DATE.findall(text)
    assert not dates, f"README.md holds dates {dates}; dated measurements belong in docs/benchmarks.md"
    loads = [match.group(0) for match in _LOAD.finditer(text)]
    assert not loads, f"README.md holds load figures {loads}; they belong in docs/benchmarks.md"


def test_readme_says_the_samples_are_synthetic():
    assert "synthetic" in README.read_text(encoding="utf-8").lower()


def test_every_doc_is_linked_from_the_readme():
    linked = {(ROOT / target).resolve() for target in relative_links(README.read_text(encoding="utf-8"))}
    unlinked = [str(path.relative_to(ROOT)) for path in DOCS if path.resolve() not in linked]
    assert not unlinked, f"README.md does not link to {unlinked}"


def test_the_link_checks_can_fail(tmp_path):
    """The helpers find what the checks above rely on: a broken link, and no false alarms."""
    page = tmp_path / "page.md"
    (tmp_path / "there.md").write_text("x")
    page.write_text("[ok](there.md#part) [web](https://example.org/x) [mail](mailto:a@b.c) [anchor](#top)\n"
                    "![image](missing.png) [gone](gone/file.md)\n```\n[code](not-a-link.md)\n```\n")
    assert relative_links(page.read_text()) == ["there.md", "missing.png", "gone/file.md"]
    assert broken_links(page) == ["missing.png", "gone/file.md"]
    assert _ISO_DATE.search("measured 2026-11-25 on") and _LOAD.search("load 1.2 before")
    assert not _LOAD.search("the loader reads files") and not _LOAD.search("download it")
