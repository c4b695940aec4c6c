"""
Channel contributions of ``RetailBSTS`` against known truths: what each channel's spend
added to sales over the training weeks (``RetailBSTS.channel_contributions``, the
counterfactual "channel switched off"), by the package default and by the thesis' model,
on two simulator families, over many seeds.

Simulators (each seed draws a new truth):

1. ``thesis``: the project's simulator, ``simulate_retail(num_weeks, seed,
   random_truth=True)``: the thesis' goodwill (one decay rate for every channel, last
   week's spend), 2 to 5 effective channels of random size (the others have ``q = 0``),
   covariates of random effect, Gaussian noise.  Truth: ``truth["channel_contribution"]``.
2. ``adstock``: a marketing-mix simulator of another family, written here: the same
   spend, covariates, trend and seasonal as ``simulate_retail`` draws for the seed, but
   media enter as geometric adstock that includes the current week,
   ``a_{i,t} = u_{i,t} + alpha_i a_{i,t-1}`` with a carry-over ``alpha_i`` per channel
   drawn from [0.1, 0.8], started at its steady state under the channel's mean spend,
   through a mild saturation ``f_i(a) = a / (1 + a / (3 abar_i))`` (at the mean adstock
   ``abar_i`` a quarter below linear), with positive effects ``beta_i f_i``, each channel's
   contribution sized to an sd over the weeks of U(0.5, 2) noise sds.  Truth: for each
   channel, the sales minus the sales with its spend within the data switched off (the
   adstock from before the data decays on), ``beta_i (f_i(a_{i,t}) - f_i(alpha_i^{t+1}
   a_{i,0}))`` summed over the training weeks.
3. ``thesis_even_spend`` (a diagnosis, drawn only when ``--simulators`` names it): the
   project's simulator with ``seasonal_spend=False``, the same draws but ``online`` and
   ``search`` spend no longer rising with the Christmas and summer peaks in demand, so that
   no channel's spend is confounded with the season.

Models: ``default`` is ``RetailBSTS()`` with every argument at its default (variant RF,
Student-t noise, ``spend_lag="auto"`` chosen by the evidence, ``carryover=
"per_channel"``, ``effects="non_negative"``, point-mass selection) and ``fit(sales, spend,
covariates, seed=s)``; ``thesis`` is ``RetailBSTS(**THESIS_MODEL)`` (lag 1, one decay rate,
real-valued ``q``: eq. (1.4)), the rest the same; ``saturation`` is the default with
``saturation="hill"`` (each channel's stock through a concave Hill curve whose bend is
sampled; the adstock simulator's own family, the thesis simulator's linear goodwill at a
bend of 0); ``lift_test`` is the default with ``roas_prior`` on the channel of the largest
true contribution, as a lift test would give it: a log-normal of mean the true ROAS times
``exp(N(0, 0.2^2))`` (the test's error, drawn with the seed) and sd a quarter of that mean;
``shared_carryover`` is the default with ``carryover="shared"`` (one decay rate for every
channel, as the project's simulator has it, the rest of the default unchanged);
``true_decay`` is the default with the decay rate's prior concentrated at the simulated
rate (``delta_prior=(400 delta, 400 (1 - delta))``, sd about 0.02; the project's
simulators only, whose one rate is every channel's): what the contributions would be if
the data pinned the carry-over.
Every channel is forced in (variant RF).  ``pymc_marketing`` is PyMC-Marketing's ``MMM`` set
up as ``benchmarks/bsts_peers.py`` sets it up (``GeometricAdstock(l_max=8)``, which
includes the current week, ``LogisticSaturation()``, yearly seasonality with 2 Fourier
modes, the covariates standardised plus a linear trend as controls, default priors, PyMC's
NUTS defaults of 2 chains x (1000 + 1000) run one after the other), fitted on the same
weeks; its contribution is ``channel_contribution_original_scale`` summed over the weeks,
which, as the truth, is the spend within the data switched off (its adstock starts at 0
before the data).  Its row reads "not installed" when ``pymc_marketing`` cannot be
imported (the ``bench`` extra installs it).

Reported per simulator x model, over channels x seeds: the relative error of the
posterior mean contribution (median / mean / p90 / max of its absolute value) for the
channels whose true contribution is at least 10 % of media's total (the issue's target: a
median at most 20 %), the sign errors (posterior mean of the sign opposite to a true
contribution that is at least 10 % of the total), the coverage of the 90 % central
credible intervals over the channels with an effect (target 80-95 %), the share of the
estimated media total given to channels without effect (the project's simulator has some;
a central interval of a non-negative contribution cannot hold 0), and for ``default`` how
often the
evidence chose the lag each simulator has (thesis: 1; adstock: 0).  A channel's ROAS is
its contribution over its own training spend, the same for the truth and the estimate,
so its relative error is the contribution's and is not repeated.

Run from the repository root::

    python benchmarks/bsts_attribution.py               # 10 seeds of each simulator
    python benchmarks/bsts_attribution.py --jobs 2      # the fits on two processes
    python benchmarks/bsts_attribution.py --budget short  # 100 + 100 draws, no extension
    python benchmarks/bsts_attribution.py --quick       # smoke test (tiny sampler)
    python benchmarks/bsts_attribution.py --models pymc_marketing --seeds 5 --merge

``--merge`` keeps the fits of the models not rerun from the last run's records
(``results/bsts_attribution.json``, written beside the report), so that one model can be
rerun, or run on fewer seeds, without refitting the others; every row of the table says
the budget and seeds its fits had.
"""

