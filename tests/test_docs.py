"""The tutorials teach the public API only and point the reader onwards (issue 37); the
built site's internal links resolve (``docs/check_links.py``, run by ``make docs``); the
inventories of the upstream documentation that the site links to, kept by hand in
``docs/inventories`` and written offline at every build (``docs/external_inventories.py``),
are well formed and read back by Sphinx as written."""

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


def _docs_module(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "docs" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MAPPINGS = sorted((ROOT / "docs" / "inventories").glob("*.txt"))


def test_every_inventory_mapping_has_a_project():
    # docs/inventories/<name>.txt <-> PROJECTS[name] (the base URL its entries are under).
    inventories = _docs_module("external_inventories")
    assert {path.stem for path in MAPPINGS} == set(inventories.PROJECTS)
    for project, base in inventories.PROJECTS.values():
        assert base.startswith("https://") and base.endswith("/"), project


@pytest.mark.parametrize("path", MAPPINGS, ids=[p.name for p in MAPPINGS])
def test_inventory_mappings_are_well_formed(path):
    # One "<type> <name> <uri>" a line: a known type, a page relative to the project's base
    # URL, each name once; the header says where the entries were checked.
    inventories = _docs_module("external_inventories")
    entries = inventories.read_mapping(path)
    assert entries
    assert inventories.problems(entries) == []
    header = path.read_text(encoding="utf-8").split("\npy:")[0]
    assert "Checked" in header and "To add an entry" in header


def test_inventory_problems_are_found(tmp_path):
    inventories = _docs_module("external_inventories")
    entries = [
        ("py:func", "a", "a.html#a"),  # a role, not a type
        ("py:class", "b", "/b.html#b"),
        ("py:class", "c", "https://example.org/c.html#c"),
        ("py:class", "d", "#d"),
        ("py:class", "e", "e.html#e"),
        ("py:function", "e", "e.html#e"),
    ]
    found = inventories.problems(entries)
    assert [line.split(":")[0] for line in found] == ["a", "b", "c", "d", "e"]
    assert inventories.problems(entries[4:5]) == []
    (tmp_path / "bad.txt").write_text("py:class torch.Tensor\n")
    with pytest.raises(ValueError, match="bad.txt:1"):
        inventories.read_mapping(tmp_path / "bad.txt")


def test_generated_inventories_round_trip_through_sphinx(tmp_path):
    # docs/conf.py's intersphinx_mapping: local objects.inv files only (the build is offline),
    # each read back by Sphinx's own loader with exactly the entries of its mapping.
    import posixpath

    from sphinx.util.inventory import InventoryFile

    inventories = _docs_module("external_inventories")
    mapping = inventories.write_inventories(tmp_path)
    assert set(mapping) == set(inventories.PROJECTS)
    for name, (base, location) in mapping.items():
        project, url = inventories.PROJECTS[name]
        assert base == url and Path(location).parent == tmp_path
        with open(location, "rb") as stream:
            data = InventoryFile.load(stream, base, posixpath.join)
        loaded = {
            (kind, obj, item.uri, item.project_name, item.display_name)
            for kind, objects in data.items()
            for obj, item in objects.items()
        }
        entries = inventories.read_mapping(inventories.mapping_path(name))
        assert loaded == {(kind, obj, base + uri, project, "-") for kind, obj, uri in entries}
