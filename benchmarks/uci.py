"""
UCI regression with Bayesian neural networks sampled by SG-MCMC, with and without
repulsion: the protocol of thesis section 2.3.3 (Tables 2.3 and 2.4), which follows
probabilistic backpropagation (Hernández-Lobato & Adams, 2015) and SVGD (Liu & Wang, 2016).

Protocol (per data set, per split, per sampler):

* ``BayesianMLP(in, hidden=(50,), relu)``, ``N(0, 1)`` weight priors, Gaussian likelihood
  with a learned noise precision ``tau ~ Gamma(1, 0.1)``; run with ``full_output=False``
  so that every step costs O(batch), not O(N).
* Inputs and targets standardised with the statistics of the training part of the split;
  metrics are reported in the original units (RMSE x y_std, LL - log y_std).
* Particles start as in the SVGD reference code (``BayesianMLP.init_strategy``): weights
  ``N(0, 1 / (fan_in + 1))``, biases 0, the noise precision 1 / (mean squared residual of
  that starting network).
* 20 particles, minibatches of 100, 2000 iterations of which the first 1000 are burn-in,
  one draw every 10 iterations after that (100 draws x 20 particles = 2000 draws).
* One step size per data set and sampler, "validated on another fold" as in the thesis:
  on each of the first ``--tune-splits`` splits (default 3) the chain runs on 80 % of the
  training part (a fixed random permutation) and is scored by the log-likelihood of the
  posterior predictive on the other 20 %; the grid value with the best mean wins. Grids
  (``step_grid``): SGLD ``{3e-3, 1e-2, 3e-2, 1e-1} / N`` with N the rows the chain runs on
  (the drift is the step times the full-data gradient, which grows with N; the thesis'
  absolute ``{1e-5, ..., 1e-3}`` diverges in the first steps on naval and protein), SGHMC
  ten times lower (its velocity settles at step / friction times the gradient), AdamSGLD
  an absolute learning rate ``{3e-4, ..., 1e-2}``; the +R grids are ``L`` (SGLD) or ``L^2``
  (momentum samplers) times the plain ones. Every split then runs the chosen step on its
  whole training part and is evaluated on its test part; if that chain diverges, or a
  particle escapes (finite, but far below the ensemble in log density:
  :class:`pyro_ext.infer.EscapedParticleWarning`), the next best step is used; in tuning,
  such a chain scores -inf.
* Test log-likelihood and RMSE of the posterior predictive mixture
  (:func:`pyro_ext.models.log_predictive_density`, :func:`pyro_ext.models.rmse`), mean +-
  standard error over splits.

Samplers: ``sgld``, ``sgld+r``, ``sghmc``, ``sghmc+r``, ``adamsgld``, ``adamsgld+r``
(``pyro_ext.infer.SGLD`` / ``SGHMC`` (friction 0.1) / ``AdamSGLD``, ``repulsion="rbf"`` for +R).

Reference columns, quoted, not re-run here: thesis Tables 2.3/2.4 (SGLD and SGLD+R, 20 splits)
and the published SVGD, PBP and MC-dropout results (``PUBLISHED``); a scoreboard counts the
data sets on which each +R sampler is at or better than its plain version and each sampler at
or better than SVGD.

Run from the repository root::

    python benchmarks/uci.py --quick                      # yacht, 1 split, 1000 its, < 1 min
    python benchmarks/uci.py --jobs 2     # default: 5 small data sets x 5 splits, SGLD vs SGLD+R
    python benchmarks/uci.py --datasets all --splits 20 --jobs 2 \
        --samplers sgld sgld+r sghmc sghmc+r adamsgld adamsgld+r   # the full protocol (~2 h)

and, running nothing, compare the test LL of two reports (the README's comparisons)::

    python benchmarks/uci.py --compare benchmarks/results/uci_bias_stiffest.md HEAD~1:benchmarks/results/uci.md

Data are read from ``$PYRO_EXT_DATA`` (default: ``../shared/data`` next to the repository).
The tables are printed and written to ``benchmarks/results/uci.md`` (``--output``).
"""

import argparse
import math
import statistics
import subprocess
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pyro  # noqa: E402
import torch  # noqa: E402
from _common import (  # noqa: E402
    BIAS_BOUND_PROTOCOL,
    REPO,  # importing _common also sets $PYRO_EXT_DATA's default
    argument_parser,
    command_line_args,
    markdown,
    spread,
    write_report,
)

from pyro_ext.datasets import (  # noqa: E402
    UCI_DATASETS,
    load_uci,
    standardize_split,
    uci_num_splits,
)  # noqa: E402
from pyro_ext.infer import MCMC, SGHMC, SGLD, AdamSGLD, EscapedParticleWarning  # noqa: E402
from pyro_ext.models import BayesianMLP, log_predictive_density, rmse  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "uci.md"
DEFAULT_DATASETS = ["boston", "yacht", "wine", "concrete", "energy"]