import os

# One core per fit for every method (numpy / pytensor BLAS as well as torch); set before
# numpy loads.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import json  # noqa: E402
import math  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from concurrent.futures import ProcessPoolExecutor  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    REPO,
    argument_parser,
    command_line_args,
    markdown,
    spread,
    write_report,
)

RESULTS = REPO / "benchmarks" / "results" / "bsts_attribution.md"
NUM_WEEKS = 104
SIMULATORS = ("thesis", "adstock", "thesis_even_spend")
# What a plain run draws from: thesis_even_spend is a diagnosis (--simulators).
DEFAULT_SIMULATORS = ("thesis", "adstock")
MODELS = (
    "default",
    "thesis",
    "saturation",
    "lift_test",
    "shared_carryover",
    "true_decay",
    "pymc_marketing",
)
# Models that need one decay rate shared by every channel in the truth (not "adstock").
SHARED_DECAY_ONLY = ("true_decay",)
LIFT_TEST_ERROR, LIFT_TEST_SD = 0.2, 0.25  # log-scale error of the test; prior sd / mean
SIMULATED_LAG = {"thesis": 1, "adstock": 0, "thesis_even_spend": 1}
SHARE = 0.1  # channels whose contribution is at least this share of media's total
INTERVAL = 0.9


def adstock_data(seed, num_weeks):
    """The ``adstock`` simulator of the docstring: ``(sales, spend, covariates, truth,
    decay)`` with ``truth`` the contribution of each channel over all the weeks, ``(T, k)``,
    and ``decay`` each channel's true decay rate ``1 - alpha_i`` (a list)."""
    import torch

    from pyro_ext.models.bsts import simulate_retail

    base = simulate_retail(num_weeks=num_weeks, seed=seed, goodwill_scale=0.0, q=[0.0] * 5)
    spend = base.spend.double()
    T, k = spend.shape
    g = torch.Generator().manual_seed(10_000 + seed)
    alpha = 0.1 + 0.7 * torch.rand(k, generator=g, dtype=torch.float64)
    effect = 0.5 + 1.5 * torch.rand(k, generator=g, dtype=torch.float64)
    start = spend.mean(0) / (1 - alpha)  # steady state of the mean spend
    stock, before = torch.zeros(T, k, dtype=torch.float64), torch.zeros(T, k, dtype=torch.float64)
    a, pre = start, start
    for t in range(T):
        a = alpha * a + spend[t]
        pre = alpha * pre
        stock[t], before[t] = a, pre
    half = 3 * stock.mean(0)

    def saturate(x):
        return x / (1 + x / half)

    unit = saturate(stock)
    beta = effect * base.truth["noise_scale"] / unit.std(0)
    media = unit * beta
    truth = (saturate(stock) - saturate(before)) * beta
    # base.sales has no goodwill (q = 0, goodwill_scale 0): add the media.
    sales = base.sales.double() + media.sum(-1)
    return sales, spend, base.covariates.double(), truth, (1 - alpha).tolist()


