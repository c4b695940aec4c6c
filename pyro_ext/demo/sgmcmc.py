"""Chapter ``sgmcmc``: stochastic-gradient MCMC with repulsion (thesis section 2.3)."""

import math
import time

import pyro
import pyro.distributions as dist
import torch

from pyro_ext.infer import MCMC, SGHMC, SGLD, AdamSGLD

FIGURES = (
    "sgmcmc_gaussian_posterior",
    "sgmcmc_svgd_vs_sgld_r",
    "sgmcmc_logistic_regression",
    "sgmcmc_compiled_step",
)


def _gaussian_posterior(quick, figures):
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
    print(f"  conjugate Gaussian, N={num_data}, minibatch {subsample_size}, 20 particles")
    print(f"    exact posterior          mean {exact_mean:.4f}   sd {exact_sd:.4f}")
    # The default step bounds the bias that minibatch noise adds (5 % on the variance); a
    # step guessed from the curvature alone does not. The bounded step relaxes the chain in
    # about 260 steps here, so the run keeps 30 000 steps (3000 draws, thinning 10), more
    # than the 100 relaxation times its draws need to mix (fewer would raise a
    # SlowMixingWarning saying so).
    for step_size in (None, 2e-5):
        pyro.set_rng_seed(0)
        kernel = SGLD(model, step_size=step_size, num_particles=20)
        mcmc = MCMC(
            kernel,
            num_samples=200 if quick else 3000,
            warmup_steps=600,
            thinning=1 if quick else 10,
            disable_progbar=True,
        )
        mcmc.run(x)
        draws = mcmc.get_samples()["mu"]
        label = "default step" if step_size is None else f"step {step_size:g}"
        step_used = kernel.diagnostics()["step_size"]
        print(
            f"    SGLD, {label:13s}  mean {draws.mean():.4f}   sd {draws.std():.4f}"
            f"   (step {step_used:.1e})"
        )
    if figures is None:
        return
    chains = mcmc.get_samples(group_by_chain=True)["mu"]  # (particles, draws)
    with figures.figure("sgmcmc_gaussian_posterior", 1, 2) as (trace, histogram):
        for chain in chains[:5]:
            trace.plot(chain, lw=0.7)
        trace.axhline(exact_mean, color="k", ls="--", lw=1, label="exact mean")
        trace.set_xlabel("draw (after warmup)")
        trace.set_ylabel("mu")
        trace.set_title("SGLD trace, 5 of the 20 particles")
        trace.legend()
        histogram.hist(draws, bins=40, density=True, alpha=0.6, label="SGLD, all particles")
        grid = torch.linspace(float(draws.min()), float(draws.max()), 200, dtype=torch.float64)
        density = torch.distributions.Normal(exact_mean, exact_sd).log_prob(grid).exp()
        histogram.plot(grid, density, "k", label="exact posterior")
        histogram.set_xlabel("mu")
        histogram.set_title(f"conjugate Gaussian, N={num_data}, minibatch {subsample_size}")
        histogram.legend()


def _svgd_vs_sgld_r(quick, figures):
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
    first_seed = {}
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
            if seed == 0:
                first_seed[name.strip()] = mcmc.get_samples()["z"]
        sd = torch.stack(sds).mean(0)
        print(f"    {name}  sd_x {sd[0]:.2f}  sd_y {sd[1]:.2f}   (target 1.00)")
    if figures is None:
        return
    with figures.figure("sgmcmc_svgd_vs_sgld_r", 1, 2, panel_size=(4.2, 4.2)) as axes:
        angle = torch.linspace(0, 2 * math.pi, 200)
        for ax, (name, z) in zip(axes, first_seed.items()):
            ax.scatter(z[:, 0], z[:, 1], s=2, alpha=0.3, label="draws (6 particles x 500)")
            for radius in (1, 2):
                ax.plot(radius * angle.cos(), radius * angle.sin(), "k", lw=0.8)
            sd = z.std(0)
            ax.set_title(f"{name}: sd {sd[0]:.2f}, {sd[1]:.2f} (target 1)")
            ax.set_xlim(-3.5, 3.5)
            ax.set_ylim(-3.5, 3.5)
            ax.set_aspect("equal")
            ax.set_xlabel("z[0]")
        axes[0].set_ylabel("z[1]")
        axes[0].legend(loc="upper left", fontsize="small")
        axes[0].figure.suptitle("2-D standard normal (1 and 2 sd circles), seed 0")


def _logistic_regression(quick, figures):
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
    posteriors = {}
    for name, make in samplers.items():
        pyro.set_rng_seed(0)
        mcmc = MCMC(make(), num_samples=steps, warmup_steps=steps, disable_progbar=True)
        start = time.perf_counter()
        mcmc.run(x_train, y_train)
        elapsed = time.perf_counter() - start
        w = mcmc.get_samples()["w"]
        posteriors[name] = w
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
    if figures is None:
        return
    with figures.figure("sgmcmc_logistic_regression", 2, 3, panel_size=(3.4, 3.2)) as axes:
        low, high = float(w_true.min()) - 0.3, float(w_true.max()) + 0.3
        for ax, (name, w) in zip(axes, posteriors.items()):
            ax.errorbar(w_true, w.mean(0), yerr=2 * w.std(0), fmt="o", ms=3, capsize=2)
            ax.plot([low, high], [low, high], "k--", lw=1)
            ax.set_title(name)
        for ax in axes[3:]:
            ax.set_xlabel("true weight")
        for ax in axes[::3]:
            ax.set_ylabel("posterior mean +- 2 sd")
        axes[0].figure.suptitle(
            f"logistic regression, D={dim}: posterior of each weight against the truth"
        )


def _compiled_step(quick, figures):
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
    if figures is None:
        return
    with figures.figure("sgmcmc_compiled_step", 1, 2) as (trace, gap):
        step = torch.arange(1, steps + 1)
        trace.plot(step, chains[False][0, :, 0], lw=0.8, label="eager")
        trace.plot(step, chains[True][0, :, 0], lw=0.8, ls="--", label="compiled")
        trace.set_xlabel("step")
        trace.set_ylabel("w[0], particle 0")
        trace.set_title("SGLD+R trace, same seed")
        trace.legend()
        gap.semilogy(step, difference.clamp_min(1e-12))
        gap.set_xlabel("step")
        gap.set_ylabel("max |compiled - eager| over particles")
        gap.set_title("round-off grows, the chains part")


def run(quick=False, figures=None):
    print("== Chapter: stochastic-gradient MCMC with repulsion (thesis 2.3) ==")
    _gaussian_posterior(quick, figures)
    _svgd_vs_sgld_r(quick, figures)
    _logistic_regression(quick, figures)
    _compiled_step(quick, figures)
