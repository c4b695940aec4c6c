"""
Variable selection of ``RetailBSTS`` on simulated truths it has not seen: inclusion
probabilities of true and null covariates, 90 % interval coverage of delta, q and beta,
convergence (split-R-hat) and fit time, for each ``selection`` (``"ssvs"``: the narrow
Gaussian spike summed out; ``"point_mass"``: a point mass at zero with beta integrated out
by the Kalman filter and the indicators moved by Gibbs) and variant (RF, RA).

Protocol: for each seed (100, 101, ... by default: seeds no test uses),
``simulate_retail(num_weeks=234, seed=s, random_truth=True)`` draws a truth (decay rate
in (0.15, 0.6); at least 2 of the 5 channels effective; 1 to 4 of the 7 covariates with a
nonzero coefficient of random sign, one covariate sd moving sales by 0.5-1.5 noise sds;
the rest exactly 0) and the data; the first 104 weeks train.  Each selection x variant is
``RetailBSTS(variant=v, selection=sel, noise="gaussian").fit(sales, spend, covariates,
method="sgld", seed=s)`` with the package defaults otherwise.  Gaussian observation noise,
as simulated (and as ``benchmarks/bsts.py`` fits the simulator), rather than the package
default Student-t, which costs about 4x (165 s instead of about 40 s per fit here) and
would take the full run past the 30 minutes of the slow full-run test;
``--noise student_t`` runs the package default.  A fit that still
diverges after the model's own step-size halving is retried with seed + 1000 (counted as
a failed attempt).

Reported per selection x variant, over seeds: the mean posterior inclusion probability of
the true covariates and of the null ones (all nulls; the random-walk nulls ``unemp_ix``,
``price_ix``, ``cc_ix``, which a local level can mimic; and the nulls other than ``hols``,
whose dummy marks the simulator's Christmas and Easter bumps that a 2-harmonic seasonal
cannot follow, so that it picks up sales even when its true coefficient is 0); the
fraction of central 90 % posterior intervals (``coefficient_draws()``) that contain the
truth for delta, q (all 5 channels) and the true nonzero betas, with the binomial
standard error of a 90 % rate at that count; the largest split-R-hat over all static
sites per seed (mean and max over seeds); and the wall time of ``fit`` (median / mean /
p90 / max over seeds).  A per-covariate table gives the inclusion probability when the
covariate matters and when it is null.

Targets: mean inclusion probability >= 0.8 for the true covariates and <= 0.2 for the
null ones; split-R-hat < 1.05 for RA on every seed.

What any method could reach (``oracle_section``): exact posterior inclusion probabilities
on the same seeds by enumeration of all 2^7 covariate subsets, for an oracle that knows
the goodwill, the noise sd and the level's innovation sd (the rest of the data Gaussian
and marginalised: one dense Gaussian density per subset), with the model's slab and
prior. Three oracles: everything else known; the level unknown; and the model's form (the
level unknown and the seasonal as the model's 2 harmonics, so the simulator's one-week
holiday spikes stay unexplained), which bounds what any sampler of a model of that form
reaches. Beside them, the mean absolute difference between the point-mass fits' inclusion
probabilities and that oracle's; then that oracle over a grid of priors (expected model
size x slab sd x seasonal harmonics), marking where it meets both targets at once.

Ablation (``--seasonal oracle``): the same fits on the sales less the simulator's own
seasonal (``truth["seasonal"]``: smooth yearly waves plus Christmas, Easter and summer
bumps that the model's 2-harmonic seasonal cannot follow), every other part of the data
as simulated.  It tells whether delta's misses come from that misspecification or from
the sampler.  ``--simulate NAME=VALUE ...`` passes keyword arguments to
``simulate_retail`` for other ablations (``level_scale=0``: a level without innovations;
``goodwill_scale=0``: a goodwill without shocks).

Sampler check (``--rao-blackwell``, shared ``delta`` only): for each fit, the model's own
conditional density of ``delta`` given every other site, on a grid of 91 values in
[0.05, 0.95] (the log joint of the model evaluated by Pyro's trace, normalised over the
grid), averaged over 40 of the posterior draws of the other sites: a Rao-Blackwellised
estimate of delta's marginal posterior.  Its mean and 90 % interval sit beside the
sampler's in the per-seed table; where they agree, the sampler draws delta as the model
says, and a miss of the truth is the model's, not the sampler's.

Run from the repository root::

    python benchmarks/bsts_selection.py             # full: 10 seeds, both selections
    python benchmarks/bsts_selection.py --quick     # smoke test: 1 seed, tiny sampler
    python benchmarks/bsts_selection.py --selections ssvs --seeds 10
    python benchmarks/bsts_selection.py --selections point_mass --variants RF \
        --seasonal oracle --rao-blackwell \
        --output benchmarks/results/bsts_selection_seasonal_removed.md

The report is printed and written to
``benchmarks/results/bsts_selection.md`` (rewritten after every seed, so an interrupted
run leaves the seeds it finished).
"""

