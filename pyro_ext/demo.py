"""
The demo tour: ``python -m pyro_ext.demo [--chapter NAME] [--quick]`` (``make demo``).

Each landed capability contributes a chapter that runs on generated or shared data and
prints its results. Chapters so far:

- ``sgmcmc``: stochastic-gradient MCMC with repulsion (thesis section 2.3).
- ``distributed``: the same sampler sharded over two processes with torch.distributed.
- ``bnn``: Bayesian neural networks on UCI regression (thesis 1.3, 2.3.3).
- ``ngvi``: natural-gradient variational inference (IVON, VOGN) for a BNN.
- ``online``: online variational Bayes (BONG, LoFi, WoLF) on streams.
- ``vis``: variationally inferred sampling (thesis section 2.4).
- ``timeseries``: exact HMM and dynamic linear model inference (thesis 2.4.2, 1.2.2).
- ``bsts``: the retail structural time series and budget allocation (thesis chapter 1.2).
- ``ara``: adversarial risk analysis defenses and security evaluation (thesis chapter 3).
- ``rl``: threatened Markov decision processes (thesis chapter 4).
"""

import argparse
import math
import time

import pyro
import pyro.distributions as dist
import torch

from pyro_ext.infer import MCMC, SGHMC, SGLD, AdamSGLD


def _gaussian_posterior(quick):
    """SGLD with minibatches on a conjugate Gaussian model against the exact posterior."""
    num_data, subsample_size = 2000, 100
    generator = torch.Generator().manual_seed(0)
    x = 1.5 + torch.randn(num_data, generator=generator, dtype=torch.float64)

    def model(x):
        mu = pyro.sample("mu", dist.Normal(x.new_zeros(()), 10.0))
        with pyro.plate("data", x.shape[0], subsample_size=subsample_size) as idx:
            pyro.sample("obs", dist.Normal(mu, 1.0), obs=x[idx])

    precision = 1 / 100 + num_data
    exact_mean, exact_sd = float(x.sum() / precision), 1 / math.sqrt(precision)
    kernel = SGLD(model, step_size=2e-5, num_particles=20)
    mcmc = MCMC(kernel, num_samples=200 if quick else 1000, warmup_steps=300, disable_progbar=True)
    mcmc.run(x)
    draws = mcmc.get_samples()["mu"]
    print(f"  conjugate Gaussian, N={num_data}, minibatch {subsample_size}, 20 particles")
    print(f"    posterior mean  exact {exact_mean:.4f}   SGLD {draws.mean():.4f}")
    print(
        f"    posterior sd    exact {exact_sd:.4f}   SGLD {draws.std():.4f}"
        "   (minibatch noise inflates it at fixed step size)"
    )


def _svgd_vs_sgld_r(quick):
    """Thesis section 2.3.1: SVGD underestimates the spread that SGLD+R recovers."""

    def model():
        pyro.sample("z", dist.Normal(torch.zeros(2), 1.0).to_event(1))

    def start(site):
        return 3.0 + 0.5 * torch.randn(2)

    seeds = 5 if quick else 20
    print(
        "  2-D standard normal, 6 particles from N([3,3], 0.25 I), 1000 steps; sd of the"
        " last 500 steps, mean over seeds"
    )
    for name, temperature in (("SVGD  ", 0.0), ("SGLD+R", 1.0)):
        sds = []
        for seed in range(seeds):
            pyro.set_rng_seed(seed)
            kernel = SGLD(
                model,
                step_size=0.3,
                num_particles=6,
                repulsion="rbf",
                temperature=temperature,
                init_strategy=start,
            )
            mcmc = MCMC(kernel, num_samples=500, warmup_steps=500, disable_progbar=True)
            mcmc.run()
            sds.append(mcmc.get_samples()["z"].std(0))
        sd = torch.stack(sds).mean(0)
        print(f"    {name}  sd_x {sd[0]:.2f}  sd_y {sd[1]:.2f}   (target 1.00)")


