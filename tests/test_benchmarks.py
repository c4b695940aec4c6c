"""The benchmark scripts run end to end in their quick mode (full runs: ``make bench``)."""

import importlib.util
import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

# End-to-end runs: `make test-integration` (CI runs it after `make test`).
pytestmark = pytest.mark.integration

# gpu_check.py's smoke mode has its own end-to-end test, with its stages' checks
# (tests/test_gpu_check.py): it runs once.
BENCHMARKS = sorted(
    path
    for path in (Path(__file__).resolve().parents[1] / "benchmarks").glob("[!_]*.py")
    if path.stem != "gpu_check"
)


def check_online_bandits(text):
    # The MNIST bandit: every agent's row in each table, rewards at most the rounds played.
    agents = ("LoFi-TS", "compiled LoFi-TS", "LoFi ε-greedy", "linear TS", "neural ε-greedy")
    for agent in agents + ("uniform random",):
        assert text.count(f"| {agent}") == 3, agent
    table = text.split("## Cumulative reward after")[1].split("##")[0]
    rewards = [
        float(row.split("|")[2])
        for row in table.splitlines()
        if row.startswith("| ") and "agent" not in row
    ]
    assert len(rewards) == 6 and all(0 <= r <= 200 for r in rewards)
    # The compiled agent draws what the eager one draws: the same game, to round-off.
    assert abs(rewards[0] - rewards[1]) <= 2, rewards


def check_online(text):
    # Issue 16's reproductions: every method's row in each of the four tables, the MNIST
    # misclassification / ECE cells in [0, 1], and the posteriors cross-check when present.
    sections = text.split("\n## ")[1:]
    assert [s[:2] for s in sections] == ["1.", "2.", "3.", "4.", "5."]
    moons, mnist, uci, speed, compiled = sections
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
    # Section 5: each filter eager, compiled and through update_many; dynamax's EKF (when
    # installed) agreeing with our compiled full-covariance filter.
    for label in ("BONG full (EKF)", "BONG diag", "LoFi rank 5"):
        for mode in (
            "eager, one at a time",
            "compiled, one at a time",
            "compiled, update_many (with predictions), unroll 1",
            "compiled, update_many (with predictions), unroll 4",
        ):
            assert f"| 65 | {label} | {mode}" in compiled, (label, mode)
    if "dynamax not installed" not in compiled:
        assert "| 65 | dynamax `extended_kalman_filter` (jit) |" in compiled
        gap = float(compiled.split("differ by at most ")[1].split(" ")[0])
        assert gap < 1e-3
        # The diagonal and LoFi families written out in JAX: the same filters as ours
        # (LoFi over the stream; the diagonal one, whose mean runs far on this network,
        # after its first update).
        for label in ("diagonal", "LoFi rank 5"):
            assert f"| 65 | JAX {label}, written out (jit) |" in compiled, label
        lofi = float(compiled.split("LoFi rank 5 ")[-1].split(" ")[0])
        first = float(compiled.split("the diagonal family's by ")[1].rstrip().split()[0][:-1])
        assert lofi < 1e-3 and first < 1e-5, (lofi, first)


def check_bsts_selection(text):
    # Both variants of every selection the model has (today's model without the keyword
    # runs ssvs only and says point_mass was not run); inclusion probabilities and coverage
    # fractions in [0, 1], R-hat and fit time positive.
    from pyro_ext.models.bsts import RetailBSTS

    has_keyword = "selection" in inspect.signature(RetailBSTS).parameters
    selections = ("ssvs", "point_mass") if has_keyword else ("ssvs",)
    if not has_keyword:
        assert "Not run: point_mass" in text
    table = text.split("## Selection, coverage, convergence, time")[1].split("\n## ")[0]
    rows = [r.split("|")[1:-1] for r in table.splitlines() if r.startswith("| ")][1:]
    assert [(r[0].strip(), r[1].strip()) for r in rows] == [
        (sel, v) for sel in selections for v in ("RF", "RA")
    ]

    def number(cell):
        return float(cell.strip().strip("*").split()[0])

    for row in rows:
        assert row[2].strip() == "1", row  # one seed
        for cell in row[3:12]:
            if cell.strip() != "n/a":
                assert 0 <= number(cell) <= 1, row
        assert number(row[3]) >= 0 and number(row[4]) >= 0
        assert number(row[12]) > 0.9, row  # split-R-hat
        assert all(float(v) > 0 for v in row[13].split(" / ")), row
    assert "## The simulated truths" in text and "| 100 |" in text
    # The exact oracles: each one's row per variant with probabilities in [0, 1], and the
    # grid of priors of the oracle of the model's form.
    oracles = text.split("## What any method could reach: exact oracles")[1]
    for variant in ("RF", "RA"):
        for structure in ("all known", "level unknown", "the model's form"):
            row = next(
                r
                for r in oracles.splitlines()
                if r.startswith(f"| oracle: {structure} | {variant} |")
            )
            for cell in row.split("|")[4:8]:
                if cell.strip() != "n/a":
                    assert 0 <= number(cell) <= 1, row
    grid = [r for r in oracles.split("both targets")[-1].splitlines() if r.startswith("| ")]
    assert len(grid) == 24  # 4 expected model sizes x 3 slab sds x 2 seasonals


