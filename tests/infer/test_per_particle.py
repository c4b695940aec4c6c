"""PerParticle model arguments: particle k's log density and gradient are those of the
model on value[k], in the eager and the compiled step, and wrong sizes are refused."""

import pyro
import pyro.distributions as dist
import pytest
import torch

from pyro_ext.infer import MCMC, SGLD, PerParticle, SlowMixingWarning
from pyro_ext.infer.potential import ParticlePotential

NUM_PARTICLES = 4


def regression(x, y):
    w = pyro.sample("w", dist.Normal(torch.zeros(3, device=x.device), 1.0).to_event(1))
    with pyro.plate("data", x.shape[0]):
        pyro.sample("obs", dist.Normal(x @ w, 1.0), obs=y)


def data(device, generator_seed=0):
    generator = torch.Generator().manual_seed(generator_seed)
    x = torch.randn(NUM_PARTICLES, 10, 3, generator=generator).to(device)
    y = torch.randn(10, generator=generator).to(device)
    return x, y


def exact(x, y, z):
    """Log density and gradient of the conjugate regression at ``w = z``, by hand."""
    z = z.clone().requires_grad_(True)
    log_density = (
        dist.Normal(0.0, 1.0).log_prob(z).sum() + dist.Normal(x @ z, 1.0).log_prob(y).sum()
    )
    (grad,) = torch.autograd.grad(log_density, z)
    return log_density.detach(), grad


@pytest.mark.parametrize("as_keyword", [False, True])
def test_each_particle_sees_its_own_argument(device, as_keyword):
    x, y = data(device)
    args, kwargs = ((), {"x": PerParticle(x), "y": y}) if as_keyword else ((PerParticle(x), y), {})
    potential = ParticlePotential(regression, args, kwargs)
    z = torch.randn(NUM_PARTICLES, 3, device=device)
    log_density, grad = potential.log_density_and_grad(z)
    for k in range(NUM_PARTICLES):
        expected_log_density, expected_grad = exact(x[k], y, z[k])
        assert torch.allclose(log_density[k], expected_log_density, rtol=1e-5)
        assert torch.allclose(grad[k], expected_grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("jit_compile", [False, "trace"])
def test_sgld_step_follows_each_particles_gradient(device, jit_compile):
    x, y = data(device)
    kernel = SGLD(
        regression, 1e-2, num_particles=NUM_PARTICLES, temperature=0.0, jit_compile=jit_compile
    )
    pyro.set_rng_seed(0)
    kernel.setup(0, PerParticle(x), y)
    before = kernel.particles.detach().clone()
    kernel.sample(kernel.initial_params)
    after = kernel.particles.detach()
    for k in range(NUM_PARTICLES):
        _, grad = exact(x[k], y, before[k])
        assert torch.allclose(after[k], before[k] + 1e-2 * grad, rtol=1e-5, atol=1e-6)


def test_mcmc_runs_with_per_particle_data_and_default_step(device):
    x, y = data(device)
    mcmc = MCMC(SGLD(regression, num_particles=NUM_PARTICLES), num_samples=20, warmup_steps=20)
    with pytest.warns(SlowMixingWarning):  # 40 steps are too few to mix: said, not hidden
        mcmc.run(PerParticle(x), y)
    assert mcmc.get_samples()["w"].shape == (NUM_PARTICLES * 20, 3)


def test_wrong_per_particle_arguments_are_refused():
    x, y = data("cpu")
    kernel = SGLD(regression, 1e-2, num_particles=NUM_PARTICLES)
    kernel.setup(0, x[0], y)
    with pytest.raises(ValueError, match="leading size 3 but there are 4 particles"):
        kernel.set_data(PerParticle(x[:3]), y)
    with pytest.raises(ValueError, match=r"leading sizes \[4, 3\]"):
        kernel.set_data(PerParticle(x), PerParticle(y.expand(3, 10)))
    with pytest.raises(TypeError, match="PerParticle must wrap a tensor"):
        kernel.set_data(PerParticle(x.tolist()), y)
    with pytest.raises(ValueError, match="0-dimensional"):
        ParticlePotential(regression, (x[0], PerParticle(torch.tensor(1.0))))
    with pytest.raises(ValueError, match="leading size 3 but there are 4 particles"):
        SGLD(regression, 1e-2, num_particles=NUM_PARTICLES).setup(0, PerParticle(x[:3]), y)
    plate = ParticlePotential(regression, (PerParticle(x), y), vectorize="plate")
    with pytest.raises(ValueError, match="need vectorize='vmap'"):
        plate.log_density_and_grad(torch.zeros(NUM_PARTICLES, 3))


def test_bad_data_in_any_particles_slice_is_refused():
    x, y = data("cpu")
    x[2, 5, 1] = float("nan")
    with pytest.raises(ValueError, match="x"):
        ParticlePotential(regression, (PerParticle(x), y))
