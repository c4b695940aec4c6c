"""The demo tour: its chapters run (quick mode), print their results and draw their figures."""

import subprocess
import sys

import pytest

from pyro_ext import demo

# End-to-end runs: `make test-integration` (CI runs it after `make test`).
pytestmark = pytest.mark.integration

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# What each chapter draws: the files of its figures folder, without ".png".
EXPECTED_FIGURES = {
    "sgmcmc": {
        "sgmcmc_gaussian_posterior",
        "sgmcmc_svgd_vs_sgld_r",
        "sgmcmc_logistic_regression",
        "sgmcmc_compiled_step",
    },
    "distributed": {"distributed_draws"},
    "bnn": {"bnn_predictive"},
    "ngvi": {"ngvi_predictive"},
    "online": {"online_two_moons", "online_outliers"},
    "vis": {"vis_funnel_elbo"},
    "timeseries": {"timeseries_casino", "timeseries_co2_forecast"},
    "bsts": {"bsts_effects", "bsts_forecast", "bsts_frontier"},
    "ara": {"ara_spam", "ara_security_curves"},
    "rl": {"rl_reward_curves"},
}


def assert_png(path):
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, f"{path.name} is not a PNG file"
    assert data[12:16] == b"IHDR"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert width >= 200 and height >= 200, f"{path.name} is {width} x {height}"
    assert len(data) > 5000, f"{path.name} has {len(data)} bytes: an empty plot?"


def test_every_chapter_lists_its_figures():
    assert set(demo.CHAPTERS) == set(EXPECTED_FIGURES)
    assert {name: set(figures) for name, figures in demo.FIGURES.items()} == EXPECTED_FIGURES


@pytest.mark.parametrize("chapter", sorted(demo.CHAPTERS))
def test_demo_chapter_runs_quick(chapter, tmp_path, capsys):
    folder = tmp_path / "figures"
    demo.main(["--chapter", chapter, "--quick", "--figures", str(folder)])
    out = capsys.readouterr().out
    assert "== Chapter" in out
    assert "nan" not in out.lower()
    assert out.rstrip().splitlines()[-1].startswith(f"Figures written to {folder.resolve()}")
    if chapter == "ara" and "skipped:" in out:  # no MNIST / Spambase under PYRO_EXT_DATA
        expected = set()
    else:
        expected = EXPECTED_FIGURES[chapter]
    assert {path.stem for path in folder.iterdir()} == expected
    for name in expected:
        assert_png(folder / f"{name}.png")


def _fake_chapter(calls):
    def run(quick=False, figures=None):
        print("== Chapter: fake ==")
        calls.append(figures)
        if figures is not None:
            with figures.figure("fake_line") as ax:
                ax.plot([0, 1, 2], [1, 0, 1])

    return run


def test_no_figures_writes_nothing(tmp_path, monkeypatch, capsys):
    calls = []
    monkeypatch.setitem(demo.CHAPTERS, "fake", _fake_chapter(calls))
    monkeypatch.chdir(tmp_path)
    demo.main(["--chapter", "fake", "--no-figures"])
    assert calls == [None]
    assert list(tmp_path.iterdir()) == []
    assert "Figures" not in capsys.readouterr().out


def test_figures_default_folder(tmp_path, monkeypatch, capsys):
    calls = []
    monkeypatch.setitem(demo.CHAPTERS, "fake", _fake_chapter(calls))
    monkeypatch.chdir(tmp_path)
    demo.main(["--chapter", "fake"])
    folder = tmp_path / "pyro_ext_demo_figures"
    assert [path.name for path in folder.iterdir()] == ["fake_line.png"]
    assert_png(folder / "fake_line.png")
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == f"Figures written to {folder.resolve()} (1 PNG file)"


def test_without_matplotlib_the_tour_runs_and_says_so(tmp_path, monkeypatch, capsys):
    calls = []
    monkeypatch.setitem(demo.CHAPTERS, "fake", _fake_chapter(calls))
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib fails
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    demo.main(["--chapter", "fake", "--figures", str(tmp_path / "figures")])
    assert calls == [None]
    assert not (tmp_path / "figures").exists()
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("Figures skipped: matplotlib is not installed")
    assert 'pip install "pyro-ext[demo]"' in last


def test_module_help_runs_as_a_command():
    result = subprocess.run(
        [sys.executable, "-m", "pyro_ext.demo", "--help"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    for option in ("--chapter", "--quick", "--figures", "--no-figures"):
        assert option in result.stdout
    assert "sgmcmc" in result.stdout
