"""Measurements live in docs/ and benchmarks/results/, not in the code's prose (no TensorFlow import).

No docstring or comment under data/, models/, experiments/ or in run.py, and no comment in conf/'s YAML,
holds a measurement: a ratio such as 1.17x, a rate in steps, images or examples per second, a timing, a
share in percent, a GPU model, or a figure introduced by "measured". Code says what it does and why; the
figures behind a why are in the docs, which it may name. docs/benchmarks.md stays one page whose figures
link to their records under benchmarks/results/, and the records' own links resolve.
"""
import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

from tests.test_docs import relative_links

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("data", "models", "experiments", "run.py")
BENCHMARKS_DOC = ROOT / "docs" / "benchmarks.md"
RESULTS = ROOT / "benchmarks" / "results"
BENCHMARKS_DOC_LIMIT = 15_000

MEASUREMENT = re.compile("|".join((
    r"(?<![\w.])\d+(?:\.\d+)?\s*[x×](?!\w)",  # a ratio (1.17x, 3 ×), not a size or a kernel (224x224, 3x3)
    r"\d[\d,.]*\s*(?:steps|images|examples|pairs|batches|records)\s*(?:/\s*s\b|per\s+(?:CPU-)?sec)",  # a rate
    r"\b(?:H100|H200|GH200|A100|A10G?|V100|P100|K80|B200|L4|L40S?|T4)\b",  # a GPU model
    r"(?<![\w.-])\d[\d,]*(?:\.\d+)?\s+(?:ns|µs|us|ms|s|sec|seconds?|minutes?|CPU-s|CPU-seconds?)\b",  # a timing
    r"(?<![\w.-])\d[\d,]*(?:\.\d+)?\s*%",  # a share
    r"\bmeasured\b[^.;]*\d",  # a figure measured
)), re.IGNORECASE)


def python_prose(text):
    """(line, text) of every comment and every module, class and function docstring of Python source `text`."""
    prose = [(token.start[0], token.string) for token in tokenize.generate_tokens(io.StringIO(text).readline)
             if token.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            docstring = ast.get_docstring(node, clean=False)
            if docstring is not None:
                prose += [(node.body[0].lineno + number, line) for number, line in enumerate(docstring.splitlines())]
    return prose


def yaml_comments(text):
    """(line, text) of every comment of YAML `text`: from a # at a line's start or after a blank, outside quotes."""
    comments = []
    for number, line in enumerate(text.splitlines(), 1):
        quote = None
        for index, char in enumerate(line):
            if quote:
                quote = None if char == quote else quote
            elif char in "'\"":
                quote = char
            elif char == "#" and (index == 0 or line[index - 1].isspace()):
                comments.append((number, line[index:]))
                break
    return comments


def measurements(root):
    """'path:line: text' for each piece of prose under `root` that holds a measurement."""
    found = []
    paths = [path for name in SOURCES for path in ([root / name] if name.endswith(".py")
                                                   else sorted((root / name).rglob("*.py")))]
    for path in [*paths, *sorted((root / "conf").rglob("*.yaml"))]:
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8")
        prose = python_prose(text) if path.suffix == ".py" else yaml_comments(text)
        found += [f"{path.relative_to(root)}:{line}: {piece.strip()}" for line, piece in prose
                  if MEASUREMENT.search(piece)]
    return found


def heading_anchors(text):
    """The anchors a Markdown renderer gives `text`'s headings (lower case, punctuation dropped, blanks to -)."""
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
            for heading in re.findall(r"^#+ (.+)$", text, re.MULTILINE)}


def test_no_measurement_in_the_codes_prose_or_the_configs_comments():
    found = measurements(ROOT)
    assert not found, ("measurements belong in docs/ or benchmarks/results/; the code keeps a contract and a "
                       "why without figures:\n" + "\n".join(found))


def test_the_prose_check_can_fail(tmp_path):
    """It finds each kind of measurement in comments, docstrings and YAML comments, and nothing in code,
    strings, sizes or quoted #s."""
    (tmp_path / "data").mkdir()
    (tmp_path / "conf" / "trainer").mkdir(parents=True)
    (tmp_path / "data" / "fast.py").write_text(
        '"""Loads images.\n\nOn an H100 it trained 1.17x the steps/s."""\n'
        'x = 3 * x  # a 224x224 crop, 3x3 kernels, 0x1f\n'
        'label = "1.5x faster, 40 ms"\n\n\n'
        'def load():\n    """Decodes 1,200 images/s."""\n    return 2  # took 0.25 s\n\n\n'
        'class Cache:\n    """Measured no change."""\n    # saves 30% of the CPU; measured 2.0 against 1.9\n')
    (tmp_path / "run.py").write_text('"""The entry point."""\n')
    (tmp_path / "conf" / "trainer" / "default.yaml").write_text(
        "# 10 steps take about 15 s.\nname: 'a # 2 s quoted'  # 3x faster\nsize: 4  # pixels, 4x4 blocks\n")
    assert measurements(tmp_path) == [
        "data/fast.py:10: # took 0.25 s",
        "data/fast.py:15: # saves 30% of the CPU; measured 2.0 against 1.9",
        "data/fast.py:3: On an H100 it trained 1.17x the steps/s.",
        "data/fast.py:9: Decodes 1,200 images/s.",
        "conf/trainer/default.yaml:1: # 10 steps take about 15 s.",
        "conf/trainer/default.yaml:2: # 3x faster",
    ]


def test_benchmarks_doc_is_one_page_whose_records_resolve():
    text = BENCHMARKS_DOC.read_text(encoding="utf-8")
    assert len(text) < BENCHMARKS_DOC_LIMIT, (
        f"docs/benchmarks.md has {len(text)} characters; keep it under {BENCHMARKS_DOC_LIMIT} (history belongs in "
        "benchmarks/results/)")
    records = [target for target in relative_links(text) if target.startswith("../benchmarks/results/")]
    assert records, "docs/benchmarks.md links to no record under benchmarks/results/"
    missing = sorted({target for target in records if not (BENCHMARKS_DOC.parent / target).is_file()})
    assert not missing, f"docs/benchmarks.md links to records that do not exist: {missing}"


def test_the_records_links_resolve():
    pages = sorted(RESULTS.glob("*.md"))
    assert pages, "benchmarks/results/ holds no record"
    broken = [f"{page.name}: {target}" for page in pages for target in relative_links(page.read_text(encoding="utf-8"))
              if not (page.parent / target).exists()]
    assert not broken, broken


@pytest.mark.parametrize("path", sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")]),
                         ids=lambda path: str(path.relative_to(ROOT)))
def test_links_into_the_benchmarks_doc_name_its_headings(path):
    anchors = heading_anchors(BENCHMARKS_DOC.read_text(encoding="utf-8"))
    targets = re.findall(r"benchmarks\.md#([\w-]+)", path.read_text(encoding="utf-8"))
    assert not [target for target in targets if target not in anchors], (path.name, targets, sorted(anchors))


def test_heading_anchors_drop_punctuation():
    assert heading_anchors("# LFW's image table\n### Fetching ahead (trainer.fetch_ahead)\n") == {
        "lfws-image-table", "fetching-ahead-trainerfetch_ahead"}
