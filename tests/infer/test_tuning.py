"""tune_step_size: the step size by kernel Stein discrepancy of pilot runs (issue 20)."""

import math

import pyro
import pyro.distributions as dist
import pytest
import torch

from pyro_ext.infer import MCMC, SGLD, SamplerDivergenceError, tune_step_size
from pyro_ext.infer.sgmcmc import ParticlePotential
from pyro_ext.infer.tuning import _full_data_score

N, BATCH = 100, 20


def data():
    return torch.randn(N, generator=torch.Generator().manual_seed(0), dtype=torch.float64) + 1.5


def model(y, subsample_size=BATCH):
    mu = pyro.sample("mu", dist.Normal(y.new_zeros(()), 1.0))
    with pyro.plate("data", len(y), subsample_size=subsample_size) as rows:
        pyro.sample("obs", dist.Normal(mu, 1.0), obs=y[rows])


def exact_posterior(y):
    precision = 1.0 + len(y)
    return float(y.sum()) / precision, precision**-0.5


def factory(step_size):
    return SGLD(model, step_size=step_size, num_particles=10)


CANDIDATES = [1e-6, 1e-4, 1e-3, 3e-3, 1e-2, 1.0]


def test_picks_a_step_that_samples_the_exact_posterior():
    y = data()
    tuning = tune_step_size(factory, y, candidates=CANDIDATES, num_steps=200)
    ksd = {t.step_size: t.ksd for t in tuning.trials}
    # Too small a step has not left its start after 200 steps; too large diverges.
    assert ksd[1e-6] > 10 * ksd[tuning.step_size]
    assert math.isinf(ksd[1.0])
    assert tuning.trials[-1].diverged_at is not None and tuning.trials[-1].diverged_at < 200
    assert tuning.step_size in (1e-3, 3e-3, 1e-2)
    assert tuning.step_size == min(tuning.trials, key=lambda t: t.ksd).step_size
    assert "<- chosen" in str(tuning)
    # The chosen step size samples the conjugate posterior.
    mean, sd = exact_posterior(y)
    mcmc = MCMC(factory(tuning.step_size), num_samples=500, warmup_steps=200, disable_progbar=True)
    mcmc.run(y)
    draws = mcmc.get_samples()["mu"]
    assert abs(float(draws.mean()) - mean) < 0.3 * sd
    assert 0.7 * sd < float(draws.std()) < 1.5 * sd


def test_same_seed_same_tuning():
    y = data()
    first = tune_step_size(factory, y, candidates=[1e-3, 1e-2], num_steps=50)
    second = tune_step_size(factory, y, candidates=[1e-3, 1e-2], num_steps=50)
    assert [t.ksd for t in first.trials] == [t.ksd for t in second.trials]


def test_full_data_score_is_the_whole_data_gradient():
    y = data()
    z = torch.randn(7, 1, dtype=torch.float64)
    subsampled = ParticlePotential(model, (y,))
    full = ParticlePotential(lambda y: model(y, None), (y,))
    torch.testing.assert_close(_full_data_score(subsampled, z), full.log_density_and_grad(z, {})[1])


def test_every_candidate_diverging_is_an_error_naming_the_smallest():
    with pytest.raises(
        ValueError, match=r"every candidate step size diverged \(the smallest, 0\.5"
    ):
        tune_step_size(factory, data(), candidates=[1.0, 0.5], num_steps=50)


def test_the_divergence_error_points_to_the_tuner():
    error = SamplerDivergenceError(3, ["mu"], [0])
    assert "tune_step_size" in str(error)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"candidates": [1e-3, -1.0]}, ValueError, "candidates"),
        ({"candidates": "1e-3"}, TypeError, "candidates"),
        ({"candidates": []}, ValueError, "candidates"),
        ({"num_steps": 1}, ValueError, "num_steps"),
        ({"num_steps": 10, "burn_in": 10}, ValueError, "burn_in"),
        ({"max_draws": 2.5}, TypeError, "max_draws"),
    ],
)
def test_bad_arguments_name_themselves(kwargs, error, match):
    with pytest.raises(error, match=match):
        tune_step_size(factory, data(), **kwargs)


def test_a_factory_that_is_not_one_is_a_type_error():
    with pytest.raises(TypeError, match="kernel_factory must be a callable"):
        tune_step_size(SGLD(model, step_size=1e-3), data())
    with pytest.raises(TypeError, match="must return a stochastic-gradient kernel"):
        tune_step_size(lambda h: h, data(), candidates=[1e-3])
