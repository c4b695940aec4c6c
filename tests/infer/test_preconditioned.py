"""PreconditionedSGHMC: a registered pure update, its windowed mass, compiled and calibrated."""

import pyro
import pyro.distributions as dist
import pytest
import torch

from pyro_ext.infer import MCMC, PreconditionedSGHMC
from pyro_ext.infer.calibration import normal_means_sbc
from pyro_ext.infer.sgmcmc import KERNELS, SAMPLERS, get_kernel
from pyro_ext.infer.sgmcmc.mass import rescale_momenta, windowed_mass
from pyro_ext.infer.sgmcmc.updates import (
    AdamState,
    PreconditionedState,
    adam_sgld_update,
    preconditioned_sghmc_update,
)

#: a Gaussian whose coordinates' scales span four orders of magnitude
SCALES = torch.tensor([100.0, 1.0, 0.01], dtype=torch.float64)


def scaled_gaussian():
    pyro.sample("z", dist.Normal(torch.zeros(3, dtype=torch.float64), SCALES).to_event(1))


def test_registered_with_the_other_samplers():
    assert get_kernel("preconditioned_sghmc") is PreconditionedSGHMC
    assert KERNELS["preconditioned_sghmc"] is PreconditionedSGHMC
    assert SAMPLERS["preconditioned_sghmc"].hyper == ("friction",)


def test_the_update_is_adam_sgld_with_its_mass_frozen(device):
    # adam_sgld_update with v = M^2, no bias correction left and no adaptation is SGHMC
    # with the constant mass M (+ eps) and friction 1 - beta1: the same numbers.
    generator = torch.Generator().manual_seed(0)
    z, velocity, grad, noise = torch.randn(4, 5, 3, generator=generator, dtype=torch.float64)
    mass = torch.rand(5, 3, generator=generator, dtype=torch.float64) + 0.5
    z, velocity, grad, noise, mass = (t.to(device) for t in (z, velocity, grad, noise, mass))
    count = torch.tensor(10**9, device=device)
    adam = adam_sgld_update(
        AdamState(z, velocity, mass.pow(2), count), grad, 0.01, noise, eps=0.0, adapt=False
    )
    state = PreconditionedState(z, velocity, mass, torch.zeros_like(z), count.new_zeros(()))
    ours = preconditioned_sghmc_update(state, grad, 0.01, noise, friction=0.1)
    torch.testing.assert_close(ours.z, adam.z, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ours.velocity, adam.velocity, rtol=1e-12, atol=1e-12)
    # Observing sums grad^2 (a bool, or a tensor flag for a compiled step).
    observed = preconditioned_sghmc_update(ours, grad, 0.01, noise, observe=torch.tensor(True))
    torch.testing.assert_close(observed.grad_sq, grad.pow(2))
    assert int(observed.count) == 1
    assert int(preconditioned_sghmc_update(ours, grad, 0.01, noise, observe=False).count) == 0


def test_windowed_mass_is_the_robust_pooled_inverse_variance():
    torch.manual_seed(0)
    draws = SCALES * torch.randn(8, 500, 3, dtype=torch.float64)
    no_floor = torch.zeros(3, dtype=torch.float64)
    initial = 2.0 * SCALES.pow(2)  # an initial guess off by a factor 2
    mass = windowed_mass(draws, no_floor, initial)
    torch.testing.assert_close(mass, SCALES.pow(-2), rtol=0.1, atol=0)
    # One stray particle of eight, 1000 sd away, moves the interquartile range by half
    # (a plain variance would put the mass near 1e-5).
    draws[0, :, 1] += 1e3
    assert 0.5 < float(windowed_mass(draws, no_floor, initial)[1]) < 1.0
    # Shrunk towards the initial variance with the weight of five draws: one draw per
    # coordinate gives at least 5/6 of the initial variance.
    one = windowed_mass(draws[1:2, :1], no_floor, initial)
    assert torch.all(one <= 1.2 / initial)
    # Never below adam_floor times Adam's mass sqrt(E[grad^2]).
    floored = windowed_mass(draws, torch.full((3,), 1e16).double(), initial, 0.6)
    torch.testing.assert_close(floored, torch.full((3,), 0.6e8).double())


def test_rescaled_momenta_keep_their_stationary_law():
    state = PreconditionedState(
        torch.zeros(2, 3),
        torch.ones(2, 3),
        torch.full((2, 3), 4.0),
        torch.ones(2, 3),
        torch.tensor(7),
    )
    new = rescale_momenta(state, torch.tensor([1.0, 4.0, 16.0]))
    # velocity ~ N(0, eps M): its sd scales as sqrt(M_new / M_old)
    torch.testing.assert_close(new.velocity, torch.tensor([[0.5, 1.0, 2.0]] * 2))
    assert new.mass.shape == (2, 3) and int(new.count) == 0 and float(new.grad_sq.sum()) == 0