def thesis_data(seed, num_weeks, seasonal_spend=True):
    from pyro_ext.models.bsts import simulate_retail

    d = simulate_retail(
        num_weeks=num_weeks, seed=seed, random_truth=True, seasonal_spend=seasonal_spend
    )
    truth = d.truth["channel_contribution"].double()
    decay = [d.truth["delta"]] * d.spend.shape[1]  # one rate for every channel
    return d.sales.double(), d.spend.double(), d.covariates.double(), truth, decay


# --budget short: fewer draws than fit's defaults and no R-hat driven extension.
SHORT = dict(num_samples=100, warmup_steps=100, rhat_target=None)


def lift_test(truth, spend, seed):
    """``roas_prior`` for the channel of the largest true contribution: what a lift test of
    log-scale error ``LIFT_TEST_ERROR`` would report, with sd ``LIFT_TEST_SD`` of it."""
    import torch

    contribution = truth.sum(0)
    i = int(contribution.argmax())
    true_roas = float(contribution[i]) / float(spend[:, i].sum())
    noise = torch.randn((), generator=torch.Generator().manual_seed(10_000 + seed))
    measured = true_roas * math.exp(LIFT_TEST_ERROR * float(noise))
    return {i: (measured, LIFT_TEST_SD * measured)}


def run_pymc(simulator, seed, sales, spend, covariates, truth, quick):
    """PyMC-Marketing's ``MMM`` on the simulated weeks (None when it is not installed)."""
    from importlib.metadata import version

    import numpy as np
    import torch
    from bsts_peers import fit_pymc_mmm, import_pymc_marketing, pymc_contributions, pymc_rhat

    try:
        import_pymc_marketing()
    except ImportError:
        return None
    T, k = spend.shape
    dates = np.datetime64("2022-01-03") + 7 * np.arange(T)  # Mondays, as the simulator's weeks
    channels = [f"channel_{i}" for i in range(k)]
    controls = {f"covariate_{j}": covariates[:, j].numpy() for j in range(covariates.shape[1])}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mmm, idata, _, _, seconds = fit_pymc_mmm(
            dates, spend.numpy(), channels, controls, sales.numpy(), T, seed, quick
        )
    draws = torch.as_tensor(pymc_contributions(idata, channels))
    return dict(
        draws=draws,
        lag=None,
        evidence=None,
        rhat=pymc_rhat(mmm, idata),
        seconds=seconds,
        warnings=sorted({type(w.message).__name__ for w in caught}),
        divergences=int(idata.sample_stats["diverging"].sum()),
        package=", ".join(f"{p} {version(p)}" for p in ("pymc-marketing", "pymc")),
    )


def run_one(task):
    """One fit: ``(simulator, model, seed, num_weeks, quick, budget)`` -> a dict (None for
    a model whose package is not installed)."""
    simulator, model_name, seed, num_weeks, quick, budget = task
    import torch

    from pyro_ext.models.bsts import THESIS_MODEL, RetailBSTS

    torch.set_num_threads(1)
    if simulator == "adstock":
        data = adstock_data(seed, num_weeks)
    else:
        data = thesis_data(seed, num_weeks, seasonal_spend=simulator == "thesis")
    sales, spend, covariates, truth, true_decay = data
    if model_name == "pymc_marketing":
        fit = run_pymc(simulator, seed, sales, spend, covariates, truth, quick)
        if fit is None:
            return None
    else:
        model = {
            "default": RetailBSTS,
            "thesis": lambda: RetailBSTS(**THESIS_MODEL),
            "saturation": lambda: RetailBSTS(saturation="hill"),
            "lift_test": lambda: RetailBSTS(roas_prior=lift_test(truth, spend, seed)),
            "shared_carryover": lambda: RetailBSTS(carryover="shared"),
            # The decay rate's prior concentrated at the truth (sd about 0.02).
            "true_decay": lambda: RetailBSTS(
                delta_prior=(400 * true_decay[0], 400 * (1 - true_decay[0]))
            ),
        }[model_name]()
        options = (
            dict(
                num_samples=10,
                warmup_steps=10,
                num_particles=2,
                map_init_steps=20,
                rhat_target=None,
            )
            if quick
            else (SHORT if budget == "short" else {})
        )
        start = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model.fit(sales, spend, covariates, seed=seed, **options)
        delta = model.samples["delta"]
        fit = dict(
            draws=model.channel_contributions(),  # (n, k)
            # posterior mean decay rate: one per channel, or the shared one
            decay=delta.reshape(delta.shape[0], -1).double().mean(0).tolist(),
            lag=model.spend_lag,
            evidence=model.spend_lag_evidence,
            rhat=max(float(r.max()) for r in model.rhat().values()),
            seconds=time.perf_counter() - start,
            warnings=sorted({type(w.message).__name__ for w in caught}),
            divergences=None,
        )
    draws = fit.pop("draws")
    tails = torch.tensor([(1 - INTERVAL) / 2, (1 + INTERVAL) / 2], dtype=torch.float64)
    low, high = torch.quantile(draws.double(), tails, dim=0)
    return dict(
        simulator=simulator,
        model=model_name,
        seed=seed,
        budget="quick" if quick else budget,
        weeks=num_weeks,
        truth=truth.sum(0).tolist(),
        true_decay=true_decay,
        mean=draws.double().mean(0).tolist(),
        low=low.tolist(),
        high=high.tolist(),
        **fit,
    )


