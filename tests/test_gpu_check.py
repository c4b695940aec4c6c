"""``benchmarks/gpu_check.py``: the stage runner stops at the first broken capability with
the stage named and what was measured until then written, and the CPU smoke mode (what
keeps the CUDA run from rotting where no GPU is) runs every stage end to end."""

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check():
    # Loaded from its file; the benchmarks folder it puts on sys.path for its own imports
    # is taken off again, so that the benchmark scripts' module names shadow nothing here.
    path = list(sys.path)
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = path
    return module


def _stage(gpu_check, name, run, share=0.3):
    return gpu_check.Stage(name, f"the {name} stage", share, run)


def _run(gpu_check, stages, output, budget_seconds=10.0):
    ctx = gpu_check.Context(device=torch.device("cpu"), small=True, cpu=True)
    return gpu_check.run_stages(stages, ctx, budget_seconds, output, lambda: "# report")


def test_stops_at_the_first_failing_stage(gpu_check, tmp_path, capsys):
    ran = []

    def good(ctx, record):
        record.row("first thing", "1.0 s", "ratio 1.00")
        ran.append("good")

    def broken(ctx, record):
        record.row("half-way row", "2.0 s", "-")
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    def never(ctx, record):
        ran.append("never")

    output = tmp_path / "report.md"
    stages = [
        _stage(gpu_check, "good", good),
        _stage(gpu_check, "broken", broken),
        _stage(gpu_check, "never", never),
    ]
    assert _run(gpu_check, stages, output) == 1
    assert ran == ["good"]  # the stage after the failure did not run
    message = capsys.readouterr().err
    assert "FAILED at stage 1 (broken" in message
    assert "RuntimeError: CUDA error: an illegal memory access" in message
    text = output.read_text()
    assert "| first thing | 1.0 s | ratio 1.00 | pass |" in text  # the earlier stage's rows
    assert "| half-way row | 2.0 s | - | pass |" in text  # and the failing one's so far
    assert "## 0. the good stage: PASS" in text
    assert "## 1. the broken stage: FAIL" in text and "illegal memory access" in text
    assert "## 2. the never stage: not run" in text
    assert "| broken | FAIL |" in text and "| never | not run |" in text


def test_a_stage_past_its_budget_stops_the_run(gpu_check, tmp_path, capsys):
    def slow(ctx, record):
        record.row("before the hang", "-", "-")
        time.sleep(30)

    output = tmp_path / "report.md"
    began = time.perf_counter()
    stages = [_stage(gpu_check, "slow", slow, share=0.05), _stage(gpu_check, "next", slow)]
    assert _run(gpu_check, stages, output, budget_seconds=4.0) == 1
    assert time.perf_counter() - began < 10  # stopped at its 0.2 s share, not after 30 s
    assert "FAILED at stage 0 (slow" in capsys.readouterr().err
    text = output.read_text()
    assert "outran its budget" in text and "| before the hang |" in text
    assert "## 1. the next stage: not run" in text


def test_an_incomplete_stage_lets_the_run_go_on(gpu_check, tmp_path, capsys):
    def incomplete(ctx, record):
        raise gpu_check.StageIncomplete("pytest did not finish within 1 s")

    def after(ctx, record):
        record.row("after", "-", "-")

    output = tmp_path / "report.md"
    stages = [_stage(gpu_check, "tests", incomplete), _stage(gpu_check, "after", after)]
    assert _run(gpu_check, stages, output) == 2
    assert "tests did not finish within its budget" in capsys.readouterr().err
    text = output.read_text()
    assert "## 0. the tests stage: INCOMPLETE" in text and "## 1. the after stage: PASS" in text


@pytest.mark.integration  # about a minute: every stage at its smallest on the CPU
def test_cpu_smoke_mode_runs_every_stage(gpu_check, tmp_path):
    output = tmp_path / "smoke.md"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--quick", "--output", str(output)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "CI": "1"},
    )
    assert result.returncode == 0, result.stderr[-4000:]
    text = output.read_text()
    assert "Device **cpu**" in text
    for index, stage in enumerate(gpu_check.STAGES):
        assert f"| {stage.name} | PASS |" in text, stage.name
        section = text.split(f"## {index}. {stage.title}: PASS")[1].split("\n## ")[0]
        assert "| what ran | time | key ratios | result |" in section, stage.name
        rows = [r for r in section.splitlines() if r.startswith("| ") and "what ran" not in r]
        assert rows and all(r.split("|")[4].strip() != "FAIL" for r in rows), stage.name


def test_keep_going_runs_every_stage_and_still_fails(gpu_check, tmp_path, capsys):
    ran = []

    def broken(ctx, record):
        ran.append("broken")
        raise RuntimeError("CUDA error: device-side assert triggered")

    def good(ctx, record):
        record.row("after the failure", "1.0 s", "-")
        ran.append("good")

    output = tmp_path / "report.md"
    ctx = gpu_check.Context(device=torch.device("cpu"), small=True, cpu=True, keep_going=True)
    stages = [_stage(gpu_check, "broken", broken), _stage(gpu_check, "good", good)]
    code = gpu_check.run_stages(stages, ctx, 10.0, output, lambda: "# report")
    assert code == 1 and ran == ["broken", "good"]
    err = capsys.readouterr().err
    assert "FAILED at stage 0 (broken" in err and "FAILED stages: broken" in err
    text = output.read_text()
    assert "## 0. the broken stage: FAIL" in text and "## 1. the good stage: PASS" in text


def test_a_failing_test_brings_its_traceback_into_the_report(gpu_check, tmp_path):
    # A GPU lease is short and rare: the report must say why a test failed, not end in
    # the warnings summary (as the first BSTS failure on the H200 did).
    test = tmp_path / "test_fails.py"
    test.write_text(
        "import warnings\n\n\ndef test_fails():\n"
        "    warnings.warn('noise ' * 400)\n"
        "    assert 1 + 1 == 3, 'the reason, on the device'\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--tb=short", str(test)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert done.returncode == 1
    section = gpu_check.failures_section(done.stdout + "\n" + "=" * 20 + " warnings " + "x" * 9000)
    assert "the reason, on the device" in section and "test_fails" in section
    assert "short test summary info" not in section and len(section) < 8100
    assert gpu_check.failures_section("3 passed in 1.0s") == "3 passed in 1.0s"
