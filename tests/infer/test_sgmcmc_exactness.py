"""Stationary moments of the samplers against closed forms on conjugate Gaussian models.

For a Gaussian target the sampler recursions are linear, so the stationary law of the
*discretised* chain is known exactly (a discrete Lyapunov equation). Comparing against it
checks the updates and the minibatch scaling sharply; the gap between it and the exact
posterior is the step-size bias, which the tests also bound.
"""

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.ops.stats import effective_sample_size

from pyro_ext.infer import MCMC, SGHMC, SGLD, AdamSGLD

N, DIM, SIGMA, TAU0 = 1000, 2, 1.0, 1.0


def make_data(device):
    generator = torch.Generator().manual_seed(1)
    x = 0.5 + SIGMA * torch.randn(N, DIM, generator=generator, dtype=torch.float64)
    return x.to(device)


def gaussian_model(x, subsample_size=None):
    mu = pyro.sample("mu", dist.Normal(x.new_zeros(DIM), TAU0).to_event(1))
    with pyro.plate("data", x.shape[0], subsample_size=subsample_size) as idx:
        pyro.sample("obs", dist.Normal(mu, SIGMA).to_event(1), obs=x[idx])


def exact_posterior(x):
    precision = 1 / TAU0**2 + N / SIGMA**2
    mean = x.sum(0) / SIGMA**2 / precision
    return mean, precision


def minibatch_gradient_variance(x, n):
    """Per-coordinate variance of (N/n) sum_{i in B} x_i / sigma^2, B drawn without replacement."""
    population_var = x.var(0, unbiased=False)
    return (N / n) ** 2 * n * population_var * (N - n) / (N - 1) / SIGMA**4


def lyapunov_variance(A, B):
    """Stationary covariance of s' = A s + B xi, xi ~ N(0, I): solves S = A S A^T + B B^T."""
    k = A.shape[0]
    lhs = torch.eye(k * k, dtype=A.dtype) - torch.kron(A, A)
    return torch.linalg.solve(lhs, (B @ B.T).reshape(-1)).reshape(k, k)


def pooled_moments(samples, num_batches=20):
    """
    Mean, variance and their Monte Carlo standard errors from (chains, draws, dim) samples.

    Particles share each step's minibatch, so their errors are correlated: the standard
    errors come from batch means over time blocks of the particle-pooled estimates, which
    accounts for correlation across particles and along the chain alike.
    """
    flat = samples.reshape(-1, samples.shape[-1])
    blocks = samples.reshape(samples.shape[0], num_batches, -1, samples.shape[-1]).transpose(0, 1)
    blocks = blocks.reshape(num_batches, -1, samples.shape[-1])
    block_means, block_vars = blocks.mean(1), blocks.var(1)
    root = math.sqrt(num_batches)
    return flat.mean(0), flat.var(0), block_means.std(0) / root, block_vars.std(0) / root


def run(kernel, x, num_samples, warmup_steps, **kwargs):
    mcmc = MCMC(kernel, num_samples=num_samples, warmup_steps=warmup_steps, disable_progbar=True)
    mcmc.run(*([] if x is None else [x]), **kwargs)
    return mcmc


# Each stationary-law check below that runs 1,000+ steps of 50-100 particles with the full
# 1,000-point likelihood (10-13 s of CPU each) is in the integration run (`make
# test-integration`, CI). The default run keeps the minibatch case of this test, the
# gamma, Dirichlet and SGLD+R checks.
@pytest.mark.parametrize(
    "subsample_size",
    [
        pytest.param(None, id="full_batch", marks=pytest.mark.integration),
        pytest.param(100, id="minibatch"),
    ],
)
def test_sgld_stationary_moments(device, subsample_size):
    x = make_data(device)
    mean, precision = exact_posterior(x)
    step_size = 1e-4
    drift = 1 - step_size * precision
    injected = 2 * step_size
    if subsample_size is not None:
        injected = injected + step_size**2 * minibatch_gradient_variance(x, subsample_size)
    target_var = injected / (1 - drift**2)

    kernel = SGLD(gaussian_model, step_size=step_size, num_particles=100)
    mcmc = run(kernel, x, 1000, 200, subsample_size=subsample_size)
    samples = mcmc.get_samples(group_by_chain=True)["mu"]
    assert samples.shape == (100, 1000, DIM)
    got_mean, got_var, mean_se, var_se = pooled_moments(samples)
    assert ((got_mean - mean).abs() < 4 * mean_se).all()
    assert ((got_var - target_var).abs() < 4 * var_se).all()
    if subsample_size is None:
        # Step-size bias of the full-batch chain: 1 / (1 - eps lambda / 2) - 1 ~ 5 %.
        assert abs(target_var * precision - 1) < 0.06