def _logistic_regression(quick):
    """Bayesian logistic regression with subsampling: the four samplers side by side."""
    generator = torch.Generator().manual_seed(1)
    num_data, dim = 5000, 10
    x = torch.randn(num_data, dim, generator=generator)
    w_true = torch.randn(dim, generator=generator)
    y = torch.bernoulli(torch.sigmoid(x @ w_true), generator=generator)
    x_train, y_train, x_test, y_test = x[:4000], y[:4000], x[4000:], y[4000:]

    def model(x, y):
        w = pyro.sample("w", dist.Normal(torch.zeros(dim), 1.0).to_event(1))
        with pyro.plate("data", x.shape[0], subsample_size=100) as idx:
            pyro.sample("y", dist.Bernoulli(logits=x[idx] @ w), obs=y[idx])

    print(
        f"  logistic regression, N=4000 train / 1000 test, D={dim}, minibatch 100,"
        " 10 particles, 300 warmup + 300 draws"
    )
    samplers = {
        "SGLD": lambda: SGLD(model, 2e-4, num_particles=10),
        "SGLD+R": lambda: SGLD(model, 2e-3, num_particles=10, repulsion="rbf"),
        "SGHMC": lambda: SGHMC(model, 2e-4, num_particles=10),
        "SGHMC+R": lambda: SGHMC(model, 2e-3, num_particles=10, repulsion="rbf"),
        "Adam+N": lambda: AdamSGLD(model, 2e-3, num_particles=10),
        "Adam+NR": lambda: AdamSGLD(model, 2e-2, num_particles=10, repulsion="rbf"),
    }
    steps = 100 if quick else 300
    for name, make in samplers.items():
        pyro.set_rng_seed(0)
        mcmc = MCMC(make(), num_samples=steps, warmup_steps=steps, disable_progbar=True)
        start = time.perf_counter()
        mcmc.run(x_train, y_train)
        elapsed = time.perf_counter() - start
        w = mcmc.get_samples()["w"]
        probs = torch.sigmoid(x_test @ w.T).mean(-1)
        accuracy = ((probs > 0.5).float() == y_test).float().mean()
        log_lik = (
            torch.distributions.Bernoulli(probs=probs.clamp(1e-6, 1 - 1e-6)).log_prob(y_test).mean()
        )
        error = (w.mean(0) - w_true).norm()
        print(
            f"    {name:8s} accuracy {accuracy:.3f}  test log-lik {log_lik:.3f}  "
            f"|E[w] - w_true| {error:.2f}  {elapsed:5.1f} s"
        )


def _compiled_step(quick):
    """The same SGLD+R chain run eagerly and as one compiled step (jit_compile=True)."""
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(5000, 10, generator=generator)
    y = torch.bernoulli(
        torch.sigmoid(x @ torch.randn(10, generator=generator)), generator=generator
    )

    def model(x, y):
        w = pyro.sample("w", dist.Normal(torch.zeros(x.shape[1]), 1.0).to_event(1))
        with pyro.plate("data", x.shape[0], subsample_size=100) as idx:
            pyro.sample("y", dist.Bernoulli(logits=x[idx] @ w), obs=y[idx])

    steps = 500 if quick else 3000
    print(f"  compiled step: SGLD+R, 10 particles, {steps} steps, same seed eager and compiled")
    chains = {}
    for jit_compile in (False, True):
        kernel = SGLD(model, 2e-3, num_particles=10, repulsion="rbf", jit_compile=jit_compile)
        mcmc = MCMC(kernel, num_samples=steps, warmup_steps=0, disable_progbar=True)
        pyro.set_rng_seed(0)
        start = time.perf_counter()
        mcmc.run(x, y)
        sampling = time.perf_counter() - start - kernel.compile_seconds
        chains[jit_compile] = mcmc.get_samples(group_by_chain=True)["w"]  # (particles, steps, D)
        compiled = f" (+ {kernel.compile_seconds:.1f} s to compile)" if jit_compile else ""
        label = "compiled" if jit_compile else "eager"
        print(f"    {label:8s} {sampling / steps * 1e6:6.0f} µs per step{compiled}")
    difference = (chains[True] - chains[False]).abs().amax((0, 2))
    # Repulsive noise goes through the Cholesky factor of a nearly singular kernel matrix,
    # which amplifies round-off from step to step: the chains part, the posteriors agree.
    half = steps // 2
    means = [chain[:, half:].mean((0, 1)) for chain in chains.values()]
    sd = chains[False][:, half:].std((0, 1))
    print(
        f"    draws differ by {difference[9]:.0e} after 10 steps, {difference[99]:.0e} after 100; "
        f"posterior means over the second half differ by at most "
        f"{((means[0] - means[1]).abs() / sd).max():.2f} posterior sd"
    )


def sgmcmc(quick=False):
    print("== Chapter: stochastic-gradient MCMC with repulsion (thesis 2.3) ==")
    _gaussian_posterior(quick)
    _svgd_vs_sgld_r(quick)
    _logistic_regression(quick)
    _compiled_step(quick)


