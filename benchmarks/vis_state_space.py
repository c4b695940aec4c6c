"""
Variationally inferred sampling on state-space models (thesis section 2.4.2): figure 2.8 and
tables 2.5 and 2.6, with the hidden states marginalised exactly by ``pyro_ext.timeseries``.

In every experiment the base guide is a point mass on the parameters θ (``AutoDelta``: plain
VI is MAP estimation, i.e. Bayesian Baum–Welch for the HMM and Kalman-filter likelihood
maximisation for the DLM), refined with T ∈ {0, 1, 2} noise-free gradient steps (sampler
``"sgd"``, VIS-P, fast gradient of eq. 2.13 as in the thesis; SGLD noise on a point-mass base
only blurs the point estimate), trained with Adam.

1. Figure 2.8: log-likelihood log p(x | θ_T) of the training series along the optimisation,
   against iterations and against wall-clock time, for the HMM of eq. 2.14 (5 states, 5
   symbols, Dirichlet priors; data from a random 5-state HMM) and the DLM of appendix 2.B.1
   (z_{t+1} ~ N(0.5 z_t + 1, σ_tr), x_t ~ N(3 z_t + 0.5, σ_em), z_0 = 0; θ = (σ_tr, σ_em)).
   The thesis shows curves only; we print the log-likelihood at fixed iterations and at
   matched wall time (mean ± sd over seeds).
2. Table 2.5: an alternating 0/1 series of 105 steps, HMM trained on the first 100 (T=0: 50
   epochs, T=1: 20 epochs, one epoch = one gradient step on the full series), scored on the
   5-step-ahead predictive p(y_t | y_{1:100}) of the last five steps averaged over 100 draws
   of the refined guide: accuracy (arg max), predictive entropy, logarithmic score.
3. Table 2.6: Mauna Loa CO2 (the monthly copy used by the thesis' code, from 1966), first 10
   years train, next 2 test, standardised with the training mean and sd; local linear trend +
   seasonal(12) in the cyclic form of appendix 2.B.1 (T=0: 10 epochs, T=1: 4 epochs): MAE of
   the predictive mean, mean predictive entropy, and the interval score (α = 0.05) averaged
   over the 24 test months (the thesis does not say; its entropy of 2.5 nats means intervals
   about 12 wide, so its 15.25 is a per-month mean, not a sum).

Run from the repository root::

    python benchmarks/vis_state_space.py           # full: 5 seeds, about 15 minutes
    python benchmarks/vis_state_space.py --quick   # smoke test

Data are read from ``$PYRO_EXT_DATA`` (default: ``../shared/data`` next to the repository).
The tables are printed and written to ``benchmarks/results/vis_state_space.md``.
"""

import functools
import math
import statistics
import time
import warnings

import pyro  # noqa: E402
import pyro.distributions as dist  # noqa: E402
import torch  # noqa: E402
from _common import (  # noqa: E402
    REPO,  # importing _common also sets $PYRO_EXT_DATA's default
    argument_parser,
    markdown,
    mean_sd,
    section_made_by,
    write_sections,
)
from pyro.infer import SVI, Trace_ELBO  # noqa: E402
from pyro.infer.autoguide import AutoDelta  # noqa: E402
from pyro.infer.autoguide.initialization import init_to_median, init_to_sample  # noqa: E402

from pyro_ext.datasets import load_co2  # noqa: E402
from pyro_ext.infer.vis import VIS  # noqa: E402
from pyro_ext.timeseries.dlm import (  # noqa: E402
    DLM,
    DLMDistribution,
    LinearGaussian,
    LocalLinearTrend,
    Seasonal,
)  # noqa: E402
from pyro_ext.timeseries.kalman import (  # noqa: E402
    StateSpaceMatrices,
    forecast_interval,
    kalman_filter,
)
from pyro_ext.timeseries.models import HiddenMarkovModel  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "vis_state_space.md"
REFINEMENT_STEPS = (0, 1, 2)
HMM_STEP_SIZE, DLM_STEP_SIZE = 1e-2, 1e-3
PAPER_HMM_TABLE = {
    "accuracy": (0.40, 0.84),
    "predictive entropy": (1.414, 1.056),
    "log score": (-1.044, -0.682),
}
PAPER_DLM_TABLE = {
    "MAE": (0.270, 0.239),
    "predictive entropy": (2.537, 2.401),
    "interval score": (15.247, 13.461),
}


