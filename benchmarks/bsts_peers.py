"""
``RetailBSTS`` next to its peers on two marketing-mix data sets: PyMC-Marketing's ``MMM``
(geometric adstock + logistic saturation, NUTS) and a ``statsmodels``
``UnobservedComponents`` regression (MLE), all fitted in one run on the same weeks.

Data (``pyro_ext.datasets.load_marketing_mix``):

1. Meta Robyn's simulated weekly data (``"robyn"``, 208 weeks from 2015-11-23): revenue;
   channels tv_S, ooh_S, print_S, facebook_S, search_S; controls competitor_sales_B,
   newsletter, event1, event2 (``benchmarks/bsts.py``'s choice; for ``RetailBSTS`` the events
   are ``holidays``, i.e. forced in).  No ground truth.
2. PyMC-Marketing's ROAS case study (``"pymc_roas"``, 131 weeks from 2021-10-02): sales
   ``y``, channels ``x1``, ``x2``, no controls (as in that notebook: the trend, the seasonal
   and the confounder ``z`` are latent).  The truth is known: normalised geometric adstock
   (``l_max`` 4, alpha 0.3 / 0.5), logistic saturation (lam 1.0 / 2.5), effects 2.0 / 1.5
   x 100, and ``y01`` / ``y02`` are ``y`` with x1 / x2 switched off, so the true incremental
   contribution of channel i over the training weeks is ``sum(y - y0i)`` and its ROAS that
   over the channel's training spend.  The unobserved ``z`` rises with x1's spend, so a
   model without it should overstate x1 (the point of the case study).

Protocol: the last 52 weeks are the holdout, every model is fitted on the weeks before
(Robyn 156, ROAS 79) and forecasts the holdout from the end of training with the holdout's
spend and controls known.  A control that is constant over the training weeks cannot be
estimated and is dropped for every method (Robyn's event2 falls in the holdout, week 179).

- ``RetailBSTS`` (``pyro_ext.models.bsts``): one row per ``selection`` (``"point_mass"``,
  ``"ssvs"``), ``RetailBSTS(selection=s)`` with the package defaults otherwise (variant RF,
  Student-t noise, the spend lag chosen by the evidence, a decay rate per channel, local
  level, 2-harmonic yearly seasonal) and ``fit(method="sgld")`` with the package defaults
  (8 particles, 200 + 200 draws, R-hat driven extension); plus one row with the thesis'
  goodwill, ``**THESIS_MODEL`` (last week's spend, one decay rate; first selection).
  A fit that still diverges after the model's own step-size halving is retried with
  seed + 1000.  Variant RF forces the channels in; the controls are selected with the
  default prior inclusion probability 1/2.  On
  the ROAS data (no controls) the two rows are the same model and the same run; on Robyn
  they differ in how the control coefficients are treated (``"point_mass"``: integrated
  out by the Kalman filter as static regression states; ``"ssvs"``: sampled).
  Forecast: mean over draws of ``RetailBSTS.forecast`` (the k-step forecast; the one-step
  ``one_step_predictions`` needs Gaussian noise and is not used).  Contribution of channel
  i: ``RetailBSTS.channel_contributions()`` (the counterfactual "channel switched off"
  over the training weeks, per posterior draw, original units).  R-hat: ``rhat()``, the
  largest split-R-hat over the static sites with the particles as chains.
- PyMC-Marketing ``MMM`` (``pymc_marketing.mmm.multidimensional.MMM``, the class that
  replaces the deprecated ``pymc_marketing.mmm.MMM``): ``GeometricAdstock(l_max=8)`` (its
  documentation's example; the truth's 4 is not assumed), ``LogisticSaturation()``,
  ``yearly_seasonality=2``, controls standardised with training statistics (MMM does not
  scale controls) plus a linear trend ``t``, default priors; ``fit`` with PyMC's NUTS
  defaults on this 2-core machine (2 chains, 1000 tune, 1000 draws, target_accept 0.8),
  except that the chains run one after the other (``cores=1``) so that every method uses
  one core.  Forecast: mean of ``sample_posterior_predictive(include_last_observations=
  True)``; contribution: ``channel_contribution_original_scale`` summed over the training
  weeks; R-hat: ``arviz.rhat`` over the free random variables.  Fit seconds include
  pytensor's compilation (cached in ``~/.pytensor`` after a first run); the notes give the
  sampling time alone.
- ``statsmodels`` ``UnobservedComponents``: local level + trigonometric yearly seasonal
  (period 52.18, 2 harmonics) + the spends and controls as static regressors, MLE.
  Contribution: coefficient x training spend (no carry-over, no saturation), +- its
  standard error.

Reported per data set x method: holdout MAPE (with the median / mean / p90 / max of the
weekly absolute percentage errors), channel contributions over the training weeks (mean
+- posterior sd) and ROAS = contribution / training spend (against the truth for the ROAS
data), the largest R-hat, and the wall time of the fit.  One seed; PyMC-Marketing rows
read "not installed" when ``pymc_marketing`` cannot be imported.

Run from the repository root::

    python benchmarks/bsts_peers.py           # full: about 11 minutes on one core
    python benchmarks/bsts_peers.py --quick   # smoke test (short series, tiny samplers)

``--quick`` cuts the series (Robyn 70, ROAS 60 weeks, 14-week holdout) and the samplers
(RetailBSTS 20 draws x 4 particles; PyMC 1 chain of 20 + 20); the first PyMC fit on a
machine also compiles pytensor's C code (about a minute, cached afterwards).  Data are
read from ``$PYRO_EXT_DATA``; the report is printed and written to
``benchmarks/results/bsts_peers.md``.
"""