def check_bsts_peers(text):
    # Both data sets, each with a row per RetailBSTS selection, the thesis' goodwill and the
    # peers (PyMC-Marketing as "not installed" where it is not); holdout MAPEs that are
    # numbers; the ROAS data's truth row beside the estimates.
    sections = text.split("\n## ")[1:]
    assert [s.split(":")[0] for s in sections] == [
        "Robyn `dt_simulated_weekly`",
        "PyMC-Marketing `mmm_roas_data`",
    ]
    for section in sections:
        summary, contributions = section.split("Channel contributions")
        rows = [r for r in summary.splitlines() if r.startswith("| ") and "| method |" not in r]
        methods = [r.split("|")[1].strip() for r in rows]
        assert methods == [
            'RetailBSTS `selection="point_mass"`',
            'RetailBSTS `selection="ssvs"`',
            'RetailBSTS `selection="point_mass"`, `**THESIS_MODEL` (the thesis\' model)',
            "PyMC-Marketing `MMM` (NUTS)",
            "statsmodels `UnobservedComponents` (MLE)",
        ]
        for row in rows:
            if "PyMC" in row and "not installed" in row:
                continue
            cell = row.split("|")[2].strip()
            assert cell.endswith(" %") and 0 <= float(cell[:-2]) < 1000, row
        for method in methods:
            assert f"| {method} |" in contributions, method
    assert "| **truth** | " in sections[1] and "| **truth** | " not in sections[0]


def check_first_try(text):
    # Every start's rows and both baselines; the default start (declared by the wrapped
    # network) beats predicting the mean at both step sizes, where it used to do far worse.
    rows = {
        (row.split("|")[1].strip(), row.split("|")[2].strip()): row.split("|")[3].strip()
        for row in text.splitlines()
        if row.startswith("| ") and "start |" not in row
    }
    mean = float(rows[("predict the training mean", "-")])
    assert float(rows[("ridge regression (LOO penalty)", "-")]) < mean
    for step in ("1e-04", "1e-03"):
        assert float(rows[("default (the network's declared start)", step)]) < mean, step
        assert ("init_to_uniform (Pyro's default, the package's before)", step) in rows
    assert any(label == "default start, tune_step_size's pick" for label, _ in rows)


def check_ngvi(text):
    # UCI: every method's row with a finite test LL and RMSE, and a validation search of
    # each VI method's own (VOGN included); MNIST: each method's accuracy / NLL / ECE after
    # the quick run's epoch, the target's verdict, and the parts of a step with the floor.
    uci, mnist = text.split("\n## ")[1:3]
    for method in ("IVON (ours)", "VOGN (ours)", "Bayes-by-backprop", "SGLD", "Adam+NR"):
        row = next(r for r in uci.splitlines() if r.startswith(f"| yacht | {method} |"))
        ll, rmse = (float(cell.strip()) for cell in row.split("|")[4:6])
        assert ll == ll and 0 < rmse < 1e3, row
    assert "\nRefits: " in uci  # the finite-failure refits are listed, or "none."
    search = uci.split("### Validation search")[1]
    for method in ("IVON (ours)", "VOGN (ours)", "Bayes-by-backprop"):
        assert f"| yacht | {method} | lr " in search, method
    for method in ("IVON (ours)", "VOGN (ours)"):  # the clip stage ran for both
        row = next(r for r in search.splitlines() if r.startswith(f"| yacht | {method} |"))
        assert ", clip 3: " in row and ", clip 1: " in row, row
    for method in ("IVON (ours)", "IVON (`ivon-opt`)", "Bayes-by-backprop", "Adam (MAP)"):
        row = next(r for r in mnist.splitlines() if r.startswith(f"| {method} |"))
        if "not installed" in row:
            continue
        # "mean ± se" over the quick run's seeds
        accuracy, nll, ece = (float(v.split("±")[0]) for v in row.split("|")[2].split(" / "))
        assert 0 <= accuracy <= 1 and nll > 0 and 0 <= ece <= 1, row
    assert "- after 1 epoch(s): **target " in mnist
    assert "(IVON's, paired over 2 seeds: NLL − MAP's " in mnist  # quick runs two seeds
    assert "| floor of any IVON step: forward + backward, then D normals |" in mnist