def rl(quick=False):
    """Thesis figure 4.3: the friend-or-foe game against an adaptive adversary."""
    from pyro_ext.rl import (
        ExponentialSmootherAdversary,
        FPQLearner,
        FriendOrFoe,
        LevelKQLearner,
        QLearner,
        play_many,
    )

    print("== Chapter: threatened Markov decision processes (thesis chapter 4) ==")
    episodes, runs = (1000, 5) if quick else (5000, 20)
    epsilon, lr, gamma = 0.1, 0.1, 0.8
    print(
        f"  stateless friend-or-foe (+-50) vs an exponential-smoother adversary (beta 0.75),"
        f" {episodes} episodes, {runs} runs; mean reward of the last {episodes // 5} episodes"
    )
    agents = {
        "Q-learner (ignores the opponent)": lambda: QLearner(epsilon, lr, gamma),
        "FPQ-learner, forget 0.8 (level 1)": lambda: FPQLearner(epsilon, lr, gamma, forget=0.8),
        "level-2 Q-learner": lambda: LevelKQLearner(2, epsilon, lr, gamma),
    }
    for name, make_agent in agents.items():
        curves = play_many(
            FriendOrFoe(),
            make_agent,
            lambda: ExponentialSmootherAdversary(0.75),
            episodes,
            runs,
            seed=0,
        )
        last = curves[:, -(episodes // 5) :].mean(1)
        print(f"    {name:36s} {last.mean():6.1f} +- {last.std():4.1f}")
    print("    (thesis figure 4.3: about -20, 0 and +40)")


def timeseries(quick=False):
    """Exact HMM and DLM inference: the dishonest casino and a Kalman-filtered CO2 forecast."""
    from pyro.infer import SVI, Trace_ELBO
    from pyro.infer.autoguide import AutoDelta

    from pyro_ext.datasets import load_co2
    from pyro_ext.timeseries import (
        DLM,
        DLMDistribution,
        LocalLinearTrend,
        Seasonal,
        forecast_interval,
        hmm_log_likelihood,
        hmm_viterbi,
    )

    print("== Chapter: exact state-space inference, HMMs and DLMs (thesis 2.4.2, 1.2.2) ==")
    trans = torch.tensor([[0.95, 0.05], [0.10, 0.90]], dtype=torch.float64)
    emission = torch.tensor([[1 / 6] * 6, [0.1] * 5 + [0.5]], dtype=torch.float64)
    generator = torch.Generator().manual_seed(0)
    num_rolls = 2000
    states = [0]
    for _ in range(num_rolls - 1):
        states.append(int(torch.multinomial(trans[states[-1]], 1, generator=generator)))
    states = torch.tensor(states)
    rolls = torch.multinomial(emission[states], 1, generator=generator)[:, 0]
    init = torch.tensor([0.5, 0.5], dtype=torch.float64).log()
    obs_log_probs = emission.log().T[rolls]
    path, _ = hmm_viterbi(init, trans.log(), obs_log_probs)
    log_lik = hmm_log_likelihood(init, trans.log(), obs_log_probs)
    print(
        f"  dishonest casino, {num_rolls} rolls: log p(rolls) = {log_lik:.1f}; the Viterbi path "
        f"names the die correctly on {(path == states).double().mean():.1%} of the rolls"
    )

    co2 = load_co2("vis", dtype=torch.float64)[-264:]  # the last 22 years
    train, test = co2[:-24], co2[-24:]
    mean, sd = train.mean(), train.std()
    y = (train - mean) / sd
    sites = ("obs_scale", "level_scale", "slope_scale", "seasonal_scale")

    def build(scales):
        trend = LocalLinearTrend(scales["level_scale"], scales["slope_scale"], init_scale=2.0)
        return DLM(
            [trend, Seasonal(12, scales["seasonal_scale"], init_scale=2.0)], scales["obs_scale"]
        )

    def model(y):
        scales = {
            name: pyro.sample(name, dist.LogNormal(y.new_tensor(-3.0), 2.0)) for name in sites
        }
        pyro.sample("obs", DLMDistribution(build(scales), y.shape[-1]), obs=y)

    pyro.clear_param_store()
    guide = AutoDelta(model)
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 0.05}), Trace_ELBO())
    start = time.perf_counter()
    for _ in range(100 if quick else 300):
        svi.step(y)
    scales = {k: v.detach() for k, v in guide.median(y).items()}
    forecast = build(scales).forecast(y, num_steps=len(test))
    lower, upper = forecast_interval(
        forecast.observation_means, forecast.observation_covs, level=0.95
    )
    pred = forecast.observation_means[:, 0] * sd + mean
    covered = (
        ((test >= lower[:, 0] * sd + mean) & (test <= upper[:, 0] * sd + mean)).double().mean()
    )
    print(
        f"  Mauna Loa CO2, local linear trend + seasonal(12), MAP noise scales by SVI through the "
        f"Kalman likelihood ({time.perf_counter() - start:.1f} s):"
    )
    print(
        f"    2-year forecast MAE {(pred - test).abs().mean():.2f} ppm, "
        f"95% interval coverage {covered:.0%}"
    )


