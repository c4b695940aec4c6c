"""Sphinx configuration of the pyro_ext documentation (``make docs``)."""

import os
import sys
from pathlib import Path

from docutils import nodes
from sphinx import addnodes
from sphinx.ext import intersphinx
from sphinx.transforms.post_transforms import SphinxPostTransform

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
REPOSITORY = "https://github.com/pyro-ext/pyro_ext/blob/main/"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(DOCS))
os.environ.setdefault("PYRO_EXT_DATA", str(ROOT.parent / "shared" / "data"))

import external_inventories  # noqa: E402

import pyro_ext  # noqa: E402

project = "pyro_ext"
author = "the pyro_ext developers"
copyright = "2026, the pyro_ext developers"
release = pyro_ext.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.doctest",
    "sphinx.ext.mathjax",
    # MathJax served from the site itself (_static/mathjax), not a CDN: math renders offline
    "sphinx-mathjax-offline",
    "sphinx.ext.viewcode",
    # Names of Python, PyTorch, Pyro and NumPy link to their documentation (below)
    "sphinx.ext.intersphinx",
    # MyST markdown and the tutorial notebooks (myst-nb includes myst-parser)
    "myst_nb",
]
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
exclude_patterns = ["_build", "**.ipynb_checkpoints", "**.partial"]
# The notebooks under docs/tutorials/ are already executed (docs/execute_tutorials.py, run by
# `make docs` before Sphinx): the site shows their outputs and never runs them itself.
nb_execution_mode = "off"
# stderr (progress-bar notices, and the convergence warnings that quick mode's short runs
# raise) would read as the method's verdict on a page that runs it small: left out of the site.
nb_output_stderr = "remove"
myst_enable_extensions = ["dollarmath"]
myst_heading_anchors = 3

# The inventories of the upstream documentation, offline: written at every build from the
# lists kept in docs/inventories/ (docs/external_inventories.py), read from local files only.
intersphinx_mapping = external_inventories.write_inventories(DOCS / "_build" / "inventories")
# Changes with those lists, so that an edit relinks every page (a config value of the build).
external_inventories_digest = external_inventories.digest()

autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "description"


class RepositoryFileLinks(SphinxPostTransform):
    """
    A link in the README or the changelog to a repository file that is no page of the site
    (a benchmark script or results file, ``CITATION.cff``) points at that file in the
    repository instead of nowhere; links to pages (the executed tutorials) are left to
    MyST, and any other dead link still fails the build.
    """

    default_priority = 5  # before MyST's reference resolver (9)

    def run(self, **kwargs):
        for node in list(self.document.findall(addnodes.pending_xref)):
            if node.get("reftype") != "myst":
                continue
            path, _, anchor = node.get("reftarget", "").partition("#")
            # Relative to the page's folder, which mirrors the repository's: the README is
            # included by index.md, tutorials/x.ipynb is the executed tutorials/x.ipynb.
            folder = Path(node.get("refdoc", "index")).parent
            if not path or "://" in path or (DOCS / folder / path).exists():
                continue
            target = (ROOT / folder / path).resolve()
            if target.exists() and target.is_relative_to(ROOT):
                uri = REPOSITORY + target.relative_to(ROOT).as_posix()
                uri += f"#{anchor}" if anchor else ""
                node.replace_self(nodes.reference("", "", *node.children, refuri=uri))


def public_bases(app, name, obj, options, bases):
    """
    "Bases:" names public classes only: a private base (``_Bandit``, ``_PeriodicTaxPolicy``),
    which has no entry to link to, is replaced by its own public bases, recursively.
    """

    def public(cls):
        if not getattr(cls, "__name__", "").startswith("_"):
            return [cls]
        return [base for parent in getattr(cls, "__bases__", ()) for base in public(parent)]

    shown = []
    for base in bases:
        shown += [cls for cls in public(base) if cls not in shown]
    if len(shown) > 1 and object in shown:
        shown.remove(object)
    bases[:] = shown or [object]


def resolve_short_names(app, env, node, contnode):
    """Link a name in a docstring to the package object it names when Python's own lookup
    misses it: a short name (``:func:`vector_scan``` in ``pyro_ext.ops.scan``) or the path
    of the module that defines it (``pyro_ext.models.bsts.attribution.roas``). Objects are
    documented where users import them (``pyro_ext.ops.vector_scan``,
    ``pyro_ext.models.bsts.roas``), not in the submodule that defines them. Only objects of
    the role's kinds match; among several, the one nearest the name's own path (else the
    current module) wins, then the shortest name (the re-export). Names outside the package
    are left alone."""
    if node.get("refdomain") != "py":
        return None
    target = node.get("reftarget", "").lstrip("~.")
    if not target or target.split(".")[0] in ("pyro", "torch", "numpy"):
        return None
    domain = env.get_domain("py")
    kinds = set(domain.objtypes_for_role(node["reftype"]) or ())
    if target.startswith("pyro_ext."):
        near, suffix = target.split("."), "." + target.rsplit(".", 1)[-1]
    else:
        near, suffix = (node.get("py:module") or "").split("."), "." + target
    matches = [
        name
        for name, entry in domain.objects.items()
        if name.startswith("pyro_ext.")
        and name.endswith(suffix)
        and name != target
        and (not kinds or entry.objtype in kinds)
    ]
    if not matches:
        return None

    def nearness(name):
        parts = name.split(".")
        shared = 0
        while shared < min(len(parts), len(near)) and parts[shared] == near[shared]:
            shared += 1
        return (-shared, len(parts))

    return domain.resolve_xref(
        env,
        node["refdoc"],
        app.builder,
        node["reftype"],
        min(matches, key=nearness),
        node,
        contnode,
    )


def link_external_any_type(app, env, node, contnode):
    """Link an upstream name that intersphinx missed because the role names another kind of
    object than upstream's: a type field makes every name a class reference, ``None`` (data)
    and ``callable`` (a function) included, and ``:func:`torch.no_grad``` names a class. The
    inventories are searched again for the name as any kind of object, as Sphinx's own lookup
    mostly does for the package's objects. Runs after intersphinx and the short names, before
    Sphinx's silencing of unlinked builtins (priority 900)."""
    if node.get("refdomain") != "py" or node.get("reftype") == "obj":
        return None
    retry = node.deepcopy()
    retry["reftype"] = "obj"
    return intersphinx.missing_reference(app, env, retry, contnode)


def setup(app):
    app.add_config_value("external_inventories_digest", "", "env", types=frozenset({str}))
    app.add_post_transform(RepositoryFileLinks)
    app.connect("autodoc-process-bases", public_bases)
    app.connect("missing-reference", resolve_short_names)
    app.connect("missing-reference", link_external_any_type, priority=800)


html_theme = "furo"
html_title = f"pyro_ext {release}"

# The names a docstring example may use without importing them (its module's).
doctest_global_setup = """
import torch
from pyro_ext.infer import *
from pyro_ext.infer.ngvi import *
from pyro_ext.timeseries import *
"""