import hashlib
import itertools
import math
import statistics
import subprocess
import time
import warnings

import torch
from _common import (
    REPO,  # importing _common also sets $PYRO_EXT_DATA's default
    argument_parser,
    command_line_args,
    markdown,
    spread,
    write_report,
)

from pyro_ext.infer import SamplerDivergenceError
from pyro_ext.models.bsts import THESIS_MODEL, RetailBSTS, simulate_retail
from pyro_ext.models.bsts.simulate import PERIOD

RESULTS = REPO / "benchmarks" / "results" / "bsts_selection.md"
SELECTIONS = ("ssvs", "point_mass")
VARIANTS = ("RF", "RA")
RANDOM_WALK = ("unemp_ix", "price_ix", "cc_ix")
CALENDAR = ("hols",)
LEVEL = 0.9
TARGET_TRUE, TARGET_NULL, TARGET_RHAT = 0.8, 0.2, 1.05
NUM_WEEKS, NUM_TRAIN = 234, 104


def code_version():
    """Which ``RetailBSTS`` ran: the git commit and a hash of the files that define it (they
    may carry uncommitted changes), read at the start of the run."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        commit = ""
    files = ["pyro_ext/models/bsts/model.py", "pyro_ext/infer/gibbs.py"]
    digest = hashlib.sha256()
    for name in files:
        path = REPO / name
        digest.update(path.read_bytes() if path.exists() else b"")
    return f"commit {commit or 'unknown'}, sha256 of {' + '.join(files)}: {digest.hexdigest()[:12]}"


EXPECTED_MODEL_SIZE = 5.0


def make_model(variant, selection, noise, expected_model_size=None):
    # The simulator's goodwill is the thesis' (one decay rate, last week's spend), and the
    # committed tables were made with expected_model_size 5 (the package's default then;
    # it now adapts to the number of candidates).
    kwargs = dict(variant=variant, noise=noise, selection=selection, **THESIS_MODEL)
    kwargs["expected_model_size"] = expected_model_size or EXPECTED_MODEL_SIZE
    return RetailBSTS(**kwargs)


def fit_kwargs(quick):
    if quick:
        return dict(
            num_samples=10, warmup_steps=10, num_particles=2, rhat_target=None, map_init_steps=20
        )
    return {}


def robust_fit(model, data, seed, quick):
    """``fit`` on the training weeks; a run that still diverges after the model's own
    step-size halving is retried once with seed + 1000. Returns the wall time of the
    successful fit and the failed attempts."""
    failures = []
    for s in (seed, seed + 1000):
        t0 = time.perf_counter()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                model.fit(
                    data.sales[:NUM_TRAIN],
                    data.spend[:NUM_TRAIN],
                    data.covariates[:NUM_TRAIN],
                    method="sgld",
                    seed=s,
                    channel_names=data.channel_names,
                    covariate_names=data.covariate_names,
                    **fit_kwargs(quick),
                )
            return time.perf_counter() - t0, failures
        except SamplerDivergenceError as error:
            failures.append(f"seed {s}: {str(error)[:100]}")
            print("fit failed:", failures[-1], flush=True)
    raise RuntimeError(f"every fit attempt failed: {failures}")


def covered(draws, truth):
    """Bool ``truth`` inside the central ``LEVEL`` interval of ``draws`` (first dim)."""
    probs = torch.tensor([(1 - LEVEL) / 2, (1 + LEVEL) / 2], dtype=torch.float64)
    lo, hi = torch.quantile(draws.to(torch.float64), probs, dim=0)
    truth = torch.as_tensor(truth, dtype=torch.float64)
    return (lo <= truth) & (truth <= hi)


def max_rhat(model):
    """Largest finite split-R-hat over the static sites, the site it belongs to and the
    number of non-finite entries (a site constant within every chain gives NaN)."""
    worst, site, nonfinite = -math.inf, None, 0
    for name, r in model.rhat().items():
        r = r.reshape(-1).to(torch.float64)
        finite = torch.isfinite(r)
        nonfinite += int((~finite).sum())
        if finite.any() and float(r[finite].max()) > worst:
            worst, site = float(r[finite].max()), name
    return worst, site, nonfinite


def rao_blackwell_delta(model, num_draws=40, grid_size=91):
    """Mean and central ``LEVEL`` interval of the shared ``delta``'s marginal posterior
    estimated as the average over ``num_draws`` posterior draws of its conditional density
    given every other site, each on a grid of ``grid_size`` values in [0.05, 0.95] from the
    model's log joint (see the docstring)."""
    import pyro

    y, u, X = model.model_data
    draws = model.samples
    others = [n for n in draws if n not in ("delta", "sigma_obs", "sigma_goodwill", "q", "beta")]
    grid = torch.linspace(0.05, 0.95, grid_size, dtype=torch.float64)
    rows = torch.linspace(0, draws["delta"].shape[0] - 1, num_draws).round().long()
    density = torch.zeros(grid_size, dtype=torch.float64)
    for i in rows.tolist():
        given = {n: draws[n][i] for n in others}
        log_joint = []
        for value in grid:
            given["delta"] = value.reshape(draws["delta"][i].shape)
            conditioned = pyro.poutine.condition(model.model, data=given)
            log_joint.append(pyro.poutine.trace(conditioned).get_trace(y, u, X).log_prob_sum())
        density += torch.softmax(torch.stack(log_joint).detach(), 0) / num_draws
    cdf = density.cumsum(0)

    def quantile(p):
        return float(grid[int((cdf >= p).nonzero()[0])])

    return float((density * grid).sum()), quantile((1 - LEVEL) / 2), quantile((1 + LEVEL) / 2)