def vis(quick=False):
    """Thesis figure 2.7: one refinement step tightens the bound on a funnel density."""
    import statistics

    from pyro.infer import SVI, Trace_ELBO
    from pyro.infer.autoguide import AutoNormal, init_to_value

    from pyro_ext.infer import VIS

    print("== Chapter: variationally inferred sampling (thesis 2.4) ==")

    def funnel():
        z1 = pyro.sample("z1", dist.Normal(torch.tensor(0.0), 1.35))
        pyro.sample("z2", dist.Normal(torch.tensor(0.0), torch.exp(z1)))

    def make_guide(num_steps):
        origin = {"z1": torch.tensor(0.0), "z2": torch.tensor(0.0)}
        base = AutoNormal(funnel, init_loc_fn=init_to_value(values=origin), init_scale=1.0)
        if num_steps == 0:
            return base
        return VIS(
            funnel,
            base,
            sampler="sgld",
            num_steps=num_steps,
            step_size=0.03,
            entropy="particle",
            gradient="full",
        )

    def elbo(num_particles):
        return Trace_ELBO(
            num_particles=num_particles, vectorize_particles=True, max_plate_nesting=0
        )

    iterations, seeds = 30, (3 if quick else 10)
    final = {0: [], 1: []}
    for seed in range(seeds):
        for num_steps in final:
            pyro.clear_param_store()
            pyro.set_rng_seed(seed)
            guide = make_guide(num_steps)
            svi = SVI(funnel, guide, pyro.optim.Adam({"lr": 0.05}), elbo(8))
            for _ in range(iterations):
                svi.step()
            # The VIS-P loss is heavy-tailed (a particle from the funnel's neck can explode
            # under one SGLD step): a median of batch means is a stable estimate.
            with torch.no_grad():
                final[num_steps].append(
                    statistics.median(elbo(500).loss(funnel, guide) for _ in range(8))
                )
    for num_steps, losses in final.items():
        print(
            f"  funnel, VIS-P with T={num_steps} SGLD step(s): -ELBO after {iterations} Adam "
            f"iterations {statistics.mean(losses):.3f} (mean of {seeds} seeds)"
        )
    print("    (thesis figure 2.7 at iteration 30: 1.011 for T=0, 0.667 for T=1)")


def _print_bnn_scores(name, net, samples, data, y_std, timing):
    """Test RMSE and log-likelihood of posterior draws, in the targets' original units."""
    from pyro_ext.models import log_predictive_density, rmse

    with torch.no_grad():
        ll = float(log_predictive_density(net, samples, data.x_test, data.y_test))
        err = float(rmse(net, samples, data.x_test, data.y_test))
    print(
        f"    {name:8s} test RMSE {err * float(y_std):.2f}  test LL "
        f"{ll - math.log(float(y_std)):6.2f}  ({timing})"
    )


def bnn(quick=False):
    """Thesis 2.3.3: a 50-unit Bayesian neural network on a UCI regression split."""
    from pyro_ext.datasets import load_uci, standardize_split
    from pyro_ext.models import BayesianMLP

    print("== Chapter: Bayesian neural networks (thesis 1.3, 2.3.3) ==")
    data, _, y_std = standardize_split(load_uci("yacht", 0))
    x, y, num_particles = data.x_train, data.y_train, 20
    n = x.shape[0]
    iterations = 600 if quick else 2000
    print(
        f"  yacht split 0 ({n} train / {data.x_test.shape[0]} test rows), in-50-1 ReLU BNN, "
        f"{num_particles} particles, batch 100, {iterations} iterations, second half kept"
    )

    def common(net):
        return dict(
            num_particles=num_particles, jit_compile=True, init_strategy=net.init_strategy(x, y)
        )

    # Steps: benchmarks/uci.py's choice for yacht on validation folds. Repulsion averages
    # the drift over the particles, so SGLD+R's step is written as L times a per-particle
    # step, and Adam+NR's (whose velocity passes through the average twice) as L^2 times.
    samplers = {
        "SGLD": lambda net: SGLD(net, 1e-2 / n, **common(net)),
        "SGLD+R": lambda net: SGLD(net, 3e-2 / n * num_particles, repulsion="rbf", **common(net)),
        "AdamSGLD": lambda net: AdamSGLD(net, 1e-3, **common(net)),
        "Adam+NR": lambda net: AdamSGLD(
            net, 3e-4 * num_particles**2, repulsion="rbf", **common(net)
        ),
    }

    for name, make in samplers.items():
        pyro.set_rng_seed(0)
        net = BayesianMLP(x.shape[1], hidden=(50,), full_output=False)
        mcmc = MCMC(
            make(net),
            num_samples=iterations // 20,
            warmup_steps=iterations // 2,
            thinning=10,
            disable_progbar=True,
        )
        start = time.perf_counter()
        mcmc.run(x, y, subsample_size=100)
        elapsed = time.perf_counter() - start
        _print_bnn_scores(name, net, mcmc.get_samples(), data, y_std, f"{elapsed:.1f} s")
    print(
        "    (thesis table 2.3/2.4, 20 splits: SGLD 0.94 / -1.21, SGLD+R 0.89 / -1.17; "
        "results/uci.md has all nine data sets)"
    )


