"""Sphinx configuration of the pyro_ext documentation (``make docs``)."""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PYRO_EXT_DATA", str(ROOT.parent / "shared" / "data"))

import pyro_ext  # noqa: E402

project = "pyro_ext"
author = "the pyro_ext developers"
copyright = "2026, the pyro_ext developers"
release = pyro_ext.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.doctest",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "myst_parser",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build"]
myst_enable_extensions = ["dollarmath"]
myst_heading_anchors = 3

autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
# The README and the changelog link to files of the repository (notebooks, benchmark
# scripts and results) that are not documentation pages: they stay plain links.
suppress_warnings = ["myst.xref_missing"]


html_theme = "furo"
html_title = f"pyro_ext {release}"

# The names a docstring example may use without importing them (its module's).
doctest_global_setup = """
import torch
from pyro_ext.infer import *
from pyro_ext.infer.ngvi import *
from pyro_ext.timeseries import *
"""