def check_bsts_attribution(text):
    # Both simulators x every model with errors, sign errors, coverage and the lag column;
    # the default's lag came from the evidence (a lag, 0 or 1, per fit in the detail table).
    # PyMC-Marketing's row has its figures where it is installed and says so where not.
    table = text.split("## Contributions over the training weeks against the truth")[1]
    table = table.split("\n## ")[0]
    rows = [r.split("|")[1:-1] for r in table.splitlines() if r.startswith("| ")][1:]
    # true_decay (the decay rate's prior at the truth) needs the project's one shared rate.
    assert [(r[0].strip(), r[1].strip()) for r in rows] == [
        (sim, model)
        for sim in ("thesis", "adstock")
        for model in (
            "default",
            "thesis",
            "saturation",
            "lift_test",
            "shared_carryover",
            "true_decay",
            "pymc_marketing",
        )
        if not (sim == "adstock" and model == "true_decay")
    ]
    for row in rows:
        if row[2].strip() == "not installed":
            assert row[1].strip() == "pymc_marketing", row
            continue
        assert row[2].strip().endswith("(quick)"), row
        errors = row[3].strip()
        assert errors == "-" or all(v.endswith("%") for v in errors.split(" / ")), row
        signs, of = row[4].split(" of ")
        assert 0 <= int(signs) <= int(of), row
        assert 0 <= float(row[5].split("%")[0]) <= 100, row
        assert row[6].strip() == "none" or "%" in row[6], row
        if row[1].strip() == "thesis":
            assert row[7].strip() == "fixed 1", row
    detail = text.split("## Every fit")[1].split("\n## ")[0]
    fits = [
        r.split("|")
        for r in detail.splitlines()
        if r.startswith("| ") and "seed" not in r and "pymc_marketing" not in r
    ]
    assert fits and {r[4].strip() for r in fits} <= {"0", "1"}
    # Each of our fits' decay rates, one per channel with the truth, in [0, 1].
    for r in fits:
        pairs = r[6].strip().split(", ")
        assert len(pairs) == 5, r
        for pair in pairs:
            fitted, true = pair.split(" (")
            assert 0 <= float(fitted) <= 1 and 0 <= float(true.rstrip(")")) <= 1, r
    # The missed intervals against the decay rate: a row per simulator x our model.
    missed = text.split("## Missed intervals and the decay rate")[1]
    missed = missed.split("\n## ")[0]
    rows = [r.split("|")[1:-1] for r in missed.splitlines() if r.startswith("| ")][1:]
    assert len(rows) == 11  # 5 models x 2 simulators, and true_decay on the project's
    for row in rows:
        count, of = row[2].split(" of ")
        assert 0 <= int(count) <= int(of), row
    # The saturation curve's ELBO against the linear default's, per simulator.
    evidence = text.split("## The saturation curve's evidence")[1].split("\n## ")[0]
    rows = [r.split("|")[1:-1] for r in evidence.splitlines() if r.startswith("| ")][1:]
    assert [r[0].strip() for r in rows] == ["thesis", "adstock"]
    for row in rows:
        larger, of = row[2].split(" of ")
        assert 0 <= int(larger) <= int(of) == int(row[1]), row


def check_vis_state_space(text):
    # Table 2.6 under the thesis' protocol is one deterministic run of the author's code
    # (quick or not): it gives the thesis' numbers, and the mended seasonal block does not.
    table = text.split("### Under the thesis' protocol: the author's code")[1]
    rows = {r.split("|")[1].strip(): r.split("|")[2:-1] for r in table.splitlines()[4:8]}
    paper_0, paper_1, author_0, author_1, mended_0, mended_1 = (float(v) for v in rows["MAE"])
    assert (author_0, author_1) == (0.271, 0.241)
    assert abs(author_0 - paper_0) < 0.005 and abs(author_1 - paper_1) < 0.005
    assert mended_0 < 0.1 and mended_1 < 0.1
    assert [float(v) for v in rows["predictive entropy"][2:4]] == [2.537, 2.401]


