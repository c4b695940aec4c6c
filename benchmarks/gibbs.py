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

**Mixture** (``--mixture``, written to ``results/gibbs_mixture.md``; issue 30, item 7): the
3-component 1-D Gaussian mixture of Pyro's GMM tutorial, ``weights ~ Dirichlet(0.5)``,
``scale ~ LogNormal(0, 2)`` (unknown), ``locs_k ~ N(0, 10^2)``, ``assignment_n ~
Categorical(weights)`` and ``y_n ~ N(locs[assignment_n], scale)``, on N = 150 points drawn
from components at -5, 0, 5 with sd 1 (data seed 0). ``Gibbs(kernel, ["assignment"])`` with
L = 4 particles, from the default start (no ``initial_params``):

- **time per step**, median / mean / p90 / max over the steps of 5 seeds, of the assignment
  move as it was (every assignment swept one at a time, ``V = 3`` model evaluations each:
  the path that remains for interacting elements, forced here) against the move now (all
  150 drawn at once from their exact conditionals, ``V + 2`` evaluations per sweep, with
  the energy check of each gradient step);
- **what a user gets**: ``Gibbs(SGLD(gmm, num_particles=4), ["assignment"])``, and the
  same with ``SGHMC`` and ``AdamSGLD``, with only the required arguments (default start,
  default step size), 1000 + 1000 steps, 5 seeds: the **sorted posterior means of the
  component locations** (each draw's locations sorted, which removes label switching,
  then averaged) overall and per particle, how many particles sit at the truth (sorted
  means within 0.5 of -5, 0, 5), the step size warm-up set, any divergence the kernel
  reports and whether it warned that the run was too short to mix
  (``SlowMixingWarning``); SGLD started in the true components' basin (locations -5, 0,
  5, scale 1, weights 1/3, step 3e-3) checks the stationary law apart from the start;
- against Pyro's ``NUTS`` with the assignments enumerated (``config_enumerate``,
  ``max_plate_nesting=1``) and NumPyro's ``DiscreteHMCGibbs(NUTS)`` (Gibbs updates of the
  assignments, NUTS on the rest), one chain per seed, 100 + 100 steps.

Run from the repository root::

    python benchmarks/gibbs.py              # full: D = 8 and 12, 3 seeds, ~5 minutes
    python benchmarks/gibbs.py --mixture    # full mixture section, 5 seeds
    python benchmarks/gibbs.py --quick      # D = 8, one seed, few draws; and the mixture's
                                            # quick section (one seed, few steps)
"""

import itertools
import os
import statistics
import time
import warnings
from importlib.metadata import version

from _common import REPO, argument_parser, command_line_args, markdown, spread, write_report

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=1")

import pyro  # noqa: E402
import pyro.distributions as dist  # noqa: E402
import torch  # noqa: E402
from pyro.ops.stats import effective_sample_size  # noqa: E402

from pyro_ext.infer import (  # noqa: E402
    MCMC,
    SGHMC,
    SGLD,
    AdamSGLD,
    Gibbs,
    SamplerDivergenceError,
    SlowMixingWarning,
)

RESULTS = REPO / "benchmarks" / "results" / "gibbs.md"
MIXTURE_RESULTS = REPO / "benchmarks" / "results" / "gibbs_mixture.md"
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


# -- the mixture of issue 30, item 7 --------------------------------------------------
K, MIXTURE_N, MIXTURE_PARTICLES = 3, 150, 4
TRUE_LOCS = (-5.0, 0.0, 5.0)


def mixture_data(seed=0):
    generator = torch.Generator().manual_seed(seed)
    locs = torch.tensor(TRUE_LOCS)
    assignment = torch.randint(0, K, (MIXTURE_N,), generator=generator)
    return locs[assignment] + torch.randn(MIXTURE_N, generator=generator)


def gmm(data):
    """Pyro's GMM tutorial model, with an unknown scale."""
    weights = pyro.sample("weights", dist.Dirichlet(0.5 * torch.ones(K)))
    scale = pyro.sample("scale", dist.LogNormal(0.0, 2.0))
    with pyro.plate("components", K):
        locs = pyro.sample("locs", dist.Normal(0.0, 10.0))
    with pyro.plate("data", len(data)):
        assignment = pyro.sample("assignment", dist.Categorical(weights))
        pyro.sample("obs", dist.Normal(locs[assignment], scale), obs=data)