def ngvi(quick=False):
    """Natural-gradient VI (IVON, VOGN) for the BNN of the ``bnn`` chapter, beside SGLD."""
    from pyro_ext.datasets import load_uci, standardize_split
    from pyro_ext.infer import NaturalGradientVI
    from pyro_ext.models import BayesianMLP

    print("== Chapter: natural-gradient variational inference (IVON, VOGN) ==")
    data, _, y_std = standardize_split(load_uci("yacht", 0))
    x, y = data.x_train, data.y_train
    steps = 600 if quick else 2000
    print(
        f"  yacht split 0, in-50-1 ReLU BNN, batch 100, {steps} steps; mean-field Gaussian "
        "posterior, test metrics from 100 posterior draws"
    )
    runs = {
        "IVON": dict(method="ivon"),
        "VOGN": dict(method="vogn"),
    }
    for name, options in runs.items():
        pyro.set_rng_seed(0)
        net = BayesianMLP(x.shape[1], hidden=(50,), full_output=False)
        vi = NaturalGradientVI(net, init_loc_fn=net.init_strategy(x, y), **options)
        start = time.perf_counter()
        for _ in range(steps):
            vi.step(x, y, subsample_size=100)
        elapsed = time.perf_counter() - start
        timing = f"{elapsed:.1f} s, {elapsed / steps * 1e3:.2f} ms per step"
        _print_bnn_scores(name, net, vi.sample_posterior(100), data, y_std, timing)
    print("    (the bnn chapter samples the same network with SGLD, SGLD+R and Adam+NR)")


def online(quick=False):
    """Online variational Bayes: BONG / LoFi filters on a stream, WoLF against outliers."""
    from pyro_ext.online import BONG, LoFi, WoLF

    print("== Chapter: online Bayesian learning (BONG, LoFi, WoLF) ==")
    generator = torch.Generator().manual_seed(0)

    def two_moons(n):
        label = torch.randint(2, (n,), generator=generator)
        angle = torch.rand(n, generator=generator) * math.pi
        x = torch.stack([torch.cos(angle), torch.sin(angle)], -1)
        x = torch.where(label.unsqueeze(-1) == 1, torch.tensor([1.0, 0.5]) - x, x)
        return x + 0.15 * torch.randn(n, 2, generator=generator), label.float()

    hidden = 16

    def mlp(x, y=None):
        w1 = pyro.sample("w1", dist.Normal(0.0, 1.0).expand([2, hidden]).to_event(2))
        b1 = pyro.sample("b1", dist.Normal(0.0, 1.0).expand([hidden]).to_event(1))
        w2 = pyro.sample("w2", dist.Normal(0.0, 1.0).expand([hidden]).to_event(1))
        b2 = pyro.sample("b2", dist.Normal(0.0, 1.0))
        with pyro.plate("data", x.shape[0]):
            logits = torch.tanh(x @ w1 + b1) @ w2 + b2
            pyro.sample("y", dist.Bernoulli(logits=logits), obs=y)

    num = 300 if quick else 1000
    x, y = two_moons(num)
    x_test, y_test = two_moons(1000)
    checkpoints = (10, 100, num)
    print(
        f"  two moons streamed one point at a time through a 2-{hidden}-1 tanh BNN "
        f"({2 * hidden + 2 * hidden + 1} weights, N(0, 1) priors); test error of the "
        "linearised predictive on 1000 points after"
    )
    filters = {
        "BONG full": lambda: BONG(mlp),
        "BONG diag": lambda: BONG(mlp, family="diag"),
        "LoFi rank 10": lambda: LoFi(mlp, rank=10),
    }
    for name, make in filters.items():
        pyro.set_rng_seed(0)
        belief = make()
        errors = []
        start = time.perf_counter()
        for t in range(num):
            belief.update(x[t : t + 1], y[t : t + 1])
            if t + 1 in checkpoints:
                probs, _ = belief.predictive(x_test)
                errors.append(((probs > 0.5).float() != y_test).float().mean().item())
        elapsed = (time.perf_counter() - start) / num * 1e3
        row = ", ".join(f"{n} points {e:.3f}" for n, e in zip(checkpoints, errors))
        print(f"    {name:>12}: {row} ({elapsed:.1f} ms per point)")

    dim, noise, n = 5, 0.3, 300 if quick else 1000
    w = torch.randn(dim, generator=generator)
    x = torch.randn(n, dim, generator=generator)
    y = x @ w + noise * torch.randn(n, generator=generator)
    outlier = torch.rand(n, generator=generator) < 0.15
    y = torch.where(outlier, torch.rand(n, generator=generator) * 100 - 50, y)

    def regression(x, y=None):
        weights = pyro.sample("w", dist.Normal(torch.zeros(dim), 1.0).to_event(1))
        with pyro.plate("data", x.shape[0]):
            pyro.sample("y", dist.Normal(x @ weights, noise), obs=y)

    print(
        f"  linear regression streamed with {int(outlier.sum())} of {n} targets replaced by "
        "uniform draws in (-50, 50): error of the posterior mean weights, |mean - truth|"
    )
    for name, belief in {
        "Kalman (BONG)": BONG(regression),
        "WoLF, c = 4 sd": WoLF(regression, c=4 * noise),
    }.items():
        for t in range(n):
            belief.update(x[t : t + 1], y[t : t + 1])
        print(f"    {name:>14}: {(belief.mean - w).norm().item():.3f}")