def divergences(runs):
    """`` (N divergences, M of K fits)`` for NUTS fits (PyMC-Marketing's), else empty."""
    counts = [r["divergences"] for r in runs if r.get("divergences") is not None]
    if not counts:
        return ""
    hit = sum(c > 0 for c in counts)
    return f" ({sum(counts):,} divergences; in {hit} of {len(counts)} fits)"


def large_channels(run):
    """``(truth, posterior mean)`` of one fit's channels whose true contribution is at
    least ``SHARE`` of media's total (those the targets are about)."""
    total = sum(abs(t) for t in run["truth"])
    return [
        (t, m)
        for t, m in zip(run["truth"], run["mean"])
        if t != 0 and total > 0 and abs(t) >= SHARE * total
    ]


def seed_spread_rows(results, resamples=2000):
    """Per simulator x model with at least 10 seeds: the median absolute relative error
    (the target's statistic) over the first and the second half of the seeds and over all,
    and a 90 % bootstrap interval of the median that resamples whole seeds (a seed's
    channels share its fit), with a fixed generator."""
    rows = []
    for simulator in SIMULATORS:
        for model in MODELS:
            runs = sorted(
                (r for r in results if r["simulator"] == simulator and r["model"] == model),
                key=lambda r: r["seed"],
            )
            if len(runs) < 10:
                continue
            per_seed = [[abs(m - t) / abs(t) for t, m in large_channels(r)] for r in runs]
            half = len(runs) // 2
            generator = random.Random(0)
            medians = sorted(
                statistics.median(
                    [
                        e
                        for i in generator.choices(range(len(runs)), k=len(runs))
                        for e in per_seed[i]
                    ]
                )
                for _ in range(resamples)
            )
            low, high = medians[int(0.05 * resamples)], medians[int(0.95 * resamples) - 1]
            rows.append(
                [
                    simulator,
                    model,
                    len(runs),
                    f"{statistics.median([e for p in per_seed[:half] for e in p]):.0%}",
                    f"{statistics.median([e for p in per_seed[half:] for e in p]):.0%}",
                    f"{statistics.median([e for p in per_seed for e in p]):.0%}",
                    f"{low:.0%} - {high:.0%}",
                ]
            )
    return rows


