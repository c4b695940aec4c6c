"""The potential package (issue 31): its layout functions, its constructor arguments and
the names pyro_ext.infer.sgmcmc keeps re-exporting."""

import pyro
import pyro.distributions as dist
import pytest
import torch

from pyro_ext.infer import potential as potential_package
from pyro_ext.infer.potential import ParticlePotential, layout


def model(y):
    mu = pyro.sample("mu", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
    scale = pyro.sample("scale", dist.LogNormal(0.0, 1.0))
    with pyro.plate("data", len(y)):
        pyro.sample("obs", dist.Normal(mu.sum(), scale), obs=y)


def test_the_layout_functions_are_the_potentials_maps():
    potential = ParticlePotential(model, (torch.randn(10),))
    z = torch.randn(4, potential.dim)
    values, log_jacobian = layout.constrain_with_log_jacobian(potential.layout, z)
    assert set(values) == {"mu", "scale"}
    assert torch.equal(values["scale"], potential.constrain(z)["scale"])
    assert torch.allclose(log_jacobian, z[:, 2])  # log|d exp(u) / du| = u
    assert torch.allclose(potential.unconstrain(potential.constrain(z), 4), z, atol=1e-6)
    assert [potential.site_of(c) for c in range(potential.dim)] == ["mu", "mu", "scale"]


def test_exclude_log_prob_is_a_constructor_argument():
    y = torch.randn(10)
    full = ParticlePotential(model, (y,))
    without_mu = ParticlePotential(model, (y,), exclude_log_prob=["mu"])
    assert without_mu.exclude_log_prob == frozenset({"mu"})
    z = torch.randn(3, full.dim)
    subsamples = full.draw_subsamples(z.device)
    prior = dist.Normal(0.0, 1.0).log_prob(z[:, :2]).sum(-1)
    got = without_mu.log_density_and_grad(z, subsamples)[0]
    assert torch.allclose(got, full.log_density_and_grad(z, subsamples)[0] - prior, atol=1e-5)
    with pytest.raises(ValueError, match=r"exclude_log_prob names \['nu'\]"):
        ParticlePotential(model, (y,), exclude_log_prob=["nu"])


def test_sgmcmc_keeps_re_exporting_the_potential_names():
    import pyro_ext.infer.sgmcmc as sgmcmc
    from pyro_ext.infer import errors

    assert sgmcmc.ParticlePotential is potential_package.ParticlePotential
    assert sgmcmc.LogJointMessenger is potential_package.LogJointMessenger
    assert sgmcmc.SupportMap is potential_package.SupportMap
    assert sgmcmc.SamplerDivergenceError is errors.SamplerDivergenceError
    for name in potential_package.__all__:
        assert hasattr(potential_package, name)


def switch_model(y):
    mu = pyro.sample("mu", dist.Normal(torch.zeros(2), 1.0).to_event(1))
    gamma = pyro.sample("gamma", dist.Bernoulli(0.5))
    with pyro.plate("data", len(y)):
        pyro.sample("obs", dist.Normal(mu[gamma.long()], 1.0), obs=y)


def test_discrete_values_are_a_call_argument_never_an_attribute():
    # What a Gibbs move holds fixed is passed to every evaluation (issue 31): the
    # potential keeps no values of its discrete sites, so no caller writes into it.
    y = torch.tensor([0.3, -1.2, 2.0])
    potential = ParticlePotential(model=switch_model, model_args=(y,), discrete_sites=["gamma"])
    assert not hasattr(potential, "conditioned")
    z = torch.tensor([[1.0, -1.0], [0.5, 2.0]])
    with pytest.raises(ValueError, match=r"conditioned has no values for .*\['gamma'\]"):
        potential.log_density_and_grad(z, {})
    gamma = torch.tensor([0.0, 1.0])
    got, _ = potential.log_density_and_grad(z, {}, {"gamma": gamma})
    for particle in range(2):
        values = {"mu": z[particle], "gamma": gamma[particle]}
        trace = pyro.poutine.trace(pyro.poutine.condition(switch_model, values)).get_trace(y)
        assert torch.allclose(got[particle], trace.log_prob_sum())