# key: (label, kernel class, repulsion, kernel options, step grid, grid unit). A "/N" unit
# means the step is the grid value divided by the number of rows the chain runs on: SGLD's
# and SGHMC's drift is the step times the full-data gradient, which grows with N, so a fixed
# grid that suits 300 rows diverges in the first steps on 10,000 (naval, protein). SGHMC's
# velocity settles at step / friction times the gradient, hence its grid 1 / friction = 10
# times lower. AdamSGLD divides the gradient by its running scale, so its step is a learning
# rate that does not grow with N: an absolute grid.
_SGLD_GRID = (3e-3, 1e-2, 3e-2, 1e-1)
_SGHMC_GRID = (3e-4, 1e-3, 3e-3, 1e-2)
_ADAM_GRID = (3e-4, 1e-3, 3e-3, 1e-2)
SAMPLERS = {
    "sgld": ("SGLD", SGLD, None, {}, _SGLD_GRID, "/N"),
    "sgld+r": ("SGLD+R", SGLD, "rbf", {}, _SGLD_GRID, "/N"),
    "sghmc": ("SGHMC", SGHMC, None, {"friction": 0.1}, _SGHMC_GRID, "/N"),
    "sghmc+r": ("SGHMC+R", SGHMC, "rbf", {"friction": 0.1}, _SGHMC_GRID, "/N"),
    "adamsgld": ("AdamSGLD", AdamSGLD, None, {}, _ADAM_GRID, ""),
    "adamsgld+r": ("AdamSGLD+R", AdamSGLD, "rbf", {}, _ADAM_GRID, ""),
}


def _per_row(key):
    return SAMPLERS[key][5] == "/N"


def step_grid(key, num_particles):
    """The validation grid of ``key``, in the units of its label (``/N`` or absolute).

    The repulsive drift averages over the particles (eq. 2.7's ``K / L``), so the effective
    per-particle step of SGLD+R is about ``step / L``: its grid is ``L`` times SGLD's. The
    momentum samplers pass the velocity through ``K / L`` once more on the way to the
    position (:func:`pyro_ext.infer.sgmcmc.updates.sghmc_update`), hence ``L^2``.
    """
    _, cls, repulsion, _, grid, _ = SAMPLERS[key]
    if repulsion is None:
        return list(grid)
    factor = num_particles if cls is SGLD else num_particles**2
    return [g * factor for g in grid]


def _step_label(key, step):
    if step is None:
        return "default"
    return f"{step:.1e}{SAMPLERS[key][5]}"


# Thesis Tables 2.3 (test LL) and 2.4 (test RMSE): (SGLD, SGLD+R), mean +- s.e. where given.
THESIS_LL = {
    "bostonHousing": ("-2.551 ± 0.018", "-2.575 ± 0.007"),
    "kin8nm": ("0.826", "0.831"),
    "naval-propulsion-plant": ("3.379", "3.428"),
    "protein-tertiary-structure": ("-2.991", "-2.987"),
    "wine-quality-red": ("-0.765", "-0.750"),
    "yacht": ("-1.211", "-1.172"),
}
THESIS_RMSE = {
    "bostonHousing": ("2.392 ± 0.018", "2.295 ± 0.017"),
    "kin8nm": ("0.104", "0.104"),
    "naval-propulsion-plant": ("0.008", "0.008"),
    "protein-tertiary-structure": ("4.810", "4.794"),
    "wine-quality-red": ("0.522", "0.514"),
    "yacht": ("0.942", "0.894"),
}
ALIASES = {
    "boston": "bostonHousing",
    "wine": "wine-quality-red",
    "naval": "naval-propulsion-plant",
    "protein": "protein-tertiary-structure",
    "power": "power-plant",
}


def _dataset_name(name):
    name = ALIASES.get(name, name)
    if name not in UCI_DATASETS:
        raise SystemExit(
            f"unknown data set {name!r}; choose from {UCI_DATASETS} or {sorted(ALIASES)}"
        )
    return name


class EscapedChainError(RuntimeError):
    """A chain whose particles escaped (see :class:`pyro_ext.infer.EscapedParticleWarning`)."""