import os

# One core for every method (numpy / pytensor BLAS as well as torch); set before numpy loads.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import math  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from importlib.metadata import version  # noqa: E402
from typing import NamedTuple  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from _common import (  # noqa: E402
    REPO,  # importing _common also sets $PYRO_EXT_DATA's default
    argument_parser,
    command_line_args,
    markdown,
    robust_fit,
    spread,
    write_report,
)

from pyro_ext.datasets import load_marketing_mix  # noqa: E402
from pyro_ext.models.bsts import THESIS_MODEL, RetailBSTS  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "bsts_peers.md"
SELECTIONS = ("point_mass", "ssvs")
ROBYN_CHANNELS = ["tv_S", "ooh_S", "print_S", "facebook_S", "search_S"]
ROBYN_COVARIATES = ["competitor_sales_B", "newsletter", "event1", "event2"]
ROBYN_HOLIDAYS = ["event1", "event2"]
ROAS_CHANNELS = ["x1", "x2"]


class Dataset(NamedTuple):
    name: str
    dates: list
    sales: torch.Tensor  # (T,)
    spend: torch.Tensor  # (T, k)
    channels: list
    covariates: torch.Tensor | None  # (T, p) or None
    covariate_names: list
    holidays: list
    num_train: int
    truth: torch.Tensor | None  # (k,) true contributions over the training weeks
    unit: float  # contributions are shown divided by this
    unit_name: str
    dropped: list  # controls dropped as constant over the training weeks


class Result(NamedTuple):
    method: str
    mape: float
    ape: list  # weekly absolute percentage errors over the holdout
    contributions: torch.Tensor  # (draws, k); for an MLE fit one row, the estimate
    contribution_sd: torch.Tensor | None  # (k,) standard errors of an MLE fit, else None
    rhat: float
    seconds: float
    draws: str
    notes: str


class Skipped(NamedTuple):
    method: str
    reason: str


