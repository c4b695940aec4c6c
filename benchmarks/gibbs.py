"""
Gibbs moves on discrete sites: ``pyro_ext.infer.Gibbs`` against NumPyro's
``DiscreteHMCGibbs``, on spike-and-slab regressions whose exact posterior inclusion
probabilities come from enumerating every model.

Model (as in ``tests/infer/test_gibbs.py``): ``y ~ N(X_g beta_g, sigma^2)`` with indicators
``gamma_j ~ Bernoulli(0.3)``, ``beta_j ~ N(0, 1)`` where ``gamma_j = 1`` (integrated out:
``y ~ N(0, sigma^2 I + X_g X_g')``) and ``sigma ~ HalfNormal(1)``; N = 40 rows, D = 8 and
D = 12 covariates, two of them strongly correlated. The exact inclusion probabilities sum
over all 2^D models with ``sigma`` integrated on a grid of 4000 points.

Samplers, with the same number of kept draws of ``gamma``:

- **ours**: ``Gibbs(SGLD(model, 5e-3, num_particles=8), ["gamma"], moves=...)`` under
  ``pyro_ext.infer.MCMC``, eager, for ``moves="gibbs"`` (every element from its exact full
  conditional; the model runs once per value, vectorised over particles) and ``"mh-flip"``;
  ``sigma`` moves by SGLD (full batch, so plain Langevin);
- **NumPyro**: ``DiscreteHMCGibbs(NUTS(model))`` (Gibbs updates of one random element of
  ``gamma`` per step, NUTS on ``sigma``), one chain, float64, jitted; its compile time is
  reported apart.

Reported per sampler, over 3 seeds: the largest error of the inclusion probabilities
against the exact ones, the effective sample size of the indicators (mean over the
covariates whose exact inclusion probability lies in (0.05, 0.95), where mixing matters;
``pyro.ops.stats.effective_sample_size``: across our particles, within NumPyro's chain),
wall time (median / mean / p90 / max over seeds, NumPyro without compilation), and ESS per
second. One CPU thread.

Run from the repository root::

    python benchmarks/gibbs.py            # full: D = 8 and 12, 3 seeds, ~5 minutes
    python benchmarks/gibbs.py --quick    # D = 8, one seed, few draws
"""

import itertools
import os
import statistics
import time
from importlib.metadata import version

from _common import REPO, argument_parser, command_line_args, markdown, spread, write_report

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=1")

import pyro  # noqa: E402
import pyro.distributions as dist  # noqa: E402
import torch  # noqa: E402
from pyro.ops.stats import effective_sample_size  # noqa: E402

from pyro_ext.infer import MCMC, SGLD, Gibbs  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "gibbs.md"
N, SLAB, PI, PARTICLES = 40, 1.0, 0.3, 8


def data(num_covariates, seed=1):
    generator = torch.Generator().manual_seed(seed)
    X = torch.randn(N, num_covariates, generator=generator, dtype=torch.float64)
    X[:, 1] = X[:, 0] + 0.3 * torch.randn(N, generator=generator, dtype=torch.float64)
    beta = torch.zeros(num_covariates, dtype=torch.float64)
    beta[[0, 2, 5]] = torch.tensor([0.8, 0.5, 0.3], dtype=torch.float64)
    y = X @ beta + 0.7 * torch.randn(N, generator=generator, dtype=torch.float64)
    return X, y


def spike_slab(X, y):
    sigma = pyro.sample("sigma", dist.HalfNormal(torch.tensor(1.0, dtype=X.dtype)))
    gamma = pyro.sample(
        "gamma", dist.Bernoulli(torch.full(X.shape[-1:], PI, dtype=X.dtype)).to_event(1)
    )
    included = X * gamma
    cov = sigma**2 * torch.eye(N, dtype=X.dtype) + SLAB**2 * included @ included.T
    pyro.sample("y", dist.MultivariateNormal(torch.zeros(N, dtype=X.dtype), cov), obs=y)


def exact_inclusion(X, y):
    """Inclusion probabilities from all 2^D models, sigma integrated on a grid."""
    sigma2 = torch.linspace(1e-3, 4.0, 4000, dtype=torch.float64).pow(2)
    log_prior_sigma = dist.HalfNormal(torch.tensor(1.0, dtype=torch.float64)).log_prob(
        sigma2.sqrt()
    )
    D = X.shape[-1]
    models = torch.tensor(list(itertools.product([0.0, 1.0], repeat=D)), dtype=torch.float64)
    log_evidence = []
    for gamma in models:
        included = X * gamma
        lam, U = torch.linalg.eigh(SLAB**2 * included @ included.T)
        variances = sigma2[:, None] + lam.clamp(min=0)
        log_like = -0.5 * (
            variances.log().sum(-1)
            + ((U.T @ y) ** 2 / variances).sum(-1)
            + N * torch.log(torch.tensor(2 * torch.pi, dtype=torch.float64))
        )
        prior = dist.Bernoulli(torch.tensor(PI, dtype=torch.float64)).log_prob(gamma).sum()
        log_evidence.append(torch.logsumexp(log_like + log_prior_sigma, 0) + prior)
    posterior = torch.stack(log_evidence).softmax(0)
    return (posterior[:, None] * models).sum(0)


def mean_ess(draws, uncertain):
    """Mean ESS of the indicators ``draws`` ``(chains, samples, D)`` whose exact inclusion
    probability is uncertain (a near-constant indicator has no meaningful ESS)."""
    ess = effective_sample_size(draws[..., uncertain], chain_dim=0, sample_dim=1)
    return float(torch.nan_to_num(ess, nan=0.0).mean())


