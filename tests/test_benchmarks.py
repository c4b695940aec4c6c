"""The benchmark scripts run end to end in their quick mode (full runs: ``make bench``)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = sorted((Path(__file__).resolve().parents[1] / "benchmarks").glob("[!_]*.py"))


@pytest.mark.parametrize("script", BENCHMARKS, ids=lambda path: path.stem)
def test_benchmark_quick_mode(script, tmp_path):
    output = tmp_path / "results.md"
    result = subprocess.run(
        [sys.executable, str(script), "--quick", "--output", str(output)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "CI": "1"},
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "|" in output.read_text()  # a markdown table was written


@pytest.mark.slow
@pytest.mark.parametrize("script", BENCHMARKS, ids=lambda path: path.stem)
def test_benchmark_full_run(script, tmp_path):
    output = tmp_path / "results.md"
    result = subprocess.run(
        [sys.executable, str(script), "--output", str(output)],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "|" in output.read_text()