def summarise(results, missing=()):
    """The report's sections from the fits ``results``; ``missing`` lists the models whose
    package is not installed (a row each says so)."""
    rows, detail = [], []
    for simulator in SIMULATORS:
        for model in MODELS:
            runs = [r for r in results if r["simulator"] == simulator and r["model"] == model]
            if not runs:
                # Only on the simulators drawn from this time (thesis_even_spend is opt-in).
                if model in missing and any(r["simulator"] == simulator for r in results):
                    rows.append([simulator, model, "not installed", *["-"] * 7])
                continue
            errors, signs, big, covered, channels, nulls = [], 0, 0, 0, 0, []
            for r in runs:
                for t, m, lo, hi in zip(r["truth"], r["mean"], r["low"], r["high"]):
                    if t == 0:
                        # A channel without effect: a central interval of a non-negative
                        # quantity cannot hold 0, so its share of media is reported instead.
                        nulls.append(abs(m) / sum(abs(v) for v in r["mean"]))
                        continue
                    channels += 1
                    covered += lo <= t <= hi
                large = large_channels(r)
                big += len(large)
                errors += [abs(m - t) / abs(t) for t, m in large]
                signs += sum((m > 0) != (t > 0) for t, m in large)
            lags = [r["lag"] for r in runs]
            right = sum(lag == SIMULATED_LAG[simulator] for lag in lags)
            seconds = [r["seconds"] for r in runs]
            budgets = "/".join(sorted({r.get("budget", "short") for r in runs}))
            if model == "thesis":
                lag = "fixed 1"
            elif model == "pymc_marketing":
                lag = "adstock from lag 0"
            else:
                lag = f"{right} of {len(runs)}"
            rows.append(
                [
                    simulator,
                    model,
                    f"{len(runs)} ({budgets})",
                    spread(errors, fmt="{:.0%}") if errors else "-",
                    f"{signs} of {big}",
                    f"{covered / channels:.0%} ({covered} of {channels})",
                    f"{len(nulls)}: {statistics.median(nulls):.1%} / {max(nulls):.1%}"
                    if nulls
                    else "none",
                    lag,
                    f"{max(r['rhat'] for r in runs):.2f}" + divergences(runs),
                    spread(seconds, fmt="{:.0f}"),
                ]
            )
            for r in runs:
                cells = ", ".join(
                    f"{m:,.0f} [{lo:,.0f}, {hi:,.0f}] ({t:,.0f})"
                    for t, m, lo, hi in zip(r["truth"], r["mean"], r["low"], r["high"])
                )
                fitted_lag = "-" if r["lag"] is None else r["lag"]
                detail.append([simulator, model, r["seed"], fitted_lag, cells, decay_cell(r)])
    header = [
        "simulator",
        "model",
        "seeds (budget)",
        f"abs. rel. error, channels >= {SHARE:.0%} of media (median / mean / p90 / max)",
        "sign errors",
        f"{INTERVAL:.0%} interval coverage, channels with an effect",
        "channels without effect: their share of the estimated media total (median / max)",
        "lag chosen as simulated",
        "max R-hat (NUTS: divergences after tuning)",
        "fit s (median / mean / p90 / max)",
    ]
    sections = [
        "## Contributions over the training weeks against the truth\n\n" + markdown(header, rows),
        "## Every fit: posterior mean [90 % interval] (truth) per channel\n\n"
        + markdown(
            [
                "simulator",
                "model",
                "seed",
                "lag",
                "channels",
                "decay rate per channel: posterior mean (truth)",
            ],
            detail,
        ),
    ]
    spread_rows = seed_spread_rows(results)
    if spread_rows:
        sections.append(
            "## The median error's spread over seeds\n\n"
            "The target's statistic, the median absolute relative error of the channels "
            f"above {SHARE:.0%} of media, over each half of the seeds and over all of them, "
            "and a 90 % bootstrap interval of it that resamples whole seeds (2,000 "
            "resamples): how far the median of this many seeds is from the model's own.\n\n"
            + markdown(
                [
                    "simulator",
                    "model",
                    "seeds",
                    "first half of the seeds",
                    "second half",
                    "all",
                    "90 % bootstrap interval over seeds",
                ],
                spread_rows,
            )
        )
    evidence = evidence_rows(results)
    if evidence:
        sections.append(
            "## The saturation curve's evidence\n\n"
            'Whether the marginal likelihood would pick `saturation="hill"` over the '
            "default's linear goodwill: on each seed fitted by both, the saturation model's "
            'ELBO minus the default\'s, each at the lag `spend_lag="auto"` chose (the '
            "AutoNormal bound of `fit`'s lag choice, nats; its Monte Carlo sd is about 1), "
            "beside the two models' median absolute errors of the large channels' "
            "contributions on the same seeds.\n\n"
            + markdown(
                [
                    "simulator",
                    "seeds",
                    "saturation's bound the larger",
                    "saturation's ELBO - default's (median / mean / p90 / max)",
                    "default: median abs. rel. error",
                    "saturation: median abs. rel. error",
                ],
                evidence,
            )
        )
    missed = missed_decay_rows(results)
    if missed:
        sections.append(
            "## Missed intervals and the decay rate\n\n"
            "Channels with an effect, over the fits whose records have the decay rates: "
            "those whose 90 % interval of the contribution missed the truth against those "
            "whose interval held it, with the error of their decay rate's posterior mean "
            "(each channel's own rate, or the shared one). A decay rate too high shrinks the "
            "stock a channel's spend builds (its mean is the mean spend over the rate), and "
            "the contribution with it.\n\n"
            + markdown(
                [
                    "simulator",
                    "model",
                    "missed (of channels with an effect)",
                    "missed below the truth",
                    "decay rate - truth, missed channels (median / mean / p90 / max)",
                    "decay rate - truth, covered channels (median / mean / p90 / max)",
                ],
                missed,
            )
        )
    return sections