def run_ours(X, y, moves, num_samples, warmup, seed):
    pyro.set_rng_seed(seed)
    kernel = Gibbs(
        SGLD(spike_slab, step_size=5e-3, num_particles=PARTICLES), ["gamma"], moves=moves
    )
    mcmc = MCMC(kernel, num_samples=num_samples, warmup_steps=warmup, disable_progbar=True)
    started = time.perf_counter()
    mcmc.run(X, y)
    seconds = time.perf_counter() - started
    gamma = mcmc.get_samples(group_by_chain=True)["gamma"]  # (L, S, D)
    return gamma, seconds, 0.0


def run_numpyro(X, y, num_samples, warmup, seed):
    import jax
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as ndist
    from numpyro.infer import MCMC as NumPyroMCMC
    from numpyro.infer import NUTS, DiscreteHMCGibbs

    numpyro.enable_x64()
    Xj, yj = jnp.asarray(X.numpy()), jnp.asarray(y.numpy())

    def model(X, y):
        sigma = numpyro.sample("sigma", ndist.HalfNormal(1.0))
        # DiscreteHMCGibbs enumerates batched sites, not .to_event() ones: a plate.
        with numpyro.plate("covariates", X.shape[-1]):
            gamma = numpyro.sample("gamma", ndist.Bernoulli(PI))
        included = X * gamma
        cov = sigma**2 * jnp.eye(N) + SLAB**2 * included @ included.T
        numpyro.sample("y", ndist.MultivariateNormal(jnp.zeros(N), covariance_matrix=cov), obs=y)

    def sample(key, num):
        mcmc = NumPyroMCMC(
            DiscreteHMCGibbs(NUTS(model)),
            num_warmup=warmup,
            num_samples=num,
            num_chains=1,
            progress_bar=False,
        )
        mcmc.run(key, Xj, yj)
        gamma = mcmc.get_samples()["gamma"]
        gamma.block_until_ready()
        return gamma

    # The first run compiles; the second, timed, reuses the compiled step.
    started = time.perf_counter()
    sample(jax.random.PRNGKey(seed + 1000), num_samples)
    first = time.perf_counter() - started
    started = time.perf_counter()
    gamma = sample(jax.random.PRNGKey(seed), num_samples)
    seconds = time.perf_counter() - started
    return torch.as_tensor(jax.device_get(gamma)).double().unsqueeze(0), seconds, first - seconds


def main():
    parser = argument_parser(
        __doc__, RESULTS, quick="D = 8 only, seed 0, short chains (smoke test)"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    dims = [8] if args.quick else [8, 12]
    seeds = [0] if args.quick else [0, 1, 2]
    per_particle = 50 if args.quick else 600  # kept draws per particle
    warmup = 20 if args.quick else 100
    started_all = time.perf_counter()
    samplers = {
        'ours, `moves="gibbs"`': lambda X, y, s: run_ours(X, y, "gibbs", per_particle, warmup, s),
        'ours, `moves="mh-flip"`': lambda X, y, s: run_ours(
            X, y, "mh-flip", per_particle, warmup, s
        ),
    }
    try:
        numpyro_version = version("numpyro")
        samplers["NumPyro `DiscreteHMCGibbs(NUTS)`"] = lambda X, y, s: run_numpyro(
            X, y, per_particle * PARTICLES, warmup * PARTICLES, s
        )
    except Exception:
        numpyro_version = None
    rows = []
    for D in dims:
        X, y = data(D)
        exact = exact_inclusion(X, y)
        uncertain = (exact > 0.05) & (exact < 0.95)
        for name, run in samplers.items():
            errors, ess, seconds, compile_s = [], [], [], []
            for seed in seeds:
                gamma, wall, compiled = run(X, y, seed)
                errors.append(float((gamma.mean((0, 1)) - exact).abs().max()))
                ess.append(mean_ess(gamma, uncertain))
                seconds.append(wall)
                compile_s.append(compiled)
            draws = gamma.shape[0] * gamma.shape[1]
            rows.append(
                [
                    D,
                    name,
                    f"{gamma.shape[0]} × {gamma.shape[1]}",
                    f"{statistics.fmean(errors):.3f} / {max(errors):.3f}",
                    f"{statistics.fmean(ess):,.0f} of {draws:,}",
                    spread(seconds, fmt="{:.2f}"),
                    f"{statistics.fmean(e / s for e, s in zip(ess, seconds)):,.0f}",
                    f"{statistics.fmean(compile_s):.1f}" if any(compile_s) else "–",
                ]
            )
        if numpyro_version is None:
            rows.append(
                [D, "NumPyro `DiscreteHMCGibbs(NUTS)`", "not installed", "", "", "", "", ""]
            )
    header = [
        "D",
        "sampler",
        "draws (chains × per chain)",
        "largest error of an inclusion probability: mean / max over seeds",
        "ESS of γ_j (mean over the j with exact inclusion in (0.05, 0.95))",
        "wall s: median / mean / p90 / max",
        "ESS / s",
        "compile s",
    ]
    preamble = (
        "# Gibbs moves on discrete sites: pyro_ext against NumPyro\n\n"
        f"Mode: {'quick' if args.quick else 'full'}. torch {version('torch')}, "
        f"numpyro {numpyro_version or 'not installed'}, one CPU thread, float64, "
        f"{len(seeds)} seed(s); total {(time.perf_counter() - started_all) / 60:.1f} min. "
        f"Generated by `python benchmarks/gibbs.py {command_line_args()}`. Protocol in the "
        "script's docstring: the same model and data for every sampler, exact inclusion "
        "probabilities by enumeration of all 2^D models, the same number of kept draws."
    )
    write_report(
        preamble, ["## Spike-and-slab regression, N = 40\n\n" + markdown(header, rows)], args.output
    )


if __name__ == "__main__":
    main()