def _run_chain(key, x, y, step_size, cfg, seed):
    """Run one sampler on (x, y); return the network, the posterior draws, the wall time
    and the step size used after warm-up (``step_size=None``: the kernel's default rule,
    whose frozen step is read back)."""
    _, cls, repulsion, extra, _, _ = SAMPLERS[key]
    pyro.clear_param_store()
    pyro.set_rng_seed(seed)
    net = BayesianMLP(x.shape[1], hidden=(cfg["hidden"],), full_output=False)
    kernel = cls(
        net,
        step_size=step_size,
        num_particles=cfg["particles"],
        repulsion=repulsion,
        jit_compile=cfg["jit"],
        init_strategy=net.init_strategy(x, y),
        **(
            {}
            if step_size is not None
            else {"bias_tolerance": cfg["bias_tolerance"], "bias_bound": cfg["bias_bound"]}
        ),
        **extra,
    )
    num_samples = (cfg["iterations"] - cfg["burnin"]) // cfg["thinning"]
    mcmc = MCMC(
        kernel,
        num_samples=num_samples,
        warmup_steps=cfg["burnin"],
        thinning=cfg["thinning"],
        disable_progbar=True,
    )
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EscapedParticleWarning)  # read below instead
        mcmc.run(x, y, subsample_size=min(cfg["batch"], x.shape[0]))
    elapsed = time.perf_counter() - start
    if mcmc.escaped_particles:
        # A particle that escaped to where the posterior has no mass ruins the predictive
        # mixture (energy split 11 at AdamSGLD's tuned step: test RMSE 1 485, the other
        # splits 0.4-0.6): a failed chain, like a divergence.
        raise EscapedChainError(f"particle(s) {mcmc.escaped_particles} escaped")
    samples = {k: v.detach() for k, v in mcmc.get_samples().items()}
    adaptation = kernel.step_size_adaptation
    used = step_size if adaptation is None else adaptation.step_size
    # The frozen default step's variance error in the stiffest direction (bias_bound="auto"
    # may raise the step above that direction's bound for the kept draws to mix).
    error = math.nan if adaptation is None else adaptation.stiffest_error()
    # Late particles (far below on average, not at the end) stay in: their first kept draws
    # are warm-up's transient, a SlowMixingWarning, not a failed chain. Reported apart.
    return net, samples, elapsed, (float(used), error, list(mcmc.rejoined_particles))


def _evaluate(net, samples, x, y):
    with torch.no_grad():
        ll = float(log_predictive_density(net, samples, x, y))
        err = float(rmse(net, samples, x, y))
    return ll, err


def _split_rows(num_rows, split, val_fraction):
    """The fit and validation rows of a split's training part: a fixed random permutation,
    its last ``val_fraction`` held out."""
    perm = torch.randperm(num_rows, generator=torch.Generator().manual_seed(1000 + split))
    n_val = max(1, int(round(val_fraction * num_rows)))
    return perm[:-n_val], perm[-n_val:]


def _failure(name, split, key, step, error, what=""):
    print(
        f"  {name} split {split} {key} {what}step {_step_label(key, step)}: failed ({str(error).splitlines()[0][:80]})",
        flush=True,
    )


def tune_task(task):
    """Validation LL of one grid step: the chain runs on the fit rows of a split's training
    part and is scored on its held-out rows (-inf if it diverges or a particle escapes)."""
    name, split, key, step, cfg = task
    torch.set_num_threads(1)
    data, _, _ = standardize_split(load_uci(name, split))
    fit, val = _split_rows(data.x_train.shape[0], split, cfg["val_fraction"])
    # The validation rows are standardised with the statistics of the full training part (a
    # fixed affine map; the selection is by the ranking of validation LL, unaffected by it).
    start = time.perf_counter()
    try:
        net, samples, _, _ = _run_chain(
            key,
            data.x_train[fit],
            data.y_train[fit],
            step / (fit.numel() if _per_row(key) else 1),
            cfg,
            seed=split,
        )
        ll, _ = _evaluate(net, samples, data.x_train[val], data.y_train[val])
    except (
        ValueError,
        RuntimeError,
    ) as error:  # a diverged chain (non-finite state), or one whose particles escaped
        _failure(name, split, key, step, error)
        ll = -math.inf
    return dict(
        name=name,
        split=split,
        key=key,
        step=step,
        ll=ll if math.isfinite(ll) else -math.inf,
        seconds=time.perf_counter() - start,
    )


def choose_steps(tuning):
    """Order each (data set, sampler)'s grid by mean validation LL over the tuning splits,
    best first; steps that diverged on any tuning split come last, in grid order."""
    by_step = {}
    for r in tuning:
        by_step.setdefault((r["name"], r["key"]), {}).setdefault(r["step"], []).append(r["ll"])
    return {
        pair: [
            step for step, lls in sorted(steps.items(), key=lambda item: -statistics.fmean(item[1]))
        ]
        for pair, steps in by_step.items()
    }