# ----------------------------------------------------------------------------- data
def load_dataset(name, num_weeks, holdout):
    if name == "robyn":
        d = load_marketing_mix("robyn", dtype=torch.float64)
        V = d.values[:num_weeks]
        sales = V[:, d.columns.index("revenue")]
        spend = V[:, [d.columns.index(c) for c in ROBYN_CHANNELS]]
        covariates = V[:, [d.columns.index(c) for c in ROBYN_COVARIATES]]
        names, channels, truth = list(ROBYN_COVARIATES), ROBYN_CHANNELS, None
        unit, unit_name, label = 1e6, "million", "Robyn `dt_simulated_weekly`"
    else:
        d = load_marketing_mix("pymc_roas", dtype=torch.float64)
        V = d.values[:num_weeks]
        sales = V[:, d.columns.index("y")]
        spend = V[:, [d.columns.index(c) for c in ROAS_CHANNELS]]
        covariates, names, channels = None, [], ROAS_CHANNELS
        num_train = V.shape[0] - holdout
        counterfactual = V[:num_train, [d.columns.index(c) for c in ("y01", "y02")]]
        truth = (sales[:num_train, None] - counterfactual).sum(0)
        unit, unit_name, label = 1.0, "", "PyMC-Marketing `mmm_roas_data`"
    num_train = V.shape[0] - holdout
    dropped = []
    if covariates is not None:
        varies = covariates[:num_train].std(0) > 0
        dropped = [n for n, v in zip(names, varies.tolist()) if not v]
        names = [n for n, v in zip(names, varies.tolist()) if v]
        covariates = covariates[:, varies]
    return Dataset(
        label,
        d.dates[: V.shape[0]],
        sales,
        spend,
        list(channels),
        covariates,
        names,
        [h for h in ROBYN_HOLIDAYS if h in names] if name == "robyn" else [],
        num_train,
        truth,
        unit,
        unit_name,
        dropped,
    )


def ape(actual, predicted):
    actual = torch.as_tensor(actual, dtype=torch.float64)
    predicted = torch.as_tensor(predicted, dtype=torch.float64)
    return (100 * (actual - predicted).abs() / actual.abs()).tolist()


# ----------------------------------------------------------------------------- RetailBSTS
def fit_kwargs(quick):
    # Quick: tiny runs for the smoke test (no R-hat driven extension). Full: the package
    # defaults of ``fit``.
    if quick:
        return dict(
            num_samples=20, warmup_steps=30, num_particles=4, map_init_steps=30, rhat_target=None
        )
    return {}


def run_bsts(data, selection, quick, seed, **spec):
    n = data.num_train
    model = RetailBSTS(selection=selection, holidays=data.holidays or None, **spec)
    failures = robust_fit(
        model,
        data.sales[:n],
        data.spend[:n],
        None if data.covariates is None else data.covariates[:n],
        method="sgld",
        seed=seed,
        channel_names=data.channels,
        covariate_names=data.covariate_names or None,
        **fit_kwargs(quick),
    )
    future_cov = None if data.covariates is None else data.covariates[n:]
    predicted = model.forecast(data.spend[n:], future_cov).mean(0)
    errors = ape(data.sales[n:], predicted)
    rhat = max(float(r.max()) for r in model.rhat().values())
    particles = fit_kwargs(quick).get("num_particles", 8)  # fit's default: 8
    per_particle = model.samples["delta"].shape[0] // particles
    notes = []
    if model.sampling_extensions:
        notes.append(f"{model.sampling_extensions} R-hat extension(s)")
    if getattr(model, "divergence_retries", 0):
        notes.append(f"step size halved {model.divergence_retries}x")
    notes += [f"failed fit {f}" for f in failures]
    label = f'RetailBSTS `selection="{selection}"`'
    if spec == THESIS_MODEL:
        label += ", `**THESIS_MODEL` (the thesis' model)"
    elif spec:
        label += ", " + ", ".join(f"`{k}={v}`" for k, v in spec.items())
    if model.spend_lag_requested == "auto":
        (elbo0, _), (elbo1, _) = model.spend_lag_evidence[0], model.spend_lag_evidence[1]
        notes.insert(0, f"lag chosen: {model.spend_lag} (ELBO {elbo0:.1f} / {elbo1:.1f} at 0 / 1)")
    return Result(
        label,
        sum(errors) / len(errors),
        errors,
        model.channel_contributions(),
        None,
        rhat,
        model.fit_seconds,
        f"{particles} × {per_particle}",
        "; ".join(notes),
    )