def fitted_decay(r):
    """The record's posterior mean decay rate per channel (a shared one repeated)."""
    return r["decay"] * len(r["true_decay"]) if len(r["decay"]) == 1 else r["decay"]


def decay_cell(r):
    """``fitted (true)`` per channel, or ``-`` for records without decay rates."""
    if not r.get("decay"):
        return "-"
    fitted = fitted_decay(r)
    return ", ".join(f"{f:.2f} ({t:.2f})" for f, t in zip(fitted, r["true_decay"]))


def missed_decay_rows(results):
    rows = []
    for simulator in SIMULATORS:
        for model in MODELS:
            runs = [
                r
                for r in results
                if r["simulator"] == simulator and r["model"] == model and r.get("decay")
            ]
            if not runs:
                continue
            missed, covered, below = [], [], 0
            for r in runs:
                fitted = fitted_decay(r)
                for i, t in enumerate(r["truth"]):
                    if t == 0:
                        continue
                    error = fitted[i] - r["true_decay"][i]
                    if r["low"][i] <= t <= r["high"][i]:
                        covered.append(error)
                    else:
                        missed.append(error)
                        below += r["high"][i] < t
            total = len(missed) + len(covered)

            rows.append(
                [
                    simulator,
                    model,
                    f"{len(missed)} of {total}",
                    f"{below} of {len(missed)}",
                    spread(missed, fmt="{:+.2f}") if missed else "-",
                    spread(covered, fmt="{:+.2f}") if covered else "-",
                ]
            )
    return rows


def best_bound(r):
    """The record's ELBO at the lag ``spend_lag="auto"`` chose (nats), or None."""
    evidence = r.get("evidence")
    if not evidence:
        return None
    return max(estimate[0] for estimate in evidence.values())


def evidence_rows(results):
    """Per simulator, the saturation curve's evidence against the linear goodwill's: on
    each seed fitted by both ``default`` and ``saturation``, the difference of their ELBOs
    at the lag each chose, beside their median absolute errors on the same seeds."""
    rows = []
    for simulator in SIMULATORS:
        fits = {
            (r["model"], r["seed"]): r
            for r in results
            if r["simulator"] == simulator and r["model"] in ("default", "saturation")
        }
        seeds = sorted(
            seed
            for model, seed in fits
            if model == "default"
            and ("saturation", seed) in fits
            and best_bound(fits["default", seed]) is not None
            and best_bound(fits["saturation", seed]) is not None
        )
        if not seeds:
            continue
        gaps = [best_bound(fits["saturation", s]) - best_bound(fits["default", s]) for s in seeds]

        def median_error(model):
            errors = []
            for s in seeds:
                r = fits[model, s]
                total = sum(abs(t) for t in r["truth"])
                errors += [
                    abs(m - t) / abs(t)
                    for t, m in zip(r["truth"], r["mean"])
                    if t != 0 and abs(t) >= SHARE * total
                ]
            return f"{statistics.median(errors):.0%}"

        rows.append(
            [
                simulator,
                len(seeds),
                f"{sum(g > 0 for g in gaps)} of {len(seeds)}",
                spread(gaps, fmt="{:+.1f}"),
                median_error("default"),
                median_error("saturation"),
            ]
        )
    return rows


def fit_all(tasks, jobs):
    """Every fit of ``tasks``, each record saying the command that made it, and the models
    whose package is not installed."""
    start = time.perf_counter()
    if jobs > 1:
        with ProcessPoolExecutor(jobs) as pool:
            results = list(pool.map(run_one, tasks))
    else:
        results = [run_one(task) for task in tasks]
    missing = sorted({task[1] for task, r in zip(tasks, results) if r is None})
    results = [r for r in results if r is not None]
    elapsed = time.perf_counter() - start
    cmd = command_line_args()
    command = f"python benchmarks/bsts_attribution.py{(' ' + cmd) if cmd else ''}"
    for r in results:
        print(r["simulator"], r["model"], r["seed"], r["lag"], f"{r['seconds']:.0f}s", flush=True)
        r["command"] = f"`{command}` ({elapsed / 60:.1f} min)"
    return results, missing