def make_guide(model, num_steps, step_size, init_loc_fn=init_to_median):
    return VIS(
        model,
        AutoDelta(model, init_loc_fn=init_loc_fn),
        sampler="sgd",
        num_steps=num_steps,
        step_size=step_size,
        learn_step_size=False,
        entropy="particle",
        gradient="fast",
    )


def train(model, guide, data, num_iterations, lr, evaluate=None, eval_every=1):
    """Adam on the refined ELBO; returns [(iteration, elapsed seconds, evaluate())]."""
    svi = SVI(model, guide, pyro.optim.Adam({"lr": lr}), Trace_ELBO())
    curve, elapsed = [], 0.0
    for it in range(1, num_iterations + 1):
        start = time.perf_counter()
        svi.step(data)
        if it > 1:  # the first step also traces the model and sets the guide up
            elapsed += time.perf_counter() - start
        if evaluate is not None and (it % eval_every == 0 or it == num_iterations):
            curve.append((it, elapsed, evaluate()))
    return curve


def refined_draws(guide, data, num_samples):
    with torch.no_grad():
        return guide.sample_posterior(data, num_samples=num_samples)


# -- the HMM of eq. 2.14 -------------------------------------------------------------------------


def random_categorical_hmm(num_states, num_symbols, length, generator):
    init = torch.distributions.Dirichlet(torch.ones(num_states)).sample()
    trans = torch.distributions.Dirichlet(0.3 * torch.ones(num_states, num_states)).sample()
    emission = torch.distributions.Dirichlet(0.3 * torch.ones(num_states, num_symbols)).sample()
    z = [int(torch.multinomial(init, 1, generator=generator))]
    for _ in range(length - 1):
        z.append(int(torch.multinomial(trans[z[-1]], 1, generator=generator)))
    z = torch.tensor(z)
    x = torch.multinomial(emission[z], 1, generator=generator)[:, 0]
    return x.double()


def hmm_log_likelihood(model, params, y):
    return float(model.distribution(params, y).log_prob(y).mean())


def figure_hmm(seeds, iterations, step_size, lr):
    results = {T: [] for T in REFINEMENT_STEPS}
    for seed in seeds:
        pyro.set_rng_seed(seed)
        y = random_categorical_hmm(5, 5, 200, torch.Generator().manual_seed(seed))
        for T in REFINEMENT_STEPS:
            pyro.clear_param_store()
            pyro.set_rng_seed(seed)
            model = HiddenMarkovModel(5, "categorical", num_symbols=5)
            guide = make_guide(model, T, step_size)
            curve = train(
                model,
                guide,
                y,
                iterations,
                lr,
                evaluate=lambda: hmm_log_likelihood(model, refined_draws(guide, y, 8), y),
            )
            results[T].append(curve)
    return results


# -- the DLM of appendix 2.B.1 ---------------------------------------------------------------------


def affine_dlm(sigma_tr, sigma_em):
    """z_{t+1} = 0.5 z_t + 1 + N(0, σ_tr²), x_t = 3 z_t + 0.5 + N(0, σ_em²), z_0 = 0, written
    with the augmented state (z_t, 1)."""
    like = torch.as_tensor(sigma_tr)
    G = torch.tensor([[0.5, 1.0], [0.0, 1.0]], dtype=like.dtype)
    F = torch.tensor([[3.0, 0.5]], dtype=like.dtype)
    zero = torch.zeros_like(like)
    W = torch.stack([torch.stack([sigma_tr**2, zero], -1), torch.stack([zero, zero], -1)], -2)
    # z_1 = 0.5 * z_0 + 1 + noise with z_0 = 0: mean (1, 1), variance σ_tr² on the first state.
    init_mean = torch.ones(like.shape + (2,), dtype=like.dtype)
    return DLM(LinearGaussian(G, F, W, init_mean, W), observation_scale=sigma_em)


