"""The benchmark scripts run end to end in their quick mode (full runs: ``make bench``)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = sorted((Path(__file__).resolve().parents[1] / "benchmarks").glob("[!_]*.py"))


def check_online_bandits(text):
    # The MNIST bandit: every agent's row in each table, rewards at most the rounds played.
    for agent in ("LoFi-TS", "LoFi ε-greedy", "linear TS", "neural ε-greedy", "uniform random"):
        assert text.count(f"| {agent}") == 3, agent
    table = text.split("## Cumulative reward after")[1].split("##")[0]
    rewards = [
        float(row.split("|")[2])
        for row in table.splitlines()
        if row.startswith("| ") and "agent" not in row
    ]
    assert len(rewards) == 5 and all(0 <= r <= 200 for r in rewards)


def check_online(text):
    # Issue 16's reproductions: every method's row in each of the four tables, the MNIST
    # misclassification / ECE cells in [0, 1], and the posteriors cross-check when present.
    sections = text.split("\n## ")[1:]
    assert [s[:2] for s in sections] == ["1.", "2.", "3.", "4."]
    moons, mnist, uci, speed = sections
    for family in ("full", "diag", "dlr"):
        for method in ("BONG", "BLR") + (("BOG", "BBB") if family != "dlr" else ()):
            assert f"| {method} {family} |" in moons, (method, family)
    assert "| OGD |" in moons
    rows = [r for r in mnist.splitlines() if r.startswith("| ") and "method" not in r]
    assert [r.split("|")[1].strip() for r in rows] == [
        "LoFi rank 1",
        "LoFi rank 10",
        "diagonal (BONG-LIN)",
        "OGD (Adam)",
    ]
    for row in rows:
        for cell in row.split("|")[2:4]:  # the two checkpoints of the quick run
            assert all(0 <= float(v) <= 1 for v in cell.split(" / ")), row
    for method in ("WoLF", "unweighted", "OGD"):
        assert f"| yacht | {method} |" in uci, method
    assert "| LoFi rank 10 (ours) |" in speed
    if "posteriors not installed" not in speed:
        assert "| `posteriors.ekf.diag_fisher` |" in speed
        assert "the same algorithm" in speed


#: content checks of a quick run's results, beyond "a table was written", by script name
CONTENT_CHECKS = {"online": check_online, "online_bandits": check_online_bandits}


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
    text = output.read_text()
    assert "|" in text  # a markdown table was written
    if script.stem in CONTENT_CHECKS:
        CONTENT_CHECKS[script.stem](text)


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
