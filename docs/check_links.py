"""
Check the built site's internal links: every relative ``href`` or ``src`` of every page must
name a file of the build, and every ``#fragment`` an ``id`` on its target page. Links to
other sites are not followed (the build machines are offline); the Sphinx build itself
already fails on a cross-reference it cannot resolve. Run by ``make docs``::

    python docs/check_links.py docs/_build/html
"""

import re
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit


class _Page(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.ids, self.links = set(), []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for key in ("id", "name"):
            if attrs.get(key):
                self.ids.add(attrs[key])
        for key in ("href", "src"):
            if attrs.get(key) is not None:
                self.links.append(attrs[key])


def _parse(path, cache):
    if path not in cache:
        page = _Page()
        page.feed(path.read_text(encoding="utf-8", errors="replace"))
        cache[path] = page
    return cache[path]


def broken_links(root):
    """``[(page, link, why)]`` for every internal link of the site under ``root``."""
    root, cache, broken = Path(root).resolve(), {}, []
    for page in sorted(root.rglob("*.html")):
        if "_static" in page.relative_to(root).parts or "_sources" in page.parts:
            continue
        for link in _parse(page, cache).links:
            parts = urlsplit(link)
            if parts.scheme or parts.netloc or link.startswith(("mailto:", "javascript:")):
                continue
            target = page if not parts.path else (page.parent / unquote(parts.path)).resolve()
            if target.is_dir():
                target = target / "index.html"
            if not target.is_file():
                broken.append((page.relative_to(root), link, "no such file"))
                continue
            fragment = unquote(parts.fragment)
            if fragment and target.suffix == ".html" and fragment not in _parse(target, cache).ids:
                broken.append((page.relative_to(root), link, f"no id {fragment!r} there"))
    return broken


#: a cross-reference Sphinx rendered as code, linked (``<a ...>`` right before it) or not
_XREF = re.compile(
    r'(<a [^>]*>)?<code class="xref py (py-\w+)[^"]*"[^>]*><span class="pre">([^<]*)</span>'
)


def unlinked_package_names(root):
    """``[(page, name)]`` for every name a page mentions as a cross-reference without a link
    although the site documents a package object of that name (an id ``pyro_ext.….name``):
    a short name in a docstring that ``docs/conf.py``'s resolver should have linked."""
    root, cache = Path(root).resolve(), {}
    pages = [
        page
        for page in sorted(root.rglob("*.html"))
        if "_static" not in page.relative_to(root).parts and "_sources" not in page.parts
    ]
    # Every dotted tail of each documented name: "RetailBSTS.fit" and "fit" for
    # "pyro_ext.models.RetailBSTS.fit"; modules (ids "module-pyro_ext....") apart.
    documented = {"objects": set(), "modules": set()}
    for page in pages:
        for name in _parse(page, cache).ids:
            kind = "modules" if name.startswith("module-pyro_ext.") else "objects"
            name = name.removeprefix("module-")
            if name.startswith("pyro_ext."):
                parts = name.split(".")
                documented[kind].update(".".join(parts[i:]) for i in range(len(parts)))
    unlinked = []
    for page in pages:
        for match in _XREF.finditer(page.read_text(encoding="utf-8", errors="replace")):
            linked, role, name = match.groups()
            name = name.removesuffix("()").lstrip("~")
            kind = "modules" if role == "py-mod" else "objects"
            if not linked and name in documented[kind]:
                unlinked.append((page.relative_to(root), name))
    return unlinked


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    root = Path(argv[0] if argv else "docs/_build/html")
    if not root.is_dir():
        print(f"check_links: {root} is not a built site (run sphinx-build first)", file=sys.stderr)
        return 2
    broken = broken_links(root)
    pages = sum(1 for _ in root.rglob("*.html"))
    for page, link, why in broken:
        print(f"check_links: {page}: {link}: {why}", file=sys.stderr)
    unlinked = unlinked_package_names(root)
    for page, name in unlinked:
        print(f"check_links: {page}: {name} is documented but not linked", file=sys.stderr)
    print(
        f"check_links: {pages} pages, {len(broken)} broken internal link(s), "
        f"{len(unlinked)} unlinked mention(s) of documented names"
    )
    return 1 if broken or unlinked else 0


if __name__ == "__main__":
    sys.exit(main())