# ----------------------------------------------------------------------------- statsmodels
def run_statsmodels(data):
    try:
        from statsmodels.tsa.statespace.structural import UnobservedComponents
    except ImportError:
        return Skipped("statsmodels `UnobservedComponents` (MLE)", "not installed")
    n, k = data.num_train, data.spend.shape[1]
    y = data.sales[:n]
    y_loc, y_scale = y.mean(), y.std()
    u_scale = data.spend[:n].mean(0)
    u_scale = u_scale.where(u_scale > 0, torch.ones_like(u_scale))
    exog = [data.spend / u_scale]
    if data.covariates is not None:
        X = data.covariates
        exog.append((X - X[:n].mean(0)) / X[:n].std(0))
    exog = torch.cat(exog, -1).numpy()
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = UnobservedComponents(
            ((y - y_loc) / y_scale).numpy(),
            level="llevel",
            exog=exog[:n],
            freq_seasonal=[{"period": 365.25 / 7, "harmonics": 2}],
        )
        res = model.fit(disp=False, maxiter=500)
        seconds = time.perf_counter() - t0
        predicted = res.forecast(data.sales.shape[0] - n, exog=exog[n:]) * float(y_scale)
        predicted = torch.as_tensor(predicted) + y_loc
        idx = [i for i, p in enumerate(model.param_names) if p.startswith("beta")][:k]
        beta = torch.as_tensor(np.asarray(res.params)[idx]) * y_scale / u_scale
        beta_se = torch.as_tensor(np.asarray(res.bse)[idx]) * y_scale / u_scale
    total_spend = data.spend[:n].sum(0)
    errors = ape(data.sales[n:], predicted)
    converged = res.mle_retvals.get("converged", True)
    return Result(
        "statsmodels `UnobservedComponents` (MLE)",
        sum(errors) / len(errors),
        errors,
        (beta * total_spend)[None],
        beta_se * total_spend,
        math.nan,
        seconds,
        "point estimate",
        "" if converged else "L-BFGS did not converge",
    )


# ----------------------------------------------------------------------------- PyMC-Marketing
def import_pymc_marketing():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from pymc_marketing.mmm import GeometricAdstock, LogisticSaturation
        from pymc_marketing.mmm.multidimensional import MMM
    return MMM, GeometricAdstock, LogisticSaturation


def fit_pymc_mmm(dates, spend, channels, controls, sales, num_train, seed, quick):
    """PyMC-Marketing's ``MMM`` as the docstring sets it up, fitted on the first
    ``num_train`` weeks: ``spend`` ``(T, k)`` and ``controls`` ``{name: (T,)}`` (standardised
    here with training statistics; a linear trend ``t`` is added) as numpy arrays, ``sales``
    ``(T,)``.  Returns ``(mmm, idata, frame, columns, seconds)``: the fitted model, its
    posterior (with the contributions in original units), the whole weekly frame and the
    columns ``MMM`` reads, and the wall time of ``fit`` (pytensor's compilation included).
    ``benchmarks/bsts_attribution.py`` fits it the same way."""
    MMM, GeometricAdstock, LogisticSaturation = import_pymc_marketing()
    import pandas as pd

    n, T = num_train, len(sales)
    frame = {"date": pd.to_datetime(dates)}
    for i, c in enumerate(channels):
        frame[c] = np.asarray(spend[:, i])
    for c, x in controls.items():
        x = np.asarray(x)
        # MMM does not scale controls itself (ddof=1: the sd torch's std gave before)
        frame[c] = (x - x[:n].mean()) / x[:n].std(ddof=1)
    frame["t"] = np.arange(T) / n
    frame["y"] = np.asarray(sales)
    df = pd.DataFrame(frame)
    columns = ["date", *channels, *controls, "t"]
    train = df.iloc[:n]
    sampler = dict(chains=1, tune=20, draws=20) if quick else dict(chains=2, tune=1000, draws=1000)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mmm = MMM(
            date_column="date",
            channel_columns=list(channels),
            target_column="y",
            adstock=GeometricAdstock(l_max=8),
            saturation=LogisticSaturation(),
            control_columns=[*controls, "t"],
            yearly_seasonality=2,
        )
        mmm.build_model(train[columns], train["y"])
        mmm.add_original_scale_contribution_variable(var=["channel_contribution", "y"])
        t0 = time.perf_counter()
        idata = mmm.fit(
            train[columns],
            train["y"],
            cores=1,
            random_seed=seed,
            progressbar=False,
            **sampler,
        )
        seconds = time.perf_counter() - t0
    return mmm, idata, df, columns, seconds


def pymc_rhat(mmm, idata):
    """The largest split-R-hat over ``MMM``'s free random variables."""
    import arviz as az

    free = [rv.name for rv in mmm.model.free_RVs]
    return float(az.rhat(idata.posterior[free]).to_array().max())


