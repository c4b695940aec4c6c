"""The ELBO with its Monte Carlo error, against the exact log evidence of a conjugate model."""

import math

import pyro
import pyro.distributions as dist
import pytest
import torch

from pyro_ext.infer import ELBOEstimate, elbo_estimate

PRIOR_SD, NOISE_SD = 2.0, 0.5


def model(y):
    mu = pyro.sample("mu", dist.Normal(torch.tensor(0.0, dtype=y.dtype), PRIOR_SD))
    with pyro.plate("data", y.shape[0]):
        pyro.sample("y", dist.Normal(mu, NOISE_SD), obs=y)


def gaussian_guide(loc, scale):
    def guide(y):
        pyro.sample("mu", dist.Normal(torch.tensor(loc, dtype=y.dtype), scale))

    return guide


def exact(y):
    """The posterior of mu and the log evidence (y ~ N(0, NOISE^2 I + PRIOR^2 11^T))."""
    n = y.shape[0]
    precision = 1 / PRIOR_SD**2 + n / NOISE_SD**2
    mean, sd = float(y.sum()) / NOISE_SD**2 / precision, precision**-0.5
    covariance = NOISE_SD**2 * torch.eye(n, dtype=y.dtype) + PRIOR_SD**2
    evidence = dist.MultivariateNormal(torch.zeros(n, dtype=y.dtype), covariance).log_prob(y)
    return mean, sd, float(evidence)


def test_the_exact_posterior_gives_the_log_evidence_with_no_error():
    y = torch.tensor([0.3, 1.1, 0.7, 1.9], dtype=torch.float64)
    mean, sd, evidence = exact(y)
    estimate = elbo_estimate(model, gaussian_guide(mean, sd), y, num_particles=8)
    assert estimate.mean == pytest.approx(evidence, abs=1e-9)
    assert estimate.sd == pytest.approx(0.0, abs=1e-9)


def test_another_guide_is_below_by_its_kl_within_the_reported_error():
    pyro.set_rng_seed(0)
    y = torch.tensor([0.3, 1.1, 0.7, 1.9], dtype=torch.float64)
    mean, sd, evidence = exact(y)
    loc, scale = mean + 0.5, 2 * sd
    kl = math.log(sd / scale) + (scale**2 + (loc - mean) ** 2) / (2 * sd**2) - 0.5
    estimate = elbo_estimate(model, gaussian_guide(loc, scale), y, num_particles=400)
    assert estimate.sd > 0
    assert abs(estimate.mean - (evidence - kl)) < 4 * estimate.sd
    # The exact posterior's bound exceeds it by more than the error of the difference.
    best = elbo_estimate(model, gaussian_guide(mean, sd), y)
    assert best.exceeds(estimate) and not estimate.exceeds(best)


def test_bad_arguments_are_refused():
    y = torch.zeros(2)
    with pytest.raises(TypeError, match="model must be callable"):
        elbo_estimate(None, gaussian_guide(0.0, 1.0), y)
    with pytest.raises(TypeError, match="guide must be callable"):
        elbo_estimate(model, "guide", y)
    with pytest.raises(ValueError, match="num_particles"):
        elbo_estimate(model, gaussian_guide(0.0, 1.0), y, num_particles=1)
    assert ELBOEstimate(1.0, 0.1).exceeds(ELBOEstimate(0.0, 0.1))


def test_a_guide_off_the_support_gives_a_non_finite_estimate_not_an_error(no_stray_tensors):
    # A draw where the model's density is zero (a scale of 0 under a HalfNormal guide point)
    # makes the ELBO -inf: the estimate says so, and is summarised on the host.
    y = torch.tensor([0.3, 1.1], dtype=torch.float64)

    def scale_model(y):
        sigma = pyro.sample("sigma", dist.HalfNormal(y.new_tensor(1.0)))
        with pyro.plate("data", y.shape[0]):
            pyro.sample("y", dist.Normal(0.0, sigma), obs=y)

    def zero_guide(y):
        pyro.sample("sigma", dist.Delta(y.new_tensor(0.0)))

    with no_stray_tensors():
        estimate = elbo_estimate(scale_model, zero_guide, y, num_particles=3)
    assert not math.isfinite(estimate.mean)