@pytest.mark.integration  # see test_sgld_stationary_moments
def test_sgld_small_step_matches_exact_posterior_covariance(device):
    x = make_data(device)
    mean, precision = exact_posterior(x)
    step_size = 5e-5
    kernel = SGLD(gaussian_model, step_size=step_size, num_particles=100)
    # Warmup of 30 relaxation times (1 / (eps lambda) = 20 steps) forgets the start.
    samples = run(kernel, x, 1000, 600).get_samples(group_by_chain=True)["mu"]
    got_mean, got_var, mean_se, var_se = pooled_moments(samples)
    step_size_bias = 1 / (precision * (1 - step_size * precision / 2)) - 1 / precision
    assert step_size_bias < 0.03 / precision
    assert ((got_mean - mean).abs() < 4 * mean_se).all()
    assert ((got_var - 1 / precision).abs() < 4 * var_se + step_size_bias).all()
    flat = samples.reshape(-1, DIM)
    correlation = torch.corrcoef(flat.T)[0, 1]
    assert correlation.abs() < 4 / math.sqrt(float(effective_sample_size(samples).min()))


@pytest.mark.integration  # see test_sgld_stationary_moments
def test_sghmc_stationary_moments(device):
    x = make_data(device)
    mean, precision = exact_posterior(x)
    step_size, friction = 2e-5, 0.2
    kernel = SGHMC(gaussian_model, step_size=step_size, friction=friction, num_particles=100)
    samples = run(kernel, x, 1000, 300).get_samples(group_by_chain=True)["mu"]
    a = step_size * precision
    A = torch.tensor([[1 - a, 1 - friction], [-a, 1 - friction]], dtype=torch.float64)
    B = math.sqrt(2 * friction * step_size) * torch.ones(2, 1, dtype=torch.float64)
    target_var = lyapunov_variance(A, B)[0, 0]
    assert abs(float(target_var * precision) - 1) < 0.1
    got_mean, got_var, mean_se, var_se = pooled_moments(samples)
    assert ((got_mean - mean).abs() < 4 * mean_se).all()
    assert ((got_var - target_var).abs() < 4 * var_se).all()


@pytest.mark.integration  # see test_sgld_stationary_moments
def test_adam_sgld_stationary_moments_with_frozen_mass(device):
    x = make_data(device)
    mean, precision = exact_posterior(x)
    step_size, betas = 5e-4, (0.9, 0.99)
    kernel = AdamSGLD(gaussian_model, step_size=step_size, betas=betas, num_particles=50)
    samples = run(kernel, x, 1000, 1000).get_samples(group_by_chain=True)["mu"]
    state = kernel.state_dict()["state"]
    mass = (state["second_moment"] / (1 - betas[1] ** state["count"])).sqrt() + kernel.eps
    beta1 = betas[0]
    target_var = torch.zeros(DIM, dtype=torch.float64)
    # The post-warmup mass is frozen per particle and coordinate: average their variances.
    for d in range(DIM):
        for m in mass[:, d].tolist():
            a = step_size * precision / m
            A = torch.tensor(
                [[1 - a, beta1 / m], [-step_size * precision, beta1]], dtype=torch.float64
            )
            B = math.sqrt(2 * (1 - beta1) * step_size * m) * torch.tensor(
                [[1 / m], [1.0]], dtype=torch.float64
            )
            target_var[d] += lyapunov_variance(A, B)[0, 0] / mass.shape[0]
    assert ((target_var * precision - 1).abs() < 0.1).all()
    got_mean, got_var, mean_se, var_se = pooled_moments(samples)
    assert ((got_mean - mean).abs() < 4 * mean_se).all()
    assert ((got_var - target_var).abs() < 4 * var_se).all()