def run_one(
    data, variant, selection, seed, noise, quick, expected_model_size=None, rao_blackwell=False
):
    model = make_model(variant, selection, noise, expected_model_size)
    seconds, failures = robust_fit(model, data, seed, quick)
    truth = data.truth
    draws = model.coefficient_draws()
    inclusion = model.inclusion_probabilities().to(torch.float64)
    true_in = truth["inclusion"]
    rhat, rhat_site, nonfinite = max_rhat(model)
    probs = torch.tensor([(1 - LEVEL) / 2, (1 + LEVEL) / 2], dtype=torch.float64)
    delta_lo, delta_hi = torch.quantile(draws["delta"].to(torch.float64), probs).tolist()
    return {
        "seed": seed,
        "inclusion": inclusion.tolist(),
        "truth_inclusion": true_in.tolist(),
        "cover_delta": covered(draws["delta"][:, None], [truth["delta"]]).tolist(),
        "delta": (float(draws["delta"].mean()), delta_lo, delta_hi),
        "cover_q": covered(draws["q"], truth["q"]).tolist(),
        "cover_beta_true": covered(draws["beta"][:, true_in], truth["beta"][true_in]).tolist(),
        "cover_beta_null": covered(draws["beta"][:, ~true_in], truth["beta"][~true_in]).tolist(),
        "rhat": rhat,
        "rhat_site": rhat_site,
        "rhat_nonfinite": nonfinite,
        "seconds": seconds,
        "failures": failures,
        "extensions": getattr(model, "sampling_extensions", 0),
        "draws": int(draws["delta"].shape[0]),
        "delta_rao_blackwell": rao_blackwell_delta(model, 4 if quick else 40)
        if rao_blackwell
        else None,
    }


# ----------------------------------------------------------------------------- report
def _mean(values):
    values = list(values)
    return statistics.fmean(values) if values else math.nan