def gibbs_run(
    data,
    step_size,
    warmup,
    num_samples,
    seed,
    sweep=False,
    initial_params=None,
    kernel_class=SGLD,
):
    """One run of ``Gibbs(kernel_class(gmm, step_size, 4), ["assignment"])`` from the
    default start (or ``initial_params``; ``step_size=None``: the kernel's default):
    ``(mcmc, kernel, seconds per step, divergence or None, slow-mixing warning or None)``.
    ``sweep=True`` moves the assignments one at a time without the energy check (the
    kernel as it was)."""
    pyro.set_rng_seed(seed)
    kernel = Gibbs(
        kernel_class(gmm, step_size=step_size, num_particles=MIXTURE_PARTICLES),
        ["assignment"],
        divergence_threshold=None if sweep else 1000.0,
    )
    if sweep:
        kernel._gibbs_block = lambda name, z: False  # the element-by-element sweep
    stamps = []
    mcmc = MCMC(
        kernel,
        num_samples=num_samples,
        warmup_steps=warmup,
        disable_progbar=True,
        initial_params=initial_params,
        hook_fn=lambda *_: stamps.append(time.perf_counter()),
    )
    divergence = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SlowMixingWarning)
        try:
            mcmc.run(data)
        except SamplerDivergenceError as error:
            divergence = error
    slow = [w for w in caught if issubclass(w.category, SlowMixingWarning)]
    seconds = [b - a for a, b in zip(stamps, stamps[1:])]
    return mcmc, kernel, seconds, divergence, (slow[0] if slow else None)


def nuts_run(data, warmup, num_samples, seed):
    from pyro.infer import MCMC as PyroMCMC
    from pyro.infer import NUTS, config_enumerate

    pyro.set_rng_seed(seed)
    mcmc = PyroMCMC(
        NUTS(config_enumerate(gmm), max_plate_nesting=1),
        num_samples=num_samples,
        warmup_steps=warmup,
        disable_progbar=True,
    )
    started = time.perf_counter()
    mcmc.run(data)
    return mcmc.get_samples(), (time.perf_counter() - started) / (warmup + num_samples)


def numpyro_run(data, warmup, num_samples, seed):
    import jax
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as ndist
    from numpyro.infer import MCMC as NumPyroMCMC
    from numpyro.infer import NUTS, DiscreteHMCGibbs

    def model(data):
        weights = numpyro.sample("weights", ndist.Dirichlet(0.5 * jnp.ones(K)))
        scale = numpyro.sample("scale", ndist.LogNormal(0.0, 2.0))
        with numpyro.plate("components", K):
            locs = numpyro.sample("locs", ndist.Normal(0.0, 10.0))
        with numpyro.plate("data", len(data)):
            assignment = numpyro.sample("assignment", ndist.Categorical(weights))
            numpyro.sample("obs", ndist.Normal(locs[assignment], scale), obs=data)

    mcmc = NumPyroMCMC(
        DiscreteHMCGibbs(NUTS(model)),
        num_warmup=warmup,
        num_samples=num_samples,
        progress_bar=False,
    )
    started = time.perf_counter()
    mcmc.run(jax.random.PRNGKey(seed), jnp.asarray(data.numpy()))
    locs = torch.as_tensor(jax.device_get(mcmc.get_samples()["locs"]))
    return {"locs": locs}, (time.perf_counter() - started) / (warmup + num_samples)


