"""The tutorials teach the public API only and point the reader onwards (issue 37); the
built site's internal links resolve (``docs/check_links.py``, run by ``make docs``)."""

import ast
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "tutorials").glob("*.ipynb"))


def _code(path):
    cells = json.loads(path.read_text())["cells"]
    return [("".join(c["source"]), i) for i, c in enumerate(cells) if c["cell_type"] == "code"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_tutorials_call_only_public_names(path):
    # An attribute or import whose name starts with one underscore (dunders are Python's).
    private = []
    for source, index in _code(path):
        lines = [line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))]
        for node in ast.walk(ast.parse("\n".join(lines))):
            names = []
            if isinstance(node, ast.Attribute):
                names = [node.attr]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [alias.name for alias in node.names]
            for name in names:
                parts = name.split(".")
                if any(p.startswith("_") and not p.startswith("__") for p in parts):
                    private.append(f"cell {index}: {name}")
    assert not private, f"{path.name} uses private names: {private}"


def test_the_private_name_check_sees_a_private_call(tmp_path):
    notebook = tmp_path / "bad.ipynb"
    cell = {"cell_type": "code", "source": ["y = model._y_loc + 1\n"], "metadata": {}}
    notebook.write_text(json.dumps({"cells": [cell]}))
    with pytest.raises(AssertionError, match="_y_loc"):
        test_tutorials_call_only_public_names(notebook)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_tutorials_end_with_where_next(path):
    last = json.loads(path.read_text())["cells"][-1]
    text = "".join(last["source"])
    assert last["cell_type"] == "markdown" and text.startswith("## Where next"), path.name
    assert "**API**" in text and "**Thesis and papers**" in text


def test_check_links_finds_a_missing_page_and_a_missing_anchor(tmp_path):
    spec = importlib.util.spec_from_file_location("check_links", ROOT / "docs" / "check_links.py")
    check_links = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check_links)
    (tmp_path / "api").mkdir()
    (tmp_path / "api" / "infer.html").write_text('<h2 id="sgld">SGLD</h2><a href="#sgld">x</a>')
    (tmp_path / "index.html").write_text(
        '<a href="api/infer.html#sgld">ok</a> <a href="https://example.org/x">external</a>'
        '<a href="api/infer.html#mcmc">no anchor</a> <a href="tutorials/vis.html">no page</a>'
    )
    broken = check_links.broken_links(tmp_path)
    assert [(str(page), link) for page, link, _ in broken] == [
        ("index.html", "api/infer.html#mcmc"),
        ("index.html", "tutorials/vis.html"),
    ]
    assert check_links.main([str(tmp_path)]) == 1
    (tmp_path / "index.html").write_text('<a href="api/infer.html#sgld">ok</a>')
    assert check_links.main([str(tmp_path)]) == 0


def test_check_links_finds_a_documented_name_left_unlinked(tmp_path):
    # A short name in a docstring (":func:`vector_scan`" in pyro_ext.ops.scan) that Sphinx
    # could not resolve renders as code without a link; docs/conf.py's resolver links it,
    # and make docs fails if one is left.
    spec = importlib.util.spec_from_file_location("check_links", ROOT / "docs" / "check_links.py")
    check_links = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check_links)

    def xref(name, role="py-func", href=None):
        code = f'<code class="xref py {role} docutils"><span class="pre">{name}</span></code>'
        return f'<a class="reference internal" href="{href}">{code}</a>' if href else code

    page = tmp_path / "ops.html"
    page.write_text(
        '<section id="module-pyro_ext.ops.scan"></section>'
        '<dt id="pyro_ext.ops.vector_scan">vector_scan</dt>'
        + xref("vector_scan()", href="#pyro_ext.ops.vector_scan")
        + xref("torch.cumsum()")  # outside the package: not ours to link
        + xref("scan", role="py-mod", href="#module-pyro_ext.ops.scan")
    )
    assert check_links.unlinked_package_names(tmp_path) == []
    page.write_text(page.read_text() + xref("vector_scan()") + xref("scan", role="py-mod"))
    assert [name for _, name in check_links.unlinked_package_names(tmp_path)] == [
        "vector_scan",
        "scan",
    ]
    assert check_links.main([str(tmp_path)]) == 1