def bsts(quick=False):
    """Thesis chapter 1.2: the retail structural model, its forecast and a budget frontier."""
    from pyro_ext.models.bsts import RetailBSTS, allocate_budget, pareto_frontier, simulate_retail

    print("== Chapter: retail Bayesian structural time series (thesis 1.2) ==")
    data = simulate_retail(num_weeks=156, seed=0)
    train = 104
    model = RetailBSTS(variant="RF", noise="gaussian")
    start = time.perf_counter()
    model.fit(
        data.sales[:train],
        data.spend[:train],
        data.covariates[:train],
        method="sgld",
        seed=0,
        channel_names=data.channel_names,
        covariate_names=data.covariate_names,
        **({"num_samples": 100, "warmup_steps": 200} if quick else {}),
    )
    elapsed = time.perf_counter() - start
    coefs = model.coefficients()
    rhat = max(float(r.max()) for r in model.rhat().values())
    print(
        f"  simulated retailer, 5 channels, 7 covariates, {train} training weeks: fitted by "
        f"SG-MCMC in {elapsed:.1f} s (max R-hat {rhat:.2f})"
    )
    print(
        f"    goodwill carry-over 1-delta: {float(coefs['ar']['mean']):.2f} "
        f"+- {float(coefs['ar']['sd']):.2f} (truth {1 - data.truth['delta']:.2f})"
    )
    q_true = ", ".join(f"{float(v):.3f}" for v in data.truth["q"])
    q_est = ", ".join(f"{float(v):.3f}" for v in coefs["q"]["mean"])
    print(f"    spend effects q: {q_est} (truth {q_true})")
    inclusion = model.inclusion_probabilities()
    selected = ", ".join(
        f"{name} {float(p):.2f}{'*' if true else ''}"
        for name, p, true in zip(data.covariate_names, inclusion, data.truth["inclusion"])
    )
    print(
        f"    P(covariate included), point-mass spike and Gibbs moves (* truly non-zero): {selected}"
    )
    draws = model.forecast(data.spend[train:], data.covariates[train:])
    truth = data.sales[train:]
    mape = float(((draws.mean(0) - truth).abs() / truth.abs()).mean())
    print(f"    {len(truth)}-week forecast MAPE {mape:.1%}")
    budget = float(data.spend[:train].sum(-1).mean())
    best = allocate_budget(model, budget)
    best_channel = model.channel_names[int(best.spend.argmax())]
    top_channel = model.channel_names[int(data.truth["q"].argmax())]
    print(
        f"    next-week budget {budget:.0f}: the max-mean plan puts "
        f"{float(best.spend.max() / budget):.0%} on {best_channel} "
        f"(the channel with the largest true q: {top_channel})"
    )
    frontier = pareto_frontier(model, budget, num_points=4)
    points = "; ".join(
        f"sd {float(sd):.1f} -> mean {float(m):.1f}" for sd, m in zip(frontier.sd, frontier.mean)
    )
    print(f"    risk-return frontier of next-week sales: {points}")