def simulate_affine_dlm(length, generator, sigma_tr=0.5, sigma_em=1.0):
    z, xs = 0.0, []
    for _ in range(length):
        z = 0.5 * z + 1.0 + sigma_tr * float(torch.randn((), generator=generator))
        xs.append(3.0 * z + 0.5 + sigma_em * float(torch.randn((), generator=generator)))
    return torch.tensor(xs, dtype=torch.float64)


def dlm_model(y):
    sigma_tr = pyro.sample("sigma_tr", dist.LogNormal(y.new_zeros(()), 1.0))
    sigma_em = pyro.sample("sigma_em", dist.LogNormal(y.new_zeros(()), 1.0))
    pyro.sample("obs", DLMDistribution(affine_dlm(sigma_tr, sigma_em), y.shape[-1]), obs=y)


def dlm_log_likelihood(params, y):
    return float(affine_dlm(params["sigma_tr"], params["sigma_em"]).log_likelihood(y).mean())


def figure_dlm(seeds, iterations, step_size, lr):
    results = {T: [] for T in REFINEMENT_STEPS}
    for seed in seeds:
        y = simulate_affine_dlm(200, torch.Generator().manual_seed(seed))
        for T in REFINEMENT_STEPS:
            pyro.clear_param_store()
            pyro.set_rng_seed(seed)
            guide = make_guide(dlm_model, T, step_size)
            curve = train(
                dlm_model,
                guide,
                y,
                iterations,
                lr,
                evaluate=lambda: dlm_log_likelihood(refined_draws(guide, y, 8), y),
            )
            results[T].append(curve)
    return results


def curve_table(results, checkpoints):
    """Log-likelihood at fixed iterations and at the wall time T=0 needs for all of them."""
    budget = statistics.median(curve[-1][1] for curve in results[0])
    header = (
        ["T"]
        + [f"iteration {c}" for c in checkpoints]
        + [f"at {1e3 * budget:.0f} ms", "ms / iteration"]
    )
    rows = []
    for T, curves in results.items():
        row = [str(T)]
        for c in checkpoints:
            row.append(mean_sd([curve[c - 1][2] for curve in curves]))
        at_budget = [
            max((p for p in curve if p[1] <= budget), key=lambda p: p[1], default=curve[0])[2]
            for curve in curves
        ]
        row.append(mean_sd(at_budget))
        row.append(
            f"{1e3 * statistics.median(curve[-1][1] / (curve[-1][0] - 1) for curve in curves):.1f}"
        )
        rows.append(row)
    return markdown(header, rows)


# -- table 2.5 ---------------------------------------------------------------------------------


#: Table 2.5's series: the symmetric single-state fit (every row of the transition matrix to
#: one state, emissions 1/2 each) scores log(1/2) per step; a fit that learned the
#: alternation scores near 0. A restart within COLLAPSE_TOLERANCE nats per step of log(1/2)
#: found only the symmetric solution.
COLLAPSE_TOLERANCE = 0.05
HMM_RESTARTS = 10


def hmm_predictive(model, guide, train_y, num_draws):
    """(symbol, step) predictive probabilities of the 5 steps after ``train_y``, a mixture
    over the refined guide's draws, and the training log-likelihood per step."""
    draws = refined_draws(guide, train_y, num_draws)
    forecast = model.forecast(train_y, draws, num_steps=5)  # batch (5, num_draws)
    symbols = torch.arange(5, dtype=torch.float64)[:, None, None]
    probs = forecast.log_prob(symbols).exp().mean(-1)
    return probs, hmm_log_likelihood(model, draws, train_y) / train_y.shape[-1]


def fit_hmm(T, num_epochs, step_size, lr, train_y, seed, init_loc_fn, num_draws):
    """Train from a fresh param store and score at once (the next fit clears the store the
    guide's parameters live in): the predictive probabilities and training log-likelihood
    per step of :func:`hmm_predictive`, its draws seeded by ``seed``."""
    pyro.clear_param_store()
    pyro.set_rng_seed(seed)
    model = HiddenMarkovModel(5, "categorical", num_symbols=5)
    guide = make_guide(model, T, step_size, init_loc_fn)
    train(model, guide, train_y, num_epochs, lr)
    return hmm_predictive(model, guide, train_y, num_draws)