def check_vis_vae(text):
    # Every MNIST row has both scores: ours (IS) and the author's (not a bound).
    table = text.split("## Test log-likelihood")[1].split("\n## ")[0]
    rows = [r.split("|")[1:-1] for r in table.splitlines() if r.startswith("| MNIST |")]
    assert len(rows) == 4
    for row in rows:
        ours, author = float(row[3]), float(row[4])
        assert ours < 0 and author < 0, row


def check_vis_cvae(text):
    # Every (T_ref, T_inf) row has an accuracy by eq. (2.15) and by the author's rule.
    table = text.split("## Test accuracy")[1].split("\n## ")[0]
    rows = [r.split("|")[1:-1] for r in table.splitlines() if r.startswith("| ")][1:]
    assert len(rows) == 4
    for row in rows:
        for cell in (row[3], row[4]):
            assert 0 <= float(cell.split("%")[0].split("±")[0]) <= 100, row


def check_ara_spam(text):
    # Table 3.1 both ways: each classifier's clean and tainted accuracy under our protocol
    # and under the authors' code's, with the thesis' column beside each.
    for heading in ("## Table 3.1:", "## Table 3.1 under the thesis' protocol"):
        table = text.split(heading)[1].split("\n## ")[0]
        rows = [r.split("|")[1:-1] for r in table.splitlines() if r.startswith("| ")][1:]
        assert [r[0].strip() for r in rows] == [
            "Naive Bayes",
            "Logistic reg. (L1)",
            "Neural net (2 layers)",
            "Random forest",
        ], heading
        for row in rows:
            clean, tainted = (float(row[i].split("±")[0]) for i in (1, 3))
            assert 0.5 < clean <= 1 and 0 <= tainted <= clean + 0.05, row


def check_hmm_fit(text):
    # The same start against hmmlearn and against dynamax's fit_em: a row per family in each,
    # and the Poisson and categorical fits reach dynamax's log-likelihood (flat priors there;
    # its Gaussian emissions keep a weak prior, so that row is not compared).
    table = text.split("## The same start, to convergence")[1].split("\n## ")[0]
    for family in ("gaussian", "poisson", "categorical"):
        assert f"| {family} |" in table, family
    table = text.split("against dynamax")[1].split("\n## ")[0]
    if importlib.util.find_spec("dynamax") is None:  # not in the test extra: the bench one
        assert "dynamax is not installed here" in table
        return
    for family in ("poisson", "categorical"):
        row = next(r for r in table.splitlines() if r.startswith(f"| {family} |"))
        low, high = (float(v) for v in row.split("|")[2].split(" / "))
        assert -1e-2 < low <= high < 1e-2, row


def check_bsts_delta_bias(text):
    # One row per variant of the sales, each with a coverage count of its one seed and an
    # error of delta inside (-1, 1); the per-seed table holds seed 100's four intervals.
    table = text.split("## Coverage and error of delta")[1].split("\n## ")[0]
    rows = [r.split("|")[1:-1] for r in table.splitlines() if r.startswith("| ")][1:]
    assert [r[0].strip() for r in rows] == [
        "simulator",
        "model_form",
        "model_form + bumps",
        "simulator, noise redrawn",
    ]
    for row in rows:
        assert row[1].strip() in ("0 of 1", "1 of 1"), row
        assert -1 < float(row[3]) < 1, row
    seed_row = next(r for r in text.splitlines() if r.startswith("| 100 |"))
    assert seed_row.count("[") == 4


def check_kalman_gradient(text):
    # The one-pass table: a row per model (the script raises before timing where the two
    # gradients disagree), each with its state size and scales.
    table = text.split("## fit_dlm's evaluation")[1].split("\n## ")[0]
    rows = [r.split("|")[1:-1] for r in table.splitlines() if r.startswith("| ")][1:]
    assert [(r[0].strip(), r[1].strip(), r[2].strip()) for r in rows] == [
        ("local level", "1", "2"),
        ("trend + 12 seasons", "13", "4"),
    ]
    for row in rows:
        assert float(row[-1]) > 0, row