def run_task(task):
    """One (data set, split, sampler): run the chosen step on the whole training part and
    evaluate on the test part; if that chain diverges or a particle escapes, fall back to the
    next step in order."""
    name, split, key, steps, cfg = task
    torch.set_num_threads(1)
    data, _, y_std = standardize_split(load_uci(name, split))
    y_std = float(y_std)
    n = data.x_train.shape[0]
    start = time.perf_counter()
    for step in steps:
        try:
            net, samples, chain_seconds, (used_step, stiffest_error, rejoined) = _run_chain(
                key,
                data.x_train,
                data.y_train,
                None if step is None else step / (n if _per_row(key) else 1),
                cfg,
                seed=10_000 + split,
            )
            ll, err = _evaluate(net, samples, data.x_test, data.y_test)
        except (ValueError, RuntimeError) as error:
            _failure(name, split, key, step, error, what="final ")
            continue
        break
    else:
        return dict(
            name=name,
            split=split,
            key=key,
            step=None,
            ll=math.nan,
            rmse=math.nan,
            seconds=time.perf_counter() - start,
        )
    result = dict(
        name=name,
        split=split,
        key=key,
        step=step,
        ll=ll - math.log(y_std),
        rmse=err * y_std,
        used_step=used_step,
        stiffest_error=stiffest_error,
        rejoined=rejoined,
        chain_seconds=chain_seconds,
        seconds=time.perf_counter() - start,
    )
    print(
        f"  {name} split {split} {SAMPLERS[key][0]}: step {_step_label(key, step)} ({used_step:.2e}), test LL {result['ll']:.3f}, "
        f"RMSE {result['rmse']:.3f} ({result['seconds']:.1f} s)",
        flush=True,
    )
    return result


def _splits(rs):
    """Completed splits, and the failed ones (every step diverged) that the means leave out."""
    failed = sum(not math.isfinite(r["ll"]) for r in rs)
    return f"{len(rs) - failed} ({failed} failed)" if failed else f"{len(rs)}"


def _mean_se(values):
    values = [v for v in values if math.isfinite(v)]
    if not values:
        return "failed"
    mean = statistics.fmean(values)
    if len(values) < 2:
        return f"{mean:.3f}"
    se = statistics.stdev(values) / math.sqrt(len(values))
    return f"{mean:.3f} ± {se:.3f}"


def _reference(name, key, metric):
    table = THESIS_LL if metric == "ll" else THESIS_RMSE
    if name in table and key in ("sgld", "sgld+r"):
        return table[name][0 if key == "sgld" else 1]
    return "-"


# Published results on the same splits and network (one hidden layer of 50 units), quoted as
# (RMSE, spread, LL, spread). SVGD and PBP: Liu & Wang (2016, table 2), spread = standard
# error; transcribed from the paper, which no stored source here could confirm offline. MC
# dropout: Gal & Ghahramani (2016, table 1, the original 40-epoch runs), checked against the
# authors' repository yaringal/DropoutUncertaintyExps, whose code logs np.std over splits:
# spread = standard deviation, divided by sqrt(splits) for the standard errors printed below.
PUBLISHED_SPREAD_IS_SD = {"SVGD": False, "PBP": False, "MC dropout": True}
PUBLISHED = {
    "SVGD": {
        "bostonHousing": (2.957, 0.099, -2.504, 0.029),
        "concrete": (5.324, 0.104, -3.082, 0.018),
        "energy": (1.374, 0.045, -1.767, 0.024),
        "kin8nm": (0.090, 0.001, 0.984, 0.008),
        "naval-propulsion-plant": (0.004, 0.000, 4.089, 0.012),
        "power-plant": (4.033, 0.033, -2.815, 0.008),
        "protein-tertiary-structure": (4.606, 0.013, -2.947, 0.003),
        "wine-quality-red": (0.609, 0.010, -0.925, 0.014),
        "yacht": (0.864, 0.052, -1.225, 0.042),
    },
    "PBP": {
        "bostonHousing": (2.977, 0.093, -2.579, 0.052),
        "concrete": (5.506, 0.103, -3.137, 0.021),
        "energy": (1.734, 0.051, -1.981, 0.028),
        "kin8nm": (0.098, 0.001, 0.901, 0.010),
        "naval-propulsion-plant": (0.006, 0.000, 3.735, 0.004),
        "power-plant": (4.052, 0.031, -2.819, 0.008),
        "protein-tertiary-structure": (4.623, 0.009, -2.950, 0.002),
        "wine-quality-red": (0.614, 0.008, -0.931, 0.014),
        "yacht": (0.778, 0.042, -1.211, 0.044),
    },
    "MC dropout": {
        "bostonHousing": (2.97, 0.85, -2.46, 0.25),
        "concrete": (5.23, 0.53, -3.04, 0.09),
        "energy": (1.66, 0.19, -1.99, 0.09),
        "kin8nm": (0.10, 0.00, 0.95, 0.03),
        "naval-propulsion-plant": (0.01, 0.00, 3.80, 0.05),
        "power-plant": (4.02, 0.18, -2.80, 0.05),
        "protein-tertiary-structure": (4.36, 0.04, -2.89, 0.01),
        "wine-quality-red": (0.62, 0.04, -0.93, 0.06),
        "yacht": (1.11, 0.38, -1.55, 0.12),
    },
}