def ara(quick=False):
    """Thesis chapter 3: ACRA against good-word insertion; ARA training against FGSM/PGD."""
    import functools

    from pyro_ext.ara import (
        ACRA,
        AdversarialTrainer,
        ARATrainer,
        BernoulliNaiveBayes,
        LangevinAttacker,
        check_security_curve,
        fgsm,
        good_word_insertion,
        pgd,
        security_evaluation_curve,
    )
    from pyro_ext.datasets import DatasetNotFoundError, load_mnist, load_spambase
    from pyro_ext.models import BayesianMLP

    print("== Chapter: adversarial risk analysis (thesis chapter 3) ==")
    try:
        x, y = load_spambase(binarized=True)
        x_mnist, y_mnist = load_mnist("train", flatten=True)
        x_test, y_test = load_mnist("test", flatten=True)
    except DatasetNotFoundError as error:
        print(f"  skipped: {error}")
        return
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    cut = int(0.75 * len(y))
    test = perm[cut:][: 300 if quick else None]
    nb = BernoulliNaiveBayes().fit(x[perm[:cut]], y[perm[:cut]])
    attacked = good_word_insertion(x[test], nb.predict_proba, n=2, y=y[test])
    acra = ACRA(nb, n=2, var=0.1, method="sequential")
    start = time.perf_counter()
    acra_labels = acra.predict(attacked)
    elapsed = time.perf_counter() - start

    def accuracy(labels):
        return float((labels == y[test]).float().mean())

    print(f"  spam, {len(test)} test e-mails, spam attacked by 2 good-word insertions:")
    print(
        f"    naive Bayes accuracy {accuracy(nb.predict(x[test])):.3f} clean, "
        f"{accuracy(nb.predict(attacked)):.3f} attacked; ACRA {accuracy(acra_labels):.3f} "
        f"attacked ({1e3 * elapsed / len(test):.1f} ms per e-mail)"
    )
    print("    (reference code: 0.887 clean, 0.724 attacked, ACRA 0.904)")

    train = 3000 if quick else 10000
    x_mnist, y_mnist = x_mnist[:train], y_mnist[:train]
    x_eval, y_eval = x_test[: 200 if quick else 500], y_test[: 200 if quick else 500]

    def mlp():
        layers = [torch.nn.Linear(784, 100), torch.nn.ReLU(), torch.nn.Linear(100, 10)]
        return torch.nn.Sequential(*layers)

    pyro.set_rng_seed(0)
    # One short epoch: a larger learning rate than the thesis' 0.01 (as in ara_images.ipynb).
    lr = 0.05
    defenses = {"none": AdversarialTrainer(mlp(), clean_fraction=1.0, lr=lr)}
    defenses["AT"] = AdversarialTrainer(mlp(), eps=0.1, steps=10, lr=lr)
    attacker = functools.partial(
        LangevinAttacker, eps=(0.02, 0.1), steps=1, steps_rate=1.0, max_steps=5, noise_scale=0.01
    )
    net = BayesianMLP(784, (100,), 10, likelihood="categorical", full_output=False)
    defenses["ARA"] = ARATrainer(
        net, attacker, step_size=lr / train, kernel="sghmc", friction=0.5, num_particles=5
    )
    epsilons = [0.0, 0.1, 0.2]
    attacks = {
        "FGSM": fgsm,
        "PGD-20": lambda f, x, y, eps: pgd(f, x, y, eps, 20, eps / 8, restarts=1),
    }
    print(
        f"  MNIST, {train} training images, one epoch each; accuracy on {len(y_eval)} test "
        f"images at eps = {epsilons}:"
    )
    for name, defense in defenses.items():
        defense.fit(x_mnist, y_mnist, epochs=1)
        rows = []
        for attack_name, attack in attacks.items():
            curve = security_evaluation_curve(
                defense.predict_logits, attack, epsilons, x_eval, y_eval
            )
            flags = "" if not check_security_curve(curve) else " (check failed)"
            values = " / ".join(f"{a:.2f}" for a in curve.accuracy.tolist())
            rows.append(f"{attack_name} {values}{flags}")
        print(f"    {name:>4} ({defense.epoch_times[0]:5.1f} s per epoch): " + "; ".join(rows))
    print(
        "    (thesis figure 3.8: ARA's curves above AT's; results/ara_scalable.md has the "
        "full protocol, where PGD breaks ARA sooner than AT)"
    )


def _logistic_data(size=4000, dim=10):
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(size, dim, generator=generator)
    logits = x @ torch.randn(dim, generator=generator)
    return x, torch.bernoulli(torch.sigmoid(logits), generator=generator)


