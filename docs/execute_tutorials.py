"""
Execute the tutorial notebooks for the docs site, in quick mode, reusing fresh copies.

``docs/tutorials/<name>.ipynb`` is the executed copy of ``tutorials/<name>.ipynb`` that the
site renders, outputs and figures included, with a note under its title saying it ran in
quick mode (``PYRO_EXT_QUICK=1``: smaller data, fewer steps). A copy is fresh while its
metadata records the sha256 of its source: ``make docs`` executes only the stale ones, and
the integration tests (``tests/test_tutorials.py``), which execute every notebook anyway,
save their copies here, so CI runs each notebook once. The repository keeps the sources
stripped of outputs; the copies are build products (ignored by git).

Run from the repository root::

    python docs/execute_tutorials.py            # the stale ones
    python docs/execute_tutorials.py --force    # all of them
"""

import argparse
import copy
import hashlib
import os
import sys
import time
from pathlib import Path

import nbclient
import nbformat

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ROOT / "tutorials"
EXECUTED = ROOT / "docs" / "tutorials"
CELL_TIMEOUT = 600  # seconds per cell
#: the environment a tutorial runs in (its kernel inherits it). No MPLBACKEND: the kernel's
#: own inline backend (headless) keeps each figure as a cell output for the site.
QUICK_ENV = {"PYRO_EXT_QUICK": "1"}
QUICK_NOTE = """```{note}
This page is the notebook [`tutorials/%s`](%s) as executed by the documentation build in
quick mode (`PYRO_EXT_QUICK=1`): smaller data and fewer steps than the full runs, so its
numbers show the method working, not its best figures; those are in the benchmarks' results
files. Set `PYRO_EXT_QUICK=0` (or leave it unset) to run it in full.
```"""
REPOSITORY = "https://github.com/pyro-ext/pyro_ext/blob/main/"


def notebooks():
    return sorted(SOURCES.glob("*.ipynb"))


def source_hash(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def executed_path(path):
    return EXECUTED / Path(path).name


def is_fresh(path):
    """Whether the executed copy of ``path`` exists and was made from its current text."""
    target = executed_path(path)
    if not target.is_file():
        return False
    meta = nbformat.read(target, as_version=4).metadata.get("pyro_ext", {})
    return meta.get("source_sha256") == source_hash(path)


def execute(path, timeout=CELL_TIMEOUT):
    """``path`` executed in a fresh kernel in its own folder; raises nbclient's errors."""
    notebook = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        notebook,
        kernel_name="python3",
        timeout=timeout,
        resources={"metadata": {"path": str(Path(path).parent)}},
    )
    client.execute()
    return notebook


def save_executed(notebook, path):
    """Write the executed ``notebook`` of source ``path`` for the site, with the quick-mode
    note after its title cell and its source's hash."""
    notebook = copy.deepcopy(notebook)
    name = Path(path).name
    note = nbformat.v4.new_markdown_cell(QUICK_NOTE % (name, REPOSITORY + "tutorials/" + name))
    note.id = "pyro-ext-quick-note"
    notebook.cells.insert(1, note)
    notebook.metadata["pyro_ext"] = {"source_sha256": source_hash(path), "quick": True}
    EXECUTED.mkdir(parents=True, exist_ok=True)
    target = executed_path(path)
    partial = target.with_suffix(".ipynb.partial")
    nbformat.write(notebook, partial)
    partial.replace(target)  # a reader of the folder never sees half a notebook
    return target


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--force", action="store_true", help="execute every notebook")
    args = parser.parse_args(argv)
    os.environ.update(QUICK_ENV)
    stale = [p for p in notebooks() if args.force or not is_fresh(p)]
    print(f"execute_tutorials: {len(notebooks()) - len(stale)} fresh, {len(stale)} to execute")
    failed = []
    for path in stale:
        start = time.perf_counter()
        try:
            save_executed(execute(path), path)
        except (nbclient.exceptions.CellExecutionError, nbclient.exceptions.CellTimeoutError) as e:
            failed.append(path.name)
            print(f"execute_tutorials: {path.name} FAILED:\n{e}", file=sys.stderr)
            continue
        print(f"execute_tutorials: {path.name} in {time.perf_counter() - start:.0f} s", flush=True)
    if failed:
        print(f"execute_tutorials: failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