def _run(kernel, num_samples=1000, warmup_steps=400, seed=0):
    pyro.set_rng_seed(seed)
    mcmc = MCMC(kernel, num_samples=num_samples, warmup_steps=warmup_steps, disable_progbar=True)
    mcmc.run()
    return mcmc


# About 5 s each, the next two run in the integration run; the default run keeps the update,
# the mass estimate and the compiled chain.
@pytest.mark.integration
def test_the_window_sets_the_mass_and_the_chain_samples_the_target(device):
    # Started from unit scales, the mass after the window is 1 / Var within the sampling
    # error of the window's draws, and every coordinate's variance is right although the
    # scales differ 10^4-fold (one step size for all).
    def model():
        pyro.sample(
            "z",
            dist.Normal(
                torch.zeros(3, dtype=torch.float64, device=device), SCALES.to(device)
            ).to_event(1),
        )

    init = {"z": SCALES.to(device)}
    kernel = PreconditionedSGHMC(model, 0.05, num_particles=16, init_scale=init)
    mcmc = _run(kernel)
    assert kernel.window() == (100, 200)
    mass = kernel.state.mass[0].cpu()
    torch.testing.assert_close(mass, SCALES.pow(-2), rtol=0.3, atol=0)
    variance = mcmc.get_samples()["z"].var(0).cpu() / SCALES.pow(2)
    assert torch.all((variance > 0.8) & (variance < 1.25)), variance


def test_the_compiled_step_gives_the_eager_chain_across_the_window():
    # Warm-up 40: the window [10, 20) has the ten draws that re-estimate the mass.
    options = dict(num_particles=4, init_scale={"z": 2.0 * SCALES})
    eager_kernel = PreconditionedSGHMC(scaled_gaussian, 0.05, **options)
    eager = _run(eager_kernel, 60, 40)
    kernel = PreconditionedSGHMC(scaled_gaussian, 0.05, jit_compile="trace", **options)
    traced = _run(kernel, 60, 40)
    assert kernel.compiled_step.num_traces == 1  # the window's flag is a tensor input
    assert not torch.allclose(kernel.state.mass, (2.0 * SCALES).pow(-2).expand(4, 3))
    torch.testing.assert_close(kernel.state.mass, eager_kernel.state.mass)
    a, b = eager.get_samples()["z"], traced.get_samples()["z"]
    torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(adapt_window=(0.5, 0.2)), ValueError, "start < end"),
        (dict(adapt_window=(0.1, 1.5)), ValueError, "adapt_window\\[1\\]"),
        (dict(adapt_window=0.5), TypeError, "adapt_window must be a pair"),
        (dict(init_scale=[1.0]), TypeError, "init_scale must be a dict"),
        (dict(adam_floor=-1.0), ValueError, "adam_floor"),
        (dict(friction=0.0), ValueError, "friction"),
    ],
)
def test_bad_settings_are_refused(kwargs, error, match):
    with pytest.raises(error, match=match):
        PreconditionedSGHMC(scaled_gaussian, 0.05, **kwargs)


@pytest.mark.integration
def test_a_checkpoint_inside_the_window_resumes_to_the_same_draws(tmp_path):
    class Interrupt(Exception):
        """A simulated crash inside the mass window."""

    def crash(kernel, params, stage, index):
        if stage == "Warmup" and index == 150:  # inside the window [100, 200)
            raise Interrupt

    path = tmp_path / "run.ckpt"
    init = dict(num_particles=4, init_scale={"z": SCALES})
    whole = _run(PreconditionedSGHMC(scaled_gaussian, 0.05, **init), 50, 400)
    pyro.set_rng_seed(0)
    options = dict(checkpoint_path=str(path), checkpoint_every=20, disable_progbar=True)
    kernel = PreconditionedSGHMC(scaled_gaussian, 0.05, **init)
    with pytest.raises(Interrupt):
        MCMC(kernel, num_samples=50, warmup_steps=400, hook_fn=crash, **options).run()
    kernel = PreconditionedSGHMC(scaled_gaussian, 0.05, **init)
    resumed = MCMC(kernel, num_samples=50, warmup_steps=400, **options)
    resumed.resume()
    torch.testing.assert_close(resumed.get_samples()["z"], whole.get_samples()["z"])


# Calibration (simulation-based, Talts et al. 2018) on the normal-means model: at a given
# step and at the default one, which warm-up sets in the final mass's coordinates.
@pytest.mark.integration
@pytest.mark.parametrize(
    "make_kernel",
    [
        lambda m: PreconditionedSGHMC(m, 0.05, num_particles=10),
        lambda m: PreconditionedSGHMC(m, num_particles=10),
    ],
    ids=["given step", "default step"],
)
def test_preconditioned_sghmc_passes_simulation_based_calibration(make_kernel):
    result = normal_means_sbc(make_kernel, 1000, 500, thin=100, num_replications=200, seed=1)
    assert result.p_value > 1e-3, result
    assert result.moments_agree(bias=0.05), result