def inclusion_groups(runs, names):
    """Mean inclusion probability over (seed, covariate) pairs in each group."""
    groups = {"true": [], "null": [], "rw null": [], "null w/o hols": [], "hols null": []}
    for r in runs:
        for name, p, t in zip(names, r["inclusion"], r["truth_inclusion"]):
            if t:
                groups["true"].append(p)
                continue
            groups["null"].append(p)
            if name in RANDOM_WALK:
                groups["rw null"].append(p)
            if name in CALENDAR:
                groups["hols null"].append(p)
            else:
                groups["null w/o hols"].append(p)
    return {k: (_mean(v), len(v)) for k, v in groups.items()}


def coverage_cell(runs, key):
    flags = [f for r in runs for f in r[key]]
    n = len(flags)
    if not n:
        return "n/a"
    se = math.sqrt(LEVEL * (1 - LEVEL) / n)
    return f"{sum(flags) / n:.2f} ({sum(flags)}/{n}; ±{se:.2f})"


def _fmt(value, n=None, digits=2):
    if math.isnan(value):
        return "n/a"
    return f"{value:.{digits}f}" + (f" ({n})" if n is not None else "")


def _mark(value, ok):
    return f"**{value}**" if ok else value


# -- what any method could reach: exact oracles ------------------------------------------
#: Exact oracles: the other parts of the simulated sales either known (subtracted) or
#: Gaussian and marginalised, so that the covariates' posterior inclusion probabilities
#: follow by enumerating all 2^p subsets (see ``oracle_inclusion``).
ORACLES = {
    "all known": "level, seasonal and goodwill known",
    "level unknown": "level unknown (a random walk with its true sd), seasonal and goodwill known",
    "the model's form": "level unknown, seasonal as the model's 2 harmonics (the simulator's "
    "holiday spikes left in), goodwill known",
}
ORACLE_GRID = [(ems, slab) for ems in (2, 3, 4, 5) for slab in (0.3, 1.0, 3.0)]
DIFFUSE = 100.0  # prior variance of the initial level and of the harmonics (standardised)


_ORACLE_CACHE = {}  # the report is rewritten after every seed: each oracle runs once


def oracle_inclusion(data, structure, pi, slab, harmonics=2):
    """
    Exact posterior inclusion probabilities of the covariates on the training weeks, with
    what the oracle ``structure`` knows of the truth: the goodwill, the noise sd and the
    level's innovation sd always, and the level and seasonal paths as ``ORACLES`` says. In
    the model's standardised units (sales and covariates over the training weeks), with
    ``RetailBSTS``'s prior: ``beta_j ~ N(0, slab^2)`` if included, each covariate
    included with probability ``pi``. The residual is then Gaussian, ``N(X_g beta_g,
    sigma^2 I + K)`` with ``K`` the unknown parts' covariance, and every subset ``g``'s
    marginal likelihood is one dense Gaussian density: an upper bound on what any
    sampler or prior on the model's form can reach on these data.
    """
    key = (id(data), structure, pi, slab, harmonics)
    if key not in _ORACLE_CACHE:
        _ORACLE_CACHE[key] = _oracle_inclusion(data, structure, pi, slab, harmonics)
    return _ORACLE_CACHE[key]


def _oracle_inclusion(data, structure, pi, slab, harmonics):
    truth, T = data.truth, NUM_TRAIN
    y, X = data.sales[:T].double(), data.covariates[:T].double()
    y_scale = y.std()
    x = (X - X.mean(0)) / X.std(0)
    t = torch.arange(T, dtype=torch.float64)
    residual = y - truth["goodwill"][:T].double()
    cov = torch.full((T, T), DIFFUSE, dtype=torch.float64)  # the unknown mean
    if structure == "all known":
        residual = residual - truth["level"][:T].double() - truth["seasonal"][:T].double()
    else:
        step = truth["level_scale"] / float(y_scale)
        cov = cov + step**2 * torch.minimum(t[:, None], t[None, :])
        if structure == "level unknown":
            residual = residual - truth["seasonal"][:T].double()
        else:
            angles = 2 * math.pi * t[:, None] * torch.arange(1, harmonics + 1) / PERIOD
            basis = torch.cat([angles.cos(), angles.sin()], -1)
            cov = cov + DIFFUSE * basis @ basis.T
    residual = (residual - residual.mean()) / y_scale
    cov = cov + (truth["noise_scale"] / float(y_scale)) ** 2 * torch.eye(T, dtype=torch.float64)
    p = x.shape[1]
    subsets = torch.tensor(list(itertools.product((0.0, 1.0), repeat=p)), dtype=torch.float64)
    log_post = []
    for g in subsets:
        included = x[:, g.bool()]
        marginal = torch.distributions.MultivariateNormal(
            torch.zeros(T, dtype=torch.float64), cov + slab**2 * included @ included.T
        )
        size = float(g.sum())
        log_post.append(
            marginal.log_prob(residual) + size * math.log(pi) + (p - size) * math.log1p(-pi)
        )
    weights = torch.softmax(torch.stack(log_post), 0)
    return (weights[:, None] * subsets).sum(0).tolist()