def test_gamma_precision_posterior_in_unconstrained_space(device):
    # tau ~ Gamma(a, b), x_i ~ N(0, tau^-1/2): posterior Gamma(a + n/2, b + sum x^2 / 2).
    generator = torch.Generator().manual_seed(2)
    data = (2.0 * torch.randn(50, generator=generator, dtype=torch.float64)).to(device)
    a, b = 2.0, 1.0

    def model(data):
        tau = pyro.sample("tau", dist.Gamma(data.new_tensor(a), data.new_tensor(b)))
        with pyro.plate("data", data.shape[0]):
            pyro.sample("obs", dist.Normal(0.0, tau.rsqrt()), obs=data)

    post_a, post_b = a + 25, b + data.pow(2).sum() / 2
    kernel = SGLD(model, step_size=2e-3, num_particles=100)
    samples = run(kernel, data, 1500, 500, **{}).get_samples(group_by_chain=True)["tau"]
    assert (samples > 0).all()
    got_mean, got_var, mean_se, var_se = pooled_moments(samples.unsqueeze(-1))
    assert abs(float(got_mean) - float(post_a / post_b)) < 4 * float(mean_se) + 0.01 * float(
        post_a / post_b
    )
    assert abs(float(got_var) - float(post_a / post_b**2)) < 4 * float(var_se) + 0.03 * float(
        post_a / post_b**2
    )


def test_dirichlet_posterior_on_the_simplex(device):
    counts = torch.tensor([3.0, 10.0, 7.0], dtype=torch.float64, device=device)
    concentration = torch.ones(3, dtype=torch.float64, device=device)

    def model(counts):
        probs = pyro.sample("probs", dist.Dirichlet(concentration))
        pyro.sample("obs", dist.Multinomial(int(counts.sum()), probs), obs=counts)

    kernel = SGLD(model, step_size=2e-3, num_particles=100)
    samples = run(kernel, counts, 1500, 500).get_samples(group_by_chain=True)["probs"]
    assert samples.shape == (100, 1500, 3)
    assert torch.allclose(samples.sum(-1), torch.ones_like(samples[..., 0]))
    posterior = concentration + counts
    exact_mean = posterior / posterior.sum()
    got_mean, _, mean_se, _ = pooled_moments(samples)
    assert ((got_mean - exact_mean).abs() < 4 * mean_se + 0.01).all()


# 10 s of long runs: in the integration run (the calibration tests check SGLD+R's
# stationary law in the default run, and the demo chapter prints this comparison).
@pytest.mark.integration
def test_sgld_r_recovers_the_spread_that_svgd_underestimates():
    # Thesis section 2.3.1: 2-D N(0, I), L = 6 particles started from N([3, 3], 0.25 I).
    def model():
        pyro.sample("z", dist.Normal(torch.zeros(2, dtype=torch.float64), 1.0).to_event(1))

    def start(site):
        return 3.0 + 0.5 * torch.randn(2, dtype=torch.float64)

    step_size = 0.3  # with K ~ I the per-particle step of eq. (2.7) is step_size / L = 0.05
    svgd = SGLD(
        model, step_size, num_particles=6, repulsion="rbf", temperature=0.0, init_strategy=start
    )
    final = run(svgd, None, 1, 1000).get_samples()["z"]
    assert final.std(0).max() < 0.85  # the SVGD fixed point is too narrow

    sgld_r = SGLD(model, step_size, num_particles=6, repulsion="rbf", init_strategy=start)
    samples = run(sgld_r, None, 4000, 500).get_samples(group_by_chain=True)["z"]
    _, var, _, var_se = pooled_moments(samples)
    # Langevin at step h = 0.05 inflates the variance by 1 / (1 - h / 2) - 1 = 2.6 %.
    assert ((var - 1).abs() < 4 * var_se + 0.026).all()