def _published_section(datasets):
    methods = list(PUBLISHED)
    rows = []
    for name in datasets:
        row = [name]
        for method in methods:
            rmse_mean, rmse_spread, ll_mean, ll_spread = PUBLISHED[method][name]
            scale = math.sqrt(uci_num_splits(name)) if PUBLISHED_SPREAD_IS_SD[method] else 1.0
            digits = 2 if method == "MC dropout" else 3
            row += [
                f"{ll_mean:.{digits}f} ± {ll_spread / scale:.{digits}f}",
                f"{rmse_mean:.{digits}f} ± {rmse_spread / scale:.{digits}f}",
            ]
        rows.append(row)
    header = ["data set"] + [f"{m} {metric}" for m in methods for metric in ("LL", "RMSE")]
    return (
        "## Published references (quoted, not re-run)\n\nMean ± standard error over the splits. "
        "SVGD and PBP: Liu & Wang (2016), table 2, transcribed from the paper (not checked against "
        "a stored copy offline). MC dropout: Gal & Ghahramani (2016), table 1, as listed in the "
        "authors' repository yaringal/DropoutUncertaintyExps (its standard deviations divided by the "
        "square root of the number of splits).\n\n" + markdown(header, rows)
    )


def _means(results, name, key):
    rs = [r for r in results if r["name"] == name and r["key"] == key]
    lls = [r["ll"] for r in rs if math.isfinite(r["ll"])]
    errs = [r["rmse"] for r in rs if math.isfinite(r["rmse"])]
    if not lls or len(lls) < len(rs):
        return None
    return statistics.fmean(lls), statistics.fmean(errs)


OUTLIER_FACTOR = 3.0


def _outliers(datasets, samplers, results):
    """Splits whose test RMSE exceeds ``OUTLIER_FACTOR`` times the median split of the same
    data set and sampler: a failure to explain, not a row to average."""
    rows = []
    for name in datasets:
        for key in samplers:
            rs = [r for r in results if r["name"] == name and r["key"] == key]
            errs = [r["rmse"] for r in rs if math.isfinite(r["rmse"])]
            if len(errs) < 2:
                continue
            median = statistics.median(errs)
            for r in rs:
                if math.isfinite(r["rmse"]) and r["rmse"] > OUTLIER_FACTOR * median:
                    rows.append(
                        [
                            name,
                            SAMPLERS[key][0],
                            r["split"],
                            f"{r['rmse']:.3f}",
                            f"{median:.3f}",
                            f"{r['ll']:.3f}",
                            f"{r.get('used_step', math.nan):.2e}",
                        ]
                    )
    intro = (
        f"## Outlying splits\n\nSplits whose test RMSE exceeds {OUTLIER_FACTOR:g}x the median split of "
        "their data set and sampler. "
    )
    text = intro + (
        "None."
        if not rows
        else "\n\n"
        + markdown(
            ["data set", "sampler", "split", "test RMSE", "median split RMSE", "test LL", "step"],
            rows,
        )
    )
    return text + "\n\n" + _late_particles(datasets, samplers, results)


def _late_particles(datasets, samplers, results):
    """The splits whose chain had a particle far below the ensemble on average over the
    kept steps but not over their final quarter (``MCMC.rejoined_particles``): late, not
    escaped; kept in the means, listed here with their metrics."""
    rows = []
    for name in datasets:
        for key in samplers:
            rs = [r for r in results if r["name"] == name and r["key"] == key]
            errs = [r["rmse"] for r in rs if math.isfinite(r["rmse"])]
            for r in rs:
                if r.get("rejoined"):
                    rows.append(
                        [
                            name,
                            SAMPLERS[key][0],
                            r["split"],
                            ", ".join(map(str, r["rejoined"])),
                            f"{r['rmse']:.3f}",
                            f"{statistics.median(errs):.3f}",
                            f"{r['ll']:.3f}",
                        ]
                    )
    intro = (
        "Late particles: splits whose chain had a particle below the ensemble by more than "
        "the escape threshold on average over the kept steps but not over their final "
        "quarter (`MCMC.rejoined_particles`, a `SlowMixingWarning`: warm-up was too short "
        "for it). They stay in the means. "
    )
    if not rows:
        return intro + "None."
    return (
        intro
        + "\n\n"
        + markdown(
            [
                "data set",
                "sampler",
                "split",
                "particles",
                "test RMSE",
                "median split RMSE",
                "test LL",
            ],
            rows,
        )
    )