def prior_inclusion(variant, expected_model_size, num_channels, num_covariates):
    """The prior inclusion probability of a covariate, as ``RetailBSTS._priors_pi``."""
    size = num_channels + num_covariates if variant == "RA" else num_covariates
    return min(1.0, expected_model_size / size)


def oracle_runs(oracles):
    """The oracles' inclusion probabilities in the layout ``inclusion_groups`` reads."""
    return [{"inclusion": pips, "truth_inclusion": inclusion} for pips, inclusion in oracles]


def oracle_section(results, truth_data, names, ems):
    """The oracles at the package's prior next to the fits, then the oracle of the model's
    form over a grid of priors: no prior meets both targets there."""
    rows = []
    for variant in VARIANTS:
        pi = prior_inclusion(variant, ems, 5, len(names))
        for structure in ORACLES:
            runs = oracle_runs(
                [
                    (oracle_inclusion(d, structure, pi, 1.0), d.truth["inclusion"].tolist())
                    for d in truth_data.values()
                ]
            )
            g = inclusion_groups(runs, names)
            rows.append(
                [f"oracle: {structure}", variant, f"{pi:.2f}"]
                + [_fmt(*g[k]) for k in ("true", "null", "null w/o hols", "rw null")]
                + ["-"]
            )
        fits = results.get(("point_mass", variant), [])
        if fits:
            g = inclusion_groups(fits, names)
            form = {
                r["seed"]: oracle_inclusion(truth_data[r["seed"]], "the model's form", pi, 1.0)
                for r in fits
            }
            gap = _mean(abs(a - b) for r in fits for a, b in zip(r["inclusion"], form[r["seed"]]))
            rows.append(
                ["fit: point_mass", variant, f"{pi:.2f}"]
                + [_fmt(*g[k]) for k in ("true", "null", "null w/o hols", "rw null")]
                + [f"{gap:.3f}"]
            )
    header = [
        "what",
        "variant",
        "prior incl.",
        f"incl. true (≥ {TARGET_TRUE})",
        f"incl. null (≤ {TARGET_NULL})",
        "incl. null w/o hols",
        "incl. random-walk null",
        "mean abs. difference to the oracle of the model's form",
    ]
    grid_rows = []
    for ems_, slab in ORACLE_GRID:
        pi = prior_inclusion("RF", ems_, 5, len(names))
        for harmonics in (2, 12):
            runs = oracle_runs(
                [
                    (
                        oracle_inclusion(d, "the model's form", pi, slab, harmonics),
                        d.truth["inclusion"].tolist(),
                    )
                    for d in truth_data.values()
                ]
            )
            g = inclusion_groups(runs, names)
            both = g["true"][0] >= TARGET_TRUE and g["null"][0] <= TARGET_NULL
            grid_rows.append(
                [f"{ems_:g}", f"{pi:.2f}", f"{slab:g}", str(harmonics)]
                + [_fmt(g[k][0]) for k in ("true", "null", "null w/o hols")]
                + ["**yes**" if both else "no"]
            )
    return (
        "## What any method could reach: exact oracles\n\n"
        "Posterior inclusion probabilities computed exactly (all 2^7 subsets enumerated, "
        "`oracle_inclusion`) by an oracle that knows the goodwill, the noise sd and the "
        "level's innovation sd, with the model's slab N(0, 1) in standardised units and "
        "its prior inclusion probability: "
        + "; ".join(f"*{k}*: {v}" for k, v in ORACLES.items())
        + ". Over the same seeds as the fits. *The model's form* bounds what any sampler of "
        "a model with a local level and a 2-harmonic seasonal can reach; the point-mass fits' "
        "last column is the mean absolute difference between their inclusion probabilities "
        "and that oracle's, per (seed, covariate).\n\n"
        + markdown(header, rows)
        + "\n\nThe oracle of the model's form over priors (RF: each of the 7 covariates "
        "included with probability expected model size / 7; slab sd; seasonal harmonics): "
        "whether the mean inclusion of the true covariates is ≥ "
        f"{TARGET_TRUE} and that of the nulls ≤ {TARGET_NULL} at once.\n\n"
        + markdown(
            [
                "expected model size",
                "prior incl.",
                "slab sd",
                "harmonics",
                "incl. true",
                "incl. null",
                "incl. null w/o hols",
                "both targets",
            ],
            grid_rows,
        )
    )