def sorted_means(locs):
    """Posterior means of the sorted locations (each draw sorted: no label switching)."""
    return locs.sort(-1).values.reshape(-1, K).mean(0)


def fmt_locs(means):
    return "(" + ", ".join(f"{float(m):.2f}" for m in means) + ")"


def mixture_section(quick):
    data = mixture_data()
    seeds = [0] if quick else [0, 1, 2, 3, 4]
    sections = []

    # 1. Time per step: the sweep as it was against the move now, at a step size stable
    # from the default start (1e-5), so both time the same path.
    timing_steps = 4 if quick else 30
    labels = {
        True: "before: element-by-element sweep, no energy check",
        False: "after: all assignments at once, with the energy check",
    }
    seconds = {True: [], False: []}
    for seed in seeds:  # interleaved, so that both see the same load of a shared machine
        for sweep in (True, False):
            steps = max(2, timing_steps // 5) if sweep else timing_steps
            seconds[sweep] += gibbs_run(data, 1e-5, 0, steps, seed, sweep=sweep)[2]
    rows = [
        [labels[sweep], len(seconds[sweep]), spread(seconds[sweep], scale=1e3, fmt="{:.1f}")]
        for sweep in (True, False)
    ]
    before_median = statistics.median(seconds[True])
    after_median = statistics.median(seconds[False])
    sections.append(
        "## Mixture: time per step\n\n"
        + markdown(
            ["assignment move", "steps timed", "ms per step: median / mean / p90 / max"], rows
        )
        + f"\n\nMedian speed-up: {before_median / after_median:.0f}×."
    )

    # 2. What a user gets: each kernel with only the required arguments (default start,
    # default step size), against NUTS with the assignments enumerated; and SGLD started in
    # the true components' basin (locs at -5, 0, 5, scale 1, weights 1/3; the assignments
    # drawn from the model given them), which checks the stationary law apart from the start.
    truth = {  # unconstrained, as the kernels take initial values
        "locs": torch.tensor(TRUE_LOCS),
        "scale": torch.tensor(0.0),  # log 1
        "weights": torch.distributions.biject_to(dist.constraints.simplex).inv(torch.ones(K) / K),
    }
    warmup, num_samples = (5, 5) if quick else (1000, 1000)
    nuts_warmup, nuts_samples = (3, 3) if quick else (100, 100)
    samplers = {
        f"Gibbs({cls.__name__}), defaults": (
            lambda seed, cls=cls: gibbs_run(data, None, warmup, num_samples, seed, kernel_class=cls)
        )
        for cls in (SGLD, SGHMC, AdamSGLD)
    }
    samplers["Gibbs(SGLD), started in the true basin, step 3e-3"] = lambda seed: gibbs_run(
        data, 3e-3, warmup, num_samples, seed, initial_params=truth
    )
    rows, summary = [], []
    for name, run in samplers.items():
        found, total, warned = 0, 0, 0
        for seed in seeds:
            mcmc, kernel, seconds, error, slow = run(seed)
            warned += slow is not None
            locs = mcmc.get_samples(group_by_chain=True)["locs"]  # (L, S, K)
            step = kernel.kernel.step_size_adaptation
            step_text = f"{step.step_size:.2g}" if step is not None and step.step_size else "3e-3"
            if error is not None or locs.shape[1] == 0:
                rows.append([name, seed, f"divergence at step {error.step}", "", "", step_text, ""])
                total += MIXTURE_PARTICLES
                continue
            means = [sorted_means(chain) for chain in locs]
            at_truth = [bool((m - torch.tensor(TRUE_LOCS)).abs().max() < 0.5) for m in means]
            found += sum(at_truth)
            total += len(at_truth)
            rows.append(
                [
                    name,
                    seed,
                    fmt_locs(sorted_means(locs)),
                    "; ".join(fmt_locs(m) for m in means),
                    f"{sum(at_truth)} of {len(at_truth)}",
                    step_text,
                    f"{statistics.fmean(seconds) * 1e3:.1f}",
                ]
            )
        summary.append([name, f"{found} of {total}", f"{warned} of {len(seeds)}"])
    for seed in seeds:
        samples, per_step = nuts_run(data, nuts_warmup, nuts_samples, seed)
        rows.append(
            [
                f"Pyro NUTS, assignments enumerated ({nuts_warmup} + {nuts_samples} steps)",
                seed,
                fmt_locs(sorted_means(samples["locs"])),
                "",
                "",
                "adapted",
                f"{per_step * 1e3:.1f}",
            ]
        )
    try:
        numpyro_version = version("numpyro")
    except Exception:
        numpyro_version = None
    if numpyro_version is None:
        rows.append(["NumPyro `DiscreteHMCGibbs(NUTS)`", "", "not installed", "", "", "", ""])
    else:
        for seed in seeds:
            samples, per_step = numpyro_run(data, nuts_warmup, nuts_samples, seed)
            rows.append(
                [
                    f"NumPyro `DiscreteHMCGibbs(NUTS)` ({nuts_warmup} + {nuts_samples} steps)",
                    seed,
                    fmt_locs(sorted_means(samples["locs"])),
                    "",
                    "",
                    "adapted",
                    f"{per_step * 1e3:.1f}",
                ]
            )
    sections.append(
        f"## Mixture: sorted posterior means of the locations ({warmup} + {num_samples} "
        f"steps for ours, {MIXTURE_PARTICLES} particles)\n\n"
        "True locations (-5, 0, 5). Each draw's locations are sorted (no label switching) "
        "and averaged; a particle is at the truth when its sorted means are within 0.5 of "
        "(-5, 0, 5). Milliseconds per step: wall time over all steps (NumPyro's includes its "
        "JIT compilation).\n\n"
        + markdown(
            [
                "sampler",
                "seed",
                "sorted means (all draws)",
                "per particle",
                "particles at the truth",
                "step size",
                "ms per step (mean)",
            ],
            rows,
        )
        + "\n\n"
        + markdown(
            ["sampler (ours)", "particles at the truth, all seeds", "SlowMixingWarning raised"],
            summary,
        )
    )
    return sections


def main():
    parser = argument_parser(
        __doc__, RESULTS, quick="D = 8 only, seed 0, short chains (smoke test)"
    )
    parser.add_argument(
        "--mixture",
        action="store_true",
        help="run the mixture section only (issue 30, item 7), written to "
        "results/gibbs_mixture.md unless --output is given",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.mixture:
        started = time.perf_counter()
        sections = mixture_section(args.quick)
        output = MIXTURE_RESULTS if args.output == RESULTS else args.output
        write_report(mixture_preamble(args.quick, started), sections, output)
        return
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
    sections = ["## Spike-and-slab regression, N = 40\n\n" + markdown(header, rows)]
    if args.quick:
        # The smoke test covers the mixture section too (its full run: --mixture).
        sections += mixture_section(quick=True)
    write_report(preamble, sections, args.output)


def mixture_preamble(quick, started):
    try:
        numpyro_version = version("numpyro")
    except Exception:
        numpyro_version = "not installed"
    return (
        "# Gibbs on mixture assignments: one pass for all of them\n\n"
        f"Mode: {'quick' if quick else 'full'}. torch {version('torch')}, pyro "
        f"{version('pyro-ppl')}, numpyro {numpyro_version}, one CPU thread (a machine shared "
        "with other jobs: the timings are comparable within this report only); total "
        f"{(time.perf_counter() - started) / 60:.1f} min. Generated by `python "
        f"benchmarks/gibbs.py {command_line_args()}`. Protocol in the script's docstring: "
        "Pyro's GMM tutorial model with an unknown scale, K = 3, N = 150 points from "
        "components at -5, 0, 5 with sd 1, L = 4 particles."
    )


if __name__ == "__main__":
    main()