def _scoreboard(datasets, samplers, results):
    """The issue's targets: +R at or better than its plain sampler on the thesis' six data
    sets, and each sampler at or better than published SVGD, by mean test LL and RMSE."""
    rows = []
    thesis = [n for n in datasets if n in THESIS_LL]
    for key in samplers:
        plain = key[:-2] if key.endswith("+r") else None
        if plain in samplers and thesis:
            pairs = [(_means(results, n, key), _means(results, n, plain)) for n in thesis]
            pairs = [(a, b) for a, b in pairs if a and b]
            rows.append(
                [
                    SAMPLERS[key][0],
                    f"vs {SAMPLERS[plain][0]} on the thesis data sets",
                    f"{sum(a[0] >= b[0] for a, b in pairs)} of {len(pairs)}",
                    f"{sum(a[1] <= b[1] for a, b in pairs)} of {len(pairs)}",
                ]
            )
        ours = [(n, _means(results, n, key)) for n in datasets]
        ours = [(n, m) for n, m in ours if m]
        svgd = PUBLISHED["SVGD"]
        rows.append(
            [
                SAMPLERS[key][0],
                "vs published SVGD",
                f"{sum(m[0] >= svgd[n][2] for n, m in ours)} of {len(ours)}",
                f"{sum(m[1] <= svgd[n][0] for n, m in ours)} of {len(ours)}",
            ]
        )
    return (
        "## Scoreboard\n\nData sets on which the sampler's mean test LL is at or above (RMSE at or below) "
        "the comparison's mean; a failed split excludes the data set.\n\n"
        + markdown(["sampler", "comparison", "LL at or better", "RMSE at or better"], rows)
    )


def _read_report(source):
    """The test-LL table of a report this script wrote, ``{(data set, sampler): (mean test
    LL, its splits cell)}``; ``source`` is a path, or ``REV:PATH`` for a committed version
    (``git show``)."""
    if not Path(source).exists() and ":" in source:
        shown = subprocess.run(["git", "show", source], cwd=REPO, capture_output=True, text=True)
        if shown.returncode != 0:
            raise SystemExit(
                f"--compare {source}: git show could not read it ({shown.stderr.strip()}); "
                "expected REV:PATH of a committed report, e.g. HEAD~1:benchmarks/results/uci.md"
            )
        text = shown.stdout
    elif not Path(source).is_file():
        raise SystemExit(
            f"--compare {source}: no such report; expected a path to a report this script "
            "wrote, or REV:PATH of a committed one"
        )
    else:
        text = Path(source).read_text()
    if "## Test log-likelihood and RMSE" not in text:
        raise SystemExit(f"--compare {source}: not a report of benchmarks/uci.py (no LL table)")
    table = text.split("## Test log-likelihood and RMSE")[1].split("\n## ")[0]
    rows = {}
    for line in table.splitlines():
        cells = [cell.strip() for cell in line.split("|")[1:-1]]
        if len(cells) < 4 or cells[0] == "data set" or set(cells[0]) <= {"-"}:
            continue
        mean = cells[3].split("±")[0].strip()
        rows[(cells[0], cells[1])] = (float(mean) if mean[-1:].isdigit() else math.nan, cells[2])
    return rows


def compare(current, bases):
    """Text comparing the test LL of the report ``current`` with each of ``bases`` (paths
    or ``REV:PATH``): over the data-set x sampler pairs with no failed split in either, on
    how many ``current`` is higher, and the median and extremes of the differences."""
    ours = _read_report(current)
    lines = []
    for base in bases:
        theirs = _read_report(base)
        complete = [
            key
            for key in ours
            if key in theirs
            and "failed" not in ours[key][1] + theirs[key][1]
            and math.isfinite(ours[key][0] - theirs[key][0])
        ]
        differences = sorted((ours[key][0] - theirs[key][0], key) for key in complete)
        if not differences:
            lines.append(f"- against `{base}`: no pair completed in both")
            continue
        (low, low_key), (high, high_key) = differences[0], differences[-1]
        median = statistics.median(d for d, _ in differences)
        lines.append(
            f"- against `{base}`: test LL higher on {sum(d > 0 for d, _ in differences)} "
            f"of {len(complete)} data-set x sampler pairs with no failed split in either, "
            f"median {median:+.2f} nats, from {low:+.2f} ({' '.join(low_key)}) to "
            f"{high:+.2f} ({' '.join(high_key)})"
        )
    failed = [f"{' '.join(key)}: {cell}" for key, (_, cell) in ours.items() if "failed" in cell]
    lines.append(f"- failed splits in `{current}`: " + ("; ".join(failed) or "none"))
    return "\n".join(lines)