def summary_table(results, names):
    header = [
        "selection",
        "variant",
        "seeds",
        f"incl. true (target ≥ {TARGET_TRUE})",
        f"incl. null (target ≤ {TARGET_NULL})",
        "incl. random-walk null",
        "incl. null w/o hols",
        "incl. hols when null",
        "90 % cover δ",
        "90 % cover q",
        "90 % cover β (true ≠ 0)",
        "90 % cover β = 0 (null)",
        "max R̂: mean / max over seeds",
        "fit s: median / mean / p90 / max",
        "failed attempts",
    ]
    rows = []
    for (sel, variant), runs in results.items():
        if not runs:
            continue
        g = inclusion_groups(runs, names)
        rh = [r["rhat"] for r in runs]
        rh_ok = max(rh) < TARGET_RHAT
        rows.append(
            [
                sel,
                variant,
                str(len(runs)),
                _mark(_fmt(*g["true"]), g["true"][0] >= TARGET_TRUE),
                _mark(_fmt(*g["null"]), g["null"][0] <= TARGET_NULL),
                _fmt(*g["rw null"]),
                _fmt(*g["null w/o hols"]),
                _fmt(*g["hols null"]),
                coverage_cell(runs, "cover_delta"),
                coverage_cell(runs, "cover_q"),
                coverage_cell(runs, "cover_beta_true"),
                coverage_cell(runs, "cover_beta_null"),
                _mark(f"{statistics.fmean(rh):.3f} / {max(rh):.3f}", rh_ok),
                spread([r["seconds"] for r in runs], fmt="{:.1f}"),
                str(sum(len(r["failures"]) for r in runs)),
            ]
        )
    return markdown(header, rows)


def per_covariate_table(results, names):
    header = ["selection", "variant"] + names
    rows = []
    for (sel, variant), runs in results.items():
        if not runs:
            continue
        cells = []
        for j in range(len(names)):
            true = [r["inclusion"][j] for r in runs if r["truth_inclusion"][j]]
            null = [r["inclusion"][j] for r in runs if not r["truth_inclusion"][j]]
            cells.append(f"{_fmt(_mean(true))} ({len(true)}) · {_fmt(_mean(null))} ({len(null)})")
        rows.append([sel, variant] + cells)
    return markdown(header, rows)


def per_seed_table(results, seeds):
    columns = {k: runs for k, runs in results.items() if runs}
    header = ["seed"] + [f"{sel} {v}" for sel, v in columns]
    rows = []
    for seed in seeds:
        row = [str(seed)]
        for runs in columns.values():
            r = next((r for r in runs if r["seed"] == seed), None)
            if r is None:
                row.append("")
                continue
            extra = f", {r['rhat_nonfinite']} NaN" if r["rhat_nonfinite"] else ""
            mean, lo, hi = r["delta"]
            cell = (
                f"{r['rhat']:.3f} ({r['rhat_site']}{extra}); {r['seconds']:.0f} s, "
                f"{r['draws']} draws; δ {mean:.2f} [{lo:.2f}, {hi:.2f}]"
            )
            if r.get("delta_rao_blackwell"):
                mean, lo, hi = r["delta_rao_blackwell"]
                cell += f"; Rao-Blackwellised δ {mean:.2f} [{lo:.2f}, {hi:.2f}]"
            row.append(cell)
        rows.append(row)
    return markdown(header, rows)