def table_hmm(seeds, epochs, step_size, lr, num_draws=100, restarts=HMM_RESTARTS):
    """
    Table 2.5 two ways per seed: from the default start (``AutoDelta``'s prior median,
    nearly symmetric across states, the run the thesis' protocol implies) and as the best,
    by training log-likelihood, of ``restarts`` starts at prior draws (symmetry broken).
    Returns ``{start: {T: {metric: [per seed]}}}`` and, per T, how many of all restarts
    collapsed to the symmetric single-state solution.
    """
    series = torch.tensor([0.0, 1.0] * 53)[:105].double()
    train_y, test_y = series[:100], series[100:]
    starts = ("default start", f"best of {restarts} prior-draw starts")
    metrics = {
        start: {T: {"accuracy": [], "predictive entropy": [], "log score": []} for T in epochs}
        for start in starts
    }
    collapsed = dict.fromkeys(epochs, 0)
    for seed in seeds:
        for T, num_epochs in epochs.items():
            fit = functools.partial(fit_hmm, T, num_epochs, step_size, lr, train_y)
            scored = [fit(seed, init_to_median, num_draws)]
            scored += [
                fit(1000 * (seed + 1) + r, init_to_sample, num_draws) for r in range(restarts)
            ]
            collapsed[T] += sum(
                log_lik <= math.log(0.5) + COLLAPSE_TOLERANCE for _, log_lik in scored[1:]
            )
            best = max(scored[1:], key=lambda pair: pair[1])
            for start, (probs, _) in zip(starts, (scored[0], best)):
                m = metrics[start][T]
                m["accuracy"].append(float((probs.argmax(0) == test_y.long()).double().mean()))
                entropy = -(probs * probs.clamp_min(1e-300).log()).sum(0)
                m["predictive entropy"].append(float(entropy.mean()))
                m["log score"].append(float(probs.gather(0, test_y.long()[None]).log().mean()))
    return metrics, collapsed


# -- table 2.6 ---------------------------------------------------------------------------------


def co2_dlm(scales):
    trend = LocalLinearTrend(scales["level_scale"], scales["slope_scale"], init_scale=1.0)
    seasonal = Seasonal(12, scales["seasonal_scale"], form="cyclic", init_scale=1.0)
    return DLM(trend + seasonal, observation_scale=scales["obs_scale"])


CO2_SITES = ("obs_scale", "level_scale", "slope_scale", "seasonal_scale")


def co2_model(y):
    scales = {
        name: pyro.sample(name, dist.LogNormal(y.new_tensor(-1.0), 1.0)) for name in CO2_SITES
    }
    pyro.sample("obs", DLMDistribution(co2_dlm(scales), y.shape[-1]), obs=y)


def table_dlm(seeds, epochs, step_size, lr, num_draws=100, alpha=0.05):
    co2 = load_co2("vis", dtype=torch.float64)[:144]
    train_raw, test_raw = co2[:120], co2[120:]
    mean, sd = train_raw.mean(), train_raw.std()
    train_y, test_y = (train_raw - mean) / sd, (test_raw - mean) / sd
    metrics = {T: {"MAE": [], "predictive entropy": [], "interval score": []} for T in epochs}
    for seed in seeds:
        for T, num_epochs in epochs.items():
            pyro.clear_param_store()
            pyro.set_rng_seed(seed)
            guide = make_guide(co2_model, T, step_size)
            train(co2_model, guide, train_y, num_epochs, lr)
            draws = refined_draws(guide, train_y, num_draws)
            forecast = co2_dlm(draws).forecast(train_y.expand(num_draws, -1), len(test_y))
            means = forecast.observation_means[..., 0]  # (draws, 24)
            variances = forecast.observation_covs[..., 0, 0]
            # Moments of the mixture over the guide's draws; Gaussian entropy and central
            # interval from them.
            mix_mean = means.mean(0)
            mix_var = (variances + means**2).mean(0) - mix_mean**2
            lower, upper = forecast_interval(
                mix_mean[:, None], mix_var[:, None, None], level=1 - alpha
            )
            lower, upper = lower[:, 0], upper[:, 0]
            score = (upper - lower) + 2 / alpha * (
                (lower - test_y).clamp_min(0) + (test_y - upper).clamp_min(0)
            )
            metrics[T]["MAE"].append(float((mix_mean - test_y).abs().mean()))
            metrics[T]["predictive entropy"].append(
                float((0.5 * torch.log(2 * math.pi * math.e * mix_var)).mean())
            )
            metrics[T]["interval score"].append(float(score.mean()))
    return metrics


