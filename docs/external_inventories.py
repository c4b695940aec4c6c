"""
Links from the site to the documentation of Python, PyTorch, Pyro and NumPy, built offline.

Sphinx links a name such as ``torch.Tensor`` in a signature or a docstring to another
project's documentation through that project's inventory (``objects.inv``, read by
``sphinx.ext.intersphinx``), which it normally downloads; the build machines are offline.
So ``docs/inventories/<name>.txt`` lists, by hand, each upstream object our pages name, one
line each::

    <type> <name> <uri>

``type`` is the object's type in Sphinx's Python domain as the upstream documentation
declares it (``py:class``, ``py:function``, ... : :data:`TYPES`), ``name`` the name our
docstrings use (an alias of the documented name is fine: ``pyro.infer.MCMC``), and ``uri``
the page and anchor where upstream documents it, relative to the project's base URL
(:data:`PROJECTS`). ``docs/conf.py`` writes each list as an ``objects.inv`` (version 2) under
``docs/_build/inventories`` at every build and points ``intersphinx_mapping`` at those files
only, so the build never touches the network. A name that no list holds stays plain text.
"""

import hashlib
import zlib
from pathlib import Path
from urllib.parse import urlsplit

DOCS = Path(__file__).resolve().parent
MAPPINGS = DOCS / "inventories"

#: inventory name (``docs/inventories/<name>.txt``): (project, base URL of its documentation)
PROJECTS = {
    "python": ("Python", "https://docs.python.org/3/"),
    "torch": ("PyTorch", "https://pytorch.org/docs/stable/"),
    "pyro": ("Pyro", "https://docs.pyro.ai/en/stable/"),
    "numpy": ("NumPy", "https://numpy.org/doc/stable/"),
}

#: the object types an entry may have: those of Sphinx's Python domain. A role finds only
#: its own types (``:class:`` a class or an exception, ``:func:`` a function); docs/conf.py
#: retries a miss as any type (``None`` in a type field is data, ``torch.no_grad`` a class).
TYPES = frozenset(
    {
        "py:module",
        "py:class",
        "py:exception",
        "py:function",
        "py:method",
        "py:classmethod",
        "py:staticmethod",
        "py:attribute",
        "py:property",
        "py:data",
    }
)


def mapping_path(name):
    return MAPPINGS / f"{name}.txt"


def read_mapping(path):
    """``[(type, name, uri)]`` of a mapping file; blank lines and ``#`` comments skipped."""
    entries = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split()
        if len(fields) != 3:
            raise ValueError(f"{path}:{number}: expected '<type> <name> <uri>', got {line!r}")
        entries.append(tuple(fields))
    return entries


def problems(entries):
    """What is wrong with a mapping's entries: an unknown type, a URI that is not relative
    to the base URL (a scheme, a host, a leading slash) or names no page, a name listed
    twice."""
    found, seen = [], set()
    for kind, name, uri in entries:
        parts = urlsplit(uri)
        if kind not in TYPES:
            found.append(f"{name}: unknown type {kind!r}")
        if parts.scheme or parts.netloc or uri.startswith("/") or not parts.path:
            found.append(f"{name}: {uri!r} is not a page relative to the base URL")
        if name in seen:
            found.append(f"{name}: listed twice")
        seen.add(name)
    return found


def inventory_bytes(entries, project, version=""):
    """The Sphinx inventory (format version 2) of ``entries``: four header lines, then one
    zlib-compressed line ``name type priority uri display-name`` per object (priority 1,
    display name ``-``: the name itself)."""
    header = (
        "# Sphinx inventory version 2\n"
        f"# Project: {project}\n"
        f"# Version: {version}\n"
        "# The remainder of this file is compressed using zlib.\n"
    )
    body = "".join(f"{name} {kind} 1 {uri} -\n" for kind, name, uri in sorted(entries))
    return header.encode() + zlib.compress(body.encode(), 9)


def write_inventories(folder):
    """Write ``<folder>/<name>.inv`` for every mapping and return the ``intersphinx_mapping``
    that reads them: ``{name: (base URL, local inventory path)}``. A faulty mapping stops
    the build."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    mapping = {}
    for name, (project, base) in PROJECTS.items():
        entries = read_mapping(mapping_path(name))
        found = problems(entries)
        if found:
            raise ValueError(f"{mapping_path(name)}: " + "; ".join(found))
        target = folder / f"{name}.inv"
        data = inventory_bytes(entries, project)
        if not target.is_file() or target.read_bytes() != data:
            target.write_bytes(data)
        check_round_trip(target, base, entries, project)
        mapping[name] = (base, str(target))
    return mapping


def check_round_trip(path, base, entries, project):
    """Read ``path`` back with Sphinx's own inventory loader and raise ``ValueError`` unless
    it holds exactly ``entries`` (``(type, name, uri)``) under ``base``: run at every docs
    build, where Sphinx is installed, so a file intersphinx would misread stops the build."""
    import posixpath

    from sphinx.util.inventory import InventoryFile

    with open(path, "rb") as stream:
        data = InventoryFile.load(stream, base, posixpath.join)
    loaded = {
        (kind, obj, item.uri, item.project_name, item.display_name)
        for kind, objects in data.items()
        for obj, item in objects.items()
    }
    expected = {(kind, obj, base + uri, project, "-") for kind, obj, uri in entries}
    if loaded != expected:
        raise ValueError(
            f"{path}: Sphinx reads back {len(loaded)} entries, not the {len(expected)} listed "
            f"(differing: {sorted(loaded ^ expected)[:3]})"
        )


def digest():
    """A hash of the mappings and their base URLs: a config value of the build that changes
    with them, so that Sphinx rereads every page (and relinks it) after an edit."""
    sha = hashlib.sha256()
    for name, (project, base) in sorted(PROJECTS.items()):
        sha.update(f"{name} {project} {base}\n".encode())
        sha.update(mapping_path(name).read_bytes())
    return sha.hexdigest()