def truth_table(truths, names, channels):
    header = ["seed", "δ", "effective channels (q)", "true covariates (β · sd / noise sd)"]
    rows = []
    for seed, t in truths.items():
        q = ", ".join(f"{c} {float(v):.3f}" for c, v in zip(channels, t["q"]) if float(v) != 0)
        b = ", ".join(
            f"{n} {float(e):+.2f}" for n, e in zip(names, t["covariate_effect"]) if float(e) != 0
        )
        rows.append([str(seed), f"{t['delta']:.3f}", q, b])
    return markdown(header, rows)


def report(
    results, truths, seeds, names, channels, args, elapsed, done, notes, version, truth_data
):
    quick = args.quick
    mode = "quick (smoke test: 1 seed, tiny sampler)" if quick else "full"
    partial = "" if done == len(seeds) else f" **Partial: {done} of {len(seeds)} seeds done.**"
    cmd = command_line_args()
    sizes = (
        "num_samples=10, warmup_steps=10, num_particles=2, map_init_steps=20, rhat_target=None"
        if quick
        else "the package defaults (8 particles, 200 warmup + 200 draws, thinning 2, "
        "extended while max R̂ ≥ 1.05 up to 800 draws per particle)"
    )
    noise = args.noise + (" (the package default)" if args.noise == "student_t" else "")
    preamble = (
        "# RetailBSTS variable selection on random simulated truths\n\n"
        f"Mode: {mode}.{partial} torch {torch.__version__}, 1 thread, float64; total "
        f"{elapsed / 60:.1f} min. Generated by `python benchmarks/bsts_selection.py"
        f"{(' ' + cmd) if cmd else ''}`. Seeds {seeds[0]}..{seeds[-1]}: "
        f"`simulate_retail(num_weeks={NUM_WEEKS}, seed=s, random_truth=True)`, the first "
        f"{NUM_TRAIN} weeks train; `RetailBSTS(variant=v, selection=sel, noise=...)` (noise: "
        f"{noise}; expected_model_size: "
        f"{args.expected_model_size or EXPECTED_MODEL_SIZE:g}; the thesis' model, "
        "`THESIS_MODEL`), "
        f'`fit(method="sgld", seed=s)` with {sizes}. Code: {version}.'
        + (
            " **Ablation: the sales less the simulator's true seasonal** (`--seasonal "
            "oracle`), so the model's seasonal has nothing it cannot follow."
            if args.seasonal == "oracle"
            else ""
        )
        + (
            f" **Ablation: `simulate_retail({', '.join(args.simulate)})`.**"
            if args.simulate
            else ""
        )
        + "\n\n"
        f"**Targets**: mean inclusion probability of the true covariates ≥ {TARGET_TRUE} and "
        f"of the null covariates ≤ {TARGET_NULL}; split-R̂ < {TARGET_RHAT} for RA on every "
        "seed. Bold: target met. Inclusion cells: mean over (seed, covariate) pairs (count). "
        "Coverage cells: fraction of central 90 % posterior intervals (`coefficient_draws()`) "
        "that contain the truth (covered / count; ± the binomial standard error of a 90 % "
        "rate at that count). δ: one per seed; q: all 5 channels, including the ineffective "
        "ones (true q = 0); β: the covariates whose true coefficient is nonzero, and "
        "separately the null ones (true β = 0). max R̂: largest split-R̂ over all static "
        "sites, particles as chains, per seed. fit s: wall time of `fit`, over seeds. "
        "`hols` marks the simulator's Christmas and Easter bumps, which the model's "
        "2-harmonic seasonal cannot follow: its dummy picks up sales even when its true "
        "coefficient is 0, a misspecification rather than a selection error, hence the "
        "columns without it."
    )
    if notes:
        preamble += "\n\n" + notes
    sections = [
        "## Selection, coverage, convergence, time\n\n" + summary_table(results, names),
        "## Inclusion probability per covariate\n\nMean inclusion probability when the "
        "covariate's true coefficient is nonzero · when it is 0 (number of seeds in "
        "each case).\n\n" + per_covariate_table(results, names),
        "## Per seed\n\nMax R̂ (the site it belongs to); fit time; draws (particles × draws "
        "per particle); posterior mean of δ [central 90 % interval] (the true δ is in the "
        "next table); with `--rao-blackwell`, the same from the model's conditional densities "
        "of δ given the other sites' draws (the script's docstring).\n\n"
        + per_seed_table(results, seeds),
        "## The simulated truths\n\n" + truth_table(truths, names, channels),
        oracle_section(
            results,
            truth_data,
            names,
            args.expected_model_size or EXPECTED_MODEL_SIZE,
        ),
    ]
    failures = [
        f"seed {r['seed']}, {sel} {v}: {f}"
        for (sel, v), runs in results.items()
        for r in runs
        for f in r["failures"]
    ]
    sections.append(
        "## Failed fit attempts (retried with seed + 1000)\n\n"
        + ("\n".join(f"- {f}" for f in failures) if failures else "None.")
    )
    write_report(preamble, sections, args.output)


