"""
Calibration of the SG-MCMC kernels: stationary laws and simulation-based calibration.

The fast checks run by default; the full suite (every kernel, the compiled step, longer
runs) is marked ``slow``. ``benchmarks/calibration.py`` writes the same measurements as
tables (``benchmarks/results/calibration.md``).
"""

import math

import pytest
import torch

from pyro_ext.infer import SGHMC, SGLD, AdamSGLD, Gibbs
from pyro_ext.infer.calibration import (
    MIXTURE_LOCS,
    NORMAL_TAIL_MASS,
    normal_means_posterior_cdf,
    normal_means_sbc,
    repulsive_ensemble_moments,
)


def within(moments, num_se=4.0):
    return (
        abs(moments.mean_square - 1.0) < num_se * moments.mean_square_se
        and abs(moments.tail_mass - NORMAL_TAIL_MASS) < num_se * moments.tail_mass_se
    )


def test_sgld_r_with_the_median_bandwidth_keeps_its_stationary_law(device):
    # 1-D N(0, 1), 5 particles, 600 independent ensembles started at the target. With the
    # bandwidth held constant in the divergence term the tails come out 15 % light (0.039
    # against 0.0455, 5 standard errors); with the exact term both moments agree.
    exact = repulsive_ensemble_moments(5, 0.05, num_ensembles=600, device=device)
    assert within(exact), exact
    held = repulsive_ensemble_moments(
        5, 0.05, num_ensembles=600, bandwidth_gradient=False, device=device
    )
    assert not within(held), held
    assert held.tail_mass < NORMAL_TAIL_MASS - 4 * held.tail_mass_se


def test_plain_sgld_ensemble_moments_match_the_discretised_chain():
    # Without repulsion each particle is z <- (1 - eps) z + sqrt(2 eps) xi: variance
    # 1 / (1 - eps / 2), lag-one autocorrelation 1 - eps, ESS per step (1 - rho) / (1 + rho).
    step_size = 0.1
    moments = repulsive_ensemble_moments(10, step_size, num_ensembles=100, repulsion=False)
    assert abs(moments.mean_square - 1 / (1 - step_size / 2)) < 4 * moments.mean_square_se
    assert abs(moments.effective_step - 1.0) < 0.05
    rho = 1 - step_size
    assert moments.ess_per_step == pytest.approx((1 - rho) / (1 + rho), rel=0.15)


# (name, kernel factory, warm-up, draws after warm-up); 10 particles; step sizes that mix
# within the run on a posterior of sd 0.45 (see benchmarks/calibration.py).
FAST = [
    ("sgld+r", lambda m: SGLD(m, 0.02, num_particles=10, repulsion="rbf"), 300, 600),
    (
        "sghmc+r",
        lambda m: SGHMC(m, 0.03, friction=0.1, num_particles=10, repulsion="rbf"),
        300,
        600,
    ),
    ("adam+r", lambda m: AdamSGLD(m, 0.1, num_particles=10, repulsion="rbf"), 300, 600),
]

FULL = [
    ("sgld", lambda m: SGLD(m, 0.004, num_particles=10), 500, 1000),
    ("sghmc", lambda m: SGHMC(m, 0.001, friction=0.1, num_particles=10), 500, 1000),
    ("adam", lambda m: AdamSGLD(m, 0.001, num_particles=10), 500, 1000),
    (
        "sgld+r compiled",
        lambda m: SGLD(m, 0.02, num_particles=10, repulsion="rbf", jit_compile=True),
        500,
        1000,
    ),
] + [(name, make, 500, 1000) for name, make, _, _ in FAST]


def gibbs_sgld(model):
    return Gibbs(SGLD(model, 0.004, num_particles=10), discrete_sites=["component"])


@pytest.mark.parametrize("name, make_kernel, warmup, num_samples", FAST, ids=[c[0] for c in FAST])
def test_repulsive_kernels_pass_simulation_based_calibration(
    name, make_kernel, warmup, num_samples
):
    result = normal_means_sbc(
        make_kernel, num_samples, warmup, thin=100, num_replications=100, seed=1
    )
    assert result.num_draws == 60
    assert result.p_value > 1e-3, result
    assert result.moments_agree(bias=0.02), result


@pytest.mark.slow
@pytest.mark.parametrize("name, make_kernel, warmup, num_samples", FULL, ids=[c[0] for c in FULL])
def test_every_kernel_passes_simulation_based_calibration(name, make_kernel, warmup, num_samples):
    result = normal_means_sbc(make_kernel, num_samples, warmup, thin=100, num_replications=200)
    assert result.p_value > 1e-3, result
    assert result.moments_agree(bias=0.02), result


# The kernels as a user calls them, without a step size: the warm-up sets the step whose
# stationary variance error is at most bias_tolerance (0.05), which is the allowance.
DEFAULTS = [
    ("sgld", lambda m: SGLD(m, num_particles=10)),
    ("sghmc", lambda m: SGHMC(m, num_particles=10)),
    ("adam", lambda m: AdamSGLD(m, num_particles=10)),
    ("sgld+r", lambda m: SGLD(m, num_particles=10, repulsion="rbf")),
    ("sghmc+r", lambda m: SGHMC(m, num_particles=10, repulsion="rbf")),
    ("adam+r", lambda m: AdamSGLD(m, num_particles=10, repulsion="rbf")),
]