def main():
    parser = argument_parser(
        __doc__, RESULTS, quick="yacht, 1 split, 1000 iterations, SGLD vs SGLD+R"
    )
    parser.add_argument(
        "--datasets",
        nargs="+",
        default=None,
        help="data set names or aliases, or 'all' for the nine (default: boston yacht wine concrete energy)",
    )
    parser.add_argument(
        "--splits",
        type=int,
        default=None,
        help="number of splits per data set (default 5; quick 1)",
    )
    parser.add_argument(
        "--samplers", nargs="+", default=None, choices=sorted(SAMPLERS), help="default: sgld sgld+r"
    )
    parser.add_argument("--iterations", type=int, default=None, help="default 2000 (quick: 1000)")
    parser.add_argument("--burnin", type=int, default=None, help="default 1000 (quick: 500)")
    parser.add_argument("--particles", type=int, default=20)
    parser.add_argument(
        "--jit",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="jit_compile the potential",
    )
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (one thread each)")
    parser.add_argument(
        "--step",
        choices=["default", "tuned"],
        default="default",
        help="default: the kernels' own step-size rule (step_size=None; no tuning); tuned: the "
        "thesis' protocol, one step per data set and sampler from a validation grid",
    )
    parser.add_argument(
        "--bias-tolerance",
        type=float,
        default=0.05,
        help="with --step default: the kernels' bias_tolerance (default 0.05, theirs)",
    )
    parser.add_argument(
        "--bias-bound",
        choices=list(BIAS_BOUND_PROTOCOL),
        default="auto",
        help="with --step default: the kernels' bias_bound (default auto, theirs)",
    )
    parser.add_argument(
        "--tune-splits",
        type=int,
        default=None,
        help="splits whose validation folds choose the step (default 3; quick 1)",
    )
    parser.add_argument(
        "--compare",
        nargs="+",
        default=None,
        metavar="REPORT",
        help="run nothing: compare the test LL of the report at --output with each REPORT (a "
        "path, or REV:PATH for a committed version, e.g. HEAD~1:benchmarks/results/uci.md)",
    )
    args = parser.parse_args()
    if args.compare:
        print(compare(str(args.output), args.compare))
        return
    torch.set_num_threads(1)

    if args.quick:
        datasets = [_dataset_name(n) for n in (args.datasets or ["yacht"])]
        num_splits = args.splits or 1
        iterations, burnin = args.iterations or 1000, args.burnin or 500
    else:
        names = args.datasets or DEFAULT_DATASETS
        datasets = list(UCI_DATASETS) if names == ["all"] else [_dataset_name(n) for n in names]
        num_splits = args.splits or 5
        iterations, burnin = args.iterations or 2000, args.burnin or 1000
    tune_splits = args.tune_splits or (1 if args.quick else 3)
    samplers = args.samplers or ["sgld", "sgld+r"]
    cfg = dict(
        hidden=50,
        particles=args.particles,
        batch=100,
        iterations=iterations,
        burnin=burnin,
        thinning=10,
        val_fraction=0.2,
        jit=args.jit,
        bias_tolerance=args.bias_tolerance,
        bias_bound=args.bias_bound,
    )
    start = time.perf_counter()
    default_step = args.step == "default"
    tune_tasks = [
        (name, split, key, step, cfg)
        for name in datasets
        for key in samplers
        for split in range(min(tune_splits, uci_num_splits(name)))
        for step in step_grid(key, args.particles)
    ]
    if default_step:  # step_size=None: each chain sets its own step during warm-up
        tuning = []
        order = {(name, key): [None] for name in datasets for key in samplers}
    else:
        tuning = _map(tune_task, tune_tasks, args.jobs)
        order = choose_steps(tuning)
    tuning_seconds = time.perf_counter() - start
    for (name, key), steps in order.items():
        print(
            f"  {name} {SAMPLERS[key][0]}: steps by validation LL {', '.join(_step_label(key, s) for s in steps)}",
            flush=True,
        )
    tasks = [
        (name, split, key, order[name, key], cfg)
        for name in datasets
        for split in range(min(num_splits, uci_num_splits(name)))
        for key in samplers
    ]
    results = _map(run_task, tasks, args.jobs)
    total = time.perf_counter() - start

    rows, timing_rows = [], []
    for name in datasets:
        for key in samplers:
            rs = [r for r in results if r["name"] == name and r["key"] == key]
            steps = sorted({r["step"] for r in rs if r["step"] is not None})
            used = [r["used_step"] for r in rs if "used_step" in r]
            step_text = (
                f"{statistics.median(used):.1e} ({min(used):.1e}-{max(used):.1e})"
                if default_step and used
                else ", ".join(_step_label(key, s) for s in steps) or "-"
            )
            errors = [
                r["stiffest_error"] for r in rs if math.isfinite(r.get("stiffest_error", math.nan))
            ]
            if default_step and errors:
                step_text += f"; error {statistics.median(errors):.2g}, {max(errors):.2g}"
            rows.append(
                [
                    name,
                    SAMPLERS[key][0],
                    _splits(rs),
                    _mean_se([r["ll"] for r in rs]),
                    _reference(name, key, "ll"),
                    _mean_se([r["rmse"] for r in rs]),
                    _reference(name, key, "rmse"),
                    step_text,
                ]
            )
            chain = [r["chain_seconds"] for r in rs if "chain_seconds" in r]
            tune = [r["seconds"] for r in tuning if r["name"] == name and r["key"] == key]
            timing_rows.append(
                [
                    name,
                    SAMPLERS[key][0],
                    spread(chain, fmt="{:.1f}") if chain else "-",
                    spread([r["seconds"] for r in rs], fmt="{:.1f}"),
                    f"{sum(tune):.0f}",
                ]
            )

    num_draws = (iterations - burnin) // 10 * args.particles
    grids = "; ".join(
        f"{SAMPLERS[k][0]} {{{', '.join(f'{g:.0e}' for g in step_grid(k, args.particles))}}}{SAMPLERS[k][5]}"
        for k in samplers
    )
    preamble = (
        f"# UCI regression: SG-MCMC with and without repulsion ({'quick' if args.quick else 'partial' if num_splits < 20 or len(datasets) < len(UCI_DATASETS) else 'full'} run)\n\n"
        f"Command: `python benchmarks/uci.py {command_line_args()}`. "
        f"Data sets: {', '.join(datasets)}; splits 0-{num_splits - 1} of each (fewer where a data set has fewer); "
        f"samplers: {', '.join(SAMPLERS[k][0] for k in samplers)}. "
        f"torch {torch.__version__} (1 thread per worker, {args.jobs} worker(s)), pyro {pyro.__version__}; "
        f"total wall time {total:.0f} s, of which step tuning {tuning_seconds:.0f} s.\n\n"
        f"Protocol: BNN in-50-1 (ReLU), N(0, 1) weight priors, Gaussian likelihood with noise precision "
        f"~ Gamma(1, 0.1) sampled; particles start as in the SVGD reference code (weights N(0, 1/(fan_in+1)), "
        f"biases 0, noise precision 1 / mean squared residual of that start); inputs and targets standardised on "
        f"the training part; L = {args.particles} particles, batch 100, {iterations} iterations, burn-in {burnin}, "
        f"a draw every 10 iterations after it ({num_draws} draws in all); jit_compile={args.jit}. "
        + (
            "Step size: each kernel's default (`step_size=None`): warm-up sets it from the posterior's "
            "local Gaussian approximation (minibatch noise and repulsion included) and freezes it for "
            f"sampling, with bias_bound={args.bias_bound!r} and a stationary variance error of "
            f"{args.bias_tolerance:g} (`bias_tolerance`): "
            + BIAS_BOUND_PROTOCOL[args.bias_bound]
            + "; no tuning, no validation fold; the column gives the frozen step's median (min-max) "
            "over splits, in absolute units, and its variance error in the stiffest direction "
            "(median, max). "
            if default_step
            else f"One step size per "
            f"data set and sampler, chosen by the mean validation LL of the posterior predictive over splits "
            f"0-{tune_splits - 1} (chain on 80 % of the training part, scored on the other 20 %; the test parts are "
            f"never used) from the grids {grids} (N: rows the chain runs on; +R grids are L (SGLD) or L^2 "
            f"(momentum samplers) times the plain ones, see `step_grid`). Each split then runs the chosen step on its "
            f"whole training part (the next best step if that chain diverges or one of its particles escapes: finite, but far below the ensemble in log density over the kept steps and over their final quarter, `EscapedParticleWarning`). "
        )
        + "Metrics on the test part in original "
        "units (RMSE x y_std, LL - log y_std), mean ± standard error over splits.\n\n"
        "Reference columns are quoted, not re-run: thesis Tables 2.3/2.4 (SGLD and SGLD+R only, 20 splits; "
        "± where the thesis gives it); the published SVGD, PBP and MC-dropout numbers are in their own table "
        "below, with the scoreboard of the issue's targets computed from the two tables."
    )
    header = [
        "data set",
        "sampler",
        "splits",
        "test LL",
        "thesis LL",
        "test RMSE",
        "thesis RMSE",
        "frozen step: median (range)" if default_step else "chosen step(s)",
    ]
    sections = [
        "## Test log-likelihood and RMSE\n\n" + markdown(header, rows),
        _published_section(datasets),
        _scoreboard(datasets, samplers, results),
        _outliers(datasets, samplers, results),
        "## Timings (seconds)\n\nChain: wall time of the final run on a whole training part; split: "
        "the final run plus the evaluation; each as median / mean / p90 / max over splits (the "
        "workers share the machine); tuning: all validation chains of the data set and sampler.\n\n"
        + markdown(
            ["data set", "sampler", "chain s: median / mean / p90 / max", "split s", "tuning s"],
            timing_rows,
        ),
    ]
    write_report(preamble, sections, args.output)


def _map(fn, tasks, jobs):
    if jobs > 1:
        with ProcessPoolExecutor(jobs) as pool:
            return list(pool.map(fn, tasks))
    return [fn(task) for task in tasks]


if __name__ == "__main__":
    main()
