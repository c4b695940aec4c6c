"""The tutorials teach the public API only and point the reader onwards (issue 37); the
API reference is one page per topic, in a learning order, each opening with when to use
what and carrying a doctest, every public name documented once and the errors on a page of
their own; the built site's internal links resolve (``docs/check_links.py``, run by ``make
docs``); the inventories of the upstream documentation that the site links to, kept by hand
in ``docs/inventories`` and written offline at every build (``docs/external_inventories.py``),
are well formed and read back by Sphinx as written."""

import ast
import importlib
import importlib.util
import inspect
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "tutorials").glob("*.ipynb"))
API = ROOT / "docs" / "api"
#: the API reference's pages (docs/api/<name>.rst), in the sidebar's (learning) order
API_PAGES = [
    "sgmcmc",
    "mcmc",
    "gibbs",
    "step_size",
    "vis",
    "ngvi",
    "distributed",
    "online",
    "bandits",
    "hmm",
    "kalman_dlm",
    "bsts",
    "bnn",
    "vae",
    "ara",
    "rl",
    "datasets",
    "ops",
    "errors",
]
#: the packages whose ``__all__`` the reference documents, each name exactly once
PACKAGES = [
    "pyro_ext.infer",
    "pyro_ext.online",
    "pyro_ext.timeseries",
    "pyro_ext.models",
    "pyro_ext.models.bsts",
    "pyro_ext.ara",
    "pyro_ext.rl",
    "pyro_ext.datasets",
    "pyro_ext.ops",
]


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
    (tmp_path / "api" / "sgmcmc.html").write_text('<h2 id="sgld">SGLD</h2><a href="#sgld">x</a>')
    (tmp_path / "index.html").write_text(
        '<a href="api/sgmcmc.html#sgld">ok</a> <a href="https://example.org/x">external</a>'
        '<a href="api/sgmcmc.html#mcmc">no anchor</a> <a href="tutorials/vis.html">no page</a>'
    )
    broken = check_links.broken_links(tmp_path)
    assert [(str(page), link) for page, link, _ in broken] == [
        ("index.html", "api/sgmcmc.html#mcmc"),
        ("index.html", "tutorials/vis.html"),
    ]
    assert check_links.main([str(tmp_path)]) == 1
    (tmp_path / "index.html").write_text('<a href="api/sgmcmc.html#sgld">ok</a>')
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


# -- the API reference: one page per topic ---------------------------------------------------
#: ``.. autoclass:: name`` (any ``auto*`` or ``py:*`` directive) and the option lines under it
_DIRECTIVE = re.compile(r"^\.\. (auto\w+|py:\w+):: (\S+)\n((?:   :[\w-]+:.*\n)*)", re.MULTILINE)
_OPTION = re.compile(r"^   :([\w-]+):(.*)$", re.MULTILINE)


def _page_text(name):
    return (API / f"{name}.rst").read_text(encoding="utf-8")


def _resolve(path):
    """The object a dotted path names: its longest importable module, then attributes."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            obj = getattr(obj, part)
        return obj
    raise ImportError(path)


def _module_members(module, options):
    """The objects ``.. automodule::`` documents with these options, as autodoc picks them
    (``members`` is on by default in docs/conf.py): the ``members`` listed, else the
    module's ``__all__``, else its own documented public names; less ``exclude-members``."""
    if "no-members" in options:
        return []
    listed = [name.strip() for name in options.get("members", "").split(",") if name.strip()]
    if not listed:
        listed = list(getattr(module, "__all__", None) or [])
    if not listed:
        listed = [
            name
            for name, obj in vars(module).items()
            if not name.startswith("_")
            and getattr(obj, "__module__", None) == module.__name__
            and inspect.getdoc(obj)
        ]
    excluded = {name.strip() for name in options.get("exclude-members", "").split(",")}
    return [getattr(module, name) for name in listed if name not in excluded]


def _documented(name):
    """``[(directive, object)]`` for every object page ``name`` documents: each directive's
    own object (a module included), and the members an ``automodule`` brings."""
    found = []
    for match in _DIRECTIVE.finditer(_page_text(name)):
        directive, target, block = match.groups()
        options = {key: value.strip() for key, value in _OPTION.findall(block)}
        if directive.startswith("py:"):
            target = f"{options['module']}.{target}" if "module" in options else target
        obj = _resolve(target)
        found.append((directive, obj))
        if directive == "automodule":
            found += [("member", member) for member in _module_members(obj, options)]
    return found


def _title_and_body(name):
    title, underline, *rest = _page_text(name).split("\n")
    return title, underline, "\n".join(rest)


def test_api_toctree_lists_the_topic_pages_in_learning_order():
    index = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    block = index.split(":caption: API reference", 1)[1].split("```", 1)[0]
    entries = [line.strip() for line in block.splitlines()[1:] if line.strip()]
    entries = [line for line in entries if not line.startswith(":")]
    assert entries == [f"api/{name}" for name in API_PAGES] + ["changelog"]
    assert sorted(path.stem for path in API.glob("*.rst")) == sorted(API_PAGES)


@pytest.mark.parametrize("name", API_PAGES)
def test_api_pages_are_titled_by_topic_and_open_with_when_to_use(name):
    # The title says the topic in words, not a module path; the first thing under it is a
    # paragraph (when to use what), before any directive, example or section.
    title, underline, body = _title_and_body(name)
    assert set(underline) == {"="} and len(underline) == len(title), name
    assert not re.fullmatch(r"pyro_ext(\.\w+)*", title), f"{name}: title {title!r}"
    first = body.strip().split("\n\n", 1)[0]
    assert not first.startswith((".. ", ">>>", "Example")), f"{name} opens with {first[:40]!r}"
    assert len(" ".join(first.split())) >= 300, f"{name}: the opening paragraph is too short"