def main():
    parser = argument_parser(__doc__, RESULTS, seeds="10 (quick 1)")
    parser.add_argument("--jobs", type=int, default=1, help="processes for the fits")
    parser.add_argument("--weeks", type=int, default=NUM_WEEKS, help="weeks per series")
    parser.add_argument(
        "--models", nargs="+", choices=MODELS, default=list(MODELS), help="which models to fit"
    )
    parser.add_argument(
        "--simulators",
        nargs="+",
        choices=SIMULATORS,
        default=list(DEFAULT_SIMULATORS),
        help="which simulators to draw from",
    )
    parser.add_argument(
        "--budget",
        choices=["default", "short"],
        default="default",
        help="default: fit's own draws (200 + 200, extended while R-hat >= 1.05); short: "
        "100 warm-up + 100 draws per particle, no extension (about 3x cheaper); "
        "PyMC-Marketing always runs its NUTS defaults",
    )
    parser.add_argument(
        "--merge",
        action="store_true",
        help="keep the fits of the (simulator, model) pairs not run now from the records "
        "beside the report (its .json), and report them all",
    )
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="fit nothing: write the report again from the records beside it",
    )
    args = parser.parse_args()
    num_seeds = args.seeds or (1 if args.quick else 10)
    weeks = 60 if args.quick else args.weeks
    tasks = [
        (simulator, model, seed, weeks, args.quick, args.budget)
        for seed in range(num_seeds)
        for simulator in args.simulators
        for model in args.models
        if not (simulator == "adstock" and model in SHARED_DECAY_ONLY)
    ]
    records = args.output.with_suffix(".json")
    if args.report_only:
        results, missing = json.loads(records.read_text()), []
    else:
        results, missing = fit_all(tasks, args.jobs)
        if args.merge and records.exists():
            rerun = {(task[0], task[1]) for task in tasks}
            kept = json.loads(records.read_text())
            results = [r for r in kept if (r["simulator"], r["model"]) not in rerun] + results
        if not args.quick:
            records.parent.mkdir(parents=True, exist_ok=True)
            records.write_text(json.dumps(results, indent=1) + "\n")
    import torch

    commands = {}
    for r in results:
        commands.setdefault(r["command"], set()).add(r["model"])
    made_by = "; ".join(f"{c}: {', '.join(sorted(m))}" for c, m in commands.items())
    # PyMC-Marketing's version where its records have it (the first run's used the pins of
    # the bench extra in constraints.txt: pymc-marketing 0.19.2, pymc 5.28.5).
    packages = sorted(
        {
            r.get("package", "the bench extra's pins")
            for r in results
            if r["model"] == "pymc_marketing"
        }
    )
    if packages:
        made_by += f" (PyMC-Marketing: {'; '.join(packages)})"
    preamble = (
        "# RetailBSTS channel contributions against known truths\n\n"
        f"Mode: {'quick (smoke test)' if args.quick else 'full'}. torch {torch.__version__}, "
        f"1 thread per fit, float64. Generated by {made_by}. "
        f"Seeds x simulators as each row says, "
        f"{'/'.join(str(w) for w in sorted({r['weeks'] for r in results}))} weeks each, "
        "every week a training "
        "week. Protocol in the script's docstring: `default` is `RetailBSTS()` with only the "
        "required arguments, `thesis` is `RetailBSTS(**THESIS_MODEL)`, `saturation` is "
        '`RetailBSTS(saturation="hill")`, `lift_test` is `RetailBSTS(roas_prior=...)` on the '
        "largest channel (a simulated lift test: the true ROAS with a 20 % log-scale error, "
        'prior sd a quarter of it), `shared_carryover` is `RetailBSTS(carryover="shared")`, '
        "`true_decay` is the default with the decay rate's prior at the truth (sd 0.02), "
        "`thesis_even_spend` the project's simulator without seasonal spend, "
        "`pymc_marketing` PyMC-Marketing's `MMM` with NUTS; budget "
        "`default` is `fit`'s own draws, `short` is "
        "`fit(num_samples=100, warmup_steps=100, rhat_target=None)` (8 particles, thinning "
        "2): see the R-hat column. Targets: no sign "
        f"error; median absolute relative error at most 20 % for channels with at least "
        f"{SHARE:.0%} of media's contribution; {INTERVAL:.0%} intervals covering 80-95 % of "
        "the truths."
    )
    write_report(preamble, summarise(results, missing), args.output)


if __name__ == "__main__":
    main()