def pymc_contributions(idata, channels):
    """Draws x channels of each channel's contribution summed over the fitted weeks."""
    return (
        idata.posterior["channel_contribution_original_scale"]
        .sel(channel=list(channels))
        .sum("date")
        .stack(sample=("chain", "draw"))
        .transpose("sample", "channel")
        .to_numpy()
    )


def run_pymc(data, quick, seed):
    label = "PyMC-Marketing `MMM` (NUTS)"
    try:
        import_pymc_marketing()
    except ImportError:
        return Skipped(label, "not installed (`pip install pymc-marketing`)")
    n = data.num_train
    controls = {}
    if data.covariates is not None:
        for j, c in enumerate(data.covariate_names):
            controls[c] = data.covariates[:, j].numpy()
    mmm, idata, df, columns, seconds = fit_pymc_mmm(
        data.dates, data.spend.numpy(), data.channels, controls, data.sales.numpy(), n, seed, quick
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pred = mmm.sample_posterior_predictive(
            df.iloc[n:][columns],
            extend_idata=False,
            include_last_observations=True,
            progressbar=False,
            random_seed=seed,
        )
    predicted = pred["y_original_scale"].mean("sample").to_numpy()
    rhat = pymc_rhat(mmm, idata)
    contribution = pymc_contributions(idata, data.channels)
    errors = ape(data.sales[n:], predicted)
    divergences = int(idata.sample_stats["diverging"].sum())
    sampling = float(idata.posterior.attrs.get("sampling_time", math.nan))
    return Result(
        label,
        sum(errors) / len(errors),
        errors,
        torch.as_tensor(contribution),
        None,
        rhat,
        seconds,
        f"{idata.posterior.sizes['chain']} × {idata.posterior.sizes['draw']}",
        f"{divergences} divergences; sampling {sampling:.0f} s",
    )


# ----------------------------------------------------------------------------- report
def contribution_moments(r):
    if r.contribution_sd is not None:  # MLE: estimate and standard error
        return r.contributions[0], r.contribution_sd
    return r.contributions.mean(0), r.contributions.std(0)


def summary_table(data, results):
    truth = data.truth
    header = ["method", "holdout MAPE", "APE median / mean / p90 / max"]
    if truth is not None:
        header += [f"ROAS rel. error {c}" for c in data.channels]
    header += ["max R̂", "fit s", "draws (chains × per chain)", "notes"]
    rows = []
    for r in results:
        if isinstance(r, Skipped):
            cells = [r.method, "-", "-"] + (["-"] * len(data.channels) if truth is not None else [])
            rows.append(cells + ["-", "-", "-", r.reason])
            continue
        row = [r.method, f"{r.mape:.2f} %", spread(r.ape, fmt="{:.1f}")]
        if truth is not None:
            mean, _ = contribution_moments(r)
            row += [f"{100 * (float(m / t) - 1):+.0f} %" for m, t in zip(mean, truth)]
        row += [
            "n/a" if math.isnan(r.rhat) else f"{r.rhat:.3f}",
            f"{r.seconds:.1f}",
            r.draws,
            r.notes or "-",
        ]
        rows.append(row)
    return markdown(header, rows)


def contribution_table(data, results):
    spend = data.spend[: data.num_train].sum(0)
    u = data.unit
    fmt = "{:,.1f}" if u > 1 else "{:,.0f}"

    def cell(mean, sd, roas):
        text = fmt.format(float(mean) / u)
        if sd is not None:
            text += " ± " + fmt.format(float(sd) / u)
        return text + f" ({float(roas):.3g})"

    header = ["method"] + list(data.channels)
    rows = [["training spend"] + [fmt.format(float(s) / u) for s in spend]]
    if data.truth is not None:
        rows.append(["**truth**"] + [cell(t, None, t / s) for t, s in zip(data.truth, spend)])
    for r in results:
        if isinstance(r, Skipped):
            rows.append([r.method] + ["-"] * len(data.channels))
            continue
        mean, sd = contribution_moments(r)
        rows.append([r.method] + [cell(m, e, m / s) for m, e, s in zip(mean, sd, spend)])
    return markdown(header, rows)


def section(data, results):
    n, T = data.num_train, data.sales.shape[0]
    unit = f" (in {data.unit_name})" if data.unit_name else ""
    controls = ", ".join(data.covariate_names) if data.covariate_names else "none"
    dropped = (
        f"; dropped as constant over the training weeks: {', '.join(data.dropped)}"
        if data.dropped
        else ""
    )
    return (
        f"## {data.name}: {T} weeks from {data.dates[0]}, {n} train, {T - n} holdout\n\n"
        f"Channels: {', '.join(data.channels)}; controls: {controls}{dropped}.\n\n"
        + summary_table(data, results)
        + f"\n\nChannel contributions over the {n} training weeks{unit}, mean ± sd "
        "(statsmodels: ± standard error), and ROAS = contribution / training spend in "
        "brackets:\n\n" + contribution_table(data, results)
    )


def peer_versions():
    out = [f"torch {torch.__version__}"]
    for package in ("pymc-marketing", "pymc", "statsmodels"):
        try:
            out.append(f"{package} {version(package)}")
        except Exception:
            out.append(f"{package} not installed")
    return ", ".join(out)


def main(argv=None):
    parser = argument_parser(__doc__, RESULTS, quick="short series, tiny samplers", seed=0)
    parser.add_argument("--selections", nargs="+", default=list(SELECTIONS), choices=SELECTIONS)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    t_start = time.perf_counter()
    quick = args.quick
    holdout = 14 if quick else 52
    sizes = {"robyn": 70, "pymc_roas": 60} if quick else {"robyn": None, "pymc_roas": None}
    sections = []
    for name in ("robyn", "pymc_roas"):
        data = load_dataset(name, sizes[name], holdout)
        results = []
        for selection in args.selections:
            results.append(run_bsts(data, selection, quick, args.seed))
            print(f"{name}: {results[-1][:2]} {results[-1].seconds:.1f}s", flush=True)
        results.append(run_bsts(data, args.selections[0], quick, args.seed, **THESIS_MODEL))
        print(f"{name}: {results[-1][:2]} {results[-1].seconds:.1f}s", flush=True)
        results.append(run_pymc(data, quick, args.seed))
        print(f"{name}: {results[-1][:2]}", flush=True)
        results.append(run_statsmodels(data))
        print(f"{name}: {results[-1][:2]}", flush=True)
        sections.append(section(data, results))
    total = time.perf_counter() - t_start

    mode = "quick (smoke test: short series, tiny samplers)" if quick else "full"
    args_text = command_line_args()
    preamble = (
        "# RetailBSTS next to PyMC-Marketing's MMM and statsmodels' UnobservedComponents\n\n"
        f"Mode: {mode}. {peer_versions()}; one core for every method, float64; total "
        f"{total / 60:.1f} min. Generated by `python benchmarks/bsts_peers.py"
        f"{' ' + args_text if args_text else ''}`. Protocol in the script's docstring. "
        'RetailBSTS: `RetailBSTS(selection=s)` with the package defaults (variant "RF", '
        "Student-t noise, the spend lag chosen by the evidence, a carry-over per channel), "
        "and the thesis' model (`**THESIS_MODEL`: lag 1, one decay rate, real-valued q); "
        '`fit(method="sgld")` with the package defaults'
        f"{' (quick: 20 draws, 30 warmup, 4 particles, 30 MAP steps, no R-hat extension)' if quick else ''}; "
        "holdout MAPE from the mean over draws of `forecast` (k-step, from the end of "
        "training). PyMC-Marketing: `GeometricAdstock(l_max=8)`, `LogisticSaturation()`, "
        "yearly seasonality with 2 Fourier modes, standardised controls plus a linear trend, "
        + (
            "NUTS with 1 chain of 20 tune + 20 draws (quick)"
            if quick
            else "PyMC's NUTS defaults (2 chains × (1000 tune + 1000 draws), "
            "target_accept 0.8) with the chains run one after the other (`cores=1`; PyMC's "
            "default here, `cores=2`, would about halve its wall time)"
        )
        + ". statsmodels: local level + trigonometric seasonal (period 52.18, 2 harmonics) + "
        "spends and controls as regressors, MLE. max R̂: largest split-R̂ over the static "
        "parameters (RetailBSTS: particles as chains). Fit s: wall time of the fit alone "
        "(PyMC's includes compiling the model)."
    )
    write_report(preamble, sections, args.output)


if __name__ == "__main__":
    main()