def author_co2_protocol(num_refinements, epochs, period_two=True, lr=1e-3, horizon=24):
    """Table 2.6 computed as the author's code computes it (vicgalle/vis, ``src/dlm_big.py``,
    run as its comment says: ``-lr 0.001 -n10 -r0`` for T = 0, 4 epochs for T = 1), with
    this package's Kalman filter; ``{metric: value}`` of one deterministic run.

    * The whole 637-month series standardised with its mean and population sd; train on
      months 0-119, forecast months 120-143 from the end of training (no updates).
    * 14 states (level, slope, p_0..p_11), each with its own noise, x_1 ~ N(0, W), the
      observation level + p_0. Fifteen log-sds (states at log 0.1, observation at log 0.5),
      no prior: maximum likelihood. The level's and slope's log-sds stand twice in the
      code's parameter list, so each takes two steps of each update.
    * Its seasonal block binds a loop variable late: every p_j (j < 11) copies p_11 and p_11
      copies p_0, a period-2 swap, not the period-12 cycle its text describes
      (``period_two=False`` builds the cycle: p_j copies p_{j+1}).
    * An epoch: ``num_refinements`` in-place gradient steps of size ``lr`` on the negative
      log-likelihood (the refinement, kept), then one Adam step (``lr``) from there.
    * The forecast starts from the filtered state of the last epoch's evaluation (before its
      Adam step) and rolls forward with the parameters after it; the interval is mean +- 2
      sd, and MAE, entropy and interval score (alpha = 0.05) are means over the months.
    """
    co2 = load_co2("vis", dtype=torch.float64)
    y = (co2 - co2.mean()) / co2.std(unbiased=False)
    train_y, test_y = y[:120, None], y[120 : 120 + horizon]
    S = 14
    G = torch.zeros(S, S, dtype=torch.float64)
    G[0, 0] = G[0, 1] = G[1, 1] = 1.0
    for j in range(11):
        G[2 + j, 13 if period_two else 3 + j] = 1.0
    G[13, 2] = 1.0
    F = torch.zeros(1, S, dtype=torch.float64)
    F[0, 0] = F[0, 2] = 1.0
    noises = [
        torch.tensor(math.log(0.1), dtype=torch.float64, requires_grad=True) for _ in range(S)
    ]
    emit = torch.tensor(math.log(0.5), dtype=torch.float64, requires_grad=True)
    params = [noises[0], noises[1], emit] + noises  # the code's list: level and slope twice

    def matrices():
        W = torch.diag(torch.exp(2 * torch.stack(noises)))
        V = torch.exp(2 * emit).reshape(1, 1)
        return StateSpaceMatrices(G, F, W, V, torch.zeros(S, dtype=torch.float64), W)

    def evaluate():
        result = kalman_filter(train_y, matrices())
        return -result.log_likelihood, result

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the duplicated parameters, on purpose
        optim = torch.optim.Adam(params, lr=lr, foreach=False)
    for _ in range(epochs):
        optim.zero_grad()
        loss, result = evaluate()
        for _ in range(num_refinements):
            grads = torch.autograd.grad(loss, params)
            with torch.no_grad():
                for p, g in zip(params, grads):
                    p -= lr * g
            loss, result = evaluate()
        loss.backward()
        optim.step()
    with torch.no_grad():
        m, P = result.filtered_means[-1], result.filtered_covs[-1]
        G_, F_, W, V = matrices()[:4]
        errors, entropies, scores = [], [], []
        for target in test_y.tolist():
            m, P = G_ @ m, G_ @ P @ G_.T + W
            mu, sd = float(F_ @ m), float((F_ @ P @ F_.T + V).sqrt())
            lower, upper = mu - 2 * sd, mu + 2 * sd
            score = upper - lower
            score += 2 / 0.05 * (max(target - upper, 0.0) + max(lower - target, 0.0))
            errors.append(abs(mu - target))
            entropies.append(math.log(sd * math.sqrt(2 * math.pi * math.e)))
            scores.append(score)
    return {
        "MAE": statistics.mean(errors),
        "predictive entropy": statistics.mean(entropies),
        "interval score": statistics.mean(scores),
    }


