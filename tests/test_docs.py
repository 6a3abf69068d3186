"""Every ```python block in docs/*.md runs: a file's blocks in order, in one namespace, in a fresh directory.

A block preceded by the line `<!-- no-run -->` is shown but not run (multi-process or GPU snippets, each
covered by a real test elsewhere).
"""
import os
import re

import pytest

DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs")
README = os.path.join(os.path.dirname(DOCS), "README.md")
_BLOCK = re.compile(r"(<!-- no-run -->\s*\n)?```python\n(.*?)```", re.S)


def python_blocks(path):
    with open(path) as f:
        text = f.read()
    return [(text[: m.start()].count("\n") + 1, m.group(2)) for m in _BLOCK.finditer(text) if not m.group(1)]


PAGES = sorted(f for f in os.listdir(DOCS) if f.endswith(".md")) if os.path.isdir(DOCS) else []


def test_docs_exist():
    for page in ("getting_started.md", "module.md", "trainer.md", "precision.md", "checkpointing.md"):
        assert page in PAGES, f"docs/{page} is missing"


@pytest.mark.timeout(600)
@pytest.mark.parametrize("page", PAGES)
def test_docs_page_runs(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__docs__"}
    blocks = python_blocks(os.path.join(DOCS, page))
    for line, code in blocks:
        try:
            exec(compile(code, f"docs/{page}:{line}", "exec"), namespace)
        except Exception as err:
            raise AssertionError(f"docs/{page}, the python block at line {line} failed: {err!r}") from err


def test_readme_example_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__docs__"}
    for line, code in python_blocks(README):
        exec(compile(code, f"README.md:{line}", "exec"), namespace)
    assert "Regressor" in namespace