def test_the_default_step_size_passes_simulation_based_calibration():
    result = normal_means_sbc(DEFAULTS[0][1], 600, 300, thin=100, num_replications=100, seed=1)
    assert result.p_value > 1e-3, result
    assert result.moments_agree(bias=0.05), result


@pytest.mark.slow
@pytest.mark.parametrize("name, make_kernel", DEFAULTS, ids=[c[0] for c in DEFAULTS])
def test_every_kernel_passes_simulation_based_calibration_at_its_default_step(name, make_kernel):
    result = normal_means_sbc(make_kernel, 1000, 500, thin=100, num_replications=200)
    assert result.p_value > 1e-3, result
    assert result.moments_agree(bias=0.05), result


@pytest.mark.slow
def test_gibbs_passes_simulation_based_calibration_on_a_mixture_prior():
    result = normal_means_sbc(gibbs_sgld, 1000, 500, thin=100, num_replications=200, mixture=True)
    assert result.p_value > 1e-3, result
    assert result.moments_agree(bias=0.02), result


def test_mixturenormal_means_posterior_cdf_matches_quadrature():
    # Prior x likelihood on a fine grid, normalised and summed: the exact posterior CDF.
    y = torch.tensor([[0.3, -2.5, 1.0], [1.1, -1.9, -0.4], [0.2, -2.2, 0.1]], dtype=torch.float64)
    grid = torch.linspace(-9, 9, 36001, dtype=torch.float64).unsqueeze(-1)  # (G, 1)
    prior = sum(
        0.5 * torch.distributions.Normal(loc, 1.0).log_prob(grid).exp() for loc in MIXTURE_LOCS
    )
    likelihood = torch.distributions.Normal(grid.unsqueeze(-2), 0.7).log_prob(y).sum(-2).exp()
    density = prior * likelihood  # (G, R)
    cdf = density.cumsum(0) / density.sum(0)
    for index in [12000, 17000, 18500, 21000]:
        theta = grid[index].expand(1, 3)
        got = normal_means_posterior_cdf(theta, y, 0.7, mixture=True)[0]
        assert torch.allclose(got, cdf[index], atol=1e-3)
    # Without the mixture, the conjugate normal posterior.
    prior = torch.distributions.Normal(0.0, 1.0).log_prob(grid).exp()
    density = prior * likelihood
    cdf = density.cumsum(0) / density.sum(0)
    got = normal_means_posterior_cdf(grid[17000].expand(1, 3), y, 0.7, mixture=False)[0]
    assert torch.allclose(got, cdf[17000], atol=1e-3)


@pytest.mark.slow
@pytest.mark.parametrize("num_particles", [10, 50])
@pytest.mark.parametrize("step_size", [0.025, 0.01])
def test_sgld_r_stationary_law_as_the_step_shrinks(num_particles, step_size):
    exact = repulsive_ensemble_moments(num_particles, step_size, num_ensembles=400)
    # Euler's bias shrinks with the step: at 0.025 it is below 2 % of E[z^2].
    assert abs(exact.mean_square - 1) < 4 * exact.mean_square_se + 0.02, exact
    assert abs(exact.tail_mass - NORMAL_TAIL_MASS) < 4 * exact.tail_mass_se + 0.002, exact


def test_normal_means_sbc_detects_a_wrong_sampler():
    # Twice the posterior's variance: SGLD at temperature 2. The moments notice, and so
    # does the rank histogram, humped since draws too wide put the truths mid-rank (the
    # hump is shallow: it takes a few hundred replications to show).
    result = normal_means_sbc(
        lambda m: SGLD(m, 0.004, num_particles=10, temperature=2.0),
        num_samples=600,
        warmup_steps=300,
        thin=100,
        num_replications=400,
    )
    assert not result.moments_agree(bias=0.02)
    assert result.mean_square > 1.5
    assert result.p_value < 1e-3
    assert math.isfinite(result.mean)


def test_normal_means_sbc_refuses_bad_arguments():
    make = lambda m: SGLD(m, 0.01, num_particles=2)  # noqa: E731
    with pytest.raises(TypeError, match="make_kernel must be callable"):
        normal_means_sbc("sgld", 10, 10, 1)
    with pytest.raises(ValueError, match="thin"):
        normal_means_sbc(make, 10, 10, 0)
    with pytest.raises(ValueError, match="num_replications"):
        normal_means_sbc(make, 10, 10, 1, num_replications=0)
    with pytest.raises(ValueError, match="noise_scale"):
        normal_means_sbc(make, 10, 10, 1, noise_scale=-1.0)
    with pytest.raises(ValueError, match="num_particles"):
        repulsive_ensemble_moments(0, 0.1)
    with pytest.raises(ValueError, match="step_size"):
        repulsive_ensemble_moments(3, 0.0)