def author_protocol_table():
    """The paper's column beside the author's protocol, as written and with its seasonal
    block mended."""
    runs = {
        (bug, T): author_co2_protocol(T, epochs, period_two=bug)
        for bug in (True, False)
        for T, epochs in ((0, 10), (1, 4))
    }
    header = ["metric", "paper T=0", "paper T=1", "author's code T=0", "author's code T=1"]
    header += ["seasonal mended T=0", "seasonal mended T=1"]
    rows = []
    for name, (p0, p1) in PAPER_DLM_TABLE.items():
        rows.append(
            [name, f"{p0:.3f}", f"{p1:.3f}"]
            + [f"{runs[(bug, T)][name]:.3f}" for bug in (True, False) for T in (0, 1)]
        )
    return markdown(header, rows)


def metric_table(metrics, paper, label="ours"):
    """Paper and our columns; ``metrics`` is ``{T: {metric: [per seed]}}``, or
    ``{start: {T: ...}}`` for one pair of columns per start."""
    by_start = metrics if isinstance(next(iter(metrics)), str) else {label: metrics}
    header = ["metric", "paper T=0", "paper T=1"]
    for start, per_t in by_start.items():
        header += [f"{start} T={t}" for t in sorted(per_t)]
    rows = []
    for name, (p0, p1) in paper.items():
        row = [name, f"{p0:.3f}", f"{p1:.3f}"]
        for per_t in by_start.values():
            row += [mean_sd(per_t[t][name]) for t in sorted(per_t)]
        rows.append(row)
    return markdown(header, rows)


#: The report's sections, each remade on its own with ``--sections``.
SECTIONS = {
    "figure": "## Figure 2.8, HMM",
    "figure-dlm": "## Figure 2.8, DLM",
    "hmm": "## Table 2.5",
    "dlm": "## Table 2.6",
}