def main(argv=None):
    parser = argument_parser(
        __doc__,
        RESULTS,
        quick="1 seed, tiny sampler",
        seeds="number of seeds (default 10; quick 1)",
    )
    parser.add_argument("--first-seed", type=int, default=100)
    parser.add_argument("--selections", nargs="+", default=list(SELECTIONS), choices=SELECTIONS)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument(
        "--noise",
        default="gaussian",
        choices=("gaussian", "student_t"),
        help="observation noise of the model (the simulated noise is Gaussian)",
    )
    parser.add_argument(
        "--expected-model-size",
        type=float,
        default=None,
        help=f"RetailBSTS's expected_model_size (default {EXPECTED_MODEL_SIZE:g}, the value of "
        "the committed tables)",
    )
    parser.add_argument(
        "--seasonal",
        default="simulated",
        choices=("simulated", "oracle"),
        help="oracle: fit the sales less the simulator's true seasonal (an ablation: see the "
        "docstring)",
    )
    parser.add_argument(
        "--simulate",
        nargs="+",
        default=[],
        metavar="NAME=VALUE",
        help="ablation: keyword arguments of simulate_retail (floats), e.g. level_scale=0 "
        "goodwill_scale=0",
    )
    parser.add_argument(
        "--rao-blackwell",
        action="store_true",
        help="also estimate delta's posterior from the model's conditional densities (the "
        "sampler check of the docstring)",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    t_start = time.perf_counter()
    version = code_version()
    seeds = [args.first_seed + i for i in range(args.seeds or (1 if args.quick else 10))]

    simulate = {k: float(v) for k, v in (a.split("=", 1) for a in args.simulate)}
    selections = list(args.selections)
    results = {(sel, v): [] for sel in selections for v in args.variants}
    truths, truth_data = {}, {}
    names = channels = None
    errors = []
    for i, seed in enumerate(seeds):
        data = simulate_retail(num_weeks=NUM_WEEKS, seed=seed, random_truth=True, **simulate)
        if args.seasonal == "oracle":
            data = data._replace(sales=data.sales - data.truth["seasonal"])
        names, channels = data.covariate_names, data.channel_names
        truths[seed] = data.truth
        truth_data[seed] = data
        for sel in selections:
            for variant in args.variants:
                key = (sel, variant)
                try:
                    r = run_one(
                        data,
                        variant,
                        sel,
                        seed,
                        args.noise,
                        args.quick,
                        args.expected_model_size,
                        args.rao_blackwell,
                    )
                except Exception as error:  # one broken configuration must not end the run
                    if args.quick:
                        raise
                    errors.append(f"seed {seed}, {sel} {variant}: {error!r}")
                    print("error:", errors[-1], flush=True)
                    continue
                results[key].append(r)
                print(
                    f"seed {seed} {sel} {variant}: {r['seconds']:.1f}s rhat {r['rhat']:.3f} "
                    f"({r['rhat_site']}) incl "
                    + " ".join(f"{p:.2f}" for p in r["inclusion"])
                    + " truth "
                    + "".join("1" if t else "0" for t in r["truth_inclusion"]),
                    flush=True,
                )
        note = ""
        if errors:
            note += ("\n\n" if note else "") + "Errors (configuration skipped for that seed):\n\n"
            note += "\n".join(f"- {e}" for e in errors)
        report(
            results,
            truths,
            seeds,
            names,
            channels,
            args,
            time.perf_counter() - t_start,
            i + 1,
            note,
            version,
            truth_data,
        )


if __name__ == "__main__":
    main()