def check_lofi_projection(text):
    # Ours is within 5e-6 of the float64 projection at every rank, the float32 Gram matrix
    # (the variant not taken) is not at rank 2, and both speed rows were timed.
    table = text.split("## Accuracy in float32")[1].split("\n## ")[0]
    rows = [r.split("|")[1:-1] for r in table.splitlines() if r.startswith("| ")][1:]
    for row in rows:
        if row[1].strip().startswith("ours"):
            assert float(row[2]) < 5e-6 and float(row[3]) < 2e-7, row
        if row[1].strip().startswith("Gram matrix in float32") and row[0].strip() == "2":
            assert float(row[2]) > 5e-6, row
    speed = text.split("## Speed, compiled")[1].split("\n## ")[0]
    assert len([r for r in speed.splitlines() if r.startswith("| ")]) == 3  # header, 2 rows


def check_online_profile(text):
    # The quick run profiles LoFi rank 10 at D = 65: the profiler found its factorisations
    # and the one product that forms the capacitance and the Gram matrix, each timed; the
    # graph is a part of the call, and the split adds up to it.
    libraries = text.split("## The library calls inside each graph")[1]
    rows = [r.split("|")[1:-1] for r in libraries.splitlines() if r.startswith("| LoFi")]
    found = {(r[1].strip(), r[2].strip()): float(r[5]) for r in rows}
    assert found[("_linalg_eigh", "11×11")] > 0
    assert found[("linalg_cholesky_ex", "11×11")] > 0
    assert found[("mm", "22×65 · 65×11 · 22×11")] > 0
    summary = text.split("## Per call")[1].split("\n## ")[0]
    (row,) = [r.split("|")[1:-1] for r in summary.splitlines() if r.startswith("| LoFi")]
    call = float(row[1].split("/")[0])
    graph, libraries_us, kernels, rest, outside = (
        float(row[i].split("(")[0]) for i in (2, 3, 4, 5, 6)
    )
    assert 0 < graph < call and outside > 0
    # The generated kernels were found and timed (inductor's module layout, which the script
    # reads, is as it expects), and the split adds up.
    assert int(row[4].split("(")[1].rstrip(") ")) > 0 and kernels > 0
    assert abs(libraries_us + kernels + rest - graph) < 0.2


#: content checks of a quick run's results, beyond "a table was written", by script name
CONTENT_CHECKS = {
    "ara_spam": check_ara_spam,
    "bsts_attribution": check_bsts_attribution,
    "bsts_delta_bias": check_bsts_delta_bias,
    "bsts_peers": check_bsts_peers,
    "first_try": check_first_try,
    "hmm_fit": check_hmm_fit,
    "kalman_gradient": check_kalman_gradient,
    "lofi_projection": check_lofi_projection,
    "ngvi": check_ngvi,
    "bsts_selection": check_bsts_selection,
    "online": check_online,
    "online_bandits": check_online_bandits,
    "online_profile": check_online_profile,
    "vis_cvae": check_vis_cvae,
    "vis_state_space": check_vis_state_space,
    "vis_vae": check_vis_vae,
}


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


def test_uci_compare_reads_two_reports(tmp_path):
    # `uci.py --compare` (the README's comparisons between UCI runs): a copy of the committed
    # report with one mean test LL lowered by 1 nat, against the report itself.
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "uci.py"
    report = script.parent / "results" / "uci.md"
    lines = report.read_text().splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("| bostonHousing | SGLD |"))
    cells = lines[first].split("|")
    mean, error = cells[4].split("±")
    cells[4] = f" {float(mean) - 1:.3f} ±{error}"
    lines[first] = "|".join(cells)
    lowered = tmp_path / "lowered.md"
    lowered.write_text("\n".join(lines))
    result = subprocess.run(
        [sys.executable, str(script), "--output", str(lowered), "--compare", str(report)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "test LL higher on 0 of" in result.stdout
    assert "from -1.00 (bostonHousing SGLD) to +0.00" in result.stdout, result.stdout
    # A report that is not there is refused in one line, naming it.
    missing = subprocess.run(
        [sys.executable, str(script), "--output", str(lowered), "--compare", "HEAD:nope.md"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert missing.returncode != 0 and "Traceback" not in missing.stderr
    assert "--compare HEAD:nope.md: git show could not read it" in missing.stderr
