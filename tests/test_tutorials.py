"""Execute every tutorial notebook end to end, in quick mode (``PYRO_EXT_QUICK=1``), and
keep the executed copy for the docs site (``docs/execute_tutorials.py``)."""

import importlib.util
import re
from pathlib import Path

import pytest

# End-to-end runs: `make test-integration` (CI runs it after `make test`).
pytestmark = pytest.mark.integration

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("matplotlib")

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "execute_tutorials", ROOT / "docs" / "execute_tutorials.py"
)
tutorials = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tutorials)

TUTORIALS = tutorials.SOURCES
NOTEBOOKS = tutorials.notebooks()
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture
def quick_mode_env(monkeypatch):
    # nbclient starts the kernel as a subprocess, which inherits this environment.
    for name, value in tutorials.QUICK_ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("MPLBACKEND", raising=False)  # the kernel's inline backend


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_tutorial_runs(path, quick_mode_env):
    failure = None
    try:
        notebook = tutorials.execute(path)
    except nbclient.exceptions.CellExecutionError as error:
        # The message holds the failing cell's source, its output so far and the traceback.
        failure = f"{path.name}: a cell raised an error\n{ANSI_ESCAPE.sub('', str(error))}"
    except nbclient.exceptions.CellTimeoutError as error:
        failure = f"{path.name}: a cell ran longer than {tutorials.CELL_TIMEOUT} s\n{error}"
    if failure is not None:
        pytest.fail(failure, pytrace=False)
    # `make docs` renders this copy instead of executing the notebook again.
    tutorials.save_executed(notebook, path)
    assert tutorials.is_fresh(path)


def test_tutorials_are_saved_without_outputs():
    """Notebooks are committed with cleared outputs, which keeps the repository small."""
    assert NOTEBOOKS, f"no notebooks found in {TUTORIALS}"
    for path in NOTEBOOKS:
        notebook = nbformat.read(path, as_version=4)
        for index, cell in enumerate(notebook.cells):
            if cell.cell_type == "code":
                assert not cell.get("outputs"), f"{path.name}: cell {index} has saved outputs"
                assert cell.get("execution_count") is None, (
                    f"{path.name}: cell {index} has an execution count"
                )