def main(argv=None):
    parser = argument_parser(
        __doc__,
        RESULTS,
        quick="2 seeds, short runs (smoke test)",
        seeds="number of seeds (default 5; quick 2)",
    )
    parser.add_argument(
        "--sections",
        nargs="+",
        choices=["figure", "hmm", "dlm"],
        default=["figure", "hmm", "dlm"],
        help="what to run (default all): figure 2.8 (both models), table 2.5 (hmm), table "
        "2.6 (dlm); the other sections are kept from the report at --output",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    num_seeds = args.seeds or (2 if args.quick else 5)
    seeds = list(range(num_seeds))
    iterations = 10 if args.quick else 100
    checkpoints = (5, 10) if args.quick else (10, 25, 50, 100)

    made = {}
    if "figure" in args.sections:
        # Step sizes from a sweep over {1e-3, 1e-2, 3e-2} on the figure's training
        # log-likelihood (2 seeds, 30 iterations): larger ones overshoot (the DLM diverges
        # at 3e-2).
        start = time.perf_counter()
        hmm_curves = figure_hmm(seeds, iterations, step_size=HMM_STEP_SIZE, lr=0.05)
        made["figure"] = section_made_by(
            "## Figure 2.8, HMM: log p(x | θ_T) of the training series (T = refinement steps)"
            "\n\n" + curve_table(hmm_curves, checkpoints),
            args.quick,
            time.perf_counter() - start,
        )
        start = time.perf_counter()
        dlm_curves = figure_dlm(seeds, iterations, step_size=DLM_STEP_SIZE, lr=0.05)
        made["figure-dlm"] = section_made_by(
            "## Figure 2.8, DLM: log p(x | θ_T)\n\n" + curve_table(dlm_curves, checkpoints),
            args.quick,
            time.perf_counter() - start,
        )
    if "hmm" in args.sections:
        start = time.perf_counter()
        restarts = 2 if args.quick else HMM_RESTARTS
        hmm_metrics, collapsed = table_hmm(
            seeds, {0: 50, 1: 20}, step_size=HMM_STEP_SIZE, lr=0.1, restarts=restarts
        )
        collapse = ", ".join(f"T={T}: {n} of {restarts * num_seeds}" for T, n in collapsed.items())
        made["hmm"] = section_made_by(
            "## Table 2.5: HMM prediction on the alternating series "
            "(T=0: 50 epochs, T=1: 20 epochs)\n\n"
            "From the default start (`AutoDelta`'s prior median, nearly the same for every "
            "state) the fit stays at the symmetric single-state solution: every transition "
            "row to one state, emissions 1/2 each, training log-likelihood log(1/2) per step. "
            "Its accuracy is an argmax tie, not a prediction. Starting at prior draws breaks "
            f"the symmetry: each seed keeps the best of {restarts} such starts by training "
            "log-likelihood. Restarts that still collapsed (training log-likelihood within "
            f"{COLLAPSE_TOLERANCE} nats per step of log(1/2)): {collapse}.\n\n"
            + metric_table(hmm_metrics, PAPER_HMM_TABLE),
            args.quick,
            time.perf_counter() - start,
        )
    if "dlm" in args.sections:
        start = time.perf_counter()
        dlm_metrics = table_dlm(seeds, {0: 10, 1: 4}, step_size=DLM_STEP_SIZE, lr=0.1)
        made["dlm"] = section_made_by(
            "## Table 2.6: CO2 forecast, local linear trend + seasonal(12) "
            "(T=0: 10 epochs, T=1: 4 epochs)\n\n"
            + metric_table(dlm_metrics, PAPER_DLM_TABLE)
            + "\n\n### Under the thesis' protocol: the author's code\n\n"
            "The same table computed as the author's code computes it (vicgalle/vis, "
            "`src/dlm_big.py`; `author_co2_protocol` here, with this package's Kalman "
            "filter): the whole series standardised with its mean and population sd (sd "
            "25.6 ppm, against 3.7 for the training months above), 15 state and observation "
            "log-sds fitted by maximum likelihood from log 0.1 and log 0.5 with Adam at lr "
            "0.001 (T = 0: 10 epochs; T = 1: 4 epochs, each after one in-place gradient step of "
            "the same size, kept), one deterministic run, a forecast interval of mean ± 2 sd. "
            "Its seasonal block binds a loop variable late, so the seasonal states swap with "
            "period 2 instead of cycling with period 12; the last two columns mend that. The "
            "author's code gives the thesis' numbers to the third decimal: at 10 Adam steps of "
            "0.001 the model is barely fitted, and T = 1's gain comes from its extra in-place "
            "gradient steps (kept, so they train the parameters), not from a refined "
            "posterior. On the mended model the MAE is "
            "0.017, that is 0.4 ppm, about half of ours above (0.19 on the training months' "
            "scale, 0.7 ppm).\n\n" + author_protocol_table(),
            args.quick,
            time.perf_counter() - start,
        )

    preamble = (
        "# VIS on state-space models (thesis figure 2.8, tables 2.5, 2.6)\n\n"
        f"{num_seeds} seeds (mean ± sd); AutoDelta base guide refined with T gradient steps "
        "(VIS-P, "
        "fast gradient), Adam; hidden states marginalised exactly (forward algorithm / Kalman "
        f"filter). torch {torch.__version__}, 1 thread, float64. "
        "`python benchmarks/vis_state_space.py` makes every section; `--sections` remakes "
        "some and keeps the others. Each section names the command that made it."
    )
    write_sections(preamble, SECTIONS, made, args.output)


if __name__ == "__main__":
    main()