def _logistic_model(x, y, batch):
    w = pyro.sample("w", dist.Normal(torch.zeros(x.shape[1]), 1.0).to_event(1))
    with pyro.plate("data", x.shape[0], subsample_size=batch) as idx:
        pyro.sample("y", dist.Bernoulli(logits=x[idx] @ w), obs=y[idx])


def _sharded_chain(shard, steps, world_size):
    """SGLD+R with 8 particles: its draws ``(8, steps, D)`` and seconds per step."""
    x, y = _logistic_data()
    # Data sharding: the plate's minibatch is each rank's share of the 200 rows.
    batch = 200 // world_size if shard == "data" else 200
    kernel = SGLD(_logistic_model, 1e-2, num_particles=8, repulsion="rbf", shard=shard)
    mcmc = MCMC(kernel, num_samples=steps, warmup_steps=0, disable_progbar=True)
    pyro.set_rng_seed(0)  # the same seed on every rank
    start = time.perf_counter()
    mcmc.run(x, y, batch)
    return mcmc.get_samples(group_by_chain=True)["w"], (time.perf_counter() - start) / steps


def _mean_gap(draws, reference):
    """The largest gap between two runs' means over their second halves, in posterior sd."""
    half = draws.shape[1] // 2
    gap = draws[:, half:].mean((0, 1)) - reference[:, half:].mean((0, 1))
    return float((gap.abs() / reference[:, half:].std((0, 1))).max())


def _distributed_worker(rank, world_size, init_file, shard, steps, queue):
    import torch.distributed as dist_c10d

    torch.set_num_threads(1)
    dist_c10d.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size
    )
    try:
        draws, seconds = _sharded_chain(shard, steps, world_size)
        # NumPy, not a tensor: a tensor would travel as shared memory that dies with this process.
        queue.put((rank, draws.numpy(), seconds))
    finally:
        dist_c10d.destroy_process_group()


def distributed(quick=False):
    """Particles and minibatches sharded over two gloo processes, against one process."""
    import tempfile

    import torch.multiprocessing as mp

    print("== Chapter: SG-MCMC over torch.distributed (particles and data sharded) ==")
    steps = 100 if quick else 500
    world_size = 2
    single, seconds = _sharded_chain(None, steps, 1)
    print(
        f"  SGLD+R, 8 particles, logistic regression (minibatch 200), {steps} steps; "
        f"one process: {seconds * 1e3:.1f} ms per step"
    )
    context = mp.get_context("spawn")
    for shard in ("particles", "data"):
        queue = context.Queue()
        with tempfile.TemporaryDirectory() as folder:
            processes = [
                context.Process(
                    target=_distributed_worker,
                    args=(rank, world_size, f"{folder}/init", shard, steps, queue),
                )
                for rank in range(world_size)
            ]
            for process in processes:
                process.start()
            results = sorted((queue.get(timeout=600) for _ in processes), key=lambda r: r[0])
            for process in processes:
                process.join()
        (_, draws, seconds), (_, other, _) = results
        draws, other = torch.from_numpy(draws), torch.from_numpy(other)
        what = "4 particles per rank" if shard == "particles" else "100 rows per rank"
        print(
            f"  shard={shard!r:12s} 2 processes ({what}): {seconds * 1e3:.1f} ms per step; "
            f"the ranks hold identical draws: {torch.equal(draws, other)}"
        )
        difference = (draws - single).abs().amax((0, 2))
        # Summing a minibatch in two halves rounds differently; repulsive noise amplifies
        # round-off from step to step, so such chains part while their posteriors agree.
        print(
            f"    draws differ from one process by {difference[0]:.0e} after 1 step, "
            f"{difference[9]:.0e} after 10, {difference[-1]:.0e} after {steps}; posterior means "
            f"over the second half differ by {_mean_gap(draws, single):.2f} posterior sd"
        )
    print(
        "  (a model this small is faster in one process: the collectives cost more than the "
        "gradients they share; see benchmarks/results/distributed.md)"
    )


CHAPTERS = {
    "sgmcmc": sgmcmc,
    "distributed": distributed,
    "bnn": bnn,
    "ngvi": ngvi,
    "online": online,
    "vis": vis,
    "timeseries": timeseries,
    "bsts": bsts,
    "ara": ara,
    "rl": rl,
}


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--chapter",
        choices=sorted(CHAPTERS),
        action="append",
        help="run only these chapters (default: all)",
    )
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    args = parser.parse_args(argv)
    # The tour's models are small: intra-op threads only add synchronisation, which costs
    # up to 10x on a busy machine (ACRA's many small tensor ops).
    torch.set_num_threads(1)
    pyro.set_rng_seed(0)
    for name in args.chapter or CHAPTERS:
        CHAPTERS[name](quick=args.quick)


if __name__ == "__main__":
    main()