def _docstrings(obj):
    yield inspect.getdoc(obj) or ""
    if inspect.isclass(obj):
        for member in vars(obj).values():
            member = getattr(member, "fget", None) or getattr(member, "__func__", member)
            if callable(member):
                yield inspect.getdoc(member) or ""


@pytest.mark.parametrize("name", API_PAGES)
def test_api_pages_carry_a_doctest(name):
    # A ">>>" example in the page itself or in a docstring it shows (module docstrings
    # included); `make docs` runs them all (sphinx-build -b doctest).
    texts = [_page_text(name)]
    texts += [doc for _, obj in _documented(name) for doc in _docstrings(obj)]
    assert any(re.search(r"^\s*>>> ", text, re.MULTILINE) for text in texts), name


def test_every_public_name_is_documented_once():
    counts = {}
    for name in API_PAGES:
        for _, obj in _documented(name):
            counts[id(obj)] = counts.get(id(obj), 0) + 1
    problems = []
    for package in PACKAGES:
        module = importlib.import_module(package)
        for public in module.__all__:
            count = counts.get(id(getattr(module, public)), 0)
            if count != 1:
                problems.append(f"{package}.{public}: documented {count} times")
    assert not problems, "\n".join(problems)


def test_errors_are_documented_on_the_errors_page_only():
    # Every exception or warning class the packages export, or a documented module defines,
    # is on api/errors.rst, once; no other page documents one (they point to it).
    def is_error(obj):
        return inspect.isclass(obj) and issubclass(obj, BaseException)

    exported = {
        id(obj): f"{package}.{public}"
        for package in PACKAGES
        for public in importlib.import_module(package).__all__
        if is_error(obj := getattr(importlib.import_module(package), public))
    }
    for name in API_PAGES:
        for directive, module in _documented(name):
            if directive == "automodule":
                exported.update(
                    (id(obj), f"{module.__name__}.{key}")
                    for key, obj in vars(module).items()
                    if is_error(obj)
                    and not key.startswith("_")
                    and obj.__module__.startswith("pyro_ext")
                )
    on_errors_page = [id(obj) for _, obj in _documented("errors") if is_error(obj)]
    missing = sorted(exported[key] for key in set(exported) - set(on_errors_page))
    assert not missing, f"not on api/errors.rst: {missing}"
    assert len(on_errors_page) == len(set(on_errors_page)), "an error documented twice"
    assert set(on_errors_page) == set(exported), "api/errors.rst documents an unknown error"
    elsewhere = [
        (name, obj.__name__)
        for name in API_PAGES
        if name != "errors"
        for _, obj in _documented(name)
        if is_error(obj)
    ]
    assert not elsewhere, elsewhere


def test_the_api_checks_see_a_missing_and_a_misplaced_name(monkeypatch, tmp_path):
    # The same checks on a copy of the reference that lost the bandit environments and
    # documents RankFailedError on the VAE page as well as on the errors page.
    for path in API.glob("*.rst"):
        (tmp_path / path.name).write_text(path.read_text(encoding="utf-8"), encoding="utf-8")
    bandits = (tmp_path / "bandits.rst").read_text(encoding="utf-8")
    cut = bandits.split("Environments\n")[0] + "The Thompson" + bandits.split("The Thompson")[1]
    (tmp_path / "bandits.rst").write_text(cut, encoding="utf-8")
    vae = (tmp_path / "vae.rst").read_text(encoding="utf-8")
    vae += "\n.. autoexception:: pyro_ext.infer.RankFailedError\n"
    (tmp_path / "vae.rst").write_text(vae, encoding="utf-8")
    monkeypatch.setitem(globals(), "API", tmp_path)
    with pytest.raises(AssertionError) as missing:
        test_every_public_name_is_documented_once()
    assert [line.strip() for line in str(missing.value).splitlines()[:5]] == [
        "pyro_ext.infer.RankFailedError: documented 2 times",
        "pyro_ext.online.BernoulliBandit: documented 0 times",
        "pyro_ext.online.GaussianBandit: documented 0 times",
        "pyro_ext.online.LinearContextualBandit: documented 0 times",
        "pyro_ext.online.LogisticContextualBandit: documented 0 times",
    ]
    with pytest.raises(AssertionError, match="RankFailedError"):
        test_errors_are_documented_on_the_errors_page_only()


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
    # each read back by Sphinx's own loader with exactly the entries of its mapping. The docs
    # build runs the same check (write_inventories); here where Sphinx is installed (the
    # docs extra), and a tampered file must fail it.
    pytest.importorskip("sphinx.util.inventory")
    inventories = _docs_module("external_inventories")
    mapping = inventories.write_inventories(tmp_path)
    assert set(mapping) == set(inventories.PROJECTS)
    for name, (base, location) in mapping.items():
        project, url = inventories.PROJECTS[name]
        assert base == url and Path(location).parent == tmp_path
    name = next(iter(inventories.PROJECTS))
    project, base = inventories.PROJECTS[name]
    entries = inventories.read_mapping(inventories.mapping_path(name))
    tampered = tmp_path / "tampered.inv"
    tampered.write_bytes(inventories.inventory_bytes(entries[1:], project))
    with pytest.raises(ValueError, match="reads back"):
        inventories.check_round_trip(tampered, base, entries, project)
